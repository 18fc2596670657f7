"""The library's kernels, each written once with ``@gw.kernel`` and run on every backend and element type.

Each function here makes the kernel for one element type (a kernel type name: "f32", "f16", "i32" ...), once: the
body is written once, its types are the factory's (``T`` the input's, ``VAL`` what a value computes as, ``ACC`` what
sums accumulate in), and float32's kernels are the ones the library had before it took other types. Kernels of other
types are named with the type (``row_sum_i32``): a trace tells them apart. 16-bit floats compute and accumulate in
float32, float64 in float64, integers accumulate in int64.

Row operations run one block of ``ROW`` threads per row: each thread walks the row in steps of ``ROW`` (the same
number of steps in every thread, so the CPU runs them vectorised), then the block combines its threads' partial
results in shared memory by halving (``HALVINGS`` rounds). Whole-array reductions are one row. NaN propagates as in
NumPy: a NaN beats every number in max and argmax (the first NaN's index for argmax), except on WebGPU, where WGSL
lets implementations assume there is no NaN (lavapipe folds ``v != v`` to false).
"""

import functools
import math

import numpy as np

from .. import pykernel as gw
from ..pykernel import PythonKernel
from ..pykernel.ktypes import HALVES, INTS, SCALAR_TYPES, ScalarType

TILE = 16  # matmul and transpose tiles: TILE × TILE threads per block
BLOCK = 4 * TILE  # the tiled matmul's tile of c per block (4 × 4 values per thread)
ROW = 256  # threads per block for row operations
HALVINGS = 8  # log2(ROW)
NEG_INF = -math.inf
INT_RESULT = "i64"  # sums and scans of integers, as NumPy gives them on 64-bit platforms


def kernel_name(base: str, t: str) -> str:
    """The span name of kernel ``base`` for element type ``t``: float32's keeps the bare name."""
    return base if t == "f32" else f"{base}_{t}"


def _val(t: str) -> ScalarType:
    """What a value of ``t`` computes as: float32 for the 16-bit floats, else ``t`` itself."""
    return SCALAR_TYPES["f32" if t in HALVES else t]


def _acc(t: str) -> ScalarType:
    """What sums of ``t`` accumulate in: int64 for integers, float64 for float64, float32 for the rest."""
    return SCALAR_TYPES[INT_RESULT if t in INTS else "f64" if t == "f64" else "f32"]


def sum_type(t: str) -> str:
    """The element type of the sum (and the scan) of ``t``: int64 for integers, ``t`` itself for floats."""
    return INT_RESULT if t in INTS else t


def _lowest(t: str) -> float | int:
    """What every value of ``t`` is at least: -inf for floats, the integer type's minimum."""
    return int(np.iinfo(SCALAR_TYPES[t].dtype).min) if t in INTS else NEG_INF


@functools.cache
def matmul_naive(ty: str = "f32") -> PythonKernel:
    T = SCALAR_TYPES[ty]

    @gw.kernel(name=kernel_name("matmul_naive", ty), block=(TILE, TILE))
    def matmul_naive(
        x: gw.index,
        y: gw.index,
        c: T[:, gw.width.n],
        a: T[:, gw.width.k],
        b: T[:, gw.width.n],
        m: gw.i32,
        n: gw.i32,
        k: gw.i32,
    ):
        """c = a @ b, one thread per element of c reading a row of a and a column of b."""
        if y < m and x < n:
            acc = 0.0
            for j in range(k):
                acc += a[y, j] * b[j, x]
            c[y, x] = acc

    return matmul_naive


