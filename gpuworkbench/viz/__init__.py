"""Pictures of a trace (Bokeh): timeline, memory plot, source lines, all of them together, and the live dashboard.

Everything embeds BokehJS inline (``bokeh.resources.INLINE``), never from a CDN, because the machine may be offline.
The dashboard (ipywidgets + jupyter_bokeh) is imported on first use only.
"""

from __future__ import annotations

from typing import Any

from .._format import in_notebook
from .compare import comparison_figure
from .counters import counters_figure, trace_counters_plot
from .inline import inline_setup
from .memory import memory_figure, trace_memory_plot
from .palette import KIND_COLORS, STATE_COLORS
from .source_view import source_figure
from .timeline import timeline_figure, timeline_view, trace_timeline
from .timeline_data import DETAIL_LIMIT, WEBGL_THRESHOLD


def trace_layout(trace: Any, window: tuple[int, int] | None = None, summary: Any = None) -> Any:
    """Timeline, memory plot (sharing its time axis), the counter tracks where the trace sampled counters, the overview
    strip that moves them, and the summary table of a trace, as one Bokeh column; above them, where the trace recorded
    source lines, the source view (tapping a line picks out its spans on the timeline).

    ``window`` (start_ns, end_ns), e.g. a cell's wall time, is the summary's W instead of first-to-last op;
    ``summary``: that ``trace.summary(window=window)`` where the caller has it already.
    """
    from bokeh.layouts import column
    from bokeh.models import Div

    timeline, overview = trace_timeline(trace).children
    memory = trace_memory_plot(trace, x_range=timeline.x_range)
    if summary is None:
        summary = trace.summary(window=window)
    counters = [trace_counters_plot(trace, x_range=timeline.x_range)] if getattr(trace, "counting", False) else []
    parts = [timeline, memory, *counters, overview, Div(text=summary._repr_html_(), sizing_mode="stretch_width")]
    if getattr(trace, "locations", None):
        parts.insert(0, source_figure(trace, timeline))
    return column(*parts, sizing_mode="stretch_width")


def show_trace(trace: Any, window: tuple[int, int] | None = None, summary: Any = None) -> Any:
    """``Trace.show``: display timeline, memory and summary in a notebook (inline BokehJS); elsewhere return them.

    Returns None after displaying, so that the cell does not also print the layout's repr. In a notebook the layout
    is published as ``bokeh.io.show`` publishes it, without keeping it in ``curdoc()`` (``notebook_doc``), and a
    layout shaped as an earlier one is that one given the new trace's values (``reuse``).
    """
    if not inline_setup():
        return trace_layout(trace, window, summary)
    from . import notebook_doc

    if notebook_doc.fast_path_applies():
        try:
            if getattr(trace, "counting", False):  # counter tracks: not a kept shape (``reuse``); built each time
                notebook_doc.publish(trace_layout(trace, window, summary))
                return None
            from .reuse import show_trace_reused

            show_trace_reused(trace, window, summary, trace_layout)
            return None
        except (AttributeError, TypeError, KeyError):  # a Bokeh whose private model store differs: Bokeh's own show
            notebook_doc.FAILED.append(True)  # from now on (fast_path_applies says no)
    from bokeh.io import show

    show(trace_layout(trace, window, summary))
    return None


def warm_up() -> None:
    """Build, keep and encode (without showing) the layouts a first ``%%gpu`` cell most likely has: one device, its
    streams' state rows, the source view with the cell's lines, and a memory plot without samples (the cell allocated
    nothing) or with one device's (it did). Bokeh's imports and first-time set-up and the summary's are paid between
    cells after ``%load_ext``, the first cell shown is a refill (``reuse``) instead of a build, and the BokehJS loader
    it publishes is made already (``inline.prepare_inline``)."""
    from .inline import prepare_inline
    from .reuse import warm

    for memory in (False, True):
        warm(warm_up_trace(memory), trace_layout)
    prepare_inline()


def warm_up_trace(memory: bool) -> Any:
    """A small trace of a ``%%gpu`` cell's shape: an upload, a kernel and a download from three lines of a cell on
    one device's stream; ``memory``: with the device's memory samples (held and used bytes)."""

    from ..trace.columns import DeviceClock
    from ..trace.lines import Location
    from ..trace.recorder import Trace
    from ..trace.spans import empty_memory_table, table_from_records

    cell = "<gpuworkbench warm-up>"
    lines = ("x.copy_from_host(h)", "f(x, y)", "y.copy_to_host(h)")
    locations = [Location(cell, i + 1, "<module>", text=text) for i, text in enumerate(lines)]
    records = [
        {"kind": kind, "stream": 0, "start_ns": 1_000 * (2 * i + 1), "end_ns": 1_000 * (2 * i + 2), "name": name,
         "bytes": nbytes, "loc": i}
        for i, (kind, name, nbytes) in enumerate((("h2d", "copy", 4096), ("kernel", "f", 0), ("d2h", "copy", 4096)))
    ]  # fmt: skip
    memory_table = None
    if memory:
        memory_table = empty_memory_table(2)
        memory_table["t_ns"][:] = (500, 6_500)
        memory_table["held_bytes"][:] = (8192, 0)
        memory_table["used_bytes"][:] = (1 << 20, 1 << 20)
    clock = DeviceClock(key="device:0", name="device 0", source="records")
    return Trace.finished(
        table_from_records(records), {0: clock}, {}, memory_table, started_ns=1, stopped_ns=7_000, locations=locations
    )


def __getattr__(name: str) -> Any:
    if name in ("Live", "live"):
        from . import dashboard

        return getattr(dashboard, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DETAIL_LIMIT",
    "KIND_COLORS",
    "STATE_COLORS",
    "WEBGL_THRESHOLD",
    "comparison_figure",
    "counters_figure",
    "Live",
    "in_notebook",
    "inline_setup",
    "live",
    "memory_figure",
    "show_trace",
    "source_figure",
    "timeline_figure",
    "timeline_view",
    "trace_layout",
    "trace_memory_plot",
    "trace_counters_plot",
    "trace_timeline",
    "warm_up",
]
