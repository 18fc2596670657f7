"""Time ``statistics`` (the ``nsys stats``-like tables) on a random 10^6-span trace built with NumPy.

The tables must stay interactive on long traces: 10^6 spans (kernels of 200 names with long C++ names, copies of
both directions and memory kinds, memsets, API calls) should take well under 2 s on a 2-core machine.
Run from the repository root: ``python benchmarks/bench_statistics.py [n_spans] [repeats] [--json out.json]``.
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

from gpuworkbench.trace.spans import KIND_CODE, empty_table, thread_stream  # noqa: E402
from gpuworkbench.trace.statistics import statistics  # noqa: E402


def random_table(n: int, names: int = 200, streams: int = 8, devices: int = 2, seed: int = 0) -> dict:
    """Half kernels, a quarter copies and memsets, a quarter API calls; each name a distinct str object per span
    (as a loaded trace has them), so that grouping cannot lean on object identity."""
    rng = np.random.default_rng(seed)
    table = empty_table(n)
    kinds = np.array([KIND_CODE[k] for k in ("kernel", "kernel", "h2d", "d2h", "d2d", "memset", "api", "api")])
    table["kind"][:] = rng.choice(kinds, size=n)
    table["device"][:] = rng.integers(0, devices, size=n)
    table["stream"][:] = rng.integers(0, streams, size=n)
    api = table["kind"] == KIND_CODE["api"]
    table["stream"][api] = thread_stream(0)
    start = np.sort(rng.integers(0, 10**10, size=n))
    table["start_ns"][:] = start
    table["end_ns"][:] = start + rng.integers(1_000, 100_000, size=n)
    table["enqueue_ns"][:] = np.where(api, -1, start - rng.integers(0, 50_000, size=n))
    table["bytes"][:] = rng.integers(1 << 10, 1 << 24, size=n)
    table["pinned"][:] = rng.choice(np.array([-1, 0, 1], dtype=np.int8), size=n)
    pool = [f"void kernel_{i}<float, 128>(float*, float const*, int)" for i in range(names)]
    calls = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize"]
    picks = rng.integers(0, names, size=n)
    table["name"][:] = [(pool[p] if not a else calls[p % 4]) + "" for p, a in zip(picks.tolist(), api.tolist())]
    table["name"][:] = [s[:-1] + s[-1] for s in table["name"]]  # new str objects, not the pool's
    return table


def _time(label: str, n: int, repeats: int, kernels_only: bool = False) -> dict:
    """Best and worst of ``repeats``, each on a fresh table (so that no string hash is cached from a previous run)."""
    times = []
    for seed in range(repeats):
        table = random_table(n, seed=seed)
        if kernels_only:
            table["kind"][:] = KIND_CODE["kernel"]
        t0 = time.perf_counter()
        stats = statistics(table)
        times.append(time.perf_counter() - t0)
    print(f"{label} ({n:,} spans): best {min(times):.3f} s, worst {max(times):.3f} s of {repeats}  {stats!r}")
    return {"best_s": min(times), "worst_s": max(times), "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n_spans", nargs="?", type=int, default=1_000_000)
    parser.add_argument("repeats", nargs="?", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    n, repeats = args.n_spans, args.repeats
    statistics(random_table(1000))  # pandas' import (~0.3 s, once per process) is not the tables' time
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_cores": os.cpu_count(), "spans": n}
    results["mixed"] = _time("mixed trace", n, repeats)
    results["kernels_only"] = _time("every span a kernel", n, repeats, kernels_only=True)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
