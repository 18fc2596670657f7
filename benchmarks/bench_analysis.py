"""Time ``summarize`` and friends on a random 10^6-span trace built with NumPy.

The analysis must stay interactive on long traces: a 10^6-span table should summarise in well under a second.
Run from the repository root: ``python benchmarks/bench_analysis.py [n_spans] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench_common import write_json

from gpuworkbench.trace.analysis import gap_causes, state_segments, summarize, union
from gpuworkbench.trace.spans import KIND_CODE, empty_table


def random_table(n: int, streams: int = 8, devices: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """In-order streams of random copies and kernels with random gaps, as a real pipeline trace looks.

    Each stream's ops follow one another (start after the previous end), so gaps and overlaps are realistic.
    """
    rng = np.random.default_rng(seed)
    table = empty_table(n)
    kinds = np.array([KIND_CODE[k] for k in ("h2d", "kernel", "kernel", "d2h", "memset", "d2d", "marker")])
    table["kind"][:] = rng.choice(kinds, size=n)
    table["device"][:] = rng.integers(0, devices, size=n)
    table["stream"][:] = rng.integers(0, streams, size=n)
    duration = rng.integers(1_000, 100_000, size=n)
    gap = rng.integers(0, 20_000, size=n)
    # Start times: a running sum of duration + gap within each (device, stream), so streams stay in order.
    group = table["device"].astype(np.int64) * streams + table["stream"]
    order = np.argsort(group, kind="stable")
    step = (duration + gap)[order]
    running = np.cumsum(step) - step
    group_sorted = group[order]
    first = np.flatnonzero(np.append(True, group_sorted[1:] != group_sorted[:-1]))
    offset = np.repeat(running[first], np.diff(np.append(first, n)))
    start = np.empty(n, dtype=np.int64)
    start[order] = running - offset + gap[order]
    table["start_ns"][:] = start
    table["end_ns"][:] = start + duration
    table["enqueue_ns"][:] = start - rng.integers(-5_000, 50_000, size=n)
    table["bytes"][:] = rng.integers(1 << 10, 1 << 24, size=n)
    table["pinned"][:] = rng.choice(np.array([0, 1], dtype=np.int8), size=n, p=[0.01, 0.99])
    return table


def _best_of(repeats: int, fn, *args) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n_spans", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--json", help="also write the results (ms, best of 3) here")
    args = parser.parse_args()
    n = args.n_spans
    table = random_table(n)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_cores": os.cpu_count(), "spans": n}
    print(f"{n:,} spans, 2 devices, 8 streams each (best of 3)")
    for key, label, fn, fn_args in (
        ("union_ms", "union of all spans", union, (table["start_ns"], table["end_ns"])),
        ("gap_causes_ms", "gap_causes", gap_causes, (table,)),
        ("state_segments_ms", "state_segments(0)", state_segments, (table, 0)),
        ("summarize_ms", "summarize", summarize, (table,)),
    ):
        results[key] = _best_of(3, fn, *fn_args) * 1e3
        print(f"  {label:<20} {results[key]:8.1f} ms")
    one_device = random_table(n, devices=1)
    results["summarize_one_device_ms"] = _best_of(3, summarize, one_device) * 1e3
    print(f"  summarize, 1 device  {results['summarize_one_device_ms']:8.1f} ms")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