@functools.cache
def matmul_tiled(ty: str = "f32") -> PythonKernel:
    T, ACC = SCALAR_TYPES[ty], _acc(ty)

    @gw.kernel(name=kernel_name("matmul_tiled", ty), block=(TILE, TILE))
    def matmul_tiled(
        x: gw.index,
        y: gw.index,
        c: T[:, gw.width.n],
        a: T[:, gw.width.k],
        b: T[:, gw.width.n],
        m: gw.i32,
        n: gw.i32,
        k: gw.i32,
    ):
        """c = a @ b, register-blocked: a block of TILE × TILE threads computes a BLOCK × BLOCK tile of c, each thread
        4 × 4 of it (rows ty + TILE·i, columns tx + TILE·j, so that neighbouring threads touch neighbouring columns),
        from BLOCK × TILE slices of a and TILE × BLOCK slices of b staged in shared memory. Each value read from shared
        memory feeds 4 multiply-adds. The launch covers (rows, columns) rounded up to BLOCK, divided by 4."""
        ta = gw.shared((BLOCK, TILE), ACC)
        tb = gw.shared((TILE, BLOCK), ACC)
        tx = gw.local_id(0)
        ty = gw.local_id(1)
        row0 = gw.group_id(1) * BLOCK + ty
        col0 = gw.group_id(0) * BLOCK + tx
        c00 = 0.0
        c01 = 0.0
        c02 = 0.0
        c03 = 0.0
        c10 = 0.0
        c11 = 0.0
        c12 = 0.0
        c13 = 0.0
        c20 = 0.0
        c21 = 0.0
        c22 = 0.0
        c23 = 0.0
        c30 = 0.0
        c31 = 0.0
        c32 = 0.0
        c33 = 0.0
        for t in range((k + TILE - 1) // TILE):
            kk = t * TILE
            r = row0
            ta[ty, tx] = a[r, kk + tx] if r < m and kk + tx < k else 0.0
            r = row0 + TILE
            ta[ty + TILE, tx] = a[r, kk + tx] if r < m and kk + tx < k else 0.0
            r = row0 + 2 * TILE
            ta[ty + 2 * TILE, tx] = a[r, kk + tx] if r < m and kk + tx < k else 0.0
            r = row0 + 3 * TILE
            ta[ty + 3 * TILE, tx] = a[r, kk + tx] if r < m and kk + tx < k else 0.0
            q = col0
            tb[ty, tx] = b[kk + ty, q] if kk + ty < k and q < n else 0.0
            q = col0 + TILE
            tb[ty, tx + TILE] = b[kk + ty, q] if kk + ty < k and q < n else 0.0
            q = col0 + 2 * TILE
            tb[ty, tx + 2 * TILE] = b[kk + ty, q] if kk + ty < k and q < n else 0.0
            q = col0 + 3 * TILE
            tb[ty, tx + 3 * TILE] = b[kk + ty, q] if kk + ty < k and q < n else 0.0
            gw.barrier()
            for p in range(TILE):
                a0 = ta[ty, p]
                a1 = ta[ty + TILE, p]
                a2 = ta[ty + 2 * TILE, p]
                a3 = ta[ty + 3 * TILE, p]
                b0 = tb[p, tx]
                b1 = tb[p, tx + TILE]
                b2 = tb[p, tx + 2 * TILE]
                b3 = tb[p, tx + 3 * TILE]
                c00 += a0 * b0
                c01 += a0 * b1
                c02 += a0 * b2
                c03 += a0 * b3
                c10 += a1 * b0
                c11 += a1 * b1
                c12 += a1 * b2
                c13 += a1 * b3
                c20 += a2 * b0
                c21 += a2 * b1
                c22 += a2 * b2
                c23 += a2 * b3
                c30 += a3 * b0
                c31 += a3 * b1
                c32 += a3 * b2
                c33 += a3 * b3
            gw.barrier()
        r = row0
        if r < m:
            if col0 < n:
                c[r, col0] = c00
            if col0 + TILE < n:
                c[r, col0 + TILE] = c01
            if col0 + 2 * TILE < n:
                c[r, col0 + 2 * TILE] = c02
            if col0 + 3 * TILE < n:
                c[r, col0 + 3 * TILE] = c03
        r = row0 + TILE
        if r < m:
            if col0 < n:
                c[r, col0] = c10
            if col0 + TILE < n:
                c[r, col0 + TILE] = c11
            if col0 + 2 * TILE < n:
                c[r, col0 + 2 * TILE] = c12
            if col0 + 3 * TILE < n:
                c[r, col0 + 3 * TILE] = c13
        r = row0 + 2 * TILE
        if r < m:
            if col0 < n:
                c[r, col0] = c20
            if col0 + TILE < n:
                c[r, col0 + TILE] = c21
            if col0 + 2 * TILE < n:
                c[r, col0 + 2 * TILE] = c22
            if col0 + 3 * TILE < n:
                c[r, col0 + 3 * TILE] = c23
        r = row0 + 3 * TILE
        if r < m:
            if col0 < n:
                c[r, col0] = c30
            if col0 + TILE < n:
                c[r, col0 + TILE] = c31
            if col0 + 2 * TILE < n:
                c[r, col0 + 2 * TILE] = c32
            if col0 + 3 * TILE < n:
                c[r, col0 + 3 * TILE] = c33

    return matmul_tiled


@functools.cache
def transpose(ty: str = "f32") -> PythonKernel:
    T = SCALAR_TYPES[ty]

    @gw.kernel(name=kernel_name("transpose", ty), block=(TILE, TILE))
    def transpose(x: gw.index, y: gw.index, out: T[:, gw.width.rows], a: T[:, gw.width.cols], rows: gw.i32,
                  cols: gw.i32):  # fmt: skip
        """out = a.T through a shared tile, so that both the reads and the writes run along rows."""
        tile = gw.shared((TILE, TILE + 1), T)  # one column more: the column reads hit different banks
        tx = gw.local_id(0)
        ty = gw.local_id(1)
        if y < rows and x < cols:
            tile[ty, tx] = a[y, x]
        gw.barrier()
        ox = gw.group_id(1) * TILE + tx  # a column of out is a row of a
        oy = gw.group_id(0) * TILE + ty
        if oy < cols and ox < rows:
            out[oy, ox] = tile[tx, ty]

    return transpose


@functools.cache
def row_sum(ty: str = "f32") -> PythonKernel:
    T, ACC, OUT = SCALAR_TYPES[ty], _acc(ty), SCALAR_TYPES[sum_type(ty)]

    @gw.kernel(name=kernel_name("row_sum", ty), block=ROW)
    def row_sum(i: gw.index, out: OUT[:], x: T[:, gw.width.cols], cols: gw.i32):
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        total = ACC(0)
        for t in range((cols + ROW - 1) // ROW):
            c = t * ROW + lid
            if c < cols:
                total += x[row, c]
        red[lid] = total
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        if lid == 0:
            out[row] = red[0]

    return row_sum


@functools.cache
def row_max(ty: str = "f32") -> PythonKernel:
    T, VAL, LOWEST, NANS = SCALAR_TYPES[ty], _val(ty), _lowest(ty), ty not in INTS

    @gw.kernel(name=kernel_name("row_max", ty), block=ROW)
    def row_max(i: gw.index, out: T[:], x: T[:, gw.width.cols], cols: gw.i32):
        red = gw.shared(ROW, VAL)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        best = VAL(LOWEST)
        for t in range((cols + ROW - 1) // ROW):
            c = t * ROW + lid
            if c < cols:
                v = x[row, c]
                if v > best or (NANS and v != v):
                    best = v
        red[lid] = best
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                other = red[lid + stride]
                if other > red[lid] or (NANS and other != other):
                    red[lid] = other
            gw.barrier()
            stride //= 2
        if lid == 0:
            out[row] = red[0]

    return row_max


@functools.cache
def row_argmax(ty: str = "f32", index: str = "i64") -> PythonKernel:
    """``index``: the type of the indices written (int64 as NumPy's; int32 where the device has no int64)."""
    T, VAL, LOWEST, IDX, NANS = SCALAR_TYPES[ty], _val(ty), _lowest(ty), SCALAR_TYPES[index], ty not in INTS

    @gw.kernel(name=kernel_name("row_argmax", ty), block=ROW)
    def row_argmax(i: gw.index, out: IDX[:], x: T[:, gw.width.cols], cols: gw.i32):
        """The index of each row's first largest element (of its first NaN where it has one), as np.argmax."""
        val = gw.shared(ROW, VAL)
        at = gw.shared(ROW, gw.i32)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        best = VAL(LOWEST)
        where = cols  # none yet: any element beats it
        for t in range((cols + ROW - 1) // ROW):
            c = t * ROW + lid
            if c < cols:
                v = x[row, c]
                if where == cols or v > best or (NANS and v != v and best == best):
                    best = v
                    where = c
        val[lid] = best
        at[lid] = where
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                ov = val[lid + stride]
                oi = at[lid + stride]
                bv = val[lid]
                bi = at[lid]
                same = ov == bv or (NANS and ov != ov and bv != bv)
                if ov > bv or (NANS and ov != ov and bv == bv) or (same and oi < bi):
                    val[lid] = ov
                    at[lid] = oi
            gw.barrier()
            stride //= 2
        if lid == 0:
            out[row] = at[0]

    return row_argmax


@functools.cache
def row_softmax(ty: str = "f32") -> PythonKernel:
    T, ACC = SCALAR_TYPES[ty], _acc(ty)

    @gw.kernel(name=kernel_name("row_softmax", ty), block=ROW)
    def row_softmax(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32,
                    take_log: gw.i32):  # fmt: skip
        """softmax (log_softmax where take_log) of each row, the row's maximum subtracted first."""
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        best = NEG_INF
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                v = x[row, c]
                if v > best or v != v:
                    best = v
        red[lid] = best
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                other = red[lid + stride]
                if other > red[lid] or other != other:
                    red[lid] = other
            gw.barrier()
            stride //= 2
        top = red[0]
        gw.barrier()  # every thread has read the maximum before red is used again
        total = 0.0
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                total += math.exp(x[row, c] - top)
        red[lid] = total
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        total = red[0]
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                v = x[row, c] - top
                out[row, c] = v - math.log(total) if take_log != 0 else math.exp(v) / total

    return row_softmax


@functools.cache
def row_layer_norm(ty: str = "f32") -> PythonKernel:
    T, ACC = SCALAR_TYPES[ty], _acc(ty)

    @gw.kernel(name=kernel_name("row_layer_norm", ty), block=ROW)
    def row_layer_norm(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], gamma: T[:], beta: T[:],
                       cols: gw.i32, eps: ACC):  # fmt: skip
        """(x - mean) / sqrt(var + eps) * gamma + beta over each row; the variance from the deviations (two passes)."""
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        total = 0.0
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                total += x[row, c]
        red[lid] = total
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        mean = red[0] / cols
        gw.barrier()  # every thread has read the sum before red is used again
        total = 0.0
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                d = x[row, c] - mean
                total += d * d
        red[lid] = total
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        scale = 1.0 / math.sqrt(red[0] / cols + eps)
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]

    return row_layer_norm


@functools.cache
def row_cumsum(ty: str = "f32") -> PythonKernel:
    T, ACC, OUT = SCALAR_TYPES[ty], _acc(ty), SCALAR_TYPES[sum_type(ty)]

    @gw.kernel(name=kernel_name("row_cumsum", ty), block=ROW)
    def row_cumsum(i: gw.index, out: OUT[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32):
        """Inclusive prefix sums of each row: ROW elements at a time scanned in shared memory (Hillis-Steele), plus
        the running total of the chunks before."""
        scan = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        carry = ACC(0)
        for t in range((cols + ROW - 1) // ROW):
            c = t * ROW + lid
            scan[lid] = x[row, c] if c < cols else 0
            gw.barrier()
            offset = 1
            for _ in range(HALVINGS):
                v = scan[lid]
                if lid >= offset:
                    v += scan[lid - offset]
                gw.barrier()  # every thread has read before any writes
                scan[lid] = v
                gw.barrier()
                offset *= 2
            if c < cols:
                out[row, c] = scan[lid] + carry
            carry += scan[ROW - 1]
            gw.barrier()  # every thread has read the chunk's total before the next chunk overwrites it

    return row_cumsum
