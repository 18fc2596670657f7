"""What a fresh trace costs around one 16 x 64 MiB pipeline run, and where that time goes (needs a CUDA GPU, CuPy and
cupti-python).

    python benchmarks/bench_trace_start.py [--pairs 10] [--json out.json]

ABBA pairs of one ``Pipeline.run`` untraced and inside a fresh ``gw.trace()``, back to back and with 0.2 s between
runs (as between notebook cells), with timers around the trace's start and CUPTI's start and stop; then
``with gw.trace(): pass``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_any_cuda import pipeline_setup, traced_pairs  # noqa: E402

from gpuworkbench.trace import cupti as cupti_source  # noqa: E402
from gpuworkbench.trace import recorder  # noqa: E402

TIMES: dict[str, list[float]] = {}


def _timed(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            TIMES.setdefault(label, []).append((time.perf_counter_ns() - t0) / 1e6)

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="ABBA pairs per spacing (default 10)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    _timed(recorder.Trace, "start", "Trace.start")
    _timed(recorder.Trace, "_start_cupti", "CUPTI start for the trace (waits for the last trace's hand-over)")
    _timed(cupti_source.CuptiSource, "start", "CuptiSource.start")
    _timed(cupti_source.CuptiSource, "stop", "CuptiSource.stop")
    gw, _dev, pipe, inputs, outputs = pipeline_setup()
    with gw.trace():
        pipe.run(inputs[:1], outputs[:1])
    results = []
    for gap in (0.0, 0.2):
        TIMES.clear()
        pairs = traced_pairs(gw, pipe, inputs, outputs, args.pairs, gap)
        row = {
            "what": f"pipeline 16x64MiB, fresh trace per traced run, {gap} s between runs",
            "untraced_ms": statistics.median(p["untraced"] for p in pairs),
            "traced_ms": statistics.median(p["traced"] for p in pairs),
            "delta_ms_median": statistics.median(p["traced"] - p["untraced"] for p in pairs),
            "ratio_median": statistics.median(p["traced"] / p["untraced"] for p in pairs),
            "timers_ms_median": {k: statistics.median(v) for k, v in TIMES.items()},
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    empty = []
    for _ in range(30):
        t0 = time.perf_counter()
        with gw.trace():
            pass
        empty.append((time.perf_counter() - t0) * 1e3)
    row = {"what": "with gw.trace(): pass", "ms_median": statistics.median(empty), "ms_max": max(empty)}
    results.append(row)
    print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
