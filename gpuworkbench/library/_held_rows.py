"""Softmax and layer norm for rows that fit in shared memory: the row is read once into the block's shared memory,
and every later pass runs there (as PyTorch's shared-memory softmax does).

Against ``_row_kernels``' kernels, which read the row twice from memory and compute its statistics online, a held row
needs one ``exp`` per value (the online softmax takes two) and plain two-pass statistics for layer norm (the row's
mean, then the squared deviations from it; no per-chunk merge), at the price of shared memory, and so of blocks per
SM. Each thread reads back only the values it wrote itself (columns ``lid``, ``lid + ROW``, ...), so the passes over
the held row need no barrier; only the block's reductions do. ``hold_bytes`` picks the smallest size that holds a
row; the library uses these kernels where the row fits ``MOST_HELD`` bytes and the device's shared memory. Their
spans carry the op's kernel name (``row_softmax``, ``row_layer_norm``), as the online kernels' do: the bytes they
move and the crossovers the analysis compares them with are the op's.
"""

import functools
import math

from .. import pykernel as gw
from ..pykernel import PythonKernel
from ..pykernel.ktypes import ITEMSIZE, SCALAR_TYPES
from ._kernels import NEG_INF, acc_type, kernel_name
from ._row_kernels import HALVINGS, LOG2E, ROW, unroll_rows

#: The largest row held, in bytes: with 16 KiB held, 8 blocks of 256 threads still fit an H100's or H200's SM.
MOST_HELD = 16 << 10
_LEAST_HELD = 4 << 10


def hold_bytes(ty: str, cols: int) -> int:
    """The shared bytes that hold a row of ``cols`` values of ``ty`` (a power of two from 4 KiB), 0 where it takes
    more than ``MOST_HELD`` or ``ty`` is a 16-bit float: held in float32, its rows were slower than the online
    kernels' on an H200 (softmax 0.72 against 0.75 of the copy, layer norm 0.57 against 0.68;
    ``benchmarks/probes/held_rows.py``), where float32's and float64's were faster."""
    need = cols * ITEMSIZE[acc_type(ty).name]
    if need > MOST_HELD or ITEMSIZE[ty] == 2:
        return 0
    size = _LEAST_HELD
    while size < need:
        size *= 2
    return size


@functools.cache
def row_softmax_held(ty: str, hold: int, distinct: bool = True) -> PythonKernel:
    T, ACC, U = SCALAR_TYPES[ty], acc_type(ty), unroll_rows(ty)
    HOLD = hold // ITEMSIZE[ACC.name]

    @gw.kernel(name=kernel_name("row_softmax", ty), block=ROW, distinct=distinct)
    def row_softmax_held(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32,
                         take_log: gw.i32):  # fmt: skip
        """softmax (log_softmax where take_log) of each row of at most HOLD values: the row and its maximum in one
        read, then exp(v - max) and its sum over the held row (kept there for softmax), then the result written."""
        held = gw.shared(HOLD, ACC)
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        full = cols // (U * ROW)
        m = ACC(NEG_INF)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                v = ACC(x[row, base + u * ROW])
                held[base + u * ROW] = v
                if v > m or v != v:
                    m = v
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                v = ACC(x[row, c])
                held[c] = v
                if v > m or v != v:
                    m = v
        red[lid] = m
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
        s = ACC(0)
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                e = math.exp2((held[c] - top) * LOG2E)
                if take_log == 0:
                    held[c] = e
                s += e
        red[lid] = s
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        total = red[0]
        scale = 1.0 / total
        shift = top + math.log(total)
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                out[row, c] = held[c] - shift if take_log != 0 else held[c] * scale

    return row_softmax_held


@functools.cache
def row_layer_norm_held(ty: str, hold: int, distinct: bool = True) -> PythonKernel:
    T, ACC, U = SCALAR_TYPES[ty], acc_type(ty), unroll_rows(ty)
    HOLD = hold // ITEMSIZE[ACC.name]

    @gw.kernel(name=kernel_name("row_layer_norm", ty), block=ROW, distinct=distinct)
    def row_layer_norm_held(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], gamma: T[:],
                            beta: T[:], cols: gw.i32, eps: ACC):  # fmt: skip
        """(x - mean) / sqrt(var + eps) * gamma + beta over each row of at most HOLD values: the row and its sum in
        one read, then the squared deviations from the mean over the held row, then the result written."""
        held = gw.shared(HOLD, ACC)
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        full = cols // (U * ROW)
        s = ACC(0)
        for t in range(full):
            base = t * (U * ROW) + lid
            part = ACC(0)
            for u in range(U):
                v = ACC(x[row, base + u * ROW])
                held[base + u * ROW] = v
                part += v
            s += part
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                v = ACC(x[row, c])
                held[c] = v
                s += v
        red[lid] = s
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        mean = red[0] / cols
        gw.barrier()  # every thread has read the sum before red is used again
        q = ACC(0)
        for t in range(steps):
            c = t * ROW + lid
            if c < cols:
                d = held[c] - mean
                q += d * d
        red[lid] = q
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
                out[row, c] = (held[c] - mean) * scale * gamma[c] + beta[c]

    return row_layer_norm_held
