"""What a fresh trace costs around one 16 x 64 MiB pipeline run, against the same run in a process state as if it
never traced (needs a CUDA GPU, CuPy and cupti-python).

    python benchmarks/bench_trace_start.py [--rounds 10] [--json out.json]

Per round, in alternating order, 0.2 s between runs (as between notebook cells), seven runs:
``untraced``: CUPTI let go first (``cupti.let_go``: the state of a process that never traced);
``traced``: inside a fresh ``gw.trace()`` that takes over the source a trace of 4 batches 0.2 s before left
lingering, itself taken over from a trace before it (traced cells after traced cells; each source is primed as it
parks unless ``GPUWB_CUPTI_PRIME=0``);
``traced, CUPTI ready``: CUPTI let go and initialized again with no kind on (``cupti.reattach_soon``, as after an
untraced notebook cell), so the trace enables its kinds;
``untraced, CUPTI ready``: no trace, in that state (what untraced work pays once a process has traced);
``untraced, after a trace``: no trace, 0.2 s after a traced one (its first launch lets the lingering source go);
``untraced, CUPTI recording``: no trace, while a source lingers with the watch off: what CUPTI itself costs the run;
``traced, attaching``: CUPTI let go first, so the trace attaches it again.
Then ``with gw.trace(): pass`` taking over a lingering source, with timers on the trace's start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_any_cuda import pipeline_setup, time_calls, timed_run  # noqa: E402
from bench_common import write_json

from gpuworkbench.trace import cupti as cupti_source  # noqa: E402
from gpuworkbench.trace import recorder  # noqa: E402
from gpuworkbench.trace.cupti.detach import ExitDetach  # noqa: E402
from gpuworkbench.trace.spans import KIND_CODE  # noqa: E402

TIMES: dict[str, list[float]] = {}
GAP_S = 0.2


def _timed(owner: object, name: str, label: str) -> None:
    time_calls(owner, name, label, TIMES)


def _empty_trace(gw) -> None:
    with gw.trace() as t:
        pass
    t.wait_pending()  # its harvester parks the source as it ends


def _cells_before(gw, pipe, inputs, outputs) -> None:
    """Two traced runs of 4 batches, as traced cells before the one timed: each source parks as its trace ends, and
    the second takes the first's over."""
    for _ in range(2):
        with gw.trace() as t:
            pipe.run(inputs[:4], outputs[:4])
        t.wait_pending()
        time.sleep(0.05)


def run(gw, pipe, inputs, outputs, mode: str) -> float:
    """One timed run of ``mode`` after its untimed setup and the gap; ms."""
    if mode in ("untraced", "traced, attaching") or mode.endswith("ready"):
        if not cupti_source.let_go() and not cupti_source.detached():
            raise SystemExit("CUPTI could not be let go")
        if mode.endswith("ready"):
            cupti_source.reattach_soon(0.0)
            cupti_source.settle(5)
            if not cupti_source.state().startswith("ready"):
                raise SystemExit(f"CUPTI is not ready: {cupti_source.state()}")
    else:
        cupti_source.WATCH_UNTRACED = mode != "untraced, CUPTI recording"
        _cells_before(gw, pipe, inputs, outputs)
        cupti_source.WATCH_UNTRACED = True
    time.sleep(GAP_S)
    ms, t = timed_run(gw, pipe, inputs, outputs, mode.startswith("traced"))
    if t is not None:
        t.wait_pending()
        kernels = int((t.table()["kind"] == KIND_CODE["kernel"]).sum()) if len(t) else 0
        if kernels < len(inputs):
            raise SystemExit(f"{mode}: the trace holds {kernels} kernels, {len(inputs)} launched")
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the seven runs (default 10)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    gw, _dev, pipe, inputs, outputs = pipeline_setup()
    with gw.trace() as t:
        pipe.run(inputs[:1], outputs[:1])
    t.wait_pending()
    modes = [
        "untraced",
        "traced",
        "traced, CUPTI ready",
        "untraced, CUPTI ready",
        "untraced, after a trace",
        "untraced, CUPTI recording",
        "traced, attaching",
    ]
    ms: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            ms[mode].append(run(gw, pipe, inputs, outputs, mode))
    base = ms["untraced"]
    results = []
    for mode in modes:
        row = {
            "what": f"pipeline 16x64MiB: {mode}",
            "ms_median": statistics.median(ms[mode]),
            "delta_ms_median_of_rounds": statistics.median(a - b for a, b in zip(ms[mode], base)),
            "ratio_median_of_rounds": statistics.median(a / b for a, b in zip(ms[mode], base)),
            "all": [round(x, 2) for x in ms[mode]],
        }
        results.append(row)
        print(json.dumps(row), flush=True)
    _timed(recorder.Trace, "__init__", "Trace()")
    _timed(recorder.Trace, "start", "Trace.start")
    _timed(recorder.Trace, "_start_cupti", "Trace._start_cupti")
    _timed(recorder.WindowClock, "sample", "WindowClock.sample")
    _timed(recorder.HARVEST_THREADS, "run", "HarvestThreads.run")
    _timed(recorder.Trace, "stop", "Trace.stop")
    _timed(cupti_source.CuptiSource, "start", "CuptiSource.start")
    _timed(cupti_source.CuptiSource, "clock_sample", "CuptiSource.clock_sample")
    _timed(ExitDetach, "disarm", "ExitDetach.disarm")
    _timed(cupti_source.CuptiSource, "stop", "CuptiSource.stop (on the harvest thread)")
    empty = []
    _empty_trace(gw)
    for _ in range(30):
        time.sleep(0.02)
        t0 = time.perf_counter()
        with gw.trace() as t:
            pass
        empty.append((time.perf_counter() - t0) * 1e3)
        t.wait_pending()
    row = {
        "what": "with gw.trace(): pass, taking over a lingering source",
        "ms_median": statistics.median(empty),
        "ms_max": max(empty),
        "timers_ms_median": {k: statistics.median(v) for k, v in TIMES.items()},
    }
    results.append(row)
    print(json.dumps(row), flush=True)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
