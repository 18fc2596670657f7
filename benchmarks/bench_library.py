"""``gw.library`` against the best baseline in the same run: the tiled matmul (float32 and float64) against CuPy's
(cuBLAS, TF32 off) or, without CUDA, NumPy's on the host; every memory-bound op (sum, max, argmax, cumsum, softmax,
log_softmax, layer_norm, transpose) on every dtype the device holds against the device's own device-to-device copy
bandwidth, at the same bytes (each dtype's rows hold the bytes of float32's 16384 × 4096: 16384 rows of 16 KiB).

Run from the repository root: ``python benchmarks/bench_library.py [--device SPEC] [--quick] [--json out.json]
[--dtypes float32,int32] [--ops sum,softmax] [--matmul float32]``.
Targets on a GPU: matmul at 4096² ≥ 50 % of cuBLAS's GFLOP/s of the same dtype; the memory-bound ops (each reads and
writes what ``gw.library.KERNEL_BYTES`` says) ≥ 70 % of the copy's bandwidth (bytes read plus written, as for the ops).
Elsewhere (CPU backend, OpenCL on PoCL) the sizes are smaller and the figures are for reference: the targets are a
GPU's. Each op's first rows are compared with NumPy's.

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
MEMORY_TARGET = 0.7  # of the device-to-device copy's bandwidth


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
    """CuPy's matmul (cuBLAS SGEMM with TF32 off, or DGEMM) on CUDA device ``index``, ABBA against ``ours``."""
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
    c = cupy.empty(a.shape, a.dtype)
    stream = cupy.cuda.Stream(non_blocking=True)

    def theirs_once() -> None:
        with stream:
            cupy.matmul(a, b, out=c)

    theirs = repeat(theirs_once, inner, stream.synchronize)
    theirs()
    ours_s, theirs_s = abba(ours, theirs, pairs, inner)
    return {"baseline": "cupy.matmul (cuBLAS)", "tf32": mode, "ours_s": ours_s, "baseline_s": theirs_s}


def bench_matmul(dev: gw.Device, n: int, pairs: int, inner: int, cuda: bool, dtype: str) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((n, n)).astype(dtype)
    b_host = rng.standard_normal((n, n)).astype(dtype)
    a, b, c = (dev.alloc((n, n), dtype) for _ in range(3))
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
        dtype=dtype,
        correct=correct,
        ours_gflops=flops / found["ours_s"] / 1e9,
        baseline_gflops=flops / found["baseline_s"] / 1e9,
    )
    found["ratio"] = found["ours_gflops"] / found["baseline_gflops"]
    found["target"] = MATMUL_TARGET if cuda else None
    found["met"] = found["ratio"] >= MATMUL_TARGET if cuda else None
    print(
        f"matmul {dtype} {n}²: ours {found['ours_s'] * 1e3:.3f} ms ({found['ours_gflops']:.1f} GFLOP/s), "
        f"{found['baseline']} {found['baseline_s'] * 1e3:.3f} ms ({found['baseline_gflops']:.1f} GFLOP/s): "
        f"{found['ratio'] * 100:.1f} %{'' if correct else '  RESULT WRONG'}"
        + (f"  [{found['tf32']}]" if "tf32" in found else ""),
        flush=True,
    )
    return found


