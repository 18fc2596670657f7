"""Host time of one ``gw.library.sum`` call against its kernel's plain launch, and what each gives against the copy
when timed back to back. ``python benchmarks/probes/library_call_cost.py``."""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_library import abba, repeat  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench import library as lib  # noqa: E402
from gpuworkbench.library import _row_kernels as rk  # noqa: E402

dev = gw.Device("cuda:0")
s = dev.create_stream("probe")
rows, cols = 16384, 4096
x, cp = dev.alloc((rows, cols)), dev.alloc((rows, cols))
sums = dev.alloc(rows)
x.copy_from_host(np.ones(rows * cols, np.float32))
k = rk.row_sum("f32")
calls = {
    "lib.sum": lambda: lib.sum(x, axis=-1, out=sums, stream=s),
    "kernel.launch": lambda: k.launch(rows * rk.ROW, sums, x, cols, stream=s),
}
for name, fn in calls.items():
    fn()
    s.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(20):
        fn()
    t1 = time.perf_counter_ns()
    s.synchronize()
    t2 = time.perf_counter_ns()
    print(f"{name}: {(t1 - t0) / 20 / 1e3:.1f} µs host per call; 20 calls and the wait {(t2 - t0) / 1e3:.0f} µs")
copier = repeat(lambda: cp.copy_from(x, s), 5, s.synchronize)
for inner in (5, 20):
    for name, fn in calls.items():
        ours, copy = abba(repeat(fn, inner, s.synchronize), repeat(lambda: cp.copy_from(x, s), inner, s.synchronize),
                          8, inner)  # fmt: skip
        print(
            f"inner {inner} {name}: {ours * 1e6:.1f} µs per call, copy {copy * 1e6:.1f} µs: "
            f"{4 * rows * cols / ours / (8 * rows * cols / copy):.3f} of the copy"
        )
with gw.trace() as tr:
    for _ in range(20):
        calls["lib.sum"]()
        cp.copy_from(x, s)
    s.synchronize()
durations: dict[str, list[int]] = {}
for span in tr.spans:
    durations.setdefault(span.kind if span.kind != "kernel" else span.name, []).append(span.end_ns - span.start_ns)
for name, ds in durations.items():
    print(f"traced {name}: median {np.median(ds) / 1e3:.1f} µs on the device over {len(ds)}")
if "row_sum" in durations and "d2d" in durations:
    ratio = 4 * rows * cols / np.median(durations["row_sum"]) / (8 * rows * cols / np.median(durations["d2d"]))
    print(f"device times: row_sum at {ratio:.3f} of the copy")
