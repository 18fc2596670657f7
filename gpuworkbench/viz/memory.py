"""The memory plot: bytes gpuworkbench holds on each device over time, beside the device's used total where known.

Drawn from the trace's memory samples (one per allocation or free) as step lines, on the timeline's ms axis, so that
a leak or a peak lines up with the spans that caused it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import (
    AdaptiveTicker,
    ColumnDataSource,
    CustomJSTickFormatter,
    FixedTicker,
    HoverTool,
    PanTool,
    Range1d,
    ResetTool,
    SaveTool,
    WheelZoomTool,
)
from bokeh.plotting import figure

from . import timeline_js
from .palette import DEVICE_COLORS

#: Binary units of the memory axis, each 1024 times the one before.
BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

#: The memory axis's label: short enough to fit beside the plot's height (240 px by default).
Y_LABEL = "bytes (1 KiB = 1024 B)"

#: What an empty memory plot says, at the height of its only tick, 0 B.
EMPTY_NOTE = "nothing allocated or freed while tracing: 0 B held throughout"


def byte_tick_labels(ticks: Any) -> list[str]:
    """Labels for byte ticks that tell every tick apart: the unit from the largest tick, the decimals from the
    spacing (the fewest that write each tick within 5 % of the spacing and no two alike). The browser runs the same
    rule (``timeline_js.BYTE_TICKS``), so "4.0 MiB" is never written five times down one axis."""
    values = [float(t) for t in ticks]
    if not values:
        return []
    top = max(abs(v) for v in values)
    unit = 0
    while unit < len(BYTE_UNITS) - 1 and top >= 1024.0 ** (unit + 1):
        unit += 1
    scale = 1024.0**unit
    gaps = [abs(b - a) for a, b in zip(values, values[1:]) if b != a]
    step = min(gaps) if gaps else scale
    decimals = 0
    for decimals in range(6):
        labels = [_fixed(v / scale, decimals) for v in values]
        exact = all(abs(float(label) * scale - v) <= 0.05 * step for label, v in zip(labels, values))
        if exact and len(set(labels)) == len(values):
            break
    return [f"{_fixed(v / scale, decimals)} {BYTE_UNITS[unit]}" for v in values]


def _fixed(value: float, decimals: int) -> str:
    """``value`` with ``decimals`` decimals, as JavaScript's ``toFixed`` writes it (halves away from zero)."""
    from decimal import ROUND_HALF_UP, Decimal

    return str(Decimal(repr(value)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


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
    hover = HoverTool(tooltips=[("", "$name"), ("time", "@t_ms{0,0.000} ms"), ("bytes", "@bytes{0,0} B")])
    empty = not t_ns.size
    options: dict[str, Any] = {"x_range": x_range} if x_range is not None else {}
    if empty:  # no bytes to show: an axis from 0 that says nothing was held, not one from -1 B to 1 B
        options.setdefault("x_range", Range1d(0, 1))
        options["y_range"] = Range1d(0, 1)
    fig = figure(
        title=title if not empty else f"{title}: no memory samples (nothing allocated or freed while tracing)",
        width=width,
        height=height,
        x_axis_label="time since trace start (ms)",
        y_axis_label=Y_LABEL,
        tools=[pan, wheel, ResetTool(), SaveTool(), hover],
        active_drag=pan,
        active_scroll=wheel,
        sizing_mode="stretch_width",
        **options,
    )
    fig.toolbar.logo = None
    # Ticks at multiples of a power of two, labelled in the unit and decimals that keep them apart.
    fig.yaxis.ticker = (
        FixedTicker(ticks=[0]) if empty else AdaptiveTicker(base=2, mantissas=[1], min_interval=1, num_minor_ticks=0)
    )
    fig.yaxis.formatter = CustomJSTickFormatter(code=timeline_js.BYTE_TICKS)
    for device, label, color, held, used in memory_series(memory_table, device_names, t0_ns):
        fig.step(
            "t_ms",
            "bytes",
            source=ColumnDataSource(held),
            mode="after",
            line_width=2,
            color=color,
            legend_label=f"{label}: held by gpuworkbench",
            name=f"held:{device}",
        )
        if used is not None:
            fig.step(
                "t_ms",
                "bytes",
                source=ColumnDataSource(used),
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
        fig.text(
            x=[0],
            y=[0.5],
            text=[EMPTY_NOTE],
            text_font_size="10pt",
            text_baseline="middle",
            x_offset=8,
            name="empty",
        )
    return fig


def memory_series(
    memory_table: Mapping[str, np.ndarray], device_names: Mapping[int, str] | None, t0_ns: int
) -> list[tuple[int, str, str, dict[str, np.ndarray], dict[str, np.ndarray] | None]]:
    """Per device: (device, label, colour, its held-bytes steps, its used-bytes steps or None where never known), the
    steps as columns ``t_ms`` (from ``t0_ns``) and ``bytes``."""
    t_ns = np.asarray(memory_table["t_ns"], dtype=np.int64)
    devices = np.asarray(memory_table["device"])
    held = np.asarray(memory_table["held_bytes"], dtype=np.float64)
    used = np.asarray(memory_table["used_bytes"], dtype=np.float64)
    names = dict(device_names or {})
    out = []
    for i, device in enumerate(int(d) for d in np.unique(devices)):
        rows = np.flatnonzero(devices == device)
        rows = rows[np.argsort(t_ns[rows], kind="stable")]
        t_ms = (t_ns[rows] - t0_ns) / 1e6
        known = used[rows] >= 0
        used_steps = {"t_ms": t_ms[known], "bytes": used[rows][known]} if known.any() else None
        label = names.get(device, f"device {device}")
        color = DEVICE_COLORS[i % len(DEVICE_COLORS)]
        out.append((device, label, color, {"t_ms": t_ms, "bytes": held[rows]}, used_steps))
    return out


def trace_memory_t0(trace: Any) -> int:
    """Time zero of a trace's memory plot: the timeline's."""
    from .timeline import trace_start_ns

    return trace.started_ns or trace_start_ns(trace, trace.table(wait=False))


def trace_memory_plot(trace: Any, **kw: Any) -> Any:
    """``Trace.memory_plot``: the memory figure of a whole trace, on the same time axis as its timeline."""
    from .timeline import device_names

    memory = trace.memory_table()
    if "t0_ns" not in kw:
        kw["t0_ns"] = trace_memory_t0(trace)
    return memory_figure(memory, device_names(trace), **kw)
