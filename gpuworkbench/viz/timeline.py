"""The timeline: a row per device stream and per host thread, the 8 overlap states under each device, launch links.

Host rows come first in each device's group: one per host thread (its API calls and ``gw.range`` / NVTX ranges; calls
that block the thread, a synchronize or a blocking copy, drawn hatched in the "host wait" style), then the workbench's
own row (allocations, markers, and where ops were enqueued from). Hovering or selecting a device span draws an arrow
from the call that launched it (the ``api`` span with the same ``corr``), or from its enqueue on the workbench's row,
to where it ran; the tooltip gives the launch latency (start minus the call's start) and how much of it the span
queued behind earlier work on its stream. Names are written on bars wide enough to hold them.

Up to ``DETAIL_LIMIT`` spans the figure's source holds every span. Above it the document carries every span in compact
typed arrays and the browser (``timeline_js.VIEW``) draws the spans in view when few enough are, otherwise cells per
(row, pixel column) with their counts and busy fraction (``aggregate``); an overview strip below the detail view
(``timeline_view``) moves and sizes the visible range. Columns are built with NumPy from the span table, never a
loop over spans; the live dashboard reuses ``RowLayout`` and ``span_columns`` to stream new spans into the figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.models import (
    Arrow,
    BoxZoomTool,
    ColumnDataSource,
    CustomJS,
    DataRange1d,
    FactorRange,
    HoverTool,
    PanTool,
    Range1d,
    RangeTool,
    ResetTool,
    SaveTool,
    TapTool,
    VeeHead,
    WheelZoomTool,
)
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from gpuworkbench.trace.analysis import STATES
from gpuworkbench.trace.device_limits import DeviceLimits, limits_of
from gpuworkbench.trace.lines import Location
from gpuworkbench.trace.spans import KIND_CODE

from . import timeline_js
from .aggregate import aggregate
from .coded import lookup, take
from .palette import HOST_WAIT, HOST_WAIT_HATCH, STATE_COLORS, STYLE_COLORS, STYLE_INK, STYLES
from .timeline_data import (
    ALL_COLORS,
    ALL_STYLES,
    BAR_HEIGHT,
    BUSY_STEPS,
    CELL_COLUMNS,
    CELL_PX,
    CHAR_PX,
    DETAIL_LIMIT,
    KIND_ALPHAS,
    KIND_HEIGHTS,
    LINK_COLOR,
    NEST_MIN,
    NEST_SHRINK,
    RANGE_KIND,
    SPAN_COLUMNS,
    STATE_COLUMNS,
    TIME_AXIS,
    WAIT_STYLE,
    WEBGL_THRESHOLD,
    RowLayout,
    cell_columns,
    compact_columns,
    launch_links,
    name_codes,
    span_columns,
    span_styles,
    state_columns,
)
from .timeline_legend import add_legends, span_formatters, span_tooltips

_ON_ROWS = {"y": "row", "left": "left", "right": "right"}  # every bar of a source with these columns sits on its row


def _empty(columns: Mapping[str, Any]) -> dict[str, list]:
    return {col: [] for col in columns}


@dataclass
class TimelineValues:
    """What a timeline shows of its table, before any Bokeh model: drawn sources' columns, the compact arrays, the
    style names present (the kinds legend) and the options they decide (``build_timeline`` and ``reuse`` read it)."""

    large: bool
    webgl: bool
    line_tip: bool  # the tooltip names each span's source line
    state_data: dict[str, Any] | None
    span_data: dict[str, Any]
    wait_data: dict[str, Any]
    cell_data: Mapping[str, Any]
    columns: dict[str, np.ndarray] | None
    names: list[str]
    max_dur: float
    present: list[str]


def timeline_values(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    *,
    width: int = 1000,
    webgl: bool | None = None,
    webgl_threshold: int = WEBGL_THRESHOLD,
    detail_limit: int = DETAIL_LIMIT,
    compact: bool = False,
    locations: Sequence[Location] | None = None,
) -> TimelineValues:
    """``build_timeline``'s data (its arguments have the same meaning); adds the table's rows to ``rows``."""
    n = len(table["kind"])
    links = launch_links(table)
    rows.add_table(table, links)
    names = name_codes(table)
    state_data = state_columns(table, rows, t0_ns) if rows.states else None
    large = max(n, len(state_data["left"]) if state_data else 0) > detail_limit
    if webgl is None:
        # A large timeline draws at most ``detail_limit`` bars or a few per pixel column: the canvas does that faster
        # than WebGL where WebGL is software-rendered (headless Chromium: 120 against 340 ms a zoomed-out redraw).
        webgl = n > webgl_threshold and not large
    if large:
        span_data: dict[str, Any] = _empty(SPAN_COLUMNS)
    else:
        span_data = span_columns(table, rows, t0_ns, links, locations, names)
        # ranges first, outermost first: each drawn under what it encloses
        behind = np.lexsort((np.asarray(span_data["depth"]), np.asarray(table["kind"]) != RANGE_KIND))
        span_data = {col: take(values, behind) for col, values in span_data.items()}
    waits = lookup(span_data["style"], lambda style: style == HOST_WAIT, bool)
    wait_data = {col: np.asarray(span_data[col])[waits] for col in ("left", "right", "row", "height")}
    columns: dict[str, np.ndarray] | None = None
    strings: list[str] = []
    if large or compact:
        columns, strings = compact_columns(table, rows, t0_ns, state_data, links, names)
    cell_data: Mapping[str, Any] = _empty(CELL_COLUMNS)
    if large and columns is not None:
        lo, hi = time_extent(table, t0_ns)
        pad = 0.02 * (hi - lo)
        first = _aggregate_columns(columns, lo - pad, hi + pad, width // CELL_PX, len(rows.top_to_bottom))
        cell_data = cell_columns(first, rows.top_to_bottom)
    present = np.unique(span_styles(table)).tolist() if n else []
    return TimelineValues(
        large=large,
        webgl=webgl,
        line_tip=bool(locations) and not large,  # the browser fills a large timeline's spans without their lines
        state_data=state_data,
        span_data=span_data,
        wait_data=wait_data,
        cell_data=cell_data,
        columns=columns,
        names=strings,
        max_dur=float(columns["dur"].max()) if large and columns is not None else 0.0,
        present=[STYLES[s] for s in present],
    )


def build_timeline(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    *,
    title: str = "timeline",
    width: int = 1000,
    row_px: int = 26,
    webgl: bool | None = None,
    webgl_threshold: int = WEBGL_THRESHOLD,
    x_range: Any = None,
    detail_limit: int = DETAIL_LIMIT,
    compact: bool = False,
    locations: Sequence[Location] | None = None,
) -> tuple[Any, ColumnDataSource, ColumnDataSource | None, dict[str, np.ndarray] | None]:
    """The timeline figure with its span source, its state source (None when ``rows.states`` is off) and the compact
    columns of every span (when the figure carries them, or ``compact`` asks; else None).

    With ``locations`` (the trace's) each span's tooltip names the source line that issued it (``line`` column).

    The live dashboard keeps the sources and streams into them (it passes no ``x_range``: a ``DataRange1d`` follows the
    data). Above ``detail_limit`` spans or state segments the sources start empty and the browser fills them from the
    compact arrays (the ``timeline raw`` source); cells per pixel column (``cell source``) draw the zoomed-out view.
    """
    v = timeline_values(table, rows, t0_ns, width=width, webgl=webgl, webgl_threshold=webgl_threshold,
                        detail_limit=detail_limit, compact=compact, locations=locations)  # fmt: skip
    large, webgl, state_data, columns, names = v.large, v.webgl, v.state_data, v.columns, v.names
    if x_range is None:
        x_range = DataRange1d(range_padding=0.02)
    tooltips = span_tooltips()
    if not large:  # a large timeline's spans are filled in the browser, without their launch
        tooltips.insert(2, ("launch", "@launch{custom}"))
    if v.line_tip:
        tooltips.insert(1, ("line", "@line"))
    hover = HoverTool(tooltips=tooltips, formatters=span_formatters(), name="span hover")
    wheel = WheelZoomTool(dimensions="width")
    pan = PanTool(dimensions="width")
    tap = TapTool()
    fig = figure(
        title=title,
        width=width,
        height=rows.height(row_px),  # rows were added by timeline_values
        x_range=x_range,
        y_range=FactorRange(factors=rows.factors),
        x_axis_label=TIME_AXIS,
        tools=[pan, wheel, BoxZoomTool(dimensions="width"), tap, ResetTool(), SaveTool(), hover],
        active_drag=pan,
        active_scroll=wheel,
        output_backend="webgl" if webgl else "canvas",
        sizing_mode="stretch_width",
        name="timeline",
    )
    fig.ygrid.grid_line_color = None
    fig.yaxis.major_label_text_font_size = "8pt"
    fig.toolbar.logo = None

    state_source = None
    if state_data is not None:
        state_source = ColumnDataSource(_empty(STATE_COLUMNS) if large else state_data, name="state source")
        tips = [("state", "@state"), ("start", "@left{0,0.000} ms"), ("duration", "@duration_us{0,0.0} µs")]
        _row_bars(fig, state_source, "state", STATE_COLORS, STATES, "states", "state hover", tips)

    span_data = v.span_data
    span_source = ColumnDataSource(span_data, name="span source")
    style_colors = factor_cmap("style", [STYLE_COLORS[s] for s in STYLES], list(STYLES))
    bars = fig.hbar(
        **_ON_ROWS,
        height="height",
        fill_color=style_colors,
        fill_alpha="alpha",
        line_color=style_colors,  # an outline keeps zero-length spans (markers) visible
        line_width=1,
        source=span_source,
        name="spans",
    )
    # Spans left out of a selection (a tapped span, a source line's spans) fade, outlines included.
    bars.nonselection_glyph = bars.glyph.clone(fill_alpha=0.15, line_alpha=0.15)
    hover.renderers = [bars]
    tap.renderers = [bars]
    # Host waits hatched, drawn over their bars from a source of their own: a hatch pattern per bar (a vector hatch
    # on the span renderer) makes BokehJS create a canvas layer per bar at every redraw, seconds for 10^4 bars.
    wait_source = ColumnDataSource(v.wait_data, name="wait source")
    fig.hbar(
        **_ON_ROWS,
        height="height",
        fill_color=None,
        line_color=None,
        hatch_pattern=HOST_WAIT_HATCH,
        hatch_color="#ffffff",
        hatch_weight=1.5,
        source=wait_source,
        name="host waits",
    )

    # Names on the bars wide enough to hold them (the view callback fills this source).
    labels = ColumnDataSource({"x": [], "row": [], "text": [], "color": []}, name="name source")
    fig.text(
        x="x",
        y="row",
        text="text",
        text_color="color",
        source=labels,
        text_font_size="8pt",
        text_baseline="middle",
        name="names",
    )

    # The arrow from a hovered or selected device span's launching call to the span.
    arrows = ColumnDataSource({"x0": [], "y0": [], "x1": [], "y1": [], "call": [], "launch_us": []}, name="link source")
    fig.add_layout(
        Arrow(
            end=VeeHead(size=8, fill_color=LINK_COLOR, line_color=LINK_COLOR),
            x_start="x0",
            y_start="y0",
            x_end="x1",
            y_end="y1",
            source=arrows,
            line_color=LINK_COLOR,
            line_width=2,
            name="launch links",
        )
    )
    show_links = CustomJS(args={"spans": span_source, "links": arrows}, code=timeline_js.LINKS)
    hover.callback = show_links
    span_source.selected.js_on_change("indices", show_links)

    raw = ColumnDataSource(columns, name="timeline raw") if large and columns is not None else None
    cell_data = v.cell_data
    cells = ColumnDataSource(cell_data, name="cell source")
    tips = [
        ("row", "@row"),
        ("from", "@left{0,0.000} ms"),
        ("to", "@right{0,0.000} ms"),
        ("spans starting here", "@count{0,0}"),
        ("busy", "@busy{0.0%}"),
        ("mostly", "@style"),
    ]
    _row_bars(fig, cells, "style", ALL_COLORS, ALL_STYLES, "cells", "cell hover", tips, fill_alpha="alpha")
    view = CustomJS(
        args={
            "fig": fig,
            "spans": span_source,
            "states": state_source or ColumnDataSource(_empty(STATE_COLUMNS)),
            "agg": cells,
            "waits": wait_source,
            "labels": labels,
            "raw": raw,
            "row_names": rows.top_to_bottom,
            "names": names,
            "styles": list(ALL_STYLES),
            "copies": ["h2d", "d2h", "d2d"],
            "inks": dict(STYLE_INK),
            "n_styles": len(STYLES),
            "wait_style": WAIT_STYLE,
            "kind_of_wait": KIND_CODE["api"],
            "limit": detail_limit,
            "max_dur": v.max_dur,
            "char_px": CHAR_PX,
            "busy_steps": BUSY_STEPS,
            "cell_px": CELL_PX,
            "heights": KIND_HEIGHTS.tolist(),
            "alphas": KIND_ALPHAS.tolist(),
            "range_style": RANGE_KIND,
            "nest_shrink": NEST_SHRINK,
            "nest_min": NEST_MIN,
        },
        code=timeline_js.VIEW,
        name="timeline view",
    )
    _follow(fig, view)
    add_legends(fig, v.present, rows.states)
    return fig, span_source, state_source, columns


def _row_bars(fig: Any, source: ColumnDataSource, column: str, colors: Mapping[str, str], factors: Sequence[str],
              name: str, hover: str, tooltips: list[tuple[str, str]], **glyph: Any) -> None:  # fmt: skip
    """Bars of ``source`` on their rows, coloured by ``column`` (one of ``factors``), with a hover of their own."""
    bars = fig.hbar(
        **_ON_ROWS,
        height=BAR_HEIGHT,
        fill_color=factor_cmap(column, [colors[f] for f in factors], list(factors)),
        line_color=None,
        source=source,
        name=name,
        **glyph,
    )
    fig.add_tools(HoverTool(renderers=[bars], tooltips=tooltips, name=hover))


def _aggregate_columns(columns: Mapping[str, np.ndarray], lo: float, hi: float, bins: int, n_rows: int) -> dict:
    """``aggregate`` over compact columns (what the browser computes from the same arrays)."""
    start = np.asarray(columns["start"], dtype=np.float64)
    end = start + np.asarray(columns["dur"], dtype=np.float64)
    return aggregate(columns["row"], columns["style"], start, end, lo, hi, bins, n_rows, len(ALL_STYLES))


def _follow(fig: Any, view: CustomJS) -> None:
    """Run ``view`` when the visible time range or the plot's width changes: on every change of the figure's range,
    and at the end of every interaction (``RangesUpdate``), which still reaches it after ``fig.x_range`` is replaced
    (``Comparison.figure`` shares one range between two timelines)."""
    fig.x_range.js_on_change("start", view)
    fig.x_range.js_on_change("end", view)
    fig.js_on_change("inner_width", view)
    fig.js_on_event("rangesupdate", view)


def time_extent(table: Mapping[str, np.ndarray], t0_ns: int) -> tuple[float, float]:
    """The table's first start and last end in ms from ``t0_ns`` ((0, 1) for an empty table)."""
    if not len(table["start_ns"]):
        return 0.0, 1.0
    lo = (int(np.min(table["start_ns"])) - t0_ns) / 1e6
    hi = (int(np.max(table["end_ns"])) - t0_ns) / 1e6
    return lo, max(hi, lo + 1e-6)


def timeline_figure(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    stream_labels: Mapping[tuple[int, int], str] | None = None,
    *,
    t0_ns: int | None = None,
    states: bool = True,
    overview: bool = False,
    limits: Mapping[int, DeviceLimits | None] | None = None,
    **options: Any,
) -> Any:
    """A Bokeh figure of the spans: a row per (device, stream) and host thread, a colour per kind, launch links, the
    8 states under each device, on a fixed x range (the spans' extent, padded).

    ``t0_ns`` is time zero of the ms axis (default: the first span's start); ``overview`` puts the overview strip
    under it (``timeline_view``); ``limits`` (each device's ``DeviceLimits``) give kernels' occupancy in the tooltip.
    ``options`` are ``build_timeline``'s: ``title``, ``width`` (px), ``row_px``, ``webgl`` (default: above
    ``webgl_threshold`` spans), ``detail_limit`` (above it the browser draws what is in view: module docstring) and
    ``locations`` (the tooltip's source line). Builds from arrays: 10^5 spans take a fraction of a second, 10^6 a few
    seconds.
    """
    if t0_ns is None:
        t0_ns = int(np.min(table["start_ns"])) if len(table["start_ns"]) else 0
    lo, hi = time_extent(table, t0_ns)
    pad = 0.02 * (hi - lo)
    x_range = Range1d(start=lo - pad, end=hi + pad, bounds=(lo - pad, hi + pad), name="timeline x range")
    rows = RowLayout(device_names, stream_labels, states=states, limits=limits)
    fig, _, _, columns = build_timeline(table, rows, t0_ns, x_range=x_range, compact=overview, **options)
    if not overview or columns is None:
        return fig
    from bokeh.layouts import column

    strip = overview_figure(fig, columns, rows.top_to_bottom, (lo, hi), width=fig.width)
    return column(fig, strip, sizing_mode="stretch_width", name="timeline view")


def overview_figure(
    fig: Any, columns: Mapping[str, np.ndarray], rows: list[str], extent: tuple[float, float], width: int = 1000
) -> Any:
    """The strip under a timeline: every row of the whole trace (``columns``: ``compact_columns``; ``rows`` top to
    bottom) in ``width`` cells, and a box (``RangeTool``) on the detail view's range: drag it to move the view, drag
    its edges to zoom."""
    lo, hi = extent
    pad = 0.02 * (hi - lo)
    overview = figure(
        height=max(50 + 5 * len(rows), 90),
        width=width,
        x_range=Range1d(start=lo - pad, end=hi + pad, name="overview x range"),
        y_range=FactorRange(factors=rows[::-1]),
        x_axis_label=TIME_AXIS + "; drag the box to move the view, its edges to zoom",
        tools="",
        toolbar_location=None,
        sizing_mode="stretch_width",
        name="overview",
    )
    overview.yaxis.visible = False
    overview.ygrid.grid_line_color = None
    overview.xaxis.axis_label_text_font_size = "8pt"
    overview.hbar(
        **_ON_ROWS,
        height=1.0,
        fill_color=factor_cmap("style", [ALL_COLORS[s] for s in ALL_STYLES], list(ALL_STYLES)),
        fill_alpha="alpha",
        line_color=None,
        source=ColumnDataSource(overview_cells(columns, rows, extent, width), name="overview cell source"),
        name="overview cells",
    )
    selector = RangeTool(x_range=fig.x_range, name="overview range")
    selector.overlay.fill_color = "#636363"
    selector.overlay.fill_alpha = 0.15
    overview.add_tools(selector)
    return overview


def overview_cells(
    columns: Mapping[str, np.ndarray], rows: list[str], extent: tuple[float, float], width: int = 1000
) -> dict[str, Any]:
    """The overview strip's drawn cells: every row of the whole trace in ``width`` cells over the padded extent."""
    lo, hi = extent
    pad = 0.02 * (hi - lo)
    return cell_columns(_aggregate_columns(columns, lo - pad, hi + pad, width, len(rows)), rows)


def timeline_view(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    stream_labels: Mapping[tuple[int, int], str] | None = None,
    **options: Any,
) -> Any:
    """``timeline_figure`` above its overview strip, as one Bokeh column (the figure is its first child); ``options``
    are ``timeline_figure``'s."""
    return timeline_figure(table, device_names, stream_labels, overview=True, **options)


def device_names(trace: Any) -> dict[int, str]:
    """Row names of a trace's devices: the spec ("cuda:0") of a real device, the given name of a hand-built one."""
    return {n: (clock.name if clock.source == "records" else clock.key) for n, clock in trace.devices.items()}


def trace_start_ns(trace: Any, table: Mapping[str, np.ndarray]) -> int:
    """Time zero of a trace's pictures: when it started recording, or its first span for a hand-built trace."""
    if trace.started_ns:
        return int(trace.started_ns)
    return int(np.min(table["start_ns"])) if len(table["start_ns"]) else 0


def trace_timeline(trace: Any, **kw: Any) -> Any:
    """``Trace.timeline``: the timeline of a whole trace above its overview strip (waits for pending spans once it
    stopped); the detail figure is the column's first child (``name="timeline"``)."""
    table = trace.table()
    kw.setdefault("t0_ns", trace_start_ns(trace, table))
    kw.setdefault("locations", getattr(trace, "locations", None))
    kw.setdefault("title", timeline_title(trace))
    kw.setdefault("limits", limits_of(trace.devices))
    return timeline_view(table, device_names(trace), trace.stream_labels, **kw)


def timeline_title(trace: Any) -> str:
    """A trace's timeline title: "timeline", and the real devices it ran on."""
    real = [f"{c.key} = {c.name} ({c.source})" for c in trace.devices.values() if c.source != "records"]
    return "timeline" + (f": {'; '.join(real)}" if real else "")
