"""``%%gpu``'s picture without building it again: a layout shaped as an earlier one is that one given new values.

Making the ~200 Bokeh models of a traced cell's layout (timeline, overview, memory plot, source view, summary) costs
more than the rest of the cell's post-code path together, and the models are the same from cell to cell: only their
data, ranges, row names, sizes and titles follow the trace. So the first layout of each shape (``_shape``: the
options the values decide, the memory plot's devices, whether a source view shows) is built as ``trace_layout``
builds it and kept; a later trace of that shape writes its values into the kept models (``_refill``, the same values
``trace_layout`` would give them: the tests compare the two documents) and ``notebook_doc.publish`` re-encodes only
what changed, under fresh ids. After publishing, the kept models let go of the trace's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bokeh.core.properties import value
from bokeh.core.property.validation import validate
from bokeh.model import Model

from gpuworkbench.trace.device_limits import limits_of

from .memory import memory_series, trace_memory_t0
from .notebook_doc import publish
from .source_view import BORDER_PX, MAX_VISIBLE, ROW_PX, TITLE_PX, source_values
from .timeline import (
    RowLayout,
    device_names,
    overview_cells,
    time_extent,
    timeline_title,
    timeline_values,
    trace_start_ns,
)

#: Layout shapes kept at once (a notebook's cells mostly share one or two).
KEEP = 4


@dataclass
class _Kept:
    """A kept layout: its root, its models by (class, name), its memory legend's items, and the texts ``doc_text``
    keeps of its models."""

    root: Any
    models: dict[tuple[str, str], Model]
    legend_items: dict[str, Model]  # the memory plot's legend items by their renderer's name (held:N, used:N)
    cache: dict = field(default_factory=dict)


_kept: dict[tuple, _Kept] = {}


def show_trace_reused(trace: Any, window: tuple[int, int] | None, summary: Any, build: Any) -> None:
    """Publish ``trace``'s layout (``build(trace, window, summary)`` for a shape not seen yet, else a kept one
    refilled) to the notebook."""
    kept = _layout(trace, window, summary, build)
    try:
        publish(kept.root, kept.cache)
    finally:
        with validate(False):
            _let_go(kept)


def warm(trace: Any, build: Any) -> None:
    """Build and keep the layout of ``trace``'s shape and write its document once (unpublished), so that a later
    trace of that shape is a refill whose unchanged models keep the text written here; its data let go after."""
    from .notebook_doc import notebook_bundle

    kept = _layout(trace, None, None, build)
    try:
        notebook_bundle(kept.root, kept.cache)
    finally:
        with validate(False):
            _let_go(kept)


def _layout(trace: Any, window: tuple[int, int] | None, summary: Any, build: Any) -> _Kept:
    """The layout of ``trace``: a kept one of its shape refilled, else one built (and kept)."""
    table = trace.table()
    t0_ns = trace_start_ns(trace, table)
    locations = getattr(trace, "locations", None)
    names = device_names(trace)
    rows = RowLayout(names, trace.stream_labels, states=True, limits=limits_of(trace.devices))
    tv = timeline_values(table, rows, t0_ns, compact=True, locations=locations)
    series = memory_series(trace.memory_table(), names, trace_memory_t0(trace))
    if summary is None:
        summary = trace.summary(window=window)
    linked = len(tv.span_data["loc"]) > 0
    key = (
        tv.large,
        tv.webgl,
        tv.line_tip,
        tv.columns is not None,
        tuple((device, color, used is not None) for device, _, color, _, used in series),  # labels are refilled
        bool(locations),
        linked,
    )
    kept = _kept.get(key)
    if kept is None:
        root = build(trace, window, summary)
        references = root.references()
        models = {(type(m).__name__, m.name or ""): m for m in references}
        items = {r.name: m for m in references if type(m).__name__ == "LegendItem" for r in m.renderers if r.name}
        kept = _Kept(root, models, items)
        if len(_kept) >= KEEP:
            _kept.pop(next(iter(_kept)))
        _kept[key] = kept
        return kept
    with validate(False):  # the values a build of this shape validated, of the same types
        _refill(kept, trace, table, t0_ns, rows, tv, series, summary)
        holds = not locations or _source_shape_holds(kept, trace, table)
    if not holds:
        _kept.pop(key)
        return _layout(trace, window, summary, build)
    return kept


def _refill(
    kept: _Kept, trace: Any, table: Any, t0_ns: int, rows: RowLayout, tv: Any, series: list, summary: Any
) -> None:
    """Write a trace's values into a kept layout of its shape: what ``trace_layout`` would have built."""
    m = kept.models
    fig = m[("figure", "timeline")]
    _put(fig.title, text=timeline_title(trace))
    _put(fig, height=rows.height(26))
    order = rows.top_to_bottom
    _put(fig.y_range, factors=order[::-1])
    lo, hi = time_extent(table, t0_ns)
    pad = 0.02 * (hi - lo)
    _put(m[("Range1d", "timeline x range")], start=lo - pad, end=hi + pad, bounds=(lo - pad, hi + pad))
    if tv.state_data is not None:
        m[("ColumnDataSource", "state source")].data = {} if tv.large else tv.state_data
    m[("ColumnDataSource", "span source")].data = tv.span_data
    m[("ColumnDataSource", "wait source")].data = tv.wait_data
    m[("ColumnDataSource", "cell source")].data = dict(tv.cell_data)
    if tv.large:
        m[("ColumnDataSource", "timeline raw")].data = tv.columns
    view = m[("CustomJS", "timeline view")]
    _put(view, args={**view.args, "row_names": order, "names": tv.names, "max_dur": tv.max_dur})
    legend_source = m[("ColumnDataSource", "kind legend")]
    n = len(tv.present)
    legend_source.data = {"y": [float("nan")] * n, "x": [float("nan")] * n, "style": tv.present}
    _put(m[("Legend", "kinds legend")], ncols=min(6, max(n, 1)))
    overview = m[("figure", "overview")]
    _put(overview, height=max(50 + 5 * len(order), 90))
    _put(m[("Range1d", "overview x range")], start=lo - pad, end=hi + pad)
    _put(overview.y_range, factors=order[::-1])
    m[("ColumnDataSource", "overview cell source")].data = overview_cells(tv.columns, order, (lo, hi), fig.width)
    for device, label, _, held, used in series:
        m[("GlyphRenderer", f"held:{device}")].data_source.data = held
        _put(kept.legend_items[f"held:{device}"], label=value(f"{label}: held by gpuworkbench"))
        if used is not None:
            m[("GlyphRenderer", f"used:{device}")].data_source.data = used
            _put(kept.legend_items[f"used:{device}"], label=value(f"{label}: used on the device"))
    _put(m[("Div", "")], text=summary._repr_html_())


