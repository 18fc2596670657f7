"""Where a fresh trace's start goes, step by step, on a CPU that has idled 0.2 s as between notebook cells (needs a
CUDA GPU, CuPy and cupti-python).

    python benchmarks/probes/trace_start_steps.py [--rounds 16] [--ready]

Per round, in alternating order: one 16 x 64 MiB pipeline run untraced (CUPTI let go first: the baseline), and one
inside a fresh ``gw.trace()`` that takes over the source two traced cells left lingering, per ``--quiet-by`` value
(``cupti.QUIET_BY``: who turns the taken-over watch's callbacks off), and with ``--ready`` one from *ready* (CUPTI let
go by an untraced run after a traced one, and initialized again with no kind on); 0.2 s before each. Each step of the
traced start is timed by a wrapper (which adds its own ~1 µs warm), and so is the run's first op (its first H2D's
``copy_from_host_async``); only steps done inside the timed run count (not the harvester's after it, such as making the
next trace ahead). The harvest loop's first wake and the linger thread's ``_QUIET`` call are placed against the trace's
start. Prints per step the median µs over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_any_cuda import pipeline_setup, timed_run  # noqa: E402

from gpuworkbench.buffer import Buffer  # noqa: E402
from gpuworkbench.trace import cupti as cupti_source  # noqa: E402
from gpuworkbench.trace import harvest_threads, recorder  # noqa: E402
from gpuworkbench.trace.cupti import foreign as cupti_foreign  # noqa: E402

STEPS: dict[str, int] = {}  # label -> ns of this round (first call only)
MARKS: dict[str, int] = {}  # label -> perf_counter_ns when it happened (first time this round)


def _wrap(owner: object, name: str, label: str, first_only: bool = True) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        MARKS.setdefault(f"{label} in", t0)
        try:
            return original(*args, **kwargs)
        finally:
            t1 = time.perf_counter_ns()
            if first_only:
                STEPS.setdefault(label, t1 - t0)
            else:
                STEPS[label] = STEPS.get(label, 0) + t1 - t0
            MARKS.setdefault(f"{label} out", t1)

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument(
        "--quiet-by",
        nargs="+",
        default=[getattr(cupti_source, "QUIET_BY", "linger")],
        help="cupti.QUIET_BY values, one traced mode each",
    )
    parser.add_argument("--ready", action="store_true", help="a traced mode from ready too")
    args = parser.parse_args()
    gw, _dev, pipe, inputs, outputs = pipeline_setup()
    _wrap(recorder.Trace, "__init__", "Trace()")
    _wrap(recorder.Trace, "start", "Trace.start")
    _wrap(recorder.Trace, "_start_cupti", "_start_cupti")
    _wrap(cupti_source.CuptiSource, "__init__", "CuptiSource()")
    _wrap(cupti_source.CuptiSource, "start", "CuptiSource.start")
    _wrap(cupti_source.CuptiSource, "clock_sample", "clock_sample x2", first_only=False)
    _wrap(cupti_foreign.ForeignRecords, "__init__", "ForeignRecords()")
    _wrap(harvest_threads.HarvestThreads, "run", "harvest thread handed its loop")
    _wrap(recorder.Trace, "_harvest_loop", "harvest loop runs")
    _wrap(Buffer, "copy_from_host_async", "first H2D")
    _wrap(recorder.Trace, "stop", "Trace.stop")
    _wrap(cupti_source.CuptiSource, "_enable", "CuptiSource._enable (from ready)")
    _wrap(cupti_source.LIFECYCLE, "_subscribe_detach", "_subscribe_detach (from ready)")
    from cupti import cupti

    _wrap(cupti, "activity_enable", "activity_enable, all kinds (from ready)", first_only=False)
    linger = cupti_source.LIFECYCLE.linger_timer
    _wrap(linger, "_fn", "linger thread's call")

    def cell_before() -> None:
        with gw.trace() as t:
            pipe.run(inputs[:4], outputs[:4])
        t.wait_pending()
        time.sleep(0.05)

    cell_before()
    per: dict[str, list[float]] = {}
    modes = ["untraced"] + [f"traced, quiet by {q}" for q in args.quiet_by] + (["traced from ready"] * args.ready)
    runs: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            if mode == "untraced":
                cupti_source.let_go()
            elif mode == "traced from ready":
                cell_before()
                pipe.run(inputs[:4], outputs[:4])  # untraced: its first launch lets CUPTI go, initialized again soon
                deadline = time.monotonic() + 5
                while not cupti_source.state().startswith("ready") and time.monotonic() < deadline:
                    time.sleep(0.02)
            else:
                cupti_source.QUIET_BY = mode.rsplit(" ", 1)[1]
                cell_before()
                cell_before()
            time.sleep(0.2)
            STEPS.clear()
            MARKS.clear()
            t0 = time.perf_counter_ns()
            ms, t = timed_run(gw, pipe, inputs, outputs, mode != "untraced")
            steps, marks = dict(STEPS), dict(MARKS)  # what ran inside the run, not the harvester's work after it
            runs[mode].append(ms)
            if t is not None:
                t.wait_pending()
            for label, ns in steps.items():
                per.setdefault(f"{mode}: {label}", []).append(ns / 1e3)
            for label, at in marks.items():
                if label.endswith(" in") and label[:-3] in ("harvest loop runs", "linger thread's call", "first H2D"):
                    per.setdefault(f"{mode}: {label[:-3]} starts at", []).append((at - t0) / 1e3)
    for label in sorted(per):
        values = per[label]
        print(json.dumps({"step": label, "us_median": round(statistics.median(values), 1), "n": len(values)}))
    for mode in modes[1:]:
        deltas = [a - b for a, b in zip(runs[mode], runs["untraced"])]
        print(json.dumps({"step": f"run, {mode} - untraced", "ms_median": round(statistics.median(deltas), 3)}))

    cupti_source.let_go()


if __name__ == "__main__":
    main()
