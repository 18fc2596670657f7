"""The library's row kernels (sum, max, argmax, cumsum, softmax, layer norm), each written once with ``@gw.kernel``.

One block of ``ROW`` threads per row. Each thread walks the row a step of several elements at a time: loads ROW apart
(coalesced across the block) issued before any is used, so that enough bytes are in flight to keep the memory busy
(``unroll``: 16 bytes per thread and step for sum and max; ``unroll_rows``: 32 for argmax, softmax and layer norm,
which test or compute more per value), then a tail one element at a time. Every thread runs the same number of
steps, so the CPU runs them vectorised. The block then combines its threads' partial results in shared memory by
halving (``HALVINGS`` rounds). Whole-array reductions are one row. Cumsum goes a chunk of ``SCAN_UNROLL`` × ROW
values at a time (see ``row_cumsum``).

Softmax reads its row once for the maximum and the sum together (a running sum rescaled when the maximum grows) and
once more to write; layer norm gathers mean and squared deviations in one read (chunks of ``unroll`` values, merged
by Chan's pairwise formula, as stable as two passes; 16-bit rows, whose results are rounded to 16 bits, take plain
sums shifted by a value of the row: ``row_layer_norm``'s SHIFTED) and reads again to write. The second read of a row
comes soon after the first, while the row is in cache. Kernels that write rows are made ``distinct`` (C's restrict:
the loads of a step issue together ahead of its stores) unless the result is written over the input. NaN propagates
as in NumPy (except on WebGPU, whose WGSL may assume there is none; see _kernels).
"""

import functools
import math

from .. import pykernel as gw
from ..pykernel import PythonKernel
from ..pykernel.ktypes import INTS, ITEMSIZE, SCALAR_TYPES
from ._kernels import NEG_INF, acc_type, kernel_name, lowest_value, sum_type, val_type

ROW = 256  # threads per block
HALVINGS = 8  # log2(ROW)
LOG2E = 1.4426950408889634  # exp(d) = exp2(d * LOG2E)


