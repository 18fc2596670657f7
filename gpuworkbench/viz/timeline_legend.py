"""The timeline's hover tooltips and its two legends (span kinds, overlap states), drawn under the rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, CustomJSHover, Legend, LegendItem
from bokeh.transform import factor_cmap, factor_hatch

from gpuworkbench.trace.analysis import STATES

from .palette import HOST_WAIT, HOST_WAIT_HATCH, STATE_COLORS, STATE_LABELS, STYLE_COLORS, STYLES
from .timeline_data import BAR_HEIGHT


def wait_hatch() -> Any:
    """Hatching for host waits, none for every other style (a new mapper per figure: models live in one document)."""
    return factor_hatch("style", [HOST_WAIT_HATCH if s == HOST_WAIT else " " for s in STYLES], list(STYLES))


def span_tooltips() -> list[tuple[str, str]]:
    """The hover tooltip of a span: name, kind, row, times, bytes and bandwidth, and what launched it when (a small
    timeline adds the line that issued it and a kernel's launch shape: ``build_timeline``)."""
    return [
        ("name", "@name"),
        ("kind", "@kind"),
        ("row", "@row"),
        ("start", "@left{0,0.000} ms"),
        ("duration", "@duration_us{0,0.0} µs"),
        ("bytes", "@bytes{custom}"),
        ("GB/s", "@gbps{custom}"),
        ("launched by", "@call"),
        ("launch latency", "@launch_us{custom} (start − call start)"),
        ("queued behind stream", "@queue_us{custom}"),
    ]


def _number_or_dash(decimals: int, unit: str = "") -> Any:
    """A hover formatter: the number with thousands separators and ``decimals`` decimals (and ``unit``), or "—" where
    the span has none (NaN: no bytes, no launching call), which Bokeh's own formats print as "NaN"."""
    return CustomJSHover(
        code=f"""
        if (value == null || Number.isNaN(value)) {{ return "—" }}
        return value.toLocaleString("en-US", {{minimumFractionDigits: {decimals}, maximumFractionDigits: {decimals}}})
            + "{unit}"
        """
    )


def span_formatters() -> dict[str, Any]:
    """The tooltip's formatters: a dash where a span has no such number (or no launch shape: not a kernel)."""
    return {
        "@bytes": _number_or_dash(0),
        "@gbps": _number_or_dash(2),
        "@launch_us": _number_or_dash(1, " µs"),
        "@queue_us": _number_or_dash(1, " µs"),
        "@launch": CustomJSHover(code='return value ? value : "—"'),
    }


_LEGEND_STYLE = {
    "label_text_font_size": "8pt",
    "glyph_height": 12,
    "glyph_width": 12,
    "spacing": 0,
    "title_text_font_size": "8pt",
    "title_text_font_style": "bold",
    "location": "top_left",
    "orientation": "horizontal",
}


def add_legends(fig: Any, styles_present: list[str], states: bool) -> None:
    """Two legends under the rows, across (they leave the plot its width in a narrow notebook or panel tab): the span
    kinds (and host waits) present, and the overlap states.

    They are drawn from a legend-only source whose glyphs sit at NaN (never visible), so they stay put while a large
    trace's drawn sources change with the view.
    """
    hatch = {"hatch_pattern": wait_hatch(), "hatch_color": "#ffffff", "line_color": None}
    kinds = {"style": styles_present}
    _legend(fig, "kind", kinds, STYLE_COLORS, STYLES, "style", "kinds", min(6, max(len(styles_present), 1)), **hatch)
    if states:
        data = {"state": list(STATES), "label": [STATE_LABELS[s] for s in STATES]}
        _legend(fig, "state", data, STATE_COLORS, STATES, "label", "overlap states (device strips)", 2,
                line_color="#bbbbbb")  # fmt: skip


def _legend(fig: Any, name: str, data: dict[str, list], colors: Mapping[str, str], factors: Sequence[str],
            label: str, title: str, ncols: int, **glyph: Any) -> None:  # fmt: skip
    """One legend: a swatch per row of ``data``, coloured by its first column (one of ``factors``), labelled by its
    column ``label``; the source and swatch are named "NAME legend", the legend "NAMEs legend"."""
    factor, n = next(iter(data)), len(next(iter(data.values())))
    source = ColumnDataSource({"y": [np.nan] * n, "x": [np.nan] * n, **data}, name=f"{name} legend")
    swatch = fig.hbar(
        y="y",
        left="x",
        right="x",
        height=BAR_HEIGHT,
        source=source,
        fill_color=factor_cmap(factor, [colors[f] for f in factors], list(factors)),
        name=f"{name} legend",
        **glyph,
    )
    legend = Legend(
        items=[LegendItem(label={"field": label}, renderers=[swatch])],
        title=title,
        name=f"{name}s legend",
        ncols=ncols,
        **_LEGEND_STYLE,
    )
    fig.add_layout(legend, "below")