def fma_peak_kernel() -> Any:
    """A float64 kernel of 8 independent multiply-add chains per thread: the device's FP64 rate on its CUDA cores
    (what any @gw.kernel can reach; cuBLAS's DGEMM also has the FP64 tensor cores)."""

    @gw.kernel(name="fma_peak_f64")
    def fma_peak_f64(i: gw.index, out: gw.f64[:], b: gw.f64, c: gw.f64, steps: gw.i32, n: gw.i32):
        a0 = i * 1e-9
        a1 = a0 + 1.0
        a2 = a0 + 2.0
        a3 = a0 + 3.0
        a4 = a0 + 4.0
        a5 = a0 + 5.0
        a6 = a0 + 6.0
        a7 = a0 + 7.0
        for _ in range(steps):
            a0 = a0 * b + c
            a1 = a1 * b + c
            a2 = a2 * b + c
            a3 = a3 * b + c
            a4 = a4 * b + c
            a5 = a5 * b + c
            a6 = a6 * b + c
            a7 = a7 * b + c
        if i < n:
            out[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

    return fma_peak_f64


def bench_fp64_peak(dev: gw.Device, pairs: int) -> dict[str, Any]:
    """GFLOP/s of fma_peak_kernel over 2**20 threads (8 per SM's 2048 slots on 132 SMs, and more), median of runs."""
    n, steps = 1 << 20, 2048
    kernel = fma_peak_kernel()
    out = dev.alloc(n, "float64")
    stream = dev.create_stream("bench-fma")
    try:
        run = repeat(lambda: kernel.launch(n, out, 0.999999, 1e-7, steps, n, stream=stream), 3, stream.synchronize)
        run()
        seconds, _ = abba(run, lambda: None, pairs, 3)
    finally:
        stream.close()
        out.free()
    gflops = 2.0 * 8 * steps * n / seconds / 1e9
    print(f"float64 multiply-add chains on the CUDA cores: {gflops:.1f} GFLOP/s", flush=True)
    return {"gflops": gflops, "threads": n, "steps": steps}


FLOATS = ("float32", "float16", "bfloat16", "float64")
INTEGERS = ("int32", "int64")
FLOAT_OPS = ("sum", "max", "argmax", "cumsum", "softmax", "log_softmax", "layer_norm", "transpose")
INTEGER_OPS = ("sum", "max", "argmax", "cumsum", "transpose")
CHECKED_ROWS = 64  # rows compared with NumPy (the whole array would take NumPy seconds per op)


def _softmax_host(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _op_table(x: Any, gamma: Any, beta: Any, stream: Any, outs: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Each op as a call enqueuing it on ``stream`` into its preallocated output."""
    return {
        "sum": lambda: lib.sum(x, axis=-1, out=outs["sum"], stream=stream),
        "max": lambda: lib.max(x, axis=-1, out=outs["max"], stream=stream),
        "argmax": lambda: lib.argmax(x, axis=-1, out=outs["argmax"], stream=stream),
        "cumsum": lambda: lib.cumsum(x, axis=-1, out=outs["cumsum"], stream=stream),
        "softmax": lambda: lib.softmax(x, out=outs["rows"], stream=stream),
        "log_softmax": lambda: lib.log_softmax(x, out=outs["rows"], stream=stream),
        "layer_norm": lambda: lib.layer_norm(x, gamma, beta, out=outs["rows"], stream=stream),
        "transpose": lambda: lib.transpose(x, out=outs["transpose"], stream=stream),
    }


def _expected(op: str, h: np.ndarray) -> np.ndarray:
    """NumPy's answer for the first rows ``h`` (float64 for floats)."""
    if op == "sum":
        return h.sum(-1)
    if op == "max":
        return h.max(-1)
    if op == "argmax":
        return h.argmax(-1)
    if op == "cumsum":
        return h.cumsum(-1)
    if op == "softmax":
        return _softmax_host(h)
    if op == "log_softmax":
        return np.log(_softmax_host(h))
    if op == "layer_norm":
        return (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    return h.T


def _got(op: str, outs: dict[str, Any], rows: int) -> np.ndarray:
    """The device's answer for the first CHECKED_ROWS rows."""
    key = op if op in outs else "rows"
    got = outs[key].copy_to_host()
    if op == "transpose":
        return got.reshape(-1, rows)[:, :CHECKED_ROWS]
    return got[:CHECKED_ROWS] if got.ndim == 1 else got.reshape(rows, -1)[:CHECKED_ROWS]


def _close(op: str, got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    if op == "argmax" or dtype in INTEGERS:
        return bool(np.array_equal(got.astype(np.float64), want.astype(np.float64)))
    tol = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 1e-3, "float64": 1e-9}[dtype]
    scale = float(np.abs(want).max()) or 1.0
    if op in ("sum", "cumsum"):
        tol *= 4  # sums of thousands of rounded values drift further
    return bool(np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale))


def bench_memory(
    dev: gw.Device, rows: int, cols: int, pairs: int, inner: int, cuda: bool, dtypes: tuple[str, ...], ops: set[str]
) -> dict[str, Any]:
    """Every memory-bound op on every dtype the device holds, each ABBA against a device-to-device copy of x. Every
    dtype's rows hold the bytes of float32's (rows, cols): ``cols`` scaled by 4 / itemsize."""
    results: dict[str, Any] = {"rows": rows, "cols_float32": cols}
    for dtype in dtypes:
        lacks = dev.backend_device.lacks_type(dtype)
        if lacks:
            print(f"{dtype}: {lacks}; skipped")
            continue
        np_dtype = np.dtype(lib_dtype(dtype))
        s = np_dtype.itemsize
        n_rows, n_cols = rows, cols * 4 // s
        r = 8 if dtype in INTEGERS else s  # the sum and scan of integers are int64
        rng = np.random.default_rng(1)
        if dtype in INTEGERS:
            x_host = rng.integers(-1000, 1000, (n_rows, n_cols)).astype(np_dtype)
        else:
            x_host = rng.standard_normal((n_rows, n_cols)).astype(np_dtype)
        sum_dtype = "int64" if dtype in INTEGERS else np_dtype
        x = dev.alloc((n_rows, n_cols), np_dtype)
        copy = dev.alloc((n_rows, n_cols), np_dtype)
        outs = {
            "sum": dev.alloc(n_rows, sum_dtype),
            "max": dev.alloc(n_rows, np_dtype),
            "argmax": dev.alloc(n_rows, "int64"),
            "cumsum": dev.alloc((n_rows, n_cols), sum_dtype),
            "rows": dev.alloc((n_rows, n_cols), np_dtype),
            "transpose": dev.alloc((n_cols, n_rows), np_dtype),
        }
        gamma, beta = dev.alloc(n_cols, np_dtype), dev.alloc(n_cols, np_dtype)
        x.copy_from_host(x_host.reshape(-1))
        gamma.copy_from_host(np.ones(n_cols, np_dtype))
        beta.copy_from_host(np.zeros(n_cols, np_dtype))
        stream = dev.create_stream("bench-memory")
        elements = n_rows * n_cols
        nbytes = {
            "sum": s * elements + r * n_rows,
            "max": s * elements + s * n_rows,
            "argmax": s * elements + 8 * n_rows,
            "cumsum": (s + r) * elements,
            "softmax": 2 * s * elements,
            "log_softmax": 2 * s * elements,
            "layer_norm": 2 * s * (elements + n_cols),
            "transpose": 2 * s * elements,
        }
        calls = _op_table(x, gamma, beta, stream, outs)
        head = x_host[:CHECKED_ROWS].astype(np.float64 if dtype in FLOATS else np.int64)
        per_dtype: dict[str, Any] = {"rows": n_rows, "itemsize": s}
        try:
            copier = repeat(lambda c=copy, x=x, s=stream: c.copy_from(x, s), inner, stream.synchronize)
            copier()
            for op in FLOAT_OPS if dtype in FLOATS else INTEGER_OPS:
                if op not in ops:
                    continue
                ours = repeat(calls[op], inner, stream.synchronize)
                ours()  # compiles
                want = _expected(op, head)
                correct = _close(op, _got(op, outs, n_rows), want, dtype)
                ours_s, copy_s = abba(ours, copier, pairs, inner)
                copy_gbps = 2 * s * elements / copy_s / 1e9  # read and written
                ours_gbps = nbytes[op] / ours_s / 1e9
                ratio = ours_gbps / copy_gbps
                per_dtype[op] = {
                    "bytes": nbytes[op],
                    "ours_s": ours_s,
                    "copy_s": copy_s,
                    "ours_gbps": ours_gbps,
                    "copy_gbps": copy_gbps,
                    "ratio": ratio,
                    "correct": correct,
                    "target": MEMORY_TARGET if cuda else None,
                    "met": ratio >= MEMORY_TARGET if cuda else None,
                }
                print(
                    f"{op:11s} {dtype:8s} {n_rows}×{n_cols}: ours {ours_s * 1e3:.3f} ms ({ours_gbps:.0f} GB/s), copy "
                    f"{copy_s * 1e3:.3f} ms ({copy_gbps:.0f} GB/s): {ratio * 100:.1f} % of the copy"
                    f"{'' if correct else '  RESULT WRONG'}",
                    flush=True,
                )
        finally:
            stream.close()
            for buf in (x, copy, gamma, beta, *outs.values()):
                buf.free()
        results[dtype] = per_dtype
    return results


def lib_dtype(name: str) -> Any:
    """The NumPy dtype of ``name``; bfloat16 is ml_dtypes'."""
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="a device spec such as cuda:0 or opencl:0 (default: gw.Device()'s choice)")
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that it runs, not figures")
    parser.add_argument("--pairs", type=int, help="ABBA rounds per comparison (default 10 on a GPU, 3 elsewhere)")
    parser.add_argument("--dtypes", default=",".join(FLOATS + INTEGERS), help="the row ops' dtypes, comma-separated")
    parser.add_argument("--ops", default=",".join(FLOAT_OPS), help="the row ops, comma-separated")
    parser.add_argument("--matmul", default="float32,float64", help="matmul's dtypes, comma-separated ('' for none)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    dev = gw.Device(args.device) if args.device else gw.Device()
    cuda = dev.backend_kind is gw.BackendKind.CUDA
    gpu = dev.info.is_gpu
    if gpu and not args.quick:
        n, rows, cols, inner, pairs = 4096, 16384, 4096, 20, 10  # 20 calls a sample: the first's host time amortised
    elif gpu:
        n, rows, cols, inner, pairs = 1024, 1024, 1024, 3, 3
    elif args.quick:
        n, rows, cols, inner, pairs = 64, 64, 1024, 1, 2
    else:
        n, rows, cols, inner, pairs = (128 if dev.caps.kernel_language == "python" else 256), 256, 4096, 1, 3
    pairs = args.pairs or pairs
    dtypes = tuple(d for d in args.dtypes.split(",") if d)
    print(f"{dev.spec} {dev.name}: matmul {n}², row ops {rows}×{cols} float32 (the same bytes for other dtypes), "
          f"{pairs} ABBA rounds of {inner} launch(es) each")  # fmt: skip
    matmuls = {}
    for dtype in (d for d in args.matmul.split(",") if d):
        lacks = dev.backend_device.lacks_type(dtype)
        if lacks:
            print(f"matmul {dtype}: {lacks}; skipped")
        else:
            matmuls[dtype] = bench_matmul(dev, n, pairs, inner, cuda, dtype)
    if cuda and "float64" in matmuls:
        f64 = matmuls["float64"]
        f64["fp64_fma_peak"] = peak = bench_fp64_peak(dev, pairs)
        print(f"matmul float64 at {f64['ours_gflops'] / peak['gflops']:.1%} of that; cuBLAS's DGEMM (FP64 tensor "
              f"cores) at {f64['baseline_gflops'] / peak['gflops']:.1%}")  # fmt: skip
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": dev.spec,
        "device_name": dev.name,
        "quick": args.quick,
        "abba_pairs": pairs,
        "inner": inner,
        "matmul": matmuls,
        "memory_bound": bench_memory(dev, rows, cols, pairs, inner, cuda, dtypes, set(args.ops.split(","))),
    }
    if not cuda:
        print("targets (matmul ≥ 50 % of CuPy, memory-bound ops ≥ 70 % of the copy) are for a CUDA GPU: not judged")
    else:
        met = [m["met"] for m in matmuls.values()]
        for per_dtype in results["memory_bound"].values():
            if isinstance(per_dtype, dict):
                met += [v["met"] for v in per_dtype.values() if isinstance(v, dict)]
        print(f"targets met: {sum(met)} of {len(met)}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
