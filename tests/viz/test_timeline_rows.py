"""The timeline's host rows, launch links, host waits, legends, large-trace aggregation and the memory axis's ticks.

Real Bokeh documents from hand-built traces; the browser tests load the standalone HTML (inline BokehJS, no server)
in headless Chromium and skip, saying why, where Chromium or Playwright is missing.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import support

pytest.importorskip("bokeh")

from bokeh.embed import file_html  # noqa: E402
from bokeh.models import (  # noqa: E402
    AdaptiveTicker,
    Arrow,
    CustomJS,
    CustomJSTickFormatter,
    GlyphRenderer,
    HoverTool,
    Legend,
    RangeTool,
)
from bokeh.resources import INLINE  # noqa: E402

from gpuworkbench.trace.recorder import Trace  # noqa: E402
from gpuworkbench.trace.spans import KIND_CODE, empty_memory_table, empty_table  # noqa: E402
from gpuworkbench.viz import (  # noqa: E402
    memory_figure,
    timeline_figure,
    timeline_js,  # noqa: E402
    timeline_view,
)
from gpuworkbench.viz.aggregate import aggregate, levels  # noqa: E402
from gpuworkbench.viz.memory import byte_tick_labels  # noqa: E402
from gpuworkbench.viz.palette import STYLES  # noqa: E402
from gpuworkbench.viz.timeline_data import ALL_STYLES, ENQUEUE, cell_columns, host_waits, launch_links  # noqa: E402

US = 1_000


span = functools.partial(support.span, unit=US)  # span records with their times in µs


#: Two host threads launching on gpu A: a range around two launches and a synchronize; a blocking copy; a kernel
#: enqueued by the workbench itself (no API call); a kernel whose call the trace lost.
RECORDS = [
    span("range", -2, 0, 60, name="step 1"),
    span("api", -2, 1, 4, name="cudaLaunchKernel", corr=11),
    span("api", -2, 5, 7, name="cudaLaunchKernel", corr=12),
    span("kernel", 0, 10, 30, name="first_kernel", corr=11),
    span("kernel", 0, 30, 45, name="second_kernel", corr=12),  # waits for first_kernel: queued 7 → 30
    span("api", -2, 46, 58, name="cudaDeviceSynchronize"),
    span("api", -3, 2, 3, name="cudaMemcpyAsync", corr=21),
    span("h2d", 1, 3, 9, name="upload", corr=21, bytes=1 << 20),
    span("api", -3, 20, 40, name="cudaMemcpy"),
    span("alloc", -1, 0, 1, name="alloc", bytes=4096),
    span("kernel", 1, 50, 55, name="own_kernel", enqueue_ns=48 * US),
    span("kernel", 1, 56, 57, name="orphan", corr=99),
]
LABELS = {(0, -2): "host MainThread", (0, -3): "host loader", (0, 0): "compute", (0, 1): "copies"}


def build(records=RECORDS, **kw):
    table = Trace.from_records(records).table()
    return table, timeline_figure(table, {0: "gpu A"}, LABELS, **kw)


def source(fig, name: str):
    return fig.select_one({"name": name, "type": GlyphRenderer}).data_source


def by_name(data, name: str) -> int:
    return list(data["name"]).index(name)


# --- rows, links, waits -----------------------------------------------------------------------------------------------


def test_host_threads_and_the_workbench_row_come_first_with_device_and_stream_names():
    _, fig = build()
    assert fig.y_range.factors[::-1] == [
        "gpu A · host MainThread",
        "gpu A · host loader",
        "gpu A · workbench",
        "gpu A · compute",
        "gpu A · copies",
        "gpu A · states",
    ]
    data = source(fig, "spans").data
    assert data["row"][by_name(data, "cudaMemcpy")] == "gpu A · host loader"
    assert data["row"][by_name(data, "step 1")] == "gpu A · host MainThread"


def test_a_trace_without_enqueues_gets_no_workbench_row():
    _, fig = build([span("api", -2, 0, 1, name="cudaLaunchKernel", corr=1), span("kernel", 0, 2, 3, corr=1)])
    assert not any("workbench" in f for f in fig.y_range.factors)


def test_each_device_span_links_to_the_call_with_its_corr():
    table, fig = build()
    data = source(fig, "spans").data
    expected = {  # device span -> (call, the call's row, call start µs, span start µs)
        "first_kernel": ("cudaLaunchKernel", "gpu A · host MainThread", 1, 10),
        "second_kernel": ("cudaLaunchKernel", "gpu A · host MainThread", 5, 30),
        "upload": ("cudaMemcpyAsync", "gpu A · host loader", 2, 3),
        "own_kernel": (ENQUEUE, "gpu A · workbench", 48, 50),
    }
    for name, (call, row, call_us, start_us) in expected.items():
        i = by_name(data, name)
        assert (data["call"][i], data["call_row"][i]) == (call, row), name
        assert data["call_left"][i] == pytest.approx(call_us / 1e3)  # ms, like every x on the figure
        assert data["launch_us"][i] == pytest.approx(start_us - call_us)
    orphan = by_name(data, "orphan")  # its call was not traced: no link
    assert data["call"][orphan] == "" and np.isnan(data["call_left"][orphan])
    for host in ("step 1", "cudaLaunchKernel", "alloc"):
        assert np.isnan(data["launch_us"][by_name(data, host)])
    # The join itself: each linked span's call has the span's corr.
    links = launch_links(table)
    linked = np.flatnonzero(links["call"] >= 0)
    assert sorted(table["name"][linked]) == ["first_kernel", "second_kernel", "upload"]
    assert np.array_equal(table["corr"][links["call"][linked]], table["corr"][linked])
    assert np.all(table["kind"][links["call"][linked]] == KIND_CODE["api"])


def test_queueing_is_the_part_of_the_launch_latency_spent_behind_the_stream():
    _, fig = build()
    data = source(fig, "spans").data
    second = by_name(data, "second_kernel")  # called at 5 µs, first_kernel ran until 30 µs, started at 30 µs
    assert data["launch_us"][second] == pytest.approx(25.0)
    assert data["queue_us"][second] == pytest.approx(25.0)  # first_kernel ran from the call (5) until it began
    first = by_name(data, "first_kernel")
    assert data["queue_us"][first] == pytest.approx(0.0)  # nothing ran before it on its stream


def test_the_arrow_is_drawn_from_the_links_of_hovered_or_selected_spans():
    _, fig = build()
    arrow = fig.select_one({"type": Arrow})
    hover = fig.select_one({"name": "span hover", "type": HoverTool})
    spans = source(fig, "spans")
    assert isinstance(hover.callback, CustomJS) and hover.callback.code == timeline_js.LINKS
    assert hover.callback.args["spans"] is spans and hover.callback.args["links"] is arrow.source
    assert spans.selected.js_property_callbacks["change:indices"] == [hover.callback]
    assert (arrow.x_start, arrow.y_start, arrow.x_end, arrow.y_end) == ("x0", "y0", "x1", "y1")
    assert len(arrow.source.data["x0"]) == 0  # nothing until the browser hovers (test below)
    tips = dict(hover.tooltips)
    assert "@launch_us" in tips["launch latency"] and "@queue_us" in tips["queued behind stream"]
    # Spans without bytes or a launching call hold NaN there: the hover prints "—", not Bokeh's "NaN"; so for the
    # launch shape of a span that is no kernel ("").
    assert set(hover.formatters) == {"@bytes", "@gbps", "@launch_us", "@queue_us", "@launch"}
    assert all("{custom}" in tips[f] for f in ("bytes", "GB/s", "launch latency", "queued behind stream", "launch"))
    numbers = [f for key, f in hover.formatters.items() if key != "@launch"]
    assert all("isNaN" in f.code and "—" in f.code for f in numbers) and "—" in hover.formatters["@launch"].code


def test_blocking_calls_are_host_waits_in_a_style_of_their_own():
    table, fig = build()
    names = [str(n) for n in table["name"][host_waits(table)]]
    assert sorted(names) == ["cudaDeviceSynchronize", "cudaMemcpy"]  # not cudaMemcpyAsync nor cudaLaunchKernel
    data = source(fig, "spans").data
    assert data["style"][by_name(data, "cudaMemcpy")] == "host wait"
    assert data["kind"][by_name(data, "cudaMemcpy")] == "api"
    assert data["style"][by_name(data, "cudaMemcpyAsync")] == "api"
    waits = source(fig, "host waits")
    assert waits.data["row"].tolist() == ["gpu A · host MainThread", "gpu A · host loader"]
    assert fig.select_one({"name": "host waits", "type": GlyphRenderer}).glyph.hatch_pattern == "/"


def test_nested_ranges_are_drawn_as_bars_inside_bars_outermost_first():
    """A PyTorch profile nests cpu_ops several deep on one thread's row: each level is drawn shorter and on top of the
    range that encloses it, so the nesting can be read; a range that only overlaps another is not nested in it."""
    records = [
        span("range", -2, 0, 100, name="step"),
        span("range", -2, 10, 40, name="aten::linear"),
        span("range", -2, 20, 30, name="aten::addmm"),
        span("range", -2, 35, 60, name="overlapping"),
        span("api", -2, 21, 22, name="cudaLaunchKernel", corr=5),
        span("range", -3, 15, 25, name="other thread"),
        span("kernel", 0, 30, 40, name="k", corr=5),
    ]
    _, fig = build(records)
    data = source(fig, "spans").data
    depth = {name: int(data["depth"][by_name(data, name)]) for name in ("step", "aten::linear", "aten::addmm")}
    assert depth == {"step": 0, "aten::linear": 1, "aten::addmm": 2}
    assert data["depth"][by_name(data, "overlapping")] == 1  # inside step, not inside aten::linear
    assert data["depth"][by_name(data, "other thread")] == 0  # another row
    heights = [data["height"][by_name(data, n)] for n in ("step", "aten::linear", "aten::addmm")]
    assert heights[0] > heights[1] > heights[2]
    assert data["height"][by_name(data, "cudaLaunchKernel")] == pytest.approx(0.55)  # calls keep their height
    order = list(data["name"])
    assert order.index("step") < order.index("aten::linear") < order.index("aten::addmm") < order.index("k")


def test_range_depths_of_rows_in_sequence_nested_and_overlapping():
    from gpuworkbench.viz.timeline_data import RANGE_KIND, range_depths

    # (stream, start, end, depth): a row of ranges one after another (a range of no length at the end of the one
    # before lies inside it), a nested row, a row of ranges that only overlap, and a kernel (never a depth)
    rows = [(1, 0, 10, 0), (1, 10, 20, 0), (1, 20, 20, 1), (1, 30, 40, 0), (2, 0, 100, 0), (2, 10, 20, 1),
            (2, 12, 15, 2), (3, 0, 10, 0), (3, 5, 15, 0), (4, 0, 10, 0)]  # fmt: skip
    table = {
        "kind": np.array([RANGE_KIND] * 9 + [KIND_CODE["kernel"]]),
        "device": np.full(10, -1),
        "stream": np.array([r[0] for r in rows]),
        "start_ns": np.array([r[1] for r in rows]),
        "end_ns": np.array([r[2] for r in rows]),
    }
    assert range_depths(table).tolist() == [r[3] for r in rows]
    sequence = {k: v[:4] for k, v in table.items()}
    sequence["end_ns"] = np.array([10, 20, 25, 40])  # every end rises: no row walked, every depth 0
    assert range_depths(sequence).tolist() == [0, 0, 0, 0]


def test_kinds_and_overlap_states_have_separate_legends():
    _, fig = build()
    legends = {legend.title: legend for legend in fig.select({"type": Legend})}
    assert set(legends) == {"kinds", "overlap states (device strips)"}
    kinds = legends["kinds"].items[0].renderers[0].data_source.data
    assert sorted(kinds["style"]) == sorted(["range", "api", "kernel", "host wait", "h2d", "alloc"])
    states = legends["overlap states (device strips)"].items[0].renderers[0].data_source.data
    assert len(states["label"]) == 8 and any("K: kernel" in label for label in states["label"])


# --- aggregation ------------------------------------------------------------------------------------------------------


def random_spans(n: int, rows: int = 5, seed: int = 1):
    rng = np.random.default_rng(seed)
    start = np.sort(rng.uniform(0, 1000, n))
    end = start + rng.exponential(0.5, n)
    return rng.integers(0, rows, n), rng.integers(0, len(STYLES), n), start, end


@pytest.mark.parametrize(("lo", "hi", "bins"), [(0, 1001, 1), (0, 1001, 700), (250, 260, 500), (499.9, 500.1, 64)])
def test_aggregated_counts_over_a_row_sum_to_its_spans_in_view(lo, hi, bins):
    row, style, start, end = random_spans(20_000)
    cells = aggregate(row, style, start, end, lo, hi, bins, 5, len(ALL_STYLES))
    in_view = (end >= lo) & (start <= hi)
    for r in range(5):
        assert cells["count"][cells["row"] == r].sum() == np.count_nonzero(in_view & (row == r))
    assert np.all((cells["busy"] >= 0) & (cells["busy"] <= 1 + 1e-9))
    assert np.all((cells["bin"] >= 0) & (cells["bin"] < bins))


def test_levels_conserve_counts_and_busy_time_at_every_resolution():
    row, style, start, end = random_spans(5_000, rows=3)
    union = []  # each row's busy time, by sweeping its spans in start order
    for r in range(3):
        covered, reach = 0.0, -np.inf
        for s, e in zip(start[row == r], end[row == r]):
            covered += max(e - max(s, reach), 0.0)
            reach = max(reach, e)
        union.append(covered)
    for cells in levels(row, style, start, end, bins=100, n_rows=3, n_styles=len(ALL_STYLES), depth=4):
        width = cells["right"][0] - cells["left"][0]
        for r in range(3):
            mine = cells["row"] == r
            assert cells["count"][mine].sum() == np.count_nonzero(row == r)
            assert (cells["busy"][mine] * width).sum() == pytest.approx(union[r], rel=1e-9)


def test_nested_spans_count_once_in_busy_and_the_longest_style_wins():
    # row 0: a range 0-10 with a call 2-3 inside it (busy once); row 1: a kernel 5-35 over three bins of 10
    cells = aggregate([0, 0, 1], [9, 8, 4], [0, 2, 5], [10, 3, 35], 0, 40, 4, 2, len(ALL_STYLES))
    assert cells["row"].tolist() == [0, 1, 1, 1, 1]
    assert cells["count"].tolist() == [2, 1, 0, 0, 0]
    assert cells["busy"].tolist() == [1.0, 0.5, 1.0, 1.0, 0.5]
    assert cells["style"].tolist() == [9, 4, 4, 4, 4]


@pytest.mark.parametrize("sort", [False, True])
def test_dense_and_sparse_counting_and_both_orders_give_the_same_cells(sort, monkeypatch):
    import gpuworkbench.viz.aggregate as module

    row, style, start, end = random_spans(20_000)
    if sort:  # a trace's spans come in start order: the row sort keeps it
        order = np.argsort(start, kind="stable")
        row, style, start, end = row[order], style[order], start[order], end[order]
    args = (row, style, start, end, 100, 900, 300, 5, len(ALL_STYLES))
    dense = aggregate(*args)
    monkeypatch.setattr(module, "DENSE_PAIRS", 0)  # every pair found by sorting
    sparse = aggregate(*args)
    shuffled = np.random.default_rng(7).permutation(row.size)  # out of start order: sorted by row and start
    unordered = aggregate(row[shuffled], style[shuffled], start[shuffled], end[shuffled], *args[4:])
    for key in dense:
        assert np.array_equal(dense[key], sparse[key]), key
        assert np.allclose(dense[key], unordered[key], rtol=1e-12, atol=1e-12), key


def test_merged_cells_keep_every_count():
    row, style, start, end = random_spans(10_000)
    cells = aggregate(row, style, start, end, 0, 1001, 400, 5, len(ALL_STYLES))
    merged = cell_columns(cells, [f"r{i}" for i in range(5)])
    assert sum(merged["count"]) == 10_000 and len(merged["left"]) <= len(cells["left"])


def test_a_large_timeline_carries_compact_arrays_and_starts_zoomed_out():
    n = 3_000
    records = [span("kernel", i % 3, 10 * i, 10 * i + 7, name=f"k{i % 5}") for i in range(n)]
    table, fig = build(records, detail_limit=500)
    raw = fig.select_one({"name": "timeline raw"}).data
    assert raw["start"].dtype == np.float64 and raw["dur"].dtype == np.float32 and raw["row"].dtype == np.uint16
    assert np.count_nonzero(raw["style"] < len(STYLES)) == n
    assert len(source(fig, "spans").data["left"]) == 0
    cells = source(fig, "cells").data
    assert sum(cells["count"]) == len(raw["start"])
    names = fig.select_one({"type": CustomJS, "code": timeline_js.VIEW}).args["names"]
    assert {"k0", "k4"} <= set(names)


def test_the_overview_strip_drives_the_detail_range():
    view = timeline_view(Trace.from_records(RECORDS).table())
    fig, overview = view.children
    selector = overview.select_one({"type": RangeTool})
    assert selector.x_range is fig.x_range
    assert overview.x_range.start <= fig.x_range.start and overview.x_range.end >= fig.x_range.end
    assert sum(source(overview, "overview cells").data["count"]) > 0
    assert "(ms)" in fig.xaxis[0].axis_label and "(ms)" in overview.xaxis[0].axis_label


# --- memory ticks -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ticks",
    [
        [4 * 2**20 + i * 2**18 for i in range(5)],  # a short trace holding ~4 MiB: 4.00, 4.25, ... MiB
        [4 * 2**20 + i * 2**14 for i in range(6)],
        [i * 2**30 for i in range(4)],
        [i * 512 for i in range(6)],
        [0, 1, 2, 3],
        [3 * 2**40 + i * 2**37 for i in range(5)],
    ],
)
def test_memory_tick_labels_are_distinct_and_exact_enough(ticks):
    labels = byte_tick_labels(ticks)
    assert len(set(labels)) == len(labels)
    unit = labels[0].split()[1]
    scale = 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(unit)
    step = ticks[1] - ticks[0]
    for label, tick in zip(labels, ticks):
        assert label.split()[1] == unit
        assert abs(float(label.split()[0]) * scale - tick) <= 0.05 * step


def test_memory_axis_uses_power_of_two_ticks_and_the_distinct_formatter():
    memory = empty_memory_table(3)
    memory["t_ns"][:] = [0, 1_000_000, 2_000_000]
    memory["held_bytes"][:] = [4 * 2**20, 4 * 2**20 + 4096, 4 * 2**20 + 8192]
    fig = memory_figure(memory)
    assert isinstance(fig.yaxis[0].formatter, CustomJSTickFormatter)
    assert fig.yaxis[0].formatter.code == timeline_js.BYTE_TICKS
    assert isinstance(fig.yaxis[0].ticker, AdaptiveTicker) and fig.yaxis[0].ticker.base == 2
    assert "1024" in fig.yaxis[0].axis_label and "(ms)" in fig.xaxis[0].axis_label


# --- in the browser ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page():
    from lab_browser import chromium_page

    with chromium_page({"width": 1300, "height": 800}) as page:
        yield page


def _load(page, tmp_path, layout, timeline: bool = True) -> None:
    path = tmp_path / "timeline.html"
    path.write_text(file_html(layout, INLINE))
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].roots().length")
    if timeline:
        page.wait_for_function(
            "() => { const f = Bokeh.documents[0].get_model_by_name('timeline'); const v = Bokeh.index.get_one(f);"
            " return v != null && v.frame.bbox.width > 0 }"
        )


#: Page coordinates of the middle of the bar a span named ``name`` draws.
BAR_AT = """(name) => {
  const doc = Bokeh.documents[0], fig = doc.get_model_by_name('timeline'), view = Bokeh.index.get_one(fig)
  const d = doc.get_model_by_name('span source').data, i = d.name.indexOf(name)
  const box = view.el.getBoundingClientRect()
  const x = view.frame.x_scale.compute((d.left[i] + d.right[i]) / 2), y = view.frame.y_scale.compute(d.row[i])
  return [box.left + x, box.top + y]
}"""


#: Page coordinates of time ``x`` (ms) on row ``row``.
POINT_AT = """([x, row]) => {
  const view = Bokeh.index.get_one(Bokeh.documents[0].get_model_by_name('timeline'))
  const box = view.el.getBoundingClientRect()
  return [box.left + view.frame.x_scale.compute(x), box.top + view.frame.y_scale.compute(row)]
}"""


@pytest.mark.browser
@pytest.mark.slow
def test_hovering_a_kernel_draws_its_launch_link_in_the_browser(page, tmp_path):
    table = Trace.from_records(RECORDS).table()
    _load(page, tmp_path, timeline_view(table, {0: "gpu A"}, LABELS))
    links = "() => Bokeh.documents[0].get_model_by_name('link source').data"
    x, y = page.evaluate(BAR_AT, "second_kernel")
    page.mouse.move(x, y)
    page.wait_for_function(f"() => ({links})().x0.length == 1")
    drawn = page.evaluate(links)
    assert drawn["y0"] == ["gpu A · host MainThread"] and drawn["y1"] == ["gpu A · compute"]
    assert drawn["x0"][0] == pytest.approx(0.005) and drawn["x1"][0] == pytest.approx(0.030)
    assert drawn["call"] == ["cudaLaunchKernel"]
    x, y = page.evaluate(BAR_AT, "upload")
    page.mouse.move(x, y)
    page.wait_for_function(f"() => ({links})().y0[0] == 'gpu A · host loader'")
    page.mouse.move(*page.evaluate(POINT_AT, [0.035, "gpu A · workbench"]))  # over nothing: the arrow goes
    page.wait_for_function(f"() => ({links})().x0.length == 0")
    # The names written on the bars wide enough: first_kernel (20 µs of ~62) is, orphan (1 µs) is not.
    names = page.evaluate("() => Bokeh.documents[0].get_model_by_name('name source').data.text")
    assert any(t.startswith("first_k") for t in names) and "orphan" not in names


@pytest.mark.browser
@pytest.mark.slow
def test_moving_the_overview_redraws_a_large_timeline_as_python_aggregates_it(page, tmp_path):
    rng = np.random.default_rng(3)
    n = 6_000
    records = [
        span("kernel", int(s), int(t), int(t) + int(d), name=f"kernel_{int(s)}")
        for s, t, d in zip(rng.integers(0, 4, n), np.sort(rng.integers(0, 600_000, n)), rng.integers(1, 80, n))
    ]
    table = Trace.from_records(records).table()
    _load(page, tmp_path, timeline_view(table, detail_limit=1_000))
    state = """() => { const doc = Bokeh.documents[0], r = doc.get_model_by_name('timeline x range');
      return {start: r.start, end: r.end, spans: doc.get_model_by_name('span source').data.left.length,
              cells: doc.get_model_by_name('cell source').data, px: Bokeh.index.get_one(
                doc.get_model_by_name('timeline')).frame.bbox.width} }"""
    zoomed_out = page.evaluate(state)
    assert zoomed_out["spans"] == 0 and sum(zoomed_out["cells"]["count"]) > 0
    # Python's cells over the same range and pixel width are the browser's.
    fig = timeline_figure(table, detail_limit=1_000)
    raw = fig.select_one({"name": "timeline raw"}).data
    view = fig.select_one({"type": CustomJS, "code": timeline_js.VIEW})
    start = raw["start"]
    end = start + raw["dur"].astype(np.float64)
    bins = int(zoomed_out["px"] // view.args["cell_px"])
    cells = aggregate(
        raw["row"], raw["style"], start, end, zoomed_out["start"], zoomed_out["end"], bins, 5, len(ALL_STYLES)
    )
    expected = cell_columns(cells, view.args["row_names"])
    assert zoomed_out["cells"]["count"] == expected["count"].tolist()
    assert zoomed_out["cells"]["row"] == expected["row"].tolist()
    # Drag the overview's box to the right: the detail range moves with it.
    overview = page.evaluate(
        """() => { const doc = Bokeh.documents[0], o = Bokeh.index.get_one(doc.get_model_by_name('overview'));
        const box = o.el.getBoundingClientRect(); return [box.left + o.frame.bbox.left, box.top + o.frame.bbox.vcenter,
        o.frame.bbox.width] }"""
    )
    page.evaluate(
        "() => { const r = Bokeh.documents[0].get_model_by_name('timeline x range');"
        " r.setv({start: r.start + 0.1 * (r.end - r.start), end: r.start + 0.2 * (r.end - r.start)}) }"
    )
    zoomed_in = page.evaluate(state)
    assert 0 < zoomed_in["spans"] <= 1_000  # few enough in view: the spans themselves
    x0, y, width = overview
    left = x0 + width * 0.15  # the box's middle
    page.mouse.move(left, y)
    page.mouse.down()
    page.mouse.move(left + width * 0.3, y, steps=5)
    page.mouse.up()
    moved = page.evaluate(state)
    span_ms = zoomed_in["end"] - zoomed_in["start"]
    assert moved["start"] > zoomed_in["start"] + 0.5 * span_ms
    assert moved["end"] - moved["start"] == pytest.approx(span_ms, rel=1e-6)
    assert 0 < moved["spans"] <= 1_000


@pytest.mark.browser
@pytest.mark.slow
def test_the_browser_labels_memory_ticks_as_python_does(page, tmp_path):
    memory = empty_memory_table(2)
    memory["t_ns"][:] = [0, 1_000_000]
    memory["held_bytes"][:] = [4 * 2**20, 4 * 2**20 + 2**20]
    _load(page, tmp_path, memory_figure(memory), timeline=False)
    cases = [[4 * 2**20 + i * 2**18 for i in range(5)], [i * 2**30 for i in range(4)], [0, 1, 2, 3]]
    formatted = page.evaluate(
        "([code, cases]) => { const f = new Function('tick', 'index', 'ticks', code);"
        " return cases.map((ticks) => ticks.map((t, i) => f(t, i, ticks))) }",
        [timeline_js.BYTE_TICKS, cases],
    )
    assert formatted == [byte_tick_labels(ticks) for ticks in cases]


def test_empty_trace_view_is_a_valid_document():
    view = timeline_view(empty_table())
    assert "<html" in file_html(view, INLINE)


@pytest.mark.browser
@pytest.mark.slow
def test_a_large_timeline_draws_nested_ranges_as_the_small_one_does(page, tmp_path):
    records = [
        span("range", -2, 0, 100, name="step"),
        span("range", -2, 10, 40, name="aten::linear"),
        span("range", -2, 20, 30, name="aten::addmm"),
    ] + [span("kernel", 0, t, t + 10, name=f"k{t}") for t in range(200, 300, 20)]
    table = Trace.from_records(records).table()
    small = source(timeline_figure(table, {0: "gpu A"}, LABELS), "spans").data
    expected = {n: small["height"][by_name(small, n)] for n in ("step", "aten::linear", "aten::addmm")}
    assert expected["step"] > expected["aten::linear"] > expected["aten::addmm"]
    _load(page, tmp_path, timeline_view(table, {0: "gpu A"}, LABELS, detail_limit=4))  # 8 spans: large
    page.evaluate(
        "() => Bokeh.documents[0].get_model_by_name('timeline x range').setv({start: -0.01, end: 0.11})"
    )  # the three ranges only: drawn one by one
    spans = "() => Bokeh.documents[0].get_model_by_name('span source').data"
    page.wait_for_function(f"() => ({spans})().name.length == 3")
    drawn = page.evaluate(spans)
    assert {n: h for n, h in zip(drawn["name"], drawn["height"])} == pytest.approx(expected)
