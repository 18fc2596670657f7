"""``gw.library`` against the best baseline in the same run: the tiled float32 matmul against CuPy's (cuBLAS, TF32
off) or, without CUDA, NumPy's on the host; softmax, layer_norm and sum against the device's own device-to-device
copy bandwidth.

Run from the repository root: ``python benchmarks/bench_library.py [--device SPEC] [--quick] [--json out.json]``.
Targets on a GPU: matmul at 4096² ≥ 50 % of CuPy's GFLOP/s; the memory-bound ops (each reads and writes what
``gw.library.KERNEL_BYTES`` says) ≥ 60 % of the copy's bandwidth (bytes read plus written, as for the ops). Elsewhere
(CPU backend, OpenCL on PoCL) the sizes are smaller and the figures are for reference: the targets are a GPU's.

Every pair is timed ABBA-interleaved (ours, the baseline, the baseline, ours; repeated), each sample ``inner``
back-to-back launches followed by one wait for the stream, timed with ``time.perf_counter_ns``; medians count.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("CUPY_TF32", "0")  # CuPy reads it at import: cuBLAS in full float32, as our kernel computes
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench_common import write_json

import gpuworkbench as gw  # noqa: E402
from gpuworkbench import library as lib  # noqa: E402

MATMUL_TARGET = 0.5  # of CuPy's GFLOP/s
MEMORY_TARGET = 0.6  # of the device-to-device copy's bandwidth


def abba(a: Callable[[], Any], b: Callable[[], Any], pairs: int, inner: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and of ``b``, each sample ``inner`` calls, in ABBA order ``pairs`` times."""
    samples: dict[int, list[int]] = {0: [], 1: []}
    fns = (a, b)
    for _ in range(pairs):
        for which in (0, 1, 1, 0):
            t0 = time.perf_counter_ns()
            fns[which]()
            samples[which].append(time.perf_counter_ns() - t0)
    return float(np.median(samples[0])) / inner / 1e9, float(np.median(samples[1])) / inner / 1e9


def repeat(fn: Callable[[], Any], inner: int, wait: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(inner):
            fn()
        wait()

    return run


def cupy_matmul(
    index: int, a_host: np.ndarray, b_host: np.ndarray, pairs: int, inner: int, ours: Callable[[], None]
) -> dict[str, Any]:
    """CuPy's float32 matmul with TF32 off on CUDA device ``index``, ABBA against ``ours``."""
    import cupy

    cupy.cuda.Device(index).use()

    mode = "CUPY_TF32=" + os.environ.get("CUPY_TF32", "")
    try:  # and cuBLAS's math mode on this device's handle, in case TF32 was turned on elsewhere
        from cupy_backends.cuda.libs import cublas

        cublas.setMathMode(cupy.cuda.device.get_cublas_handle(), cublas.CUBLAS_DEFAULT_MATH)
        mode += ", cublas math mode CUBLAS_DEFAULT_MATH"
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        mode += f" (cuBLAS math mode not set: {exc})"
    a, b = cupy.asarray(a_host), cupy.asarray(b_host)
    c = cupy.empty(a.shape, cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)

    def theirs_once() -> None:
        with stream:
            cupy.matmul(a, b, out=c)

    theirs = repeat(theirs_once, inner, stream.synchronize)
    theirs()
    ours_s, theirs_s = abba(ours, theirs, pairs, inner)
    return {"baseline": "cupy.matmul (cuBLAS)", "tf32": mode, "ours_s": ours_s, "baseline_s": theirs_s}


def bench_matmul(dev: gw.Device, n: int, pairs: int, inner: int, cuda: bool) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((n, n), dtype=np.float32)
    b_host = rng.standard_normal((n, n), dtype=np.float32)
    a, b, c = dev.alloc((n, n)), dev.alloc((n, n)), dev.alloc((n, n))
    a.copy_from_host(a_host.reshape(-1))
    b.copy_from_host(b_host.reshape(-1))
    stream = dev.create_stream("bench-matmul")
    try:
        ours = repeat(lambda: lib.matmul(a, b, out=c, stream=stream), inner, stream.synchronize)
        ours()  # compiles
        got = c.copy_to_host()
        want = a_host @ b_host
        correct = bool(np.allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max())))
        if cuda:
            found = cupy_matmul(dev.index, a_host, b_host, pairs, inner, ours)
        else:
            host = repeat(lambda: np.matmul(a_host, b_host), inner, lambda: None)
            ours_s, numpy_s = abba(ours, host, pairs, inner)
            found = {"baseline": "NumPy a @ b on the host", "ours_s": ours_s, "baseline_s": numpy_s}
    finally:
        stream.close()
        for buf in (a, b, c):
            buf.free()
    flops = 2.0 * n**3
    found.update(
        n=n,
        correct=correct,
        ours_gflops=flops / found["ours_s"] / 1e9,
        baseline_gflops=flops / found["baseline_s"] / 1e9,
    )
    found["ratio"] = found["ours_gflops"] / found["baseline_gflops"]
    found["target"] = MATMUL_TARGET if cuda else None
    found["met"] = found["ratio"] >= MATMUL_TARGET if cuda else None
    print(
        f"matmul {n}²: ours {found['ours_s'] * 1e3:.3f} ms ({found['ours_gflops']:.1f} GFLOP/s), "
        f"{found['baseline']} {found['baseline_s'] * 1e3:.3f} ms ({found['baseline_gflops']:.1f} GFLOP/s): "
        f"{found['ratio'] * 100:.1f} %{'' if correct else '  RESULT WRONG'}"
        + (f"  [{found['tf32']}]" if "tf32" in found else "")
    )
    return found


