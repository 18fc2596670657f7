"""Tests of viz/source_view.py: the annotated source above the timeline, built as real Bokeh documents from a live
CPU trace with lines and from hand-built traces with locations."""

from __future__ import annotations

import linecache
import time

import numpy as np
import pytest

pytest.importorskip("bokeh")

from bokeh.core.validation import check_integrity  # noqa: E402
from bokeh.document import Document  # noqa: E402
from bokeh.models import ColumnDataSource, CustomJS, HoverTool, TapTool, WheelPanTool  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.trace.lines import Location  # noqa: E402
from gpuworkbench.trace.recorder import Trace  # noqa: E402
from gpuworkbench.viz import source_figure  # noqa: E402
from gpuworkbench.viz.source_view import BAR_PX, line_rows  # noqa: E402

CELL = "<cell 71>"
SOURCE = (
    "a = dev.alloc(1 << 16, 'float32')\n"
    "h = np.ones(1 << 16, np.float32)\n"
    "a.copy_from_host(h)\n"
    "# nothing here\n"
    "for _ in range(3):\n"
    "    a.copy_from_host(h)\n"
)


def cache(name: str, src: str) -> None:
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)


@pytest.fixture(scope="module")
def live() -> Trace:
    """A CPU trace of SOURCE with lines: the alloc on line 1, one copy on line 3, three on line 6."""
    dev = gw.Device("cpu")
    cache(CELL, SOURCE)
    with gw.trace(lines=True) as t:
        t.lines.set_focus(CELL)
        exec(compile(SOURCE, CELL, "exec"), {"dev": dev, "np": np})  # noqa: S102 - the traced "cell"
    t.wait_pending()
    return t


def located(spans: list[tuple[str, int, int]], locations: list[Location]) -> Trace:
    """A stopped trace of ``(kind, duration_ns, loc)`` spans one after another (device work on stream 0, host calls
    on host thread 0)."""
    records, t = [], 0
    for kind, duration, loc in spans:
        stream = -2 if kind in ("api", "range") else 0
        records.append(
            {"kind": kind, "stream": stream, "start_ns": t, "end_ns": t + duration, "name": kind, "loc": loc}
        )
        t += duration
    built = Trace.from_records(records)
    return Trace.finished(built.table(), built.devices, built.stream_labels, locations=locations)


def source(view, name: str) -> dict:
    return view.select_one({"name": name, "type": ColumnDataSource}).data


def span_source(timeline) -> ColumnDataSource:
    return timeline.select_one({"name": "span source", "type": ColumnDataSource})


def link_of(view) -> CustomJS:
    (callback,) = view.select_one({"name": "source rows"}).selected.js_property_callbacks["change:indices"]
    return callback


def spans_of_rows(view) -> list[list[int]]:
    """The link's span indices for each line row of the view (decoded from the callback's arguments)."""
    args = link_of(view).args
    members, first = args["members"], args["first"]
    return [sorted(members[first[r] : first[r + 1]]) for r in range(len(first) - 1)]


# --- rows and bars ----------------------------------------------------------------------------------------------------


def test_rows_show_every_line_of_the_cell_with_ops_and_times_of_the_lines_table(live: Trace):
    view = source_figure(live, live.timeline())
    rows = source(view, "source rows")
    assert list(rows["line"]) == [1, 2, 3, 4, 5, 6]  # lines with no work in between are shown, without bars
    stats = live.statistics().lines
    expected = {int(line): (int(ops), int(ns)) for line, ops, ns in zip(stats.line, stats.ops, stats.device_time_ns)}
    assert expected.keys() == {3, 6} and expected[6][0] == 3 and expected[3][0] == 1
    got = {line: (ops, ns) for line, ops, ns in zip(rows["line"], rows["ops"], rows["time_ns"]) if ops}
    assert got == expected
    labels = source(view, "source labels")
    assert "    a.copy_from_host(h)" in labels["text"] and "# nothing here" in labels["text"]
    assert "<cell 71>" in labels["text"]  # the file's header
    three = next(s for s in rows["stats"] if s.startswith("3 ops"))
    assert f"({stats.share_pct[stats.line == 6].iloc[0]:.0f} %)" in three and three in labels["text"]


def test_a_bar_per_line_with_device_work_proportional_to_its_time(live: Trace):
    view = source_figure(live)
    rows, bars = source(view, "source rows"), source(view, "source bars")
    time_of = dict(zip(rows["y"], rows["time_ns"]))
    lengths = {}
    for y, left, right, color in zip(bars["y"], bars["left"], bars["right"], bars["color"]):
        if color != "#eef2f7":  # the bar, not its track
            lengths[y] = right - left
    assert len(lengths) == 2 and all(time_of[y] > 0 for y in lengths)  # no bar on a line without device work
    top = max(time_of.values())
    for y, length in lengths.items():
        assert length == pytest.approx(max(BAR_PX * time_of[y] / top, 1.0))


