"""Device-layer benchmarks on an NVIDIA GPU, with raw CuPy measured side by side in the same run.

Run on the GPU machine: ``python benchmarks/bench_device.py [--json out.json]``. Targets (issue 2):
pipeline through ``gw.Pipeline`` traced ≥ 0.95 of its ideal bound; tracing ≤ 2 % on that pipeline and ≤ 1.3× on an
empty-kernel launch loop; pinned copies ≥ 0.97× raw CuPy; pageable copies ≥ 3× CuPy's pageable figure;
``import gpuworkbench`` ≤ 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
from bench_common import best_of, median_of, write_json

MiB = 1 << 20
#: Untraced / traced measurements alternate this many times; the ratio reported is the median of the pairs'.
PAIRS = 5


def import_time() -> float:
    code = "import time; t=time.perf_counter(); import gpuworkbench; print(time.perf_counter()-t)"
    runs = [float(subprocess.check_output([sys.executable, "-c", code]).decode()) for _ in range(5)]
    return min(runs)


def copies(gw, cp, dev) -> dict:
    n = 256 * MiB // 4
    out: dict = {}
    pinned = dev.empty_pinned(n, "float32")
    pinned[:] = 1.0
    pageable = np.ones(n, np.float32)
    buf = dev.alloc(n, "float32")
    s = dev.create_stream("bench")
    raw_dst = cp.empty(n, cp.float32)
    raw_stream = cp.cuda.Stream(non_blocking=True)
    raw_pinned = cp.cuda.alloc_pinned_memory(n * 4)
    raw_host = np.frombuffer(raw_pinned, np.float32, n)
    raw_host[:] = 1.0
    rt = cp.cuda.runtime

    def raw_h2d():
        rt.memcpyAsync(raw_dst.data.ptr, raw_host.ctypes.data, n * 4, 1, raw_stream.ptr)
        raw_stream.synchronize()

    def raw_d2h():
        rt.memcpyAsync(raw_host.ctypes.data, raw_dst.data.ptr, n * 4, 2, raw_stream.ptr)
        raw_stream.synchronize()

    def raw_pageable_h2d():
        raw_dst.set(pageable, stream=raw_stream)
        raw_stream.synchronize()

    def our_h2d():
        buf.copy_from_host_async(pinned, s).wait()

    def our_d2h():
        buf.copy_to_host_async(pinned, s).wait()

    def our_pageable_h2d():
        buf.copy_from_host_async(pageable, s).wait()

    def our_pageable_d2h():
        buf.copy_to_host_async(pageable, s).wait()

    def raw_pageable_d2h():
        raw_dst.get(stream=raw_stream, out=pageable)
        raw_stream.synchronize()

    for name, fn in [
        ("raw_pinned_h2d", raw_h2d),
        ("ours_pinned_h2d", our_h2d),
        ("raw_pinned_d2h", raw_d2h),
        ("ours_pinned_d2h", our_d2h),
        ("raw_pageable_h2d", raw_pageable_h2d),
        ("ours_pageable_h2d", our_pageable_h2d),
        ("raw_pageable_d2h", raw_pageable_d2h),
        ("ours_pageable_d2h", our_pageable_d2h),
    ]:
        fn()
        out[name + "_GBps"] = n * 4 / best_of(fn) / 1e9
    assert np.all(buf.copy_to_host() == 1.0)
    buf.free()
    return out


EMPTY = 'extern "C" __global__ void empty(float* x) {}'


def launches(gw, cp, dev, count: int = 5000) -> dict:
    out: dict = {}
    raw = cp.RawKernel(EMPTY, "empty")
    arr = cp.empty(1, cp.float32)
    raw_stream = cp.cuda.Stream(non_blocking=True)

    def raw_loop():
        with raw_stream:
            for _ in range(count):
                raw((1,), (32,), (arr,))
        raw_stream.synchronize()

    k = dev.compile(EMPTY, "empty")
    b = dev.alloc(1, "float32")
    s = dev.create_stream("launch")

    def our_loop():
        for _ in range(count):
            k(1, 32, (b,), stream=s)
        s.synchronize()

    raw_loop()
    our_loop()
    out["raw_cupy_us"] = median_of(raw_loop) / count * 1e6
    # Untraced and traced alternate, pair by pair, so that drift of the host hits both alike.
    pairs: dict[str, list[float]] = {"untraced": [], "cupti": [], "events": []}
    for _ in range(PAIRS):
        pairs["untraced"].append(median_of(our_loop, 3) / count * 1e6)
        for source in ("cupti", "events"):
            try:
                with gw.trace(source=source) as t:
                    our_loop()  # warm the source (CUPTI start, clock alignment)
                    pairs[source].append(median_of(our_loop, 3) / count * 1e6)
                t.wait_pending(60)
                out[f"traced_{source}_spans"] = len(t)
                out[f"traced_{source}_lost"] = t.stats.lost
            except Exception as exc:  # noqa: BLE001 - report, don't hide
                out[f"ours_traced_{source}_error"] = repr(exc)
    out["ours_untraced_us"] = statistics.median(pairs["untraced"])
    for source in ("cupti", "events"):
        if len(pairs[source]) == PAIRS:
            out[f"ours_traced_{source}_us"] = statistics.median(pairs[source])
            ratios = [t / u for t, u in zip(pairs[source], pairs["untraced"])]
            out[f"traced_{source}_ratio"] = statistics.median(ratios)
            out[f"traced_{source}_ratio_range"] = [min(ratios), max(ratios)]
    b.free()
    return out


def pipeline(gw, cp, dev, batches: int = 16, batch_bytes: int = 64 * MiB, depth: int = 2) -> dict:
    out: dict = {}
    n = batch_bytes // 4
    inputs = [dev.empty_pinned(n, "float32") for _ in range(batches)]
    outputs = [dev.empty_pinned(n, "float32") for _ in range(batches)]
    for i, a in enumerate(inputs):
        a[:] = i
    f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")

    # Stage times measured alone with CUDA events (not our tracer), for the ideal bound:
    # N * max(stage) + the other stages of one batch (fill and drain).
    x, y = dev.alloc(n, "float32"), dev.alloc(n, "float32")
    s = dev.create_stream("stages")
    raw = cp.cuda.ExternalStream(s._raw.ptr)

    def timed(enqueue, reps: int = 10) -> float:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        enqueue()
        e0.record(raw)
        for _ in range(reps):
            enqueue()
        e1.record(raw)
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / 1e3 / reps

    h = timed(lambda: x.copy_from_host_async(inputs[0], s))
    k = timed(lambda: f(x, y, stream=s))
    d = timed(lambda: y.copy_to_host_async(outputs[0], s))
    x.free()
    y.free()
    ideal = batches * max(h, k, d) + (h + k + d - max(h, k, d))
    out.update(stage_h2d_ms=h * 1e3, stage_kernel_ms=k * 1e3, stage_d2h_ms=d * 1e3, ideal_ms=ideal * 1e3)

    pipe = gw.Pipeline(dev, lambda a, b, st: f(a, b, stream=st), depth=depth)
    pipe.run(inputs[:2], outputs[:2])
    runs: dict[str, list[float]] = {"untraced": [], "cupti": [], "events": []}
    summaries: dict[str, object] = {}
    for _ in range(PAIRS):
        runs["untraced"].append(median_of(lambda: pipe.run(inputs, outputs), 3))
        for source in ("cupti", "events"):
            try:
                with gw.trace(source=source) as t:
                    pipe.run(inputs[:2], outputs[:2])
                    runs[source].append(median_of(lambda: pipe.run(inputs, outputs), 3))
                summaries[source] = t
            except Exception as exc:  # noqa: BLE001
                out[f"ours_traced_{source}_error"] = repr(exc)
    untraced = statistics.median(runs["untraced"])
    out["ours_untraced_ms"] = untraced * 1e3
    out["ours_untraced_efficiency"] = ideal / untraced
    for source in ("cupti", "events"):
        if len(runs[source]) != PAIRS:
            continue
        traced = statistics.median(runs[source])
        ratios = [t / u for t, u in zip(runs[source], runs["untraced"])]
        out[f"ours_traced_{source}_ms"] = traced * 1e3
        out[f"ours_traced_{source}_efficiency"] = ideal / traced
        out[f"tracing_{source}_overhead_pct"] = (statistics.median(ratios) - 1) * 100
        out[f"tracing_{source}_overhead_pct_range"] = [(min(ratios) - 1) * 100, (max(ratios) - 1) * 100]
        out[f"traced_{source}_overlap_pct"] = summaries[source].summary().overlap_pct
    ok = all(float(o[0]) == 2 * i + 1 and float(o[-1]) == 2 * i + 1 for i, o in enumerate(outputs))
    out["ours_correct"] = ok
    pipe.close()

    # Raw CuPy, hand-tuned as in ENVIRONMENT.md: get(blocking=False) on 2..4 streams.
    raw_in = [cp.empty(n, cp.float32) for _ in range(4)]
    raw_out = [cp.empty(n, cp.float32) for _ in range(4)]
    ker = cp.ElementwiseKernel("float32 x", "float32 y", "y = 2*x + 1", "raw_scale_add")
    for nstreams in (1, 2, 4):
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(nstreams)]

        def raw_run(streams=streams, nstreams=nstreams):
            for i in range(batches):
                st = streams[i % nstreams]
                slot = i % 4 if nstreams > 1 else 0
                with st:
                    raw_in[slot].set(inputs[i], stream=st)
                    ker(raw_in[slot], raw_out[slot])
                    raw_out[slot].get(stream=st, out=outputs[i], blocking=False)
            for st in streams:
                st.synchronize()

        raw_run()
        out[f"raw_cupy_{nstreams}streams_ms"] = median_of(raw_run) * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--only", default="import,copies,launches,pipeline,pipeline_depth3")
    args = parser.parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d")}
    parts = args.only.split(",")
    if "import" in parts:
        results["import_s"] = import_time()
    import cupy as cp

    import gpuworkbench as gw

    dev = gw.Device("cuda:0")
    results["device"] = dev.name
    results["cupy"] = cp.__version__

    def pipeline_depth3(gw, cp, dev):
        return pipeline(gw, cp, dev, depth=3)

    for part, fn in (
        ("copies", copies),
        ("launches", launches),
        ("pipeline", pipeline),
        ("pipeline_depth3", pipeline_depth3),
    ):
        if part in parts:
            t0 = time.perf_counter()
            results[part] = fn(gw, cp, dev)
            results[part]["bench_s"] = time.perf_counter() - t0
            print(part, json.dumps(results[part], indent=1), flush=True)
    write_json(args.json, results)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
