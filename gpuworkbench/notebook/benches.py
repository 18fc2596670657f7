"""``%gpu bench``: quick benchmarks of the current device (copy bandwidth, launch cost, a double-buffered pipeline)
and the crossover of the library's ops against NumPy. Each shows a table (or a summary) and returns its figures."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._format import binary_bytes, in_notebook
from .._progress import Progress
from ..device import Device
from ..kernels import elementwise
from ..pipeline import Pipeline
from ..trace.recorder import Trace
from .output import Table, present


def best_s(fn: Callable[[], Any], repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls (each call waits for its own work)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_copy(dev: Device) -> dict[str, Any]:
    """Host↔device copy bandwidth from page-locked ("pinned") and ordinary ("pageable") host memory."""
    gpu = dev.info.is_gpu
    nbytes, repeat = (64 << 20, 5) if gpu else (8 << 20, 3)
    n = nbytes // 4
    buf = dev.alloc(n, "float32")
    stream = dev.create_stream("bench-copy")
    pinned = dev.empty_pinned(n, "float32")
    pinned[:] = 1.0
    pageable = np.ones(n, np.float32)
    cases = [
        ("pinned H2D", lambda: buf.copy_from_host_async(pinned, stream).wait()),
        ("pinned D2H", lambda: buf.copy_to_host_async(pinned, stream).wait()),
        ("pageable H2D", lambda: buf.copy_from_host_async(pageable, stream).wait()),
        ("pageable D2H", lambda: buf.copy_to_host_async(pageable, stream).wait()),
    ]
    results: dict[str, Any] = {"device": dev.spec, "bytes": nbytes}
    progress = Progress("copy", len(cases), in_notebook())
    try:
        for label, fn in cases:
            fn()  # warm-up: first touch of the pages, staging buffers
            gbps = nbytes / best_s(fn, repeat) / 1e9
            results[label] = gbps
            progress.step(f"{label} {gbps:.2f} GB/s")
    finally:
        progress.close()
        buf.free()
        stream.close()
    rows = [[label, f"{results[label]:.2f} GB/s"] for label, _ in cases]
    notes = [f"{dev.spec} {dev.name}, {binary_bytes(nbytes)} per copy, best of {repeat}"]
    if not dev.caps.pinned_memory:
        notes.append("this backend has no page-locked memory: 'pinned' arrays are ordinary memory here")
    present(Table(["copy", "bandwidth"], rows, notes))
    return results


def bench_launch(dev: Device) -> dict[str, Any]:
    """Kernel launch cost: host time to enqueue one, time per kernel back to back, and launch-and-wait latency."""
    count, round_trips = (5000, 200) if dev.info.is_gpu else (500, 50)
    kernel = elementwise("float32 x, float32 y", "y = x + 1", name="bench_launch")
    x, y = dev.alloc(1, "float32"), dev.alloc(1, "float32")
    stream = dev.create_stream("bench-launch")
    progress = Progress("launch", 3, in_notebook())
    try:
        x.fill_bytes(0, stream)
        kernel(x, y, stream=stream).wait()  # compiles, and warms the stream
        progress.step("compiled")
        t0 = time.perf_counter()
        for _ in range(count):
            kernel(x, y, stream=stream)
        enqueued = time.perf_counter() - t0
        stream.synchronize()
        finished = time.perf_counter() - t0
        progress.step(f"{count} launches back to back")
        latencies = []
        for _ in range(round_trips):
            t1 = time.perf_counter()
            kernel(x, y, stream=stream).wait()
            latencies.append(time.perf_counter() - t1)
        progress.step(f"{round_trips} launch-and-wait")
    finally:
        progress.close()
        x.free()
        y.free()
        stream.close()
    results = {
        "device": dev.spec,
        "enqueue_s": enqueued / count,
        "per_kernel_s": finished / count,
        "round_trip_s": float(np.median(latencies)),
    }
    rows = [
        ["enqueue (host time per launch)", _microseconds(results["enqueue_s"])],
        ["back to back (time per kernel)", _microseconds(results["per_kernel_s"])],
        ["launch and wait (median)", _microseconds(results["round_trip_s"])],
    ]
    notes = [f"{dev.spec} {dev.name}, a one-element kernel y = x + 1"]
    if dev.caps.kernel_language == "python":
        notes.append("the CPU backend's worker threads share Python's GIL with the host: launches wait for it")
    present(Table(["launch", "time"], rows, notes))
    return results


def _microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def bench_pipeline(dev: Device) -> dict[str, Any]:
    """A double-buffered ``gw.Pipeline`` (H2D → y = 2*x + 1 → D2H), timed, then traced and summarised."""
    gpu = dev.info.is_gpu
    batches, batch_bytes, repeat = (16, 16 << 20, 3) if gpu else (8, 2 << 20, 2)
    n = batch_bytes // 4
    inputs = [dev.empty_pinned(n, "float32") for _ in range(batches)]
    outputs = [dev.empty_pinned(n, "float32") for _ in range(batches)]
    for i, a in enumerate(inputs):
        a[:] = i
    kernel = elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
    progress = Progress("pipeline", repeat + 2, in_notebook())
    try:
        with Pipeline(dev, lambda a, b, s: kernel(a, b, stream=s), depth=2) as pipe:
            pipe.run(inputs[:2], outputs[:2])
            progress.step("warm-up")
            best = float("inf")
            for r in range(repeat):
                best = min(best, pipe.run(inputs, outputs).wall_s)
                progress.step(f"run {r + 1}: {best * 1e3:.2f} ms")
            with Trace() as trace:
                traced = pipe.run(inputs, outputs)
            progress.step(f"traced run: {traced.wall_s * 1e3:.2f} ms")
    finally:
        progress.close()
    correct = all(float(o[0]) == 2 * i + 1 and float(o[-1]) == 2 * i + 1 for i, o in enumerate(outputs))
    summary = trace.summary()
    moved = traced.bytes_in + traced.bytes_out
    print(
        f"{dev.spec} {dev.name}: {batches} batches × {binary_bytes(batch_bytes)}, double-buffered; "
        f"best {best * 1e3:.2f} ms ({moved / best / 1e9:.2f} GB/s moved), results "
        f"{'correct' if correct else 'WRONG'}"
    )
    present(summary)
    return {"device": dev.spec, "best_s": best, "traced": traced, "trace": trace, "correct": correct}


#: ``%gpu bench NAME`` → the benchmark it runs on the current device.
BENCHES: dict[str, Callable[[Device], dict[str, Any]]] = {
    "copy": bench_copy,
    "launch": bench_launch,
    "pipeline": bench_pipeline,
}


def bench_crossover(ops: Sequence[str], dev: Device, options: dict[str, Any]) -> dict[str, Any]:
    """``gw.crossover`` of ``ops`` (all: none) on ``dev``: the table, then the log-log plot (in a notebook)."""
    from ..library.crossover_measure import crossover

    result = crossover(list(ops) or None, dev, progress=True, **options)
    present(result)
    if in_notebook():
        from bokeh.io import show

        from ..viz import inline_setup

        inline_setup()  # BokehJS from the package (no CDN), once
        show(result.figure())
    return {"device": result.device, "result": result, "crossover": result.crossover}
