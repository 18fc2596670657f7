"""The counter tracks: a line per counter of a trace (``gw.trace(counters=True)``), on the timeline's ms axis.

Counters of one unit share an axis: the first unit's on the left (CPU shares from 0 to 100 %), each other unit's on
the right (bytes labelled as the memory plot labels them), so that "was the host busy while the device idled?" reads
straight down from the timeline when the figure shares its ``x_range``. A share (a % unit) is measured over the time
since the sample before: it is drawn across that time, as steps; other values (bytes) are drawn point to point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import (
    AdaptiveTicker,
    ColumnDataSource,
    CustomJSTickFormatter,
    DataRange1d,
    HoverTool,
    LinearAxis,
    PanTool,
    Range1d,
    ResetTool,
    SaveTool,
    WheelZoomTool,
)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from . import timeline_js

#: The device number of the host's counters, and its label.
HOST, HOST_LABEL = -1, "host"
#: Units whose values are shares from 0 to 100: their axis is fixed there.
PERCENT_UNITS = ("%", "% of all cores")
BYTE_UNITS = ("bytes", "B")
#: What an empty counters figure says.
EMPTY_NOTE = "no counters: record them with gw.trace(counters=True) or %%gpu --counters"


def counter_series(
    table: Mapping[str, np.ndarray], device_names: Mapping[int, str] | None, t0_ns: int
) -> list[tuple[str, str, dict[str, np.ndarray]]]:
    """Per counter (a device's name and unit, in order of first sample): (label, unit, columns ``t_ms`` from
    ``t0_ns``, ``value``, ``name``) in time order."""
    t_ns = np.asarray(table["time_ns"], dtype=np.int64)
    devices = np.asarray(table["device"]).astype(np.int64)
    names, units = np.asarray(table["name"], dtype=object), np.asarray(table["unit"], dtype=object)
    values = np.asarray(table["value"], dtype=np.float64)
    labels = dict(device_names or {})
    keys = list(dict.fromkeys(zip(devices.tolist(), names.tolist(), units.tolist())))
    out = []
    for device, name, unit in keys:
        rows = np.flatnonzero((devices == device) & (names == name) & (units == unit))
        rows = rows[np.argsort(t_ns[rows], kind="stable")]
        where = HOST_LABEL if device == HOST else labels.get(device, f"device {device}")
        label = f"{where}: {name}"
        t_ms, value = (t_ns[rows] - t0_ns) / 1e6, values[rows]
        if unit in PERCENT_UNITS:
            t_ms, value = interval_steps(t_ms, value)
        columns = {"t_ms": t_ms, "value": value, "name": [label] * t_ms.size}
        out.append((label, unit, columns))
    return out


def interval_steps(t_ms: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points that draw each value across the interval it was measured over, from the sample before to its own:
    (t0, v0), (t0, v1), (t1, v1), (t1, v2), (t2, v2) ... (v0, the first, has no interval: NaN, a gap)."""
    if t_ms.size < 2:
        return t_ms, values
    x = np.empty(2 * t_ms.size - 1)
    y = np.empty(2 * t_ms.size - 1)
    x[0], y[0] = t_ms[0], values[0]
    x[1::2], x[2::2] = t_ms[:-1], t_ms[1:]
    y[1::2] = y[2::2] = values[1:]
    return x, y


def counters_figure(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    *,
    t0_ns: int | None = None,
    title: str = "counters",
    width: int = 1000,
    height: int = 220,
    x_range: Any = None,
) -> Any:
    """A Bokeh figure with a line per counter of ``table`` (``Trace.counters()``'s columns), an axis per unit.

    ``t0_ns`` is time zero of the ms axis (default: the first sample); pass the timeline's ``x_range`` to pan both
    together. Renderers are named ``counter:<label>`` ("counter:host: host CPU"); a gap in a line is a sample
    without a value (NaN)."""
    t_ns = np.asarray(table["time_ns"], dtype=np.int64)
    if t0_ns is None:
        t0_ns = int(t_ns.min()) if t_ns.size else 0
    series = counter_series(table, device_names, t0_ns)
    units = list(dict.fromkeys(unit for _, unit, _ in series))
    wheel = WheelZoomTool(dimensions="width")
    pan = PanTool(dimensions="width")
    hover = HoverTool(tooltips=[("", "@name"), ("time", "@t_ms{0,0.000} ms"), ("value", "@value{0,0.[00]}")])
    options: dict[str, Any] = {"x_range": x_range} if x_range is not None else {}
    if not series:
        options.setdefault("x_range", Range1d(0, 1))
        options["y_range"] = Range1d(0, 1)
    fig = figure(
        title=title if series else f"{title}: none recorded",
        width=width,
        height=height,
        x_axis_label="time since trace start (ms)",
        y_axis_label=units[0] if units else "",
        tools=[pan, wheel, ResetTool(), SaveTool(), hover],
        active_drag=pan,
        active_scroll=wheel,
        sizing_mode="stretch_width",
        **options,
    )
    fig.toolbar.logo = None
    if not series:
        fig.yaxis.visible = False
        fig.text(x=[0], y=[0.5], text=[EMPTY_NOTE], text_font_size="10pt", text_baseline="middle", x_offset=8)
        return fig
    by_unit: dict[str, list[Any]] = {unit: [] for unit in units}
    for i, (label, unit, columns) in enumerate(series):
        extra = {} if unit == units[0] else {"y_range_name": unit}
        line = fig.line(
            "t_ms",
            "value",
            source=ColumnDataSource(columns),
            line_width=2,
            color=Category10_10[i % len(Category10_10)],
            legend_label=f"{label} ({unit})",
            name=f"counter:{label}",
            **extra,
        )
        by_unit[unit].append(line)
    fig.y_range = _unit_range(units[0], by_unit[units[0]])
    _style_axis(fig.yaxis[0], units[0])
    for unit in units[1:]:
        fig.extra_y_ranges[unit] = _unit_range(unit, by_unit[unit])
        axis = LinearAxis(y_range_name=unit, axis_label=unit)
        _style_axis(axis, unit)
        fig.add_layout(axis, "right")
    fig.legend.location = "top_left"
    fig.legend.label_text_font_size = "8pt"
    fig.legend.click_policy = "hide"
    return fig


def _unit_range(unit: str, renderers: list[Any]) -> Any:
    """The y range of one unit's lines: 0-100 for shares (a little room above, so that 100 % is not the frame), else
    fitted to those lines only (from 0 for bytes)."""
    if unit in PERCENT_UNITS:
        return Range1d(0, 105)
    if unit in BYTE_UNITS:
        return DataRange1d(renderers=renderers, start=0)
    return DataRange1d(renderers=renderers)  # Bokeh refuses start=None given explicitly


def _style_axis(axis: Any, unit: str) -> None:
    """Bytes ticked at powers of two and written as the memory plot writes them (``timeline_js.BYTE_TICKS``)."""
    if unit in BYTE_UNITS:
        axis.ticker = AdaptiveTicker(base=2, mantissas=[1], min_interval=1, num_minor_ticks=0)
        axis.formatter = CustomJSTickFormatter(code=timeline_js.BYTE_TICKS)


def trace_counters_plot(trace: Any, **kw: Any) -> Any:
    """``Trace.counters_plot``: the counters figure of a whole trace, on the same time axis as its timeline."""
    from .memory import trace_memory_t0
    from .timeline import device_names

    if "t0_ns" not in kw:
        kw["t0_ns"] = trace_memory_t0(trace)
    return counters_figure(trace.counters(), device_names(trace), **kw)