def test_lines_a_file_cannot_give_are_rows_with_their_text_and_sites_show_in_the_hover():
    locations = [
        Location("/elsewhere/model.py", 7, "forward", text="aten::mm"),
        Location("/elsewhere/model.py", 7, "forward", text="aten::add"),
        Location("/elsewhere/train.py", 3, "<module>", "/elsewhere/model.py", 7, "forward", text="loss.backward()"),
    ]
    trace = located([("kernel", 500, 0), ("kernel", 200, 1), ("kernel", 300, 2), ("kernel", 100, -1)], locations)
    rows, row_of = line_rows(trace.table(), trace.locations)
    kinds = [(r["kind"], r["text"]) for r in rows]
    assert kinds == [
        ("header", "elsewhere/model.py"),
        ("line", "aten::mm"),  # one line's calls in the order the trace first saw them
        ("line", "aten::add"),
        ("header", "elsewhere/train.py"),
        ("line", "loss.backward()"),
        ("header", "work with no recorded line"),
        ("line", "(unknown)"),
    ]
    assert row_of.tolist() == [1, 2, 4, 6]
    assert [r["time_ns"] for r in rows if r["kind"] == "line"] == [500, 200, 300, 100]
    view = source_figure(trace)
    assert source(view, "source rows")["sites"][2] == "forward at elsewhere/model.py:7"
    hover = view.select_one({"name": "source hover", "type": HoverTool})
    assert ("issued in", "@sites") in hover.tooltips


def test_a_long_file_shows_windows_around_its_lines_with_work():
    name = "/tmp/gw-test/long_module.py"
    cache(name, "".join(f"x{i} = {i}\n" for i in range(1, 301)))
    trace = located([("kernel", 100, 0), ("kernel", 100, 1)], [Location(name, 10, "f"), Location(name, 200, "g")])
    rows, _ = line_rows(trace.table(), trace.locations)
    assert [r["line"] for r in rows if r["kind"] == "line"] == [8, 9, 10, 11, 12, 198, 199, 200, 201, 202]
    assert [r["kind"] for r in rows].count("gap") == 1


def test_the_traced_cell_comes_first():
    cache("<cell 72>", "x()\n")
    cache("<cell 73>", "y()\n")
    locations = [Location("<cell 72>", 1, "<module>"), Location("<cell 73>", 1, "<module>")]
    trace = located([("kernel", 100, 0), ("kernel", 900, 1)], locations)
    assert [r["text"] for r in line_rows(trace.table(), locations)[0] if r["kind"] == "header"] == [
        "<cell 73>",  # the most device time first
        "<cell 72>",
    ]
    focused = line_rows(trace.table(), locations, focus=["<cell 72>"])[0]
    assert [r["text"] for r in focused if r["kind"] == "header"] == ["<cell 72>", "<cell 73>"]


# --- the link to the timeline -----------------------------------------------------------------------------------------


def test_a_line_maps_to_the_indices_of_its_spans_in_the_timeline_source():
    cache("<cell 74>", "first()\nsecond()\n")
    locations = [Location("<cell 74>", 1, "<module>"), Location("<cell 74>", 2, "<module>")]
    # a range last in the table: the timeline draws ranges first, so its source is in another order than the table
    spans = [("kernel", 100, 0), ("api", 10, 1), ("kernel", 300, 1), ("kernel", 50, 0), ("kernel", 20, -1)]
    trace = located([*spans, ("api", 5, -1), ("range", 40, 1)], locations)
    timeline = trace.timeline()
    spans = span_source(timeline).data
    assert spans["kind"][0] == "range" and list(trace.table()["loc"]) != list(spans["loc"])
    view = source_figure(trace, timeline)
    rows = source(view, "source rows")
    assert list(rows["line"]) == [1, 2, 0]  # the two lines, then work without a line
    by_row = spans_of_rows(view)
    loc = np.asarray(spans["loc"])
    assert by_row[0] == np.flatnonzero(loc == 0).tolist() and len(by_row[0]) == 2
    assert by_row[1] == np.flatnonzero(loc == 1).tolist() and len(by_row[1]) == 3  # the range, call and kernel
    unknown = np.flatnonzero((loc < 0) & (np.asarray(spans["kind"]) == "kernel")).tolist()
    assert by_row[2] == unknown and len(unknown) == 1  # a host call without a line belongs to no row
    link = link_of(view)
    assert link.args["spans"] is span_source(timeline) and link.args["rows"] is view.select_one({"name": "source rows"})
    assert "spans.selected.indices" in link.code
    tap = view.select_one({"type": TapTool})
    assert tap.mode == "toggle" and [r.name for r in tap.renderers] == ["source picks"]


