"""Where attaching CUPTI again goes, step by step, and what letting it go costs (needs a CUDA GPU, CuPy and
cupti-python).

    python benchmarks/probes/cupti_attach.py [--rounds 6]

Per round: a warmed process lets CUPTI go (``cupti.let_go``, timed: ``cuptiFinalize``), waits 0.3 s, then times
``with gw.trace(): <one empty launch>`` with timers on each step of the attach (buffer callbacks, the detach's
subscriber, each activity kind, the API filter), and the first launches inside it one by one. Then the empty-launch
loop right after a let-go, in 2 ms slices, shows how long launches stay slower after ``cuptiFinalize``, and the same
loop while ``cupti.reattach_soon`` initializes CUPTI again on a thread of ours what that costs the launching thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_any_cuda import time_calls  # noqa: E402

STEPS: dict[str, list[float]] = {}


def _timed(owner: object, name: str, label: str | None = None) -> None:
    time_calls(owner, name, label or "enable", STEPS, per_arg=name == "activity_enable")


def _emit(what: str, values: list[float]) -> None:
    row = {"what": what, "ms_median": round(statistics.median(values), 3), "all": [round(x, 2) for x in values]}
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    import cupy as cp
    from cupti import cupti

    import gpuworkbench as gw
    from gpuworkbench.trace import cupti as source_mod

    kernel = cp.RawKernel('extern "C" __global__ void e() {}', "e")
    for _ in range(200):
        kernel((1,), (1,), ())
    cp.cuda.Device().synchronize()
    with gw.trace() as t:
        kernel((1,), (1,), ())
    t.wait_pending()

    _timed(cupti, "activity_enable")
    _timed(source_mod.binding.RawCupti, "register", "register buffer callbacks")
    _timed(source_mod.LIFECYCLE, "_subscribe_detach", "subscribe (detach)")
    _timed(source_mod.CuptiSource, "_filter_api", "API filter")
    _timed(source_mod.CuptiSource, "_enable", "enable (all of it)")
    _timed(source_mod.CuptiSource, "start", "CuptiSource.start")
    _timed(source_mod.LIFECYCLE.clock, "await_rate", "await tick rate")
    first: list[list[float]] = []
    total: list[float] = []
    finalize: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter_ns()
        if not source_mod.let_go():
            raise SystemExit(f"CUPTI could not be let go: {source_mod.state()}")
        finalize.append((time.perf_counter_ns() - t0) / 1e6)
        time.sleep(0.3)
        t0 = time.perf_counter_ns()
        with gw.trace() as t:
            times = []
            for _ in range(5):
                a = time.perf_counter_ns()
                kernel((1,), (1,), ())
                times.append((time.perf_counter_ns() - a) / 1e3)
        total.append((time.perf_counter_ns() - t0) / 1e6)
        t.wait_pending()
        first.append(times)
    _emit("cuptiFinalize (let_go)", finalize)
    _emit("with gw.trace(): 5 launches, attaching again", total)
    for key, values in STEPS.items():
        print(
            json.dumps(
                {
                    "step": key,
                    "ms_median": round(statistics.median(values), 3),
                    "n": len(values),
                    "max": round(max(values), 3),
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "what": "first 5 launches in the trace, us (median per position)",
                "us": [round(statistics.median(r[i] for r in first), 2) for i in range(5)],
            }
        ),
        flush=True,
    )

    # launches right after a let-go, in slices
    def slice_us(n: int = 200) -> float:
        a = time.perf_counter_ns()
        for _ in range(n):
            kernel((1,), (1,), ())
        cp.cuda.Device().synchronize()
        return (time.perf_counter_ns() - a) / n / 1e3

    curves = []
    for _ in range(args.rounds):
        with gw.trace() as t:
            kernel((1,), (1,), ())
        t.wait_pending()
        source_mod.let_go()
        start = time.perf_counter()
        curve = []
        while time.perf_counter() - start < 0.2:
            curve.append((round((time.perf_counter() - start) * 1e3, 1), round(slice_us(), 2)))
        curves.append(curve)
        time.sleep(0.5)
    clean = statistics.median(slice_us() for _ in range(20))
    during = []
    for _ in range(args.rounds):  # launches while CUPTI is initialized again on our thread
        with gw.trace() as t:
            kernel((1,), (1,), ())
        t.wait_pending()
        source_mod.let_go()
        time.sleep(0.3)
        start = time.perf_counter()
        curve, armed = [], False
        while time.perf_counter() - start < 0.1:
            if not armed and time.perf_counter() - start > 0.02:
                source_mod.reattach_soon(0.0)
                armed = True
            curve.append(slice_us())
        source_mod.settle(5)
        during.append(curve)
        time.sleep(0.3)
    print(
        json.dumps(
            {
                "what": "launch us in slices of 200 while CUPTI is initialized again 20 ms in",
                "clean_us": round(clean, 2),
                "max_us": [round(max(c), 2) for c in during],
                "sum_excess_ms": [round(sum(max(0.0, x - clean) * 200 for x in c) / 1e3, 2) for c in during],
                "curve0": [round(x, 2) for x in during[0]],
            }
        ),
        flush=True,
    )
    print(
        json.dumps(
            {
                "what": "launch us in slices of 200 after let_go (ms since, us)",
                "clean_us": round(clean, 2),
                "curve0": curves[0][:40],
                "curve1": curves[1][:40],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
