"""Where a ``%%gpu --no-show`` cell's time goes after its code returns (GPU machine, PyTorch): the CUPTI wait
(``Trace.wait_pending``: the harvester's last harvest, and its end), the table, the summary; then a cProfile of the
magic's ``_summarise`` over a few cells.

    python benchmarks/probes/cell_end.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_notebook_cells import LOOP, SHOWN_TORCH_SETUP, SHOWN_TORCH_WORK  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    from IPython.core.interactiveshell import InteractiveShell

    from gpuworkbench.notebook.magics import GpuMagics
    from gpuworkbench.trace.recorder import Trace

    shell = InteractiveShell.instance()
    shell.kernel = type("Kernel", (), {"io_loop": LOOP})()
    shell.run_cell("%load_ext gpuworkbench", store_history=False).raise_error()
    shell.run_cell(SHOWN_TORCH_SETUP, store_history=False).raise_error()
    ms: dict[str, list[float]] = {}

    def timed(owner, name: str):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return original(*a, **k)
            finally:
                ms.setdefault(name, []).append((time.perf_counter_ns() - t0) / 1e6)

        setattr(owner, name, wrapper)

    for owner, name in ((Trace, "wait_pending"), (Trace, "table"), (Trace, "summary"), (GpuMagics, "_summarise")):
        timed(owner, name)
    cell = "%%gpu --no-show\n" + SHOWN_TORCH_WORK
    for _ in range(2):
        shell.run_cell(cell, store_history=False).raise_error()
        LOOP.idle(0.2)
    ms.clear()
    prof = cProfile.Profile()
    summarise = GpuMagics._summarise

    def profiled(self, record):  # the magic's work after the code returned, under the profiler
        prof.enable()
        try:
            return summarise(self, record)
        finally:
            prof.disable()

    GpuMagics._summarise = profiled
    for _ in range(args.rounds):
        shell.run_cell(cell, store_history=False).raise_error()
        LOOP.idle(0.2)
    for name, values in ms.items():
        print(f"{name}: median {statistics.median(values):.2f} ms over {len(values)} calls")
    print(f"== cProfile of _summarise over {args.rounds} cells (cumulative, gpuworkbench's and numpy's)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats("gpuworkbench|numpy", 28)
    print("== by own time")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
