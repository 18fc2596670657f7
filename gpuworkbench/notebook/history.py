"""The traces this kernel captured: one record per ``%%gpu`` cell or ``%gpu load``, newest last.

The magics append to :data:`history`; the JupyterLab panel lists it and draws its timelines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..trace.spans import KIND_CODE

if TYPE_CHECKING:
    from ..trace.recorder import Trace

#: How many traces :data:`history` keeps (the oldest go first).
HISTORY_LIMIT = 100
#: The execution count of a record made by the cell still running; :func:`number_cells` replaces it.
RUNNING_CELL = -1
#: Span kinds that are device work: a trace without any has nothing to show.
_WORK_CODES = [KIND_CODE[kind] for kind in ("h2d", "d2h", "d2d", "memset", "kernel")]


@dataclass
class TraceRecord:
    """One ``%%gpu`` cell: when it ran, how long, its headline figures and the Trace itself.

    Figures are None when the cell raised, traced no device work, or the figure does not apply (no copies).
    """

    execution_count: int | None
    started: float  # Unix time (s) when the cell started
    wall_s: float
    window_ns: tuple[int, int]  # the summary's window W on the trace clock: the cell's wall time (see GpuMagics)
    overlap_pct: float | None
    efficiency: float | None
    idle_pct: float | None
    trace: Trace
    name: str | None = None  # the ``-o`` name, if any
    error: str | None = None  # repr of the exception the cell raised, if any
    source: str | None = None  # the file ``%gpu load`` read the trace from (its window is then the trace's own)

    def take_figures(self, summary: Any) -> None:
        """Fill overlap, pipeline efficiency and idle time from ``summary`` (a ``Trace.summary()``)."""
        self.overlap_pct, self.efficiency = summary.overlap_pct, summary.pipeline_efficiency
        self.idle_pct = summary.idle_pct


#: Every trace captured by ``%%gpu`` (or read by ``%gpu load``) in this kernel, oldest first (at most HISTORY_LIMIT).
history: list[TraceRecord] = []


def keep(record: TraceRecord) -> None:
    """Append ``record`` to :data:`history`, dropping the oldest beyond :data:`HISTORY_LIMIT`."""
    history.append(record)
    del history[:-HISTORY_LIMIT]


def find(trace_id: int | None) -> TraceRecord:
    """The record of ``trace_id`` (None: the newest), or a LookupError a user can read."""
    if not history:
        raise LookupError("no trace yet: run a cell under %%gpu first")
    if trace_id is None:
        return history[-1]
    for record in history:
        if record.trace.id == trace_id:
            return record
    raise LookupError(f"trace {trace_id} is no longer in this kernel's history (it keeps the last {len(history)})")


def device_work(table: dict[str, np.ndarray]) -> np.ndarray:
    """A mask of the rows of ``table`` (a ``Trace.table()``) that are device work: copies, memsets, kernels."""
    return np.isin(table["kind"], _WORK_CODES)


def number_cells(result: Any) -> None:
    """IPython's post_run_cell hook: give records made during the cell just run that cell's number. Inside a running
    cell IPython 9's ``execution_count`` already names the next cell."""
    for record in reversed(history):
        if record.execution_count != RUNNING_CELL:
            break
        record.execution_count = result.execution_count
