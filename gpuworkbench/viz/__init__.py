"""Pictures of a trace (Bokeh): timeline, memory plot, the three together, and the live dashboard.

Everything embeds BokehJS inline (``bokeh.resources.INLINE``), never from a CDN, because the machine may be offline.
The dashboard (ipywidgets + jupyter_bokeh) is imported on first use only.
"""

from __future__ import annotations

import sys
from typing import Any

from .memory import memory_figure, trace_memory_plot
from .palette import KIND_COLORS, STATE_COLORS
from .timeline import DETAIL_LIMIT, WEBGL_THRESHOLD, timeline_figure, timeline_view, trace_timeline

_inline_loaded = False


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where ``show`` and widgets can display), False in a script or terminal IPython."""
    ipython_module = sys.modules.get("IPython")
    if ipython_module is None:
        return False
    shell = ipython_module.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def inline_setup(force: bool = False) -> bool:
    """Load BokehJS into the notebook from the Python package (no CDN), once; False outside a notebook kernel.

    Without it an offline notebook renders nothing and ``jupyter_bokeh.BokehModel`` waits forever.
    """
    global _inline_loaded
    if _inline_loaded and not force:
        return True
    if not in_notebook():
        return False
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(resources=INLINE, hide_banner=True)
    _inline_loaded = True
    return True


def trace_layout(trace: Any, window: tuple[int, int] | None = None) -> Any:
    """Timeline, memory plot (sharing its time axis), the overview strip that moves both, and the summary table of a
    trace, as one Bokeh column.

    ``window`` (start_ns, end_ns), e.g. a cell's wall time, is the summary's W instead of first-to-last op.
    """
    from bokeh.layouts import column
    from bokeh.models import Div

    timeline, overview = trace_timeline(trace).children
    memory = trace_memory_plot(trace, x_range=timeline.x_range)
    summary = Div(text=trace.summary(window=window)._repr_html_(), sizing_mode="stretch_width")
    return column(timeline, memory, overview, summary, sizing_mode="stretch_width")


def show_trace(trace: Any, window: tuple[int, int] | None = None) -> Any:
    """``Trace.show``: display timeline, memory and summary in a notebook (inline BokehJS); elsewhere return them.

    Returns None after displaying, so that the cell does not also print the layout's repr.
    """
    layout = trace_layout(trace, window)
    if not inline_setup():
        return layout
    from bokeh.io import show

    show(layout)
    return None


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
    "Live",
    "in_notebook",
    "inline_setup",
    "live",
    "memory_figure",
    "show_trace",
    "timeline_figure",
    "timeline_view",
    "trace_layout",
    "trace_memory_plot",
    "trace_timeline",
]
