"""The row cumsum and layer norm kernels built each way the library can build them, each ABBA against the
device-to-device copy of the same bytes and checked against NumPy, on one device: which body to keep for which type.

    python benchmarks/probes/scan_norm_variants.py [--device cuda:0] [--rows 16384] [--once] [TYPE ...]

cumsum (``row_cumsum``): a chunk read through shared memory or straight into registers (``direct``), the rakes' 32
sums scanned in 5 Hillis-Steele rounds or by 4 threads (``two_level``), with or without ``min_blocks=6``. Layer norm:
Chan's merges or sums shifted by the row's first value (``row_layer_norm``'s ``shifted``), the rows' own step or 32
values a step. ``--once``: launch each kernel once and check it (for a profiler such as ncu).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_library import abba, lib_dtype, repeat  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.library import _row_kernels as rk  # noqa: E402
from gpuworkbench.pykernel.ktypes import kernel_type  # noqa: E402

SCANS = {  # name -> row_cumsum's (direct, two_level, min_blocks)
    "shared, 5 rounds": (False, False, None),
    "shared, two levels": (False, True, None),
    "direct, two levels": (True, True, None),
    "direct, two levels, min_blocks=6": (True, True, 6),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--once", action="store_true", help="launch each kernel once and check it (for a profiler)")
    parser.add_argument("types", nargs="*", default=["float16", "bfloat16", "float32", "float64", "int64"])
    args = parser.parse_args()
    dev = gw.Device(args.device)
    stream = dev.create_stream("probe")
    rng = np.random.default_rng(0)
    for name in args.types:
        dt = np.dtype(lib_dtype(name))
        t, s = kernel_type(dt), dt.itemsize
        floats = dt.kind == "f" or name == "bfloat16"
        rows, cols = args.rows, 4096 * 4 // s
        host = (rng.standard_normal((rows, cols)) * (1 if floats else 100)).astype(dt)
        gh = (1 + 0.1 * rng.standard_normal(cols)).astype(dt)
        bh = (0.1 * rng.standard_normal(cols)).astype(dt)
        x, y, cp = dev.alloc((rows, cols), dt), dev.alloc((rows, cols), dt), dev.alloc((rows, cols), dt)
        g, b = dev.alloc(cols, dt), dev.alloc(cols, dt)
        x.copy_from_host(host.reshape(-1))
        g.copy_from_host(gh)
        b.copy_from_host(bh)
        copier = repeat(lambda cp=cp, x=x: cp.copy_from(x, stream), 5, stream.synchronize)
        wide = host.astype(np.float64)
        want_cs = np.cumsum(wide, axis=1)
        kernels = {
            ("cumsum", label): (rk.row_cumsum(t, True, *choice), (y, x, cols), want_cs)
            for label, choice in SCANS.items()
        }
        if floats:  # (the scan of int64 is int64, the copy's bytes; int32's would be int64)
            mu, sd = wide.mean(axis=1, keepdims=True), wide.std(axis=1, keepdims=True)
            want_ln = (wide - mu) / np.sqrt(sd * sd + 1e-5) * gh.astype(np.float64) + bh.astype(np.float64)
            norm = (y, x, g, b, cols, 1e-5)
            kernels["layer_norm", "Chan's merges"] = (rk.row_layer_norm(t, 0, True, False), norm, want_ln)
            for u in sorted({rk.unroll_rows(t), 32}):
                kernels["layer_norm", f"shifted, {u} a step"] = (rk.row_layer_norm(t, u, True, True), norm, want_ln)
        for (op, variant), (k, kargs, want) in kernels.items():
            k.launch(rows * rk.ROW, *kargs, stream=stream)
            stream.synchronize()
            got = np.empty((rows, cols), dt)
            y.copy_to_host(got.reshape(-1))
            err = float(np.max(np.abs(got.astype(np.float64) - want) / (1 + np.abs(want))))
            if args.once:
                print(f"{name:8s} {op:10s} {variant:32s}: max rel err {err:.2e}", flush=True)
                continue
            run = repeat(lambda k=k, a=kargs, n=rows: k.launch(n * rk.ROW, *a, stream=stream), 5, stream.synchronize)
            ours, copy = abba(run, copier, args.pairs, 5)
            rate = 2 * s * rows * cols / copy / 1e9
            print(f"{name:8s} {op:10s} {variant:32s}: {copy / ours:.3f} of the copy (copy {rate:.0f} GB/s), "
                  f"max rel err {err:.2e}", flush=True)  # fmt: skip
        for buf in (x, y, cp, g, b):
            buf.free()


if __name__ == "__main__":
    main()
