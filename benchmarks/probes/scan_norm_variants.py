"""Variants of the row cumsum and layer norm kernels, each ABBA against the device-to-device copy of the same bytes and
checked against NumPy, on one device: which body to keep for which element type.

    python benchmarks/probes/scan_norm_variants.py [--device cuda:0] [--rows 16384] [TYPE ...]

cumsum ``library``: the library's body (a chunk read into shared memory, 32 rakes, 5 Hillis-Steele rounds: 10
barriers a chunk); ``rakes2``: the same chunk with two levels of rakes (6 barriers); ``direct``: each thread reads its
8 neighbours straight from global memory into registers, then the two rake levels (4 barriers).
layer norm ``library``: Chan's merges, halving (8 barriers); ``shifted``: sums of values less the row's first one and
of their squares, reduced in three levels (3 barriers).
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_library import abba, lib_dtype, repeat  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.library import _row_kernels as rk  # noqa: E402
from gpuworkbench.library._kernels import acc_type, sum_type  # noqa: E402
from gpuworkbench.pykernel.ktypes import SCALAR_TYPES, kernel_type  # noqa: E402

ROW = 256
CHUNK = 8 * ROW
PADDED = CHUNK + CHUNK // 32


def cumsum_rakes2(ty: str, direct: bool):
    T, ACC, OUT = SCALAR_TYPES[ty], acc_type(ty), SCALAR_TYPES[sum_type(ty)]

    if not direct:

        @gw.kernel(name=f"cumsum_rakes2_{ty}", block=ROW, distinct=True)
        def cumsum_rakes2(i: gw.index, out: OUT[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32):
            buf = gw.shared(PADDED, ACC)
            tot = gw.shared(PADDED // 8, ACC)
            ra = gw.shared(32, ACC)
            sa = gw.shared(4, ACC)
            lid = gw.local_id(0)
            row = gw.group_id(0)
            p = lid * 8 + lid // 4
            q = lid + lid // 32
            g = lid // 8
            h = g // 8
            carry = ACC(0)
            for t in range((cols + CHUNK - 1) // CHUNK):
                base = t * CHUNK
                for u in range(8):
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
                if lid < 32:
                    run = ACC(0)
                    for u in range(8):
                        run += tot[p + u]
                        tot[p + u] = run
                    ra[lid] = run
                gw.barrier()
                if lid < 4:
                    run2 = ACC(0)
                    for u in range(8):
                        run2 += ra[lid * 8 + u]
                        ra[lid * 8 + u] = run2
                    sa[lid] = run2
                gw.barrier()
                s0 = sa[0]
                s1 = sa[1]
                s2 = sa[2]
                s3 = sa[3]
                before = carry + tot[q] - r7
                if g % 8 > 0:
                    before += ra[max(g, 1) - 1]
                if h > 0:
                    before += s0
                if h > 1:
                    before += s1
                if h > 2:
                    before += s2
                carry += s0 + s1 + s2 + s3
                buf[p] = r0 + before
                buf[p + 1] = r1 + before
                buf[p + 2] = r2 + before
                buf[p + 3] = r3 + before
                buf[p + 4] = r4 + before
                buf[p + 5] = r5 + before
                buf[p + 6] = r6 + before
                buf[p + 7] = r7 + before
                gw.barrier()
                for u in range(8):
                    j = u * ROW + lid
                    c = base + j
                    if c < cols:
                        out[row, c] = buf[j + j // 32]
                gw.barrier()

        return cumsum_rakes2

    @gw.kernel(name=f"cumsum_direct_{ty}", block=ROW, distinct=True)
    def cumsum_direct(i: gw.index, out: OUT[:, gw.width.cols], x: T[:, gw.width.cols], cols: gw.i32):
        buf = gw.shared(PADDED, ACC)
        tot = gw.shared(PADDED // 8, ACC)
        ra = gw.shared(32, ACC)
        sa = gw.shared(4, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        p = lid * 8 + lid // 4
        q = lid + lid // 32
        g = lid // 8
        h = g // 8
        carry = ACC(0)
        for t in range((cols + CHUNK - 1) // CHUNK):
            c = t * CHUNK + lid * 8
            r0 = ACC(x[row, c] if c < cols else 0)
            r1 = r0 + (x[row, c + 1] if c + 1 < cols else 0)
            r2 = r1 + (x[row, c + 2] if c + 2 < cols else 0)
            r3 = r2 + (x[row, c + 3] if c + 3 < cols else 0)
            r4 = r3 + (x[row, c + 4] if c + 4 < cols else 0)
            r5 = r4 + (x[row, c + 5] if c + 5 < cols else 0)
            r6 = r5 + (x[row, c + 6] if c + 6 < cols else 0)
            r7 = r6 + (x[row, c + 7] if c + 7 < cols else 0)
            tot[q] = r7
            gw.barrier()
            if lid < 32:
                run = ACC(0)
                for u in range(8):
                    run += tot[p + u]
                    tot[p + u] = run
                ra[lid] = run
            gw.barrier()
            if lid < 4:
                run2 = ACC(0)
                for u in range(8):
                    run2 += ra[lid * 8 + u]
                    ra[lid * 8 + u] = run2
                sa[lid] = run2
            gw.barrier()
            s0 = sa[0]
            s1 = sa[1]
            s2 = sa[2]
            s3 = sa[3]
            before = carry + tot[q] - r7
            if g % 8 > 0:
                before += ra[max(g, 1) - 1]
            if h > 0:
                before += s0
            if h > 1:
                before += s1
            if h > 2:
                before += s2
            carry += s0 + s1 + s2 + s3
            buf[p] = r0 + before
            buf[p + 1] = r1 + before
            buf[p + 2] = r2 + before
            buf[p + 3] = r3 + before
            buf[p + 4] = r4 + before
            buf[p + 5] = r5 + before
            buf[p + 6] = r6 + before
            buf[p + 7] = r7 + before
            gw.barrier()
            base = t * CHUNK
            for u in range(8):
                j = u * ROW + lid
                c2 = base + j
                if c2 < cols:
                    out[row, c2] = buf[j + j // 32]

    return cumsum_direct


def layer_norm_shifted(ty: str, U: int):
    T, ACC = SCALAR_TYPES[ty], acc_type(ty)

    @gw.kernel(name=f"layer_norm_shifted_{ty}_{U}", block=ROW, distinct=True)
    def layer_norm_shifted(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], gamma: T[:], beta: T[:],
                           cols: gw.i32, eps: ACC):  # fmt: skip
        r1 = gw.shared(ROW, ACC)
        r2 = gw.shared(ROW, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        full = cols // (U * ROW)
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
        r1[lid] = s1
        r2[lid] = s2
        gw.barrier()
        if lid < 32:  # 32 threads sum 8 each, 32 apart (no bank conflicts)
            a1 = ACC(0)
            a2 = ACC(0)
            for u in range(8):
                a1 += r1[lid + u * 32]
                a2 += r2[lid + u * 32]
            r1[lid] = a1
            r2[lid] = a2
        gw.barrier()
        if lid < 4:
            b1 = ACC(0)
            b2 = ACC(0)
            for u in range(8):
                b1 += r1[lid + u * 4]
                b2 += r2[lid + u * 4]
            r1[lid + 32] = b1
            r2[lid + 32] = b2
        gw.barrier()
        m = (r1[32] + r1[33] + r1[34] + r1[35]) / cols
        var = (r2[32] + r2[33] + r2[34] + r2[35]) / cols - m * m
        mean = shift + m
        scale = 1.0 / math.sqrt(max(var, 0.0) + eps)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                c = base + u * ROW
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]

    return layer_norm_shifted


def layer_norm_chan3(ty: str, U: int):
    """The library's per-thread (count, mean, m2) by Chan's merges, reduced in three levels (3 barriers)."""
    T, ACC = SCALAR_TYPES[ty], acc_type(ty)

    @gw.kernel(name=f"layer_norm_chan3_{ty}_{U}", block=ROW, distinct=True)
    def layer_norm_chan3(i: gw.index, out: T[:, gw.width.cols], x: T[:, gw.width.cols], gamma: T[:], beta: T[:],
                         cols: gw.i32, eps: ACC):  # fmt: skip
        rn = gw.shared(ROW + 4, ACC)
        rmean = gw.shared(ROW + 4, ACC)
        rm2 = gw.shared(ROW + 4, ACC)
        lid = gw.local_id(0)
        row = gw.group_id(0)
        steps = (cols + ROW - 1) // ROW
        full = cols // (U * ROW)
        n = ACC(0)
        mean = ACC(0)
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
        if lid < 32:  # merges the entries lid, lid + 32, ... (32 apart: no bank conflicts) into its own
            for u in range(1, 8):
                nb = rn[lid + u * 32]
                if nb > 0:
                    nn = n + nb
                    delta = rmean[lid + u * 32] - mean
                    mean += delta * (nb / nn)
                    m2 += rm2[lid + u * 32] + delta * delta * (n * nb / nn)
                    n = nn
            rn[lid] = n
            rmean[lid] = mean
            rm2[lid] = m2
        gw.barrier()
        if lid < 4:
            for u in range(1, 8):
                nb = rn[lid + u * 4]
                if nb > 0:
                    nn = n + nb
                    delta = rmean[lid + u * 4] - mean
                    mean += delta * (nb / nn)
                    m2 += rm2[lid + u * 4] + delta * delta * (n * nb / nn)
                    n = nn
            rn[ROW + lid] = n
            rmean[ROW + lid] = mean
            rm2[ROW + lid] = m2
        gw.barrier()
        n = rn[ROW]
        mean = rmean[ROW]
        m2 = rm2[ROW]
        for u in range(1, 4):
            nb = rn[ROW + u]
            if nb > 0:
                nn = n + nb
                delta = rmean[ROW + u] - mean
                mean += delta * (nb / nn)
                m2 += rm2[ROW + u] + delta * delta * (n * nb / nn)
                n = nn
        scale = 1.0 / math.sqrt(m2 / cols + eps)
        for t in range(full):
            base = t * (U * ROW) + lid
            for u in range(U):
                c = base + u * ROW
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]
        for t in range(full * U, steps):
            c = t * ROW + lid
            if c < cols:
                out[row, c] = (x[row, c] - mean) * scale * gamma[c] + beta[c]

    return layer_norm_chan3


class Bounded:
    """A kernel's CUDA source built with ``__launch_bounds__(ROW, blocks)``: at most the registers that let ``blocks``
    blocks share an SM."""

    def __init__(self, kernel, dev, blocks: int) -> None:
        src = kernel.source("cuda").replace("__global__ void", f"__global__ void __launch_bounds__({ROW}, {blocks})")
        self.raw = dev.compile(src, kernel.ir.cname)

    def launch(self, n: int, *args, stream) -> None:
        conv = [np.int32(a) if type(a) is int else np.float32(a) if type(a) is float else a for a in args]
        self.raw(n // ROW, ROW, (*conv, np.int32(n)), stream=stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--once", action="store_true", help="launch each kernel once and check it (for a profiler)")
    parser.add_argument("--bounds", action="store_true", help="cumsum with launch bounds, layer norm's unrolls too")
    parser.add_argument("types", nargs="*", default=["float16", "bfloat16", "float32"])
    args = parser.parse_args()
    dev = gw.Device(args.device)
    stream = dev.create_stream("probe")
    rng = np.random.default_rng(0)
    for name in args.types:
        dt = np.dtype(lib_dtype(name))
        t, s = kernel_type(dt), dt.itemsize
        rows, cols = args.rows, 4096 * 4 // s
        floats = dt.kind == "f" or name == "bfloat16"
        host = (rng.standard_normal((rows, cols)) * (1 if floats else 100)).astype(dt)
        gh = (1 + 0.1 * rng.standard_normal(cols)).astype(dt)
        bh = (0.1 * rng.standard_normal(cols)).astype(dt)
        x, y, cp = dev.alloc((rows, cols), dt), dev.alloc((rows, cols), dt), dev.alloc((rows, cols), dt)
        g, b = dev.alloc(cols, dt), dev.alloc(cols, dt)
        x.copy_from_host(host.reshape(-1))
        g.copy_from_host(gh)
        b.copy_from_host(bh)
        copier = repeat(lambda cp=cp, x=x: cp.copy_from(x, stream), 5, stream.synchronize)
        h32 = host.astype(np.float64)
        want_cs = np.cumsum(h32, axis=1)
        mu, sd = h32.mean(axis=1, keepdims=True), h32.std(axis=1, keepdims=True)
        want_ln = (h32 - mu) / np.sqrt(sd * sd + 1e-5) * gh.astype(np.float64) + bh.astype(np.float64)
        kernels = {
            ("cumsum", "library"): (rk.row_cumsum(t), (y, x, cols), want_cs),
            ("cumsum", "rakes2"): (cumsum_rakes2(t, False), (y, x, cols), want_cs),
            ("cumsum", "direct"): (cumsum_rakes2(t, True), (y, x, cols), want_cs),
        }
        if floats:  # (the scan of int64 is int64, as the copy's bytes; int32's would be int64)
            kernels["layer_norm", "library"] = (rk.row_layer_norm(t), (y, x, g, b, cols, 1e-5), want_ln)
            ln = layer_norm_shifted(t, rk.unroll_rows(t))
            kernels["layer_norm", "shifted"] = (ln, (y, x, g, b, cols, 1e-5), want_ln)
        if args.bounds and dev.caps.kernel_language == "cuda":
            kernels["cumsum", "direct+lb6"] = (Bounded(cumsum_rakes2(t, True), dev, 6), (y, x, cols), want_cs)
        if args.bounds:
            for u in (16, 32) if floats else ():
                if u != rk.unroll_rows(t):
                    kernels["layer_norm", f"shift u{u}"] = (layer_norm_shifted(t, u), (y, x, g, b, cols, 1e-5), want_ln)
                kernels["layer_norm", f"chan3 u{u}"] = (layer_norm_chan3(t, u), (y, x, g, b, cols, 1e-5), want_ln)
        for (op, variant), (k, kargs, want) in kernels.items():
            k.launch(rows * ROW, *kargs, stream=stream)
            stream.synchronize()
            got = np.empty((rows, cols), dt)
            y.copy_to_host(got.reshape(-1))
            err = float(np.max(np.abs(got.astype(np.float64) - want) / (1 + np.abs(want))))
            if args.once:
                print(f"{name:8s} {op:10s} {variant:8s}: max rel err {err:.2e}", flush=True)
                continue
            run = repeat(lambda k=k, a=kargs, n=rows: k.launch(n * ROW, *a, stream=stream), 5, stream.synchronize)
            ours, copy = abba(run, copier, args.pairs, 5)
            rate = 2 * s * rows * cols / copy / 1e9
            print(f"{name:8s} {op:10s} {variant:8s}: {copy / ours:.3f} of the copy (copy {rate:.0f} GB/s), "
                  f"max rel err {err:.2e}", flush=True)  # fmt: skip
        for buf in (x, y, cp, g, b):
            buf.free()


if __name__ == "__main__":
    main()
