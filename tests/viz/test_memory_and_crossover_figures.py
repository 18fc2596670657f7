"""Tests of two figures' readability: the memory plot with nothing allocated (an axis from 0 B that says so, a label
that fits) and the crossover figure (legends below the data, 1-2-5 log ticks written as durations and counts), on
real Bokeh documents and, for what only the browser computes, in headless Chromium."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bokeh")

from bokeh.document import Document  # noqa: E402
from bokeh.embed import file_html, json_item  # noqa: E402
from bokeh.models import (  # noqa: E402
    AdaptiveTicker,
    CustomJSTicker,
    CustomJSTickFormatter,
    DataRange1d,
    FixedTicker,
    Legend,
    Range1d,
)
from bokeh.resources import INLINE  # noqa: E402

from gpuworkbench.library import crossover_figure  # noqa: E402
from gpuworkbench.library.crossover_result import CrossoverResult  # noqa: E402
from gpuworkbench.trace.spans import empty_memory_table  # noqa: E402
from gpuworkbench.viz import memory  # noqa: E402


def result(units: dict[str, str], times: dict[str, list[tuple[int, float, float, float]]]) -> CrossoverResult:
    """A CrossoverResult of hand-written (size, numpy_s, device_s, copies_s) rows per op."""
    rows = [
        {
            "op": op,
            "size": size,
            "bytes": 4 * size,
            "numpy_s": numpy_s,
            "device_s": device_s,
            "device_with_copies_s": copies_s,
            "speedup": numpy_s / device_s,
            "speedup_with_copies": numpy_s / copies_s,
        }
        for op, measured in times.items()
        for size, numpy_s, device_s, copies_s in measured
    ]
    kernels = {op: f"k_{op}" for op in units}
    return CrossoverResult("cuda:0", "a GPU", "cuda", "v", rows, units, kernels)


#: matmul wins from n = 256 (with copies from 1024); sum's times span under two decades and never win.
WINS_AND_NARROW = result(
    {"matmul": "n", "sum": "elements"},
    {
        "matmul": [(64, 1e-5, 2e-5, 6e-5), (256, 2e-4, 2.5e-5, 2e-4), (1024, 1.2e-2, 2e-4, 2.5e-3)],
        "sum": [(2**p, 3.1e-5, 1.3e-5 + p * 1e-6, 3.5e-5 + p * 2e-6) for p in range(8, 27, 2)],
    },
)


# --- the memory plot with nothing allocated -------------------------------------------------------------------------


def test_an_empty_memory_plot_starts_at_zero_bytes_and_says_nothing_was_held():
    fig = memory.memory_figure(empty_memory_table(0))
    assert isinstance(fig.y_range, Range1d) and (fig.y_range.start, fig.y_range.end) == (0, 1)
    assert isinstance(fig.yaxis[0].ticker, FixedTicker) and list(fig.yaxis[0].ticker.ticks) == [0]  # "0 B" only
    assert isinstance(fig.x_range, Range1d) and fig.x_range.start == 0  # no negative times either
    note = fig.select_one({"name": "empty"}).data_source.data
    assert note["text"] == [memory.EMPTY_NOTE] and "0 B held" in memory.EMPTY_NOTE
    assert note["y"] == [0.5]  # inside the 0..1 range, not on its edge


def test_an_empty_memory_panel_keeps_the_timelines_time_axis():
    shared = DataRange1d(name="timeline x range")
    fig = memory.memory_figure(empty_memory_table(0), x_range=shared)
    assert fig.x_range is shared and isinstance(fig.y_range, Range1d)


def test_a_memory_plot_with_samples_keeps_its_fitted_axis():
    table = empty_memory_table(2)
    table["t_ns"][:] = [0, 1_000_000]
    table["held_bytes"][:] = [4096, 8192]
    fig = memory.memory_figure(table)
    assert isinstance(fig.y_range, DataRange1d) and isinstance(fig.yaxis[0].ticker, AdaptiveTicker)
    assert fig.select_one({"name": "empty"}) is None


def test_the_memory_axis_label_is_the_short_one():
    fig = memory.memory_figure(empty_memory_table(0))
    assert fig.yaxis[0].axis_label == memory.Y_LABEL
    assert "1024" in memory.Y_LABEL and len(memory.Y_LABEL) <= 24  # checked against the frame in the browser below


# --- the crossover figure ---------------------------------------------------------------------------------------------


def test_crossover_legends_sit_below_the_data_and_list_what_is_drawn():
    layout = WINS_AND_NARROW.figure()
    doc = Document()
    doc.add_root(layout)
    doc.validate()
    json.dumps(json_item(layout))
    for op, labels in (("matmul", ["NumPy (host)", "device", "device + copies", "crossover"]),
                       ("sum", ["NumPy (host)", "device", "device + copies"])):  # fmt: skip
        fig = doc.get_model_by_name(f"crossover-{op}")
        assert not [m for m in fig.center if isinstance(m, Legend)]  # nothing over the data
        (legend,) = [m for m in fig.below if isinstance(m, Legend)]
        assert [item.label.value for item in legend.items] == labels  # no "crossover" entry with nothing beside it
        assert legend.click_policy == "hide" and all(item.renderers for item in legend.items)


def test_crossover_axes_use_the_1_2_5_ticker_durations_and_counts():
    layout = WINS_AND_NARROW.figure()
    for fig in (child[0] for child in layout.children):
        for axis, grid, code in ((fig.xaxis[0], fig.xgrid[0], crossover_figure.COUNTS),
                                 (fig.yaxis[0], fig.ygrid[0], crossover_figure.SECONDS)):  # fmt: skip
            assert isinstance(axis.ticker, CustomJSTicker) and axis.ticker.major_code == crossover_figure.LOG_TICKS
            assert grid.ticker is axis.ticker  # grid lines where the ticks are
            assert isinstance(axis.formatter, CustomJSTickFormatter) and axis.formatter.code == code
        assert fig.yaxis[0].axis_label == "time (median)"


# --- in the browser ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def page():
    from lab_browser import chromium_page

    with chromium_page({"width": 1300, "height": 800}) as page:
        yield page


def _load(page, tmp_path, layout, name: str) -> None:
    path = tmp_path / "figure.html"
    path.write_text(file_html(layout, INLINE))
    page.goto(path.as_uri())
    page.wait_for_function(
        "(name) => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].get_model_by_name(name) != null"
        " && Bokeh.index.get_one(Bokeh.documents[0].get_model_by_name(name))?.frame.bbox.height > 0",
        arg=name,
    )


#: Per plot: its frame, its y ticks (pixels apart on screen) and labels, and its legends' boxes (plot coordinates).
LOOK = """(name) => {
  const fig = Bokeh.documents[0].get_model_by_name(name), view = Bokeh.index.get_one(fig), frame = view.frame.bbox
  const axis = fig.left[0], ticks = Bokeh.index.get_one(axis).tick_coords.major[1]
  const f = new Function('tick', 'index', 'ticks', axis.formatter.code)
  const legends = [...fig.center, ...fig.below].filter((m) => m.type == 'Legend' || m.constructor.name == 'Legend')
  return {frame: [frame.left, frame.top, frame.right, frame.bottom], ticks,
          pixels: ticks.map((t) => view.frame.y_scale.compute(t)), labels: ticks.map((t, i) => f(t, i, ticks)),
          legends: legends.map((m) => Bokeh.index.get_one(m).bbox).map((b) => [b.left, b.top, b.right, b.bottom])}
}"""


@pytest.mark.browser
@pytest.mark.slow
def test_the_browser_draws_crossover_legends_outside_and_ticks_apart(page, tmp_path):
    _load(page, tmp_path, WINS_AND_NARROW.figure(), "crossover-sum")
    for op in ("matmul", "sum"):
        seen = page.evaluate(LOOK, f"crossover-{op}")
        left, top, right, bottom = seen["frame"]
        assert seen["legends"], op
        for _, legend_top, _, _ in seen["legends"]:
            assert legend_top >= bottom  # below the frame, over no data
        pixels = sorted(seen["pixels"])
        assert 3 <= len(pixels) <= 6, (op, seen["ticks"])
        assert min(b - a for a, b in zip(pixels, pixels[1:])) >= 20, (op, seen)  # 8pt labels never touch
        assert len(set(seen["labels"])) == len(seen["labels"])
    # sum's times span 21 µs to 87 µs: Bokeh's log ticker would space its ticks evenly in value there.
    assert page.evaluate(LOOK, "crossover-sum")["labels"] == ["20 µs", "30 µs", "50 µs", "70 µs"]


#: The ticker's ticks and the formatter's labels for a range, called as Bokeh calls them (plain JavaScript: any page).
TICKS = """([ticker, formatter, start, end]) => {
  const ticks = new Function('cb_data', ticker)({start, end})
  const f = new Function('tick', 'index', 'ticks', formatter)
  return ticks.map((t, i) => f(t, i, ticks))
}"""


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize(
    ("start", "end", "labels"),
    [
        (1e-5, 1.0, ["10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s"]),  # a decade each
        (1e-9, 2e3, ["10 ns", "1 µs", "100 µs", "10 ms", "1 s", "100 s"]),  # twelve decades: every other one
        (9e-6, 8e-5, ["10 µs", "20 µs", "50 µs"]),  # about a decade: 1-2-5
        (1.5e-5, 8e-5, ["20 µs", "30 µs", "50 µs", "70 µs"]),  # under a decade: 1-2-3-5-7
        (1.3e-5, 1.35e-5, ["13 µs", "13.2 µs", "13.4 µs"]),  # too narrow for any: evenly, with the digits needed
        (1.3e-5, 1.3006e-5, ["13 µs", "13.002 µs", "13.004 µs", "13.006 µs"]),
    ],
)
def test_the_browser_writes_log_ticks_as_durations(page, start, end, labels):
    assert page.evaluate(TICKS, [crossover_figure.LOG_TICKS, crossover_figure.SECONDS, start, end]) == labels


@pytest.mark.browser
@pytest.mark.slow
def test_the_browser_writes_sizes_as_counts(page):
    code = [crossover_figure.LOG_TICKS, crossover_figure.COUNTS]
    assert page.evaluate(TICKS, [*code, 200, 7e7]) == ["1k", "10k", "100k", "1M", "10M"]
    assert page.evaluate(TICKS, [*code, 50, 5000]) == ["100", "300", "1k", "3k"]


@pytest.mark.browser
@pytest.mark.slow
def test_the_browser_draws_an_empty_memory_plot_from_zero_with_its_label_inside_the_frame(page, tmp_path):
    fig = memory.memory_figure(empty_memory_table(0))
    fig.name = "memory"
    _load(page, tmp_path, fig, "memory")
    seen = page.evaluate(
        """() => {
      const fig = Bokeh.documents[0].get_model_by_name('memory'), view = Bokeh.index.get_one(fig)
      const axis = Bokeh.index.get_one(fig.left[0]), ctx = document.createElement('canvas').getContext('2d')
      ctx.font = `${fig.left[0].axis_label_text_font_style} ${fig.left[0].axis_label_text_font_size} helvetica`
      return {ticks: axis.tick_coords.major[1], height: view.frame.bbox.height,
              label: ctx.measureText(fig.left[0].axis_label).width}
    }"""
    )
    assert seen["ticks"] == [0]  # one tick, 0 B: nothing below it
    assert seen["label"] < seen["height"], seen  # the label fits beside the frame
