"""Graph replay on an NVIDIA GPU: 1 000 small kernels captured once and replayed, with raw CuPy side by side.

Run on the GPU machine: ``python benchmarks/bench_graphs.py [--json out.json]``. Target (issue 6): one replay of a
graph of 1 000 small kernels costs ≤ 1.0 µs per kernel; a raw CuPy graph of the same kernels is measured in the same
run. Also printed: the same kernels launched one by one (what the graph saves), a replay while a trace records, and
which driver calls are legal while a stream captures (what gpuworkbench's capture path may call).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_common import write_json

KERNELS = 1000
REPLAYS = 50
TINY = r"""
extern "C" __global__ void tiny(float* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += 1.0f;
}
"""


def per_kernel_us(launch, synchronize, replays: int = REPLAYS, repeat: int = 7) -> float:
    """Best of ``repeat`` runs of ``replays`` launches, in µs per captured kernel (each run synchronizes at its end)."""
    launch()
    synchronize()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(replays):
            launch()
        synchronize()
        best = min(best, time.perf_counter() - t0)
    return best / replays / KERNELS * 1e6


def raw_cupy(cp) -> dict:
    kernel = cp.RawKernel(TINY, "tiny")
    y = cp.zeros(32, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    n = np.int64(32)
    stream.begin_capture()
    for _ in range(KERNELS):
        kernel((1,), (32,), (y, n), stream=stream)
    graph = stream.end_capture()
    replay = per_kernel_us(lambda: graph.launch(stream), stream.synchronize)

    def eager():
        for _ in range(KERNELS):
            kernel((1,), (32,), (y, n), stream=stream)

    raw_eager = per_kernel_us(eager, stream.synchronize, replays=10, repeat=5)
    return {"raw_graph_us_per_kernel": replay, "raw_eager_us_per_kernel": raw_eager}


def ours(gw) -> dict:
    dev = gw.Device("cuda:0")
    kernel = dev.compile(TINY, "tiny")
    s = dev.create_stream("bench-graph")
    out: dict = {}
    eager_runs = 0
    with dev.alloc(32, "float32") as y:
        y.copy_from_host(np.zeros(32, np.float32))
        with s.capture("tiny x1000") as g:
            for _ in range(KERNELS):
                kernel(1, 32, (y, np.int64(32)), stream=s)
        assert g.kind == "native" and g.ops == KERNELS
        out["graph_us_per_kernel"] = per_kernel_us(g.launch, s.synchronize)
        before = g.launches
        with gw.trace() as t:
            out["graph_traced_us_per_kernel"] = per_kernel_us(g.launch, s.synchronize, repeat=3)
        t.wait_pending()
        spans = [sp for sp in t.spans if sp.name == "graph tiny x1000"]
        out["trace_source"] = next(iter(t.devices.values())).source
        out["trace_spans_per_replay"] = len(spans) / (g.launches - before)
        out["replay_span_us"] = round(float(np.median([sp.duration_ns for sp in spans])) / 1e3, 1) if spans else None

        def eager():
            nonlocal eager_runs
            eager_runs += 1
            for _ in range(KERNELS):
                kernel(1, 32, (y, np.int64(32)), stream=s)

        out["eager_us_per_kernel"] = per_kernel_us(eager, s.synchronize, replays=10, repeat=5)
        out["correct"] = bool(np.all(y.copy_to_host() == float((g.launches + eager_runs) * KERNELS)))
        g.close()
    # A lazy op captured: upload → 2x+1 → download, replayed with new inputs.
    f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1")
    x = np.arange(1 << 16, dtype=np.float32)
    g = gw.ops.upload(x, device=dev).then(f).then(gw.ops.download()).graph_on(s, name="affine")
    ok = np.array_equal(g.sync(), 2 * x + 1)
    g.update(x + 1)
    out["op_graph_correct"] = ok and np.array_equal(g.sync(), 2 * x + 3)
    g.close()
    return out


def capture_rules(cp) -> dict:
    """Which calls the capture path might make are legal inside a relaxed-mode stream capture (ok / the error)."""
    rt = cp.cuda.runtime
    kernel = cp.RawKernel(TINY, "tiny")
    y = cp.zeros(32, cp.float32)
    pinned = cp.cuda.alloc_pinned_memory(4096)
    pageable = np.zeros(1024, np.float32)
    before = cp.cuda.Event()
    before.record(cp.cuda.Stream.null)
    before.synchronize()
    held: list = []
    calls = {
        "pointerGetAttributes(pinned)": lambda s: rt.pointerGetAttributes(pinned.ptr),
        "pointerGetAttributes(pageable)": lambda s: rt.pointerGetAttributes(pageable.ctypes.data),
        "malloc": lambda s: held.append(rt.malloc(1 << 20)),
        "alloc_pinned_memory": lambda s: held.append(cp.cuda.alloc_pinned_memory(1 << 20)),
        "memGetInfo": lambda s: rt.memGetInfo(),
        "eventQuery(recorded before)": lambda s: before.done,
        "eventRecord+query (in capture)": lambda s: ((e := cp.cuda.Event()).record(s), e.done),
        "memcpyAsync pageable h2d": lambda s: rt.memcpyAsync(y.data.ptr, pageable.ctypes.data, 128, 1, s.ptr),
    }
    result = {}
    for name, call in calls.items():
        s = cp.cuda.Stream(non_blocking=True)
        s.begin_capture()
        error = ""
        try:
            kernel((1,), (32,), (y, np.int64(32)), stream=s)
            call(s)
            kernel((1,), (32,), (y, np.int64(32)), stream=s)
        except Exception as exc:  # noqa: BLE001 - the driver's answer is the finding
            error = f"{type(exc).__name__}: {exc}"
        try:
            graph = s.end_capture()
            graph.launch(s)
            s.synchronize()
        except Exception as exc:  # noqa: BLE001
            error = error or f"capture invalidated: {type(exc).__name__}: {exc}"
        result[name] = error or "ok"
    for ptr in held:
        if isinstance(ptr, int):
            rt.free(ptr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    import cupy as cp

    import gpuworkbench as gw

    results = {"device": gw.Device("cuda:0").name, **raw_cupy(cp), **ours(gw), "capture_rules": capture_rules(cp)}
    results["target_met"] = results["graph_us_per_kernel"] <= 1.0
    print(f"device: {results['device']}")
    print(f"graph of {KERNELS} kernels, replayed {REPLAYS}x per run, best of 7 runs, µs per kernel:")
    print(f"  gpuworkbench graph      {results['graph_us_per_kernel']:.3f}   (target <= 1.0)")
    print(f"  raw CuPy graph          {results['raw_graph_us_per_kernel']:.3f}")
    print(f"  gpuworkbench, traced    {results['graph_traced_us_per_kernel']:.3f}   ({results['trace_source']} spans)")
    print(f"  gpuworkbench eager      {results['eager_us_per_kernel']:.3f}   (no graph: one launch per kernel)")
    print(f"  raw CuPy eager          {results['raw_eager_us_per_kernel']:.3f}")
    span = results["replay_span_us"]
    print(f"trace: {results['trace_spans_per_replay']:.2f} spans per replay, median span {span} µs")
    print(f"results correct: kernels {results['correct']}, op graph with update {results['op_graph_correct']}")
    print("legal inside a relaxed stream capture:")
    for name, verdict in results["capture_rules"].items():
        print(f"  {name:<34} {verdict}")
    write_json(args.json, results, indent=2)


if __name__ == "__main__":
    main()
