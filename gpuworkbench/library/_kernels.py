"""The library's kernel types, and its matmul and transpose kernels, each written once with ``@gw.kernel``.

Each function here makes the kernel for one element type (a kernel type name: "f32", "f16", "i32" ...), once: the
body is written once, its types are the factory's (``T`` the input's, ``VAL`` what a value computes as, ``ACC`` what
sums accumulate in), and float32's kernels are the ones the library had before it took other types. Kernels of other
types are named with the type (``row_sum_i32``): a trace tells them apart. 16-bit floats compute and accumulate in
float32, float64 in float64, integers accumulate in int64. The row operations are in ``_row_kernels``.

NaN propagates as in NumPy: a NaN beats every number in max and argmax (the first NaN's index for argmax), except on
WebGPU, where WGSL lets implementations assume there is no NaN (lavapipe folds ``v != v`` to false).
"""

import functools
import math

import numpy as np

from .. import pykernel as gw
from ..pykernel import PythonKernel
from ..pykernel.ktypes import HALVES, INTS, ITEMSIZE, SCALAR_TYPES, ScalarType

TILE = 16  # matmul's tiles: TILE × TILE threads per block
BLOCK = 4 * TILE  # the tiled matmul's tile of c per block (4 × 4 values per thread)
NEG_INF = -math.inf
INT_RESULT = "i64"  # sums and scans of integers, as NumPy gives them on 64-bit platforms


def kernel_name(base: str, t: str) -> str:
    """The span name of kernel ``base`` for element type ``t``: float32's keeps the bare name."""
    return base if t == "f32" else f"{base}_{t}"


def val_type(t: str) -> ScalarType:
    """What a value of ``t`` computes as: float32 for the 16-bit floats, else ``t`` itself."""
    return SCALAR_TYPES["f32" if t in HALVES else t]


def acc_type(t: str) -> ScalarType:
    """What sums of ``t`` accumulate in: int64 for integers, float64 for float64, float32 for the rest."""
    return SCALAR_TYPES[INT_RESULT if t in INTS else "f64" if t == "f64" else "f32"]


def sum_type(t: str) -> str:
    """The element type of the sum (and the scan) of ``t``: int64 for integers, ``t`` itself for floats."""
    return INT_RESULT if t in INTS else t


def lowest_value(t: str) -> float | int:
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
    T, ACC = SCALAR_TYPES[ty], acc_type(ty)

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


def transpose_tile(t: str) -> int:
    """The side of transpose's square tile for element type ``t``: rows of 128 bytes for 16-bit types, else 32."""
    return 64 if ITEMSIZE[t] == 2 else 32


def transpose_shape(t: str, rows: int, cols: int) -> tuple[int, int]:
    """transpose's launch shape (NumPy order) for a ``rows`` × ``cols`` array: one block of 8 × 32 threads per tile."""
    side = transpose_tile(t)
    return -(-rows // side) * 8, -(-cols // side) * 32


@functools.cache
def transpose(ty: str = "f32") -> PythonKernel:
    T, SIDE = SCALAR_TYPES[ty], transpose_tile(ty)
    PAD = 2 if ITEMSIZE[ty] == 2 else 1  # a tile column's values fall in different banks (16-bit: two per bank)

    @gw.kernel(name=kernel_name("transpose", ty), block=(32, 8), distinct=True)
    def transpose(x: gw.index, y: gw.index, out: T[:, gw.width.rows], a: T[:, gw.width.cols], rows: gw.i32,
                  cols: gw.i32):  # fmt: skip
        """out = a.T through a SIDE × SIDE tile in shared memory, so that both the reads and the writes run along
        rows: a block of 32 × 8 threads, each moving SIDE / 32 × SIDE / 8 values."""
        tile = gw.shared((SIDE, SIDE + PAD), T)
        tx = gw.local_id(0)
        ty = gw.local_id(1)
        r0 = gw.group_id(1) * SIDE
        c0 = gw.group_id(0) * SIDE
        for j in range(SIDE // 8):
            for q in range(SIDE // 32):
                r = r0 + ty + 8 * j
                c = c0 + tx + 32 * q
                if r < rows and c < cols:
                    tile[ty + 8 * j, tx + 32 * q] = a[r, c]
        gw.barrier()
        for j in range(SIDE // 8):
            for q in range(SIDE // 32):
                oy = c0 + ty + 8 * j  # a row of out is a column of a
                ox = r0 + tx + 32 * q
                if oy < cols and ox < rows:
                    out[oy, ox] = tile[tx + 32 * q, ty + 8 * j]

    return transpose
