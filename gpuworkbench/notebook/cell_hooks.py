"""What runs around every cell once the extension is loaded: CUPTI readied before a cell that traces and let go
before one that does not, made ready again while the kernel is idle between cells, and the traces a cell captured
numbered with that cell after it."""

from __future__ import annotations

import re
import time
from typing import Any

from ..trace import cupti
from ..trace.cupti.phase import Phase
from .history import number_cells

#: Words in a cell's source that say it traces (or asks about CUPTI): CUPTI lingering after a trace is kept for it.
TRACING_WORDS = ("%%gpu", "%gpu live", "%gpu cupti", "trace(", "gw.dask", ".live(")
#: A cell that traces on this process's GPUs (``gw.trace(``, not ``gw.load_trace(`` or ``gw.dask.trace(``): CUPTI is
#: made ready for its trace before it runs.
TRACES_HERE = re.compile(r"%%gpu|%gpu live|\.live\(|(?<!\w)(?<!dask\.)trace\(")

#: What the pre-run hook last did to CUPTI, and how long it took (ms); ``%gpu cupti`` reports it.
last_done: tuple[str, float] | None = None
#: What the kernel last did to CUPTI while idle between cells, and how long it took (ms).
last_between: tuple[str, float] | None = None
#: Whether a cell that does not trace lets go a CUPTI that is only ready (initialized, no kind on): ``cuptiFinalize``
#: costs the pre-run hook ~2.5 ms (H200), while ready costs an empty launch a few % (``docs/cupti.md``).
LET_GO_READY = False
#: How long after a cell's end the kernel's event loop readies CUPTI for the next cell (s).
IDLE_AFTER_S = 0.005


def register(ipython: Any) -> None:
    """Register the hooks on ``ipython`` once, and tell CUPTI it serves a notebook: it is attached for the cells that
    trace, before they run, not on a timer."""
    callbacks = ipython.events.callbacks
    if number_cells not in callbacks["post_run_cell"]:
        # before the panel's own post_run_cell hook (registered after this), so the panel sees the right number
        ipython.events.register("post_run_cell", number_cells)
    if ready_cupti_for_cell not in callbacks["pre_run_cell"]:
        ipython.events.register("pre_run_cell", ready_cupti_for_cell)
    loop = getattr(getattr(ipython, "kernel", None), "io_loop", None)  # a Jupyter kernel's; a terminal has none
    if loop is not None and not any(
        isinstance(getattr(c, "__self__", None), IdleAfterCell) for c in callbacks["post_run_cell"]
    ):
        ipython.events.register("post_run_cell", IdleAfterCell(loop).schedule)
    cupti.set_notebook(True)


class IdleAfterCell:
    """Schedules ``between_cells`` on the kernel's event loop after each cell: it runs once the cell's reply is sent,
    while the kernel waits for the next, so that the next pre-run hook finds CUPTI ready (no attach in a hook)."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop

    def schedule(self, _result: Any = None) -> None:
        self.loop.call_later(IDLE_AFTER_S, between_cells)


def between_cells() -> None:
    """CUPTI made ready for the next cell (``cupti.between_cells``), outside every cell; never raises."""
    global last_between
    t0 = time.perf_counter_ns()
    try:
        done = cupti.between_cells()
    except Exception as exc:  # noqa: BLE001  nothing between cells may break the kernel; the next hook does its part
        done = f"failed: {exc!r}"
    if done:
        last_between = (done, (time.perf_counter_ns() - t0) / 1e6)


def ready_cupti_for_cell(info: Any) -> None:
    """Before each cell, on the kernel's thread, outside the cell's own time: for a cell that traces, attach CUPTI if
    it was let go, park a source for the cell's trace to take over and prime it on this thread
    (``cupti.warm_for_cell``); for a cell that does not, let go an attached CUPTI that would slow every CUDA call of
    the cell (a source lingering after a trace: an empty launch 1.5 ×; left attached by torch.profiler: 1.7 × on an
    H100). CUPTI only ready (what the kernel leaves between cells) stays so unless ``LET_GO_READY``: finalizing it
    would cost this hook ~2.5 ms, more than ready costs most cells. Cells that ask about CUPTI (``%gpu cupti``) or
    trace on Dask workers leave it as it is; so does a trace or a torch.profiler that still records."""
    global last_done
    t0 = time.perf_counter_ns()
    cupti.settle(1.0)  # a re-initialization under way (one armed before %load_ext)
    source = getattr(info, "raw_cell", "") or ""
    done = ""
    if TRACES_HERE.search(source):
        attached = not cupti.detached()
        if cupti.warm_for_cell():
            done = "made CUPTI ready for the cell's trace" if attached else "attached CUPTI for the cell's trace"
    elif not any(word in source for word in TRACING_WORDS) and not cupti.detached():
        # refused while a trace, a block or another tool (torch.profiler recording) holds CUPTI
        if (LET_GO_READY or cupti.LIFECYCLE.phase is not Phase.READY) and cupti.let_go():
            done = "let CUPTI go for the untraced cell"
    if done:
        last_done = (done, (time.perf_counter_ns() - t0) / 1e6)
