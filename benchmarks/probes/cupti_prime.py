"""What priming CUPTI as a source parks (``trace/cupti/prime.py``) saves the next op (needs a CUDA GPU, CuPy and
cupti-python).

    python benchmarks/probes/cupti_prime.py [--rounds 12] [--watch]

One 16 x 64 MiB pipeline run, 0.2 s after a traced run that took a parked source over and parked it again (a traced
cell after traced cells), per mode in alternating order: ``untraced`` (CUPTI let go first: the baseline),
``recording`` (no trace; the source lingers, watch off) and ``traced`` (a fresh trace takes it over), each with the
park primed or not (``cupti.PRIME_AT_PARK``). Prints, per mode, the median duration of the run's first op (its first
H2D's ``copy_from_host_async``) and of the whole run against the baseline's, µs. ``--watch``: the parked source
watches for untraced work (``cupti.WATCH_UNTRACED``, the default outside this probe), and ``recording`` is left out
(its untraced run would let CUPTI go).
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

FIRST: dict[str, int] = {}


def _time_first_copy() -> None:
    """Wrap ``Buffer.copy_from_host_async`` so that the first call after ``FIRST.clear()`` is timed."""
    original = Buffer.copy_from_host_async

    def wrapper(self, *args, **kwargs):
        if "in" in FIRST:
            return original(self, *args, **kwargs)
        FIRST["in"] = time.perf_counter_ns()
        try:
            return original(self, *args, **kwargs)
        finally:
            FIRST["out"] = time.perf_counter_ns()

    Buffer.copy_from_host_async = wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--watch", action="store_true", help="parked sources watch for untraced work")
    args = parser.parse_args()
    gw, _dev, pipe, inputs, outputs = pipeline_setup()
    _time_first_copy()
    cupti_source.WATCH_UNTRACED = args.watch  # off: the parked source stays parked through "recording"

    def cell_before() -> None:
        with gw.trace() as t:
            pipe.run(inputs[:2], outputs[:2])
        t.wait_pending()

    cell_before()
    modes = ["untraced", "recording", "recording, primed", "traced", "traced, primed"]
    if args.watch:
        modes = ["untraced", "traced", "traced, primed"]
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            if mode == "untraced":
                cupti_source.let_go()
            else:
                cupti_source.PRIME_AT_PARK = mode.endswith("primed")
                cell_before()  # takes the parked source over and parks it again, primed or not
                cell_before()
            time.sleep(0.2)
            FIRST.clear()
            ms, t = timed_run(gw, pipe, inputs, outputs, mode.startswith("traced"))
            runs[mode].append(((FIRST["out"] - FIRST["in"]) / 1e3, ms * 1e3))
            if t is not None:
                t.wait_pending()
    cupti_source.PRIME_AT_PARK = True
    cupti_source.let_go()
    base = runs["untraced"]
    for mode in modes:
        print(
            json.dumps(
                {
                    "mode": mode,
                    "first_op_us": round(statistics.median(f for f, _ in runs[mode]), 1),
                    "run_delta_us": round(statistics.median(a[1] - b[1] for a, b in zip(runs[mode], base)), 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