def bench_memory(dev: gw.Device, rows: int, cols: int, pairs: int, inner: int, cuda: bool) -> dict[str, Any]:
    """softmax, layer_norm and sum on (rows, cols) float32, each ABBA against a device-to-device copy of x."""
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((rows, cols), dtype=np.float32)
    x, y, copy = dev.alloc((rows, cols)), dev.alloc((rows, cols)), dev.alloc((rows, cols))
    gamma, beta, sums = dev.alloc(cols), dev.alloc(cols), dev.alloc(rows)
    x.copy_from_host(x_host.reshape(-1))
    gamma.copy_from_host(np.ones(cols, np.float32))
    beta.copy_from_host(np.zeros(cols, np.float32))
    stream = dev.create_stream("bench-memory")
    elements = rows * cols
    ops: dict[str, tuple[Callable[[], Any], int, Callable[[], np.ndarray]]] = {
        "softmax": (lambda: lib.softmax(x, out=y, stream=stream), 8 * elements, lambda: y.copy_to_host()),
        "layer_norm": (
            lambda: lib.layer_norm(x, gamma, beta, out=y, stream=stream),
            8 * elements + 8 * cols,
            lambda: y.copy_to_host(),
        ),
        "sum": (lambda: lib.sum(x, axis=-1, out=sums, stream=stream), 4 * elements + 4 * rows, sums.copy_to_host),
    }
    expected = {
        "softmax": lambda: (
            np.exp(x_host - x_host.max(-1, keepdims=True))
            / np.exp(x_host - x_host.max(-1, keepdims=True)).sum(-1, keepdims=True)
        ),
        "layer_norm": lambda: (x_host - x_host.mean(-1, keepdims=True)) / np.sqrt(x_host.var(-1, keepdims=True) + 1e-5),
        "sum": lambda: x_host.sum(-1),
    }
    results: dict[str, Any] = {"rows": rows, "cols": cols}
    try:
        copier = repeat(lambda: copy.copy_from(x, stream), inner, stream.synchronize)
        copier()
        for name, (call, nbytes, read) in ops.items():
            ours = repeat(call, inner, stream.synchronize)
            ours()  # compiles
            want = expected[name]()
            correct = bool(
                np.allclose(read().reshape(want.shape), want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
            )
            t0 = time.perf_counter_ns()
            want = expected[name]()
            numpy_s = (time.perf_counter_ns() - t0) / 1e9
            ours_s, copy_s = abba(ours, copier, pairs, inner)
            copy_gbps = 2 * 4 * elements / copy_s / 1e9  # read and written
            ours_gbps = nbytes / ours_s / 1e9
            ratio = ours_gbps / copy_gbps
            results[name] = {
                "bytes": nbytes,
                "ours_s": ours_s,
                "copy_s": copy_s,
                "ours_gbps": ours_gbps,
                "copy_gbps": copy_gbps,
                "ratio": ratio,
                "numpy_s": numpy_s,
                "correct": correct,
                "target": MEMORY_TARGET if cuda else None,
                "met": ratio >= MEMORY_TARGET if cuda else None,
            }
            print(
                f"{name} {rows}×{cols}: ours {ours_s * 1e3:.3f} ms ({ours_gbps:.1f} GB/s), d2d copy "
                f"{copy_s * 1e3:.3f} ms ({copy_gbps:.1f} GB/s): {ratio * 100:.1f} % of the copy; NumPy on the host "
                f"{numpy_s * 1e3:.3f} ms{'' if correct else '  RESULT WRONG'}"
            )
    finally:
        stream.close()
        for buf in (x, y, copy, gamma, beta, sums):
            buf.free()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="a device spec such as cuda:0 or opencl:0 (default: gw.Device()'s choice)")
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that it runs, not figures")
    parser.add_argument("--pairs", type=int, help="ABBA rounds per comparison (default 10 on a GPU, 3 elsewhere)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    dev = gw.Device(args.device) if args.device else gw.Device()
    cuda = dev.backend_kind is gw.BackendKind.CUDA
    gpu = dev.info.is_gpu
    if gpu and not args.quick:
        n, rows, cols, inner, pairs = 4096, 16384, 4096, 5, 10
    elif gpu:
        n, rows, cols, inner, pairs = 1024, 1024, 1024, 3, 3
    elif args.quick:
        n, rows, cols, inner, pairs = 64, 64, 1024, 1, 2
    else:
        n, rows, cols, inner, pairs = (128 if dev.caps.kernel_language == "python" else 256), 256, 4096, 1, 3
    pairs = args.pairs or pairs
    print(f"{dev.spec} {dev.name}: matmul {n}², row ops {rows}×{cols}, {pairs} ABBA rounds of {inner} launch(es) each")
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": dev.spec,
        "device_name": dev.name,
        "quick": args.quick,
        "abba_pairs": pairs,
        "inner": inner,
        "matmul": bench_matmul(dev, n, pairs, inner, cuda),
        "memory_bound": bench_memory(dev, rows, cols, pairs, inner, cuda),
    }
    if not cuda:
        print("targets (matmul ≥ 50 % of CuPy, memory-bound ops ≥ 60 % of the copy) are for a CUDA GPU: not judged")
    else:
        met = [results["matmul"]["met"]] + [v["met"] for v in results["memory_bound"].values() if isinstance(v, dict)]
        print(f"targets met: {sum(met)} of {len(met)}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
