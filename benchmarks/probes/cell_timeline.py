"""Where a shown ``%%gpu`` cell's time goes after its code returns, as a timeline: each step of the magic's end (the
trace's stop, the harvester's last harvests and CUPTI's flushes, the table, the summary, the picture's parts, the
display messages), on whichever thread runs it, as the median start and duration after the code returned.

    python benchmarks/probes/cell_timeline.py [--rounds 8] [--profile Trace._add_foreign ...]

``--profile``: a cProfile of the named steps (on whichever thread runs them) over the cells, printed after.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_notebook_cells import LOOP, shown_shell  # noqa: E402


def steps() -> list[tuple[object, str]]:
    """(owner, attribute) of every step timed."""
    import gpuworkbench.viz as viz
    from gpuworkbench.notebook.history import TraceRecord
    from gpuworkbench.notebook.magics import GpuMagics
    from gpuworkbench.trace.cupti.clock import TickClock
    from gpuworkbench.trace.cupti.decode import RecordDecoder
    from gpuworkbench.trace.cupti.join import ExternalIdJoin
    from gpuworkbench.trace.cupti.lifecycle import Lifecycle
    from gpuworkbench.trace.cupti.source import CuptiSource
    from gpuworkbench.trace.recorder import Trace
    from gpuworkbench.viz import notebook_doc, reuse

    return [
        (Trace, "stop"), (Trace, "wait_pending"), (Trace, "_harvest"), (Trace, "_add_foreign"),
        (Trace, "_finish_cupti"), (Trace, "table"), (Trace, "summary"), (TraceRecord, "take_figures"),
        (CuptiSource, "_flush_if_due"), (CuptiSource, "stop"), (CuptiSource, "flush_columns"),
        (RecordDecoder, "decode"), (ExternalIdJoin, "join"), (TickClock, "await_rate"), (Lifecycle, "park"),
        (GpuMagics, "_summarise"), (GpuMagics, "_show"), (viz, "trace_layout"), (reuse, "_layout"),
        (reuse, "_refill"), (reuse, "timeline_values"), (reuse, "memory_series"), (reuse, "_source_shape_holds"),
        (reuse, "_let_go"), (reuse, "publish"), (notebook_doc, "document_json"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--profile", nargs="*", default=[], help="steps to profile, e.g. Trace._add_foreign")
    args = parser.parse_args()
    profile = cProfile.Profile()
    shell, what, work = shown_shell()
    events: list[tuple[str, str, int, int]] = []
    main_thread = threading.main_thread()

    def wrap(owner: object, name: str) -> None:
        original = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}".replace("gpuworkbench.", "")

        profiled = label.split(".", 1)[-1] in args.profile or label in args.profile

        def timed(*a, **k):
            t0 = time.perf_counter_ns()
            if profiled:
                profile.enable()
            try:
                return original(*a, **k)
            finally:
                if profiled:
                    profile.disable()
                where = "main" if threading.current_thread() is main_thread else "thread"
                events.append((label, where, t0, time.perf_counter_ns()))

        setattr(owner, name, timed)

    for owner, name in steps():
        wrap(owner, name)
    publisher = shell.display_pub
    publish = publisher.publish

    def published(*a, **k):
        t0 = time.perf_counter_ns()
        publish(*a, **k)
        events.append(("display message", "main", t0, time.perf_counter_ns()))

    publisher.publish = published
    cell = "%%gpu\n" + work
    rows: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    ends: list[float] = []
    for r in range(args.rounds + 2):
        events.clear()
        shell.display_pub.outputs.clear()
        LOOP.idle(0.2)
        shell.run_cell(cell, store_history=False).raise_error()
        if r < 2:
            continue
        returned = next(t0 for label, _, t0, _ in events if label.endswith("Trace.stop"))
        seen: dict[tuple[str, str], int] = {}
        for label, where, t0, t1 in events:
            if t1 < returned:
                continue
            n = seen[(label, where)] = seen.get((label, where), 0) + 1
            rows.setdefault((label, where, n), []).append(((t0 - returned) / 1e6, (t1 - t0) / 1e6))
        ends.append(max(t1 for label, _, _, t1 in events if label == "display message") / 1e6 - returned / 1e6)
    end = statistics.median(ends)
    print(f"{what}; {args.rounds} cells; code returned -> last display message: median {end:.2f} ms")
    print(f"{'step':44} {'thread':7} {'#':>2} {'start ms':>9} {'took ms':>8} {'cells':>5}")
    order = sorted(rows.items(), key=lambda kv: statistics.median(s for s, _ in kv[1]))
    for (label, where, n), values in order:
        start = statistics.median(s for s, _ in values)
        took = statistics.median(d for _, d in values)
        print(f"{label:44} {where:7} {n:>2} {start:9.2f} {took:8.2f} {len(values):>5}")
    if args.profile:
        print(f"== cProfile of {', '.join(args.profile)} (cumulative)")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        print("== by own time")
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
