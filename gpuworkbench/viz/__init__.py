"""Pictures of a trace (Bokeh): timeline, memory plot, source lines, all of them together, and the live dashboard.

Everything embeds BokehJS inline (``bokeh.resources.INLINE``), never from a CDN, because the machine may be offline.
The dashboard (ipywidgets + jupyter_bokeh) is imported on first use only.
"""

from __future__ import annotations

from typing import Any

from .._format import in_notebook
from .compare import comparison_figure
from .inline import inline_setup
from .memory import memory_figure, trace_memory_plot
from .palette import KIND_COLORS, STATE_COLORS
from .source_view import source_figure
from .timeline import timeline_figure, timeline_view, trace_timeline
from .timeline_data import DETAIL_LIMIT, WEBGL_THRESHOLD


def trace_layout(trace: Any, window: tuple[int, int] | None = None, summary: Any = None) -> Any:
    """Timeline, memory plot (sharing its time axis), the overview strip that moves both, and the summary table of a
    trace, as one Bokeh column; above them, where the trace recorded source lines, the source view (tapping a line
    picks out its spans on the timeline).

    ``window`` (start_ns, end_ns), e.g. a cell's wall time, is the summary's W instead of first-to-last op;
    ``summary``: that ``trace.summary(window=window)`` where the caller has it already.
    """
    from bokeh.layouts import column
    from bokeh.models import Div

    timeline, overview = trace_timeline(trace).children
    memory = trace_memory_plot(trace, x_range=timeline.x_range)
    if summary is None:
        summary = trace.summary(window=window)
    parts = [timeline, memory, overview, Div(text=summary._repr_html_(), sizing_mode="stretch_width")]
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
    from .notebook_doc import fast_path_applies

    if fast_path_applies():
        from .reuse import show_trace_reused

        show_trace_reused(trace, window, summary, trace_layout)
        return None
    from bokeh.io import show

    show(trace_layout(trace, window, summary))
    return None


def warm_up() -> None:
    """Build and encode (without showing) the layout of a two-span trace once: Bokeh's imports, its first-time model
    set-up and the summary's, paid between cells after ``%load_ext`` instead of by the first ``%%gpu`` cell shown."""
    from ..trace.recorder import Trace
    from .notebook_doc import notebook_bundle

    trace = Trace.from_records(
        [
            {"kind": "api", "stream": -2, "start_ns": 0, "end_ns": 1_000, "name": "cudaLaunchKernel", "corr": 1},
            {"kind": "kernel", "stream": 0, "start_ns": 2_000, "end_ns": 5_000, "name": "warm_up", "corr": 1},
        ]
    )
    notebook_bundle(trace_layout(trace))


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
    "trace_timeline",
    "warm_up",
]
