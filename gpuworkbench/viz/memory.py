"""The memory plot: bytes gpuworkbench holds on each device over time, beside the device's used total where known.

Drawn from the trace's memory samples (one per allocation or free) as step lines, on the timeline's ms axis, so that
a leak or a peak lines up with the spans that caused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool, NumeralTickFormatter, PanTool, ResetTool, SaveTool, WheelZoomTool
from bokeh.palettes import Category10_10
from bokeh.plotting import figure


def memory_figure(
    memory_table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    *,
    t0_ns: int | None = None,
    title: str = "memory",
    width: int = 1000,
    height: int = 240,
    x_range: Any = None,
) -> Any:
    """A Bokeh figure with, per device, a step line of held bytes and (dashed) the device's used bytes where known.

    ``t0_ns`` is time zero of the ms axis (default: the first sample); pass the timeline's ``x_range`` to pan both
    together. Renderers are named ``held:<device>`` and ``used:<device>``.
    """
    t_ns = np.asarray(memory_table["t_ns"], dtype=np.int64)
    if t0_ns is None:
        t0_ns = int(t_ns.min()) if t_ns.size else 0
    wheel = WheelZoomTool(dimensions="width")
    pan = PanTool(dimensions="width")
    hover = HoverTool(tooltips=[("", "$name"), ("time", "@t_ms{0,0.000} ms"), ("bytes", "@bytes{0.0 b}")])
    options: dict[str, Any] = {"x_range": x_range} if x_range is not None else {}
    fig = figure(
        title=title if t_ns.size else f"{title}: no memory samples (nothing allocated or freed while tracing)",
        width=width,
        height=height,
        x_axis_label="time since trace start (ms)",
        y_axis_label="bytes",
        tools=[pan, wheel, ResetTool(), SaveTool(), hover],
        active_drag=pan,
        active_scroll=wheel,
        sizing_mode="stretch_width",
        **options,
    )
    fig.toolbar.logo = None
    fig.yaxis.formatter = NumeralTickFormatter(format="0.0 b")
    devices = np.asarray(memory_table["device"])
    held = np.asarray(memory_table["held_bytes"], dtype=np.float64)
    used = np.asarray(memory_table["used_bytes"], dtype=np.float64)
    names = dict(device_names or {})
    for i, device in enumerate(int(d) for d in np.unique(devices)):
        rows = np.flatnonzero(devices == device)
        rows = rows[np.argsort(t_ns[rows], kind="stable")]
        t_ms = (t_ns[rows] - t0_ns) / 1e6
        label = names.get(device, f"device {device}")
        color = Category10_10[i % 10]
        fig.step(
            "t_ms",
            "bytes",
            source=ColumnDataSource({"t_ms": t_ms, "bytes": held[rows]}),
            mode="after",
            line_width=2,
            color=color,
            legend_label=f"{label}: held by gpuworkbench",
            name=f"held:{device}",
        )
        known = used[rows] >= 0
        if known.any():
            fig.step(
                "t_ms",
                "bytes",
                source=ColumnDataSource({"t_ms": t_ms[known], "bytes": used[rows][known]}),
                mode="after",
                line_width=1,
                line_dash="dashed",
                color=color,
                legend_label=f"{label}: used on the device",
                name=f"used:{device}",
            )
    if fig.renderers:
        fig.legend.location = "top_left"
        fig.legend.label_text_font_size = "8pt"
    else:  # nothing allocated: say so in the plot too (an empty figure makes Bokeh warn about missing renderers)
        fig.text(x=[0], y=[0], text=["no allocations or frees were traced"], text_font_size="10pt", name="empty")
    return fig


def trace_memory_plot(trace: Any, **kw: Any) -> Any:
    """``Trace.memory_plot``: the memory figure of a whole trace, on the same time axis as its timeline."""
    from .timeline import device_names, trace_start_ns

    memory = trace.memory_table()
    if "t0_ns" not in kw:
        kw["t0_ns"] = trace.started_ns or trace_start_ns(trace, trace.table(wait=False))
    return memory_figure(memory, device_names(trace), **kw)