def test_the_spans_left_out_of_a_selection_fade(live: Trace):
    fig = live.timeline().children[0]
    bars = fig.select_one({"name": "spans"})
    assert bars.nonselection_glyph.fill_alpha == bars.nonselection_glyph.line_alpha < 0.5


def test_a_timeline_too_large_for_its_source_gets_no_link(live: Trace):
    timeline = live.timeline(detail_limit=1)  # the browser fills the span source: its indices are not the table's
    view = source_figure(live, timeline)
    assert view.select_one({"type": TapTool}) is None
    assert "tap" not in view.title.text
    hover = timeline.select_one({"name": "span hover", "type": HoverTool})
    assert "line" not in dict(hover.tooltips)  # the spans the browser draws carry no line


# --- hover and show ---------------------------------------------------------------------------------------------------


def test_the_span_tooltip_names_the_line_that_issued_the_span(live: Trace):
    fig = live.timeline().children[0]
    hover = fig.select_one({"name": "span hover", "type": HoverTool})
    assert ("line", "@line") in hover.tooltips
    data = span_source(fig).data
    by_kind = {}
    for kind, line in zip(data["kind"], data["line"]):
        by_kind.setdefault(kind, set()).add(line)
    assert by_kind["h2d"] == {f"{CELL}:3  a.copy_from_host(h)", f"{CELL}:6  a.copy_from_host(h)"}
    assert f"{CELL}:1  a = dev.alloc(1 << 16, 'float32')" in by_kind["alloc"]


def test_a_nested_location_names_its_site_in_the_span_tooltip():
    cache("<cell 75>", "run()\n")
    trace = located([("kernel", 100, 0)], [Location("<cell 75>", 1, "<module>", "<cell 70>", 4, "run")])
    (line,) = span_source(trace.timeline()).data["line"]
    assert line == "<cell 75>:1  run()  (via run at <cell 70>:4)"


def test_show_puts_the_source_view_above_the_timeline(live: Trace):
    layout = live.show()
    view, timeline = layout.children[:2]
    assert view.name == "source view" and timeline.name == "timeline" and len(layout.children) == 5
    # x is in pixels: a fixed frame, not lined up with the timeline's (that would push it right, past its width)
    assert view.sizing_mode == "fixed" and view.frame_align is False and view.x_range.end == view.frame_width
    assert link_of(view).args["spans"] is span_source(timeline)
    doc = Document()
    doc.add_root(layout)
    issues = check_integrity([view, *view.references()])
    assert not issues.error and not issues.warning


def test_a_trace_without_locations_has_no_source_view():
    plain = Trace.from_records([{"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 100, "name": "k"}])
    layout = plain.show()
    assert len(layout.children) == 4 and layout.select_one({"name": "source view"}) is None
    fig = layout.children[0]
    assert "@line" not in dict(fig.select_one({"name": "span hover", "type": HoverTool}).tooltips).values()
    assert list(span_source(fig).data["line"]) == [""]


def test_a_thousand_spans_on_fifty_lines_build_quickly():
    cache("<cell 76>", "".join(f"step({i})\n" for i in range(50)))
    locations = [Location("<cell 76>", n, "<module>") for n in range(1, 51)]
    trace = located([("kernel", 100 + i, i % 50) for i in range(1000)], locations)
    timeline = trace.timeline()
    source_figure(trace, timeline)  # warm
    began = time.perf_counter()
    view = source_figure(trace, timeline)
    took = time.perf_counter() - began
    assert len(source(view, "source rows")["line"]) == 50 and sum(len(s) for s in spans_of_rows(view)) == 1000
    wheel = view.select_one({"type": WheelPanTool})
    assert view.toolbar.active_scroll is wheel and wheel.dimension == "height"  # 50 lines: more than are shown at once
    assert took < 0.25, f"{took * 1e3:.0f} ms"  # about 20 ms on a laptop: Bokeh's models, the rows are < 1 ms


def test_a_dark_page_gets_light_text(live: Trace) -> None:
    from gpuworkbench.viz.source_view import INK

    light = source(source_figure(live), "source labels")["color"]
    dark = source(source_figure(live, dark=True), "source labels")["color"]
    assert INK[False]["source"] in light and INK[True]["source"] in dark and INK[False]["source"] not in dark