def _put(model: Model, **values: Any) -> None:
    """Give ``model`` these property values, leaving out those it holds already: what Bokeh's setter does (nothing
    where its property ``matches`` the old value), without its preparing and checking a value that it then drops."""
    for name, new in values.items():
        if not model.lookup(name).property.matches(new, getattr(model, name)):
            setattr(model, name, new)


def _source_shape_holds(kept: _Kept, trace: Any, table: Any = None) -> bool:
    """Refill the kept source view from ``trace`` (its span source already refilled; ``table``: its spans where read
    already); False where the view's shape (rows scrolled by the wheel or not) differs, so that the layout must be
    built."""
    m = kept.models
    plot = m.get(("Plot", "source view"))
    if plot is None:
        return False
    v = source_values(trace, m[("ColumnDataSource", "span source")], table=table)
    if (v.n > MAX_VISIBLE) != (("WheelPanTool", "") in m) or v.linked != (("CustomJS", "source link") in m):
        return False
    _put(plot.title, text=v.title)
    _put(
        plot,
        frame_width=v.width,
        frame_height=v.visible * ROW_PX,
        width=v.width + 2 * BORDER_PX,
        height=v.visible * ROW_PX + TITLE_PX,
    )
    _put(plot.x_range, end=v.width)
    _put(plot.y_range, start=v.visible - 0.5, end=-0.5, bounds=(-0.5, max(v.n, 1) - 0.5))
    picks = m[("GlyphRenderer", "source picks")]
    for glyph in {id(g): g for g in (picks.glyph, picks.selection_glyph, picks.hover_glyph)}.values():
        _put(glyph, right=v.width)
    m[("ColumnDataSource", "source rows")].data = v.data
    m[("ColumnDataSource", "source bars")].data = v.bars
    m[("ColumnDataSource", "source labels")].data = v.labels
    if v.linked:
        link = m[("CustomJS", "source link")]
        _put(link, args={**link.args, "members": v.members, "first": v.first})
    return True


def _let_go(kept: _Kept) -> None:
    """Drop the trace's data from a kept layout (the sources a refill writes), so that it holds no trace between
    cells; the next refill gives each of them new values."""
    for name in _REFILLED:
        source = kept.models.get(("ColumnDataSource", name))
        if source is not None:
            source.data = {}
    for (kind, name), model in kept.models.items():
        if kind == "GlyphRenderer" and name.startswith(("held:", "used:")):
            model.data_source.data = {}


#: The named sources ``_refill`` and ``_source_shape_holds`` write.
_REFILLED = (
    "state source", "span source", "wait source", "cell source", "timeline raw", "overview cell source",
    "source rows", "source bars", "source labels",
)  # fmt: skip