def unroll(t: str) -> int:
    """Elements each thread loads per step for element type ``t`` in the reductions: 16 bytes' worth, at least 4."""
    return max(4, 16 // ITEMSIZE[t])


def unroll_rows(t: str) -> int:
    """The same for argmax, softmax and layer norm, which test or compute more per value: 32 bytes' worth, at least 4
    (measured on an H200 with benchmarks/probes/row_unroll.py: float32 softmax 0.80 of the copy at 4, 0.85 at 8;
    float64 best at 4; 16-bit argmax 0.79 at 16, 0.76 at 8)."""
    return max(4, 32 // ITEMSIZE[t])


def unroll_shifted(cols: int) -> int:
    """16-bit layer norm's values per thread and step for rows of ``cols``: 32 where a row has a step's worth (on an
    H200, float16 rows of 8192 ran at 0.72 of the copy against 0.69 with 16), else 16, so that shorter rows do not
    go one value at a time."""
    return 32 if cols >= 32 * ROW else 16


SCAN_UNROLL = 8  # cumsum's values per thread and chunk, every type (row_cumsum's body is written for 8)


@functools.cache
def row_sum(ty: str = "f32", u: int = 0) -> PythonKernel:
    T, ACC, OUT, U = SCALAR_TYPES[ty], acc_type(ty), SCALAR_TYPES[sum_type(ty)], u or unroll(ty)

    @gw.kernel(name=kernel_name("row_sum", ty), block=ROW)
    def row_sum(i: gw.index, out: OUT[:], x: T[:, gw.width.cols], cols: gw.i32):
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        total = ACC(0)
        full = cols // (U * ROW)
        for t in range(full):
            base = t * (U * ROW) + lid
            part = ACC(0)
            for u in range(U):
                part += x[row, base + u * ROW]
            total += part
        for t in range(full * U, (cols + ROW - 1) // ROW):
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
def row_max(ty: str = "f32", u: int = 0) -> PythonKernel:
    T, VAL, LOWEST, NANS, U = SCALAR_TYPES[ty], val_type(ty), lowest_value(ty), ty not in INTS, u or unroll(ty)

    @gw.kernel(name=kernel_name("row_max", ty), block=ROW)
    def row_max(i: gw.index, out: T[:], x: T[:, gw.width.cols], cols: gw.i32):
        red = gw.shared(ROW, VAL)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        best = VAL(LOWEST)
        full = cols // (U * ROW)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                v = x[row, base + u * ROW]
                if v > best or (NANS and v != v):
                    best = v
        for t in range(full * U, (cols + ROW - 1) // ROW):
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
def row_argmax(ty: str = "f32", index: str = "i64", u: int = 0) -> PythonKernel:
    """``index``: the type of the indices written (int64 as NumPy's; int32 where the device has no int64)."""
    T, VAL, LOWEST, IDX = SCALAR_TYPES[ty], val_type(ty), lowest_value(ty), SCALAR_TYPES[index]
    NANS, U = ty not in INTS, u or unroll_rows(ty)  # more tests per value than sum: 32 bytes (16-bit: 0.79 vs 0.76)

    @gw.kernel(name=kernel_name("row_argmax", ty), block=ROW)
    def row_argmax(i: gw.index, out: IDX[:], x: T[:, gw.width.cols], cols: gw.i32):
        """The index of each row's first largest element (of its first NaN where it has one), as np.argmax. Each
        thread meets its elements in increasing index, so a later equal value never replaces an earlier one."""
        val = gw.shared(ROW, VAL)
        at = gw.shared(ROW, gw.i32)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        best = VAL(LOWEST)
        where = cols  # none yet: any element beats it
        full = cols // (U * ROW)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                v = x[row, base + u * ROW]
                if where == cols or v > best or (NANS and v != v and best == best):
                    best = v
                    where = base + u * ROW
        for t in range(full * U, (cols + ROW - 1) // ROW):
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
def row_softmax(ty: str = "f32", u: int = 0, distinct: bool = True) -> PythonKernel:
    T, ACC, U = SCALAR_TYPES[ty], acc_type(ty), u or unroll_rows(ty)

    @gw.kernel(name=kernel_name("row_softmax", ty), block=ROW, distinct=distinct)
    def row_softmax(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32,
                    take_log: gw.i32):  # fmt: skip
        """softmax (log_softmax where take_log) of each row, the row's maximum subtracted first. Each thread keeps
        its maximum m and the sum s of exp(v - m) over its elements, s rescaled by exp(m - new m) when m grows; the
        block then takes the row's maximum and adds the rescaled sums. exp(d) is computed as exp2(d · log2 e): fewer
        instructions, and as accurate where it counts (d near 0, the row's largest terms)."""
        red = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        full = cols // (U * ROW)
        m = ACC(NEG_INF)
        s = ACC(0)
        for t in range(full):
            base = t * (U * ROW) + lid
            top = m
            for u in range(U):
                v = x[row, base + u * ROW]
                if v > top or v != v:
                    top = v
            if top > NEG_INF or top != top:  # else every value so far is -inf: nothing to add yet
                part = ACC(0)
                for u in range(U):
                    part += math.exp2((x[row, base + u * ROW] - top) * LOG2E)
                s = s * math.exp2((m - top) * LOG2E) + part
                m = top
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                v = x[row, c]
                top = v if v > m or v != v else m
                if top > NEG_INF or top != top:
                    s = s * math.exp2((m - top) * LOG2E) + math.exp2((v - top) * LOG2E)
                    m = top
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
        red[lid] = s * math.exp2((m - top) * LOG2E) if s != 0 or m != m else s
        gw.barrier()
        stride = ROW // 2
        for _ in range(HALVINGS):
            if lid < stride:
                red[lid] += red[lid + stride]
            gw.barrier()
            stride //= 2
        total = red[0]
        scale = 1.0 / total
        shift = math.log(total)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                v = x[row, base + u * ROW] - top
                out[row, base + u * ROW] = v - shift if take_log != 0 else math.exp2(v * LOG2E) * scale
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                v = x[row, c] - top
                out[row, c] = v - shift if take_log != 0 else math.exp2(v * LOG2E) * scale

    return row_softmax


@functools.cache
def row_layer_norm(ty: str = "f32", u: int = 0, distinct: bool = True, shifted: bool | None = None) -> PythonKernel:
    """The layer norm kernel for ``ty``, ``u`` values a step (0: ``unroll_rows``); ``shifted`` (the statistics as
    shifted sums, below) defaults to 16-bit types, Chan's merges to the others."""
    T, ACC, U = SCALAR_TYPES[ty], acc_type(ty), u or unroll_rows(ty)
    SHIFTED = ITEMSIZE[ty] == 2 if shifted is None else shifted

    @gw.kernel(name=kernel_name("row_layer_norm", ty), block=ROW, distinct=distinct)
    def row_layer_norm(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], gamma: T[:], beta: T[:],
                       cols: gw.i32, eps: ACC):  # fmt: skip
        """(x - mean) / sqrt(var + eps) * gamma + beta over each row. Each thread keeps a count, mean and sum of
        squared deviations (m2) of its elements: a chunk of U values gives its own (U, mean, m2), merged into the
        thread's by Chan's formula; lone tail values by Welford's; the block merges its threads' the same way.
        SHIFTED (16-bit rows, whose results are rounded to 16 bits): sums of d = x - x[row, 0] and of d² instead
        (var = mean(d²) - mean(d)²), reduced in three levels of plain sums (3 barriers; Chan's merges take 8 and a
        division each). Shifting by a value of the row bounds the loss to the variance's float32 rounding times the
        row length in the worst case (the row's first value an outlier), typically a few roundings. On an H200,
        float16 rows ran at 0.72 of the copy this way against 0.68 (docs/benchmarks.md, "Kernel library")."""
        rn = gw.shared(ROW + 4, ACC)  # Chan: counts; shifted: the sums of d
        rmean = gw.shared(ROW + 4, ACC)  # Chan: means; shifted: the sums of d²
        rm2 = gw.shared(ROW, ACC)  # Chan: squared deviations
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        full = cols // (U * ROW)
        mean = ACC(0)
        scale = ACC(0)
        if SHIFTED:
            shift = ACC(x[row, 0])
            s1 = ACC(0)
            s2 = ACC(0)
            for t in range(full):
                base = t * (U * ROW) + lid
                for u in range(U):
                    d = x[row, base + u * ROW] - shift
                    s1 += d
                    s2 += d * d
            for t in range(full * U, steps):
                c = t * ROW + lid
                if c < cols:
                    d = x[row, c] - shift
                    s1 += d
                    s2 += d * d
            rn[lid] = s1
            rmean[lid] = s2
            gw.barrier()
            if lid < 32:  # 32 threads sum 8 entries each, 32 apart (no bank conflicts)
                a1 = ACC(0)
                a2 = ACC(0)
                for u in range(8):
                    a1 += rn[lid + u * 32]
                    a2 += rmean[lid + u * 32]
                rn[lid] = a1
                rmean[lid] = a2
            gw.barrier()
            if lid < 4:  # then 4 threads 8 of those each
                b1 = ACC(0)
                b2 = ACC(0)
                for u in range(8):
                    b1 += rn[lid + u * 4]
                    b2 += rmean[lid + u * 4]
                rn[ROW + lid] = b1
                rmean[ROW + lid] = b2
            gw.barrier()
            m = (rn[ROW] + rn[ROW + 1] + rn[ROW + 2] + rn[ROW + 3]) / cols
            var = (rmean[ROW] + rmean[ROW + 1] + rmean[ROW + 2] + rmean[ROW + 3]) / cols - m * m
            mean = shift + m
            scale = 1.0 / math.sqrt(max(var, 0.0) + eps)
        else:
            n = ACC(0)
            m2 = ACC(0)
            for t in range(full):
                base = t * (U * ROW) + lid
                cs = ACC(0)
                for u in range(U):
                    cs += x[row, base + u * ROW]
                cm = cs / U
                cq = ACC(0)
                for u in range(U):
                    d = x[row, base + u * ROW] - cm
                    cq += d * d
                nn = n + U
                delta = cm - mean
                mean += delta * (U / nn)
                m2 += cq + delta * delta * (n * U / nn)
                n = nn
            for t in range(full * U, steps):
                c = t * ROW + lid
                if c < cols:
                    v = x[row, c]
                    n += 1
                    d = v - mean
                    mean += d / n
                    m2 += d * (v - mean)
            rn[lid] = n
            rmean[lid] = mean
            rm2[lid] = m2
            gw.barrier()
            stride = ROW // 2
            for _ in range(HALVINGS):
                if lid < stride:
                    nb = rn[lid + stride]
                    if nb > 0:
                        na = rn[lid]
                        nn = na + nb
                        delta = rmean[lid + stride] - rmean[lid]
                        rmean[lid] += delta * (nb / nn)
                        rm2[lid] += rm2[lid + stride] + delta * delta * (na * nb / nn)
                        rn[lid] = nn
                gw.barrier()
                stride //= 2
            mean = rmean[0]
            scale = 1.0 / math.sqrt(rm2[0] / cols + eps)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                c = base + u * ROW
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]

    return row_layer_norm


@functools.cache
def row_cumsum(
    ty: str = "f32",
    distinct: bool = True,
    direct: bool | None = None,
    two_level: bool | None = None,
    min_blocks: int | None = 0,
) -> PythonKernel:
    """The scan kernel for ``ty``. ``direct`` (values read into registers), ``two_level`` (rakes in two levels) and
    ``min_blocks`` default to what the docstring below measured fastest for ``ty``; other choices are for
    ``benchmarks/probes/scan_norm_variants.py``."""
    T, ACC, OUT = SCALAR_TYPES[ty], acc_type(ty), SCALAR_TYPES[sum_type(ty)]
    CHUNK = SCAN_UNROLL * ROW
    PADDED = CHUNK + CHUNK // 32  # a gap after every 32 values: a thread's 8 neighbours fall in different banks
    RAKES = ROW // SCAN_UNROLL  # threads that scan the threads' totals, 8 each
    LAST = CHUNK - 1 + (CHUNK - 1) // 32  # where the chunk's last value sits in buf
    DIRECT = ITEMSIZE[ty] == 2 if direct is None else direct
    TWO_LEVEL = DIRECT if two_level is None else two_level
    BOUND = (6 if DIRECT else None) if min_blocks == 0 else min_blocks
    assert SCAN_UNROLL == 8 and RAKES == 32  # the body below is written for 8 values per thread and 32 rakes

    @gw.kernel(name=kernel_name("row_cumsum", ty), block=ROW, distinct=distinct, min_blocks=BOUND)
    def row_cumsum(i: gw.index, out: OUT[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32):
        """Inclusive prefix sums of each row, CHUNK values at a time: each thread scans its 8 neighbouring values in
        registers; the 256 totals are scanned by 32 threads, 8 each (raking), and their 32 sums; each thread adds
        what comes before it (the chunks before, the totals before its own) and the chunk is written coalesced
        through shared memory. 16-bit values are read straight into registers (16 bytes a thread), the 32 sums
        scanned by 4 threads, 8 each (3 barriers fewer), with six blocks to a multiprocessor (registers bounded to
        fit them). Wider values come in through shared memory, where a thread's own reads would span too many cache
        lines, and their 32 sums are scanned in 5 rounds (Hillis-Steele), which held more blocks for an int64 scan.
        On an H200, float16 0.73-0.74 of the copy against 0.69-0.70 without the bound or through shared memory, and
        int32 0.92 with the 5 rounds against 0.86 with 4 threads (docs/benchmarks.md, "Kernel library")."""
        buf = gw.shared(PADDED, ACC)
        tot = gw.shared(PADDED // SCAN_UNROLL, ACC)  # the threads' totals, padded as buf is
        ra = gw.shared(RAKES, ACC)  # the rakes' sums, scanned
        rb = gw.shared(RAKES, ACC)  # their scan's other half (Hillis-Steele), or the 4 groups' sums
        lid = gw.local_id(0)
        row = gw.group_id(0)
        p = lid * 8 + lid // 4  # where this thread's 8 neighbours start in buf (and its 8 rakes' totals in tot)
        q = lid + lid // 32  # where this thread's total sits in tot
        g = lid // 8  # the rake that scans this thread's total
        h = g // 8  # the group of that rake
        carry = ACC(0)
        for t in range((cols + CHUNK - 1) // CHUNK):
            base = t * CHUNK
            if DIRECT:
                c = base + lid * 8
                r0 = ACC(x[row, c] if c < cols else 0)
                r1 = r0 + (x[row, c + 1] if c + 1 < cols else 0)
                r2 = r1 + (x[row, c + 2] if c + 2 < cols else 0)
                r3 = r2 + (x[row, c + 3] if c + 3 < cols else 0)
                r4 = r3 + (x[row, c + 4] if c + 4 < cols else 0)
                r5 = r4 + (x[row, c + 5] if c + 5 < cols else 0)
                r6 = r5 + (x[row, c + 6] if c + 6 < cols else 0)
                r7 = r6 + (x[row, c + 7] if c + 7 < cols else 0)
            else:
                for u in range(SCAN_UNROLL):
                    j = u * ROW + lid
                    c = base + j
                    buf[j + j // 32] = x[row, c] if c < cols else 0
                gw.barrier()
                r0 = buf[p]
                r1 = r0 + buf[p + 1]
                r2 = r1 + buf[p + 2]
                r3 = r2 + buf[p + 3]
                r4 = r3 + buf[p + 4]
                r5 = r4 + buf[p + 5]
                r6 = r5 + buf[p + 6]
                r7 = r6 + buf[p + 7]
            tot[q] = r7
            gw.barrier()
            if lid < RAKES:  # thread lid scans the totals of threads 8·lid ... 8·lid + 7 in place
                run = ACC(0)
                for u in range(SCAN_UNROLL):
                    run += tot[p + u]
                    tot[p + u] = run
                ra[lid] = run
            gw.barrier()
            before = carry + tot[q] - r7
            if TWO_LEVEL:  # the 32 sums scanned by 4 threads, 8 each
                if lid < 4:
                    run = ACC(0)
                    for u in range(8):
                        run += ra[lid * 8 + u]
                        ra[lid * 8 + u] = run
                    rb[lid] = run
                gw.barrier()
                if g % 8 > 0:
                    before += ra[max(g, 1) - 1]
                if h > 0:
                    before += rb[0]
                if h > 1:
                    before += rb[1]
                if h > 2:
                    before += rb[2]
            else:  # the 32 sums scanned in 5 rounds (Hillis-Steele, alternating between ra and rb)
                if lid < RAKES:
                    rb[lid] = ra[lid] + ra[lid - 1] if lid >= 1 else ra[lid]
                gw.barrier()
                if lid < RAKES:
                    ra[lid] = rb[lid] + rb[lid - 2] if lid >= 2 else rb[lid]
                gw.barrier()
                if lid < RAKES:
                    rb[lid] = ra[lid] + ra[lid - 4] if lid >= 4 else ra[lid]
                gw.barrier()
                if lid < RAKES:
                    ra[lid] = rb[lid] + rb[lid - 8] if lid >= 8 else rb[lid]
                gw.barrier()
                if lid < RAKES:
                    rb[lid] = ra[lid] + ra[lid - 16] if lid >= 16 else ra[lid]
                gw.barrier()
                if g > 0:
                    before += rb[max(g, 1) - 1]
            buf[p] = r0 + before
            buf[p + 1] = r1 + before
            buf[p + 2] = r2 + before
            buf[p + 3] = r3 + before
            buf[p + 4] = r4 + before
            buf[p + 5] = r5 + before
            buf[p + 6] = r6 + before
            buf[p + 7] = r7 + before
            gw.barrier()
            if TWO_LEVEL:
                carry = buf[LAST]  # the chunk's last sum, the carry into the next (values past the row are 0)
            else:
                carry += rb[RAKES - 1]
            for u in range(SCAN_UNROLL):
                j = u * ROW + lid
                c = base + j
                if c < cols:
                    out[row, c] = buf[j + j // 32]
            if not DIRECT:
                gw.barrier()  # every thread has read the chunk before the next one's loads overwrite buf

    return row_cumsum
