"""Tests of trace/compare.py: kernel diffs and figures of two hand-built traces, loaded traces, bad input, no pandas."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
import support
from support import rows

pytest.importorskip("bokeh")

from bokeh.document import Document  # noqa: E402
from bokeh.embed import file_html  # noqa: E402
from bokeh.models import Column, GlyphRenderer, Range1d  # noqa: E402
from bokeh.plotting import figure as figure_type  # noqa: E402
from bokeh.resources import INLINE  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.trace.compare import COLUMNS, Comparison  # noqa: E402
from gpuworkbench.trace.recorder import Trace  # noqa: E402

US = 1_000


span = functools.partial(support.span, unit=US)  # span records with their times in µs


# Run a: copy 0-10, saxpy twice (10-30, 30-40), old 40-50, steady 50-60, copy back 60-70: W = 70 µs, no overlap.
BEFORE = [
    span("h2d", 0, 0, 10, bytes=1_000_000, pinned=True),
    span("kernel", 1, 10, 30, name="saxpy"),
    span("kernel", 1, 30, 40, name="saxpy"),
    span("kernel", 1, 40, 50, name="old"),
    span("kernel", 1, 50, 60, name="steady"),
    span("kernel", 1, 60, 62, name="tiny"),
    span("d2h", 0, 62, 70, bytes=1_000_000, pinned=True),
]
# Run b, a second later on the host clock: saxpy once (15 µs) overlapping the copy, new kernel, steady unchanged,
# tiny slower by 1 µs: W = 50 µs.
AFTER = [
    span("h2d", 0, 1000, 1010, bytes=1_000_000, pinned=True),
    span("kernel", 1, 1005, 1020, name="saxpy"),
    span("kernel", 1, 1020, 1025, name="new"),
    span("kernel", 1, 1025, 1035, name="steady"),
    span("kernel", 1, 1035, 1038, name="tiny"),
    span("d2h", 0, 1038, 1050, bytes=1_000_000, pinned=True),
]


def kernel_rows(comparison: Comparison) -> list[dict]:
    return [r for r in rows(comparison.table) if r["section"] == "kernel"]


def trace_rows(comparison: Comparison) -> dict[str, dict]:
    return {r["item"]: r for r in rows(comparison.table) if r["section"] == "trace"}


@pytest.fixture
def before() -> Trace:
    return Trace.from_records(BEFORE)


@pytest.fixture
def after() -> Trace:
    return Trace.from_records(AFTER)


def test_kernels_added_removed_slower_faster_sorted_by_change_in_total(before: Trace, after: Trace):
    diff = gw.compare(before, after, labels=("before", "after"))
    got = [(r["item"], r["change"], r["count_a"], r["count_b"], r["a"], r["b"], r["delta"]) for r in kernel_rows(diff)]
    assert got == [
        ("saxpy", "faster", 2, 1, 30 * US, 15 * US, -15 * US),
        ("old", "removed", 1, 0, 10 * US, 0, -10 * US),
        ("new", "added", 0, 1, 0, 5 * US, 5 * US),
        ("tiny", "slower", 1, 1, 2 * US, 3 * US, 1 * US),
        ("steady", "same", 1, 1, 10 * US, 10 * US, 0),
    ]
    ratio = {r["item"]: r["ratio"] for r in kernel_rows(diff)}
    assert ratio["saxpy"] == pytest.approx(0.5) and ratio["tiny"] == pytest.approx(1.5)
    assert ratio["old"] == 0 and np.isnan(ratio["new"])
    assert diff.changes() == {"added": 1, "removed": 1, "slower": 1, "faster": 1, "same": 1}
    assert not diff.unchanged
    assert list(diff.table.columns) == list(COLUMNS)


def test_trace_figures_come_from_summarize(before: Trace, after: Trace):
    diff = gw.compare(before, after)
    figures = trace_rows(diff)
    assert list(figures) == ["wall time", "overlap %", "idle %", "pipeline efficiency"]
    wall = figures["wall time"]
    assert (wall["a"], wall["b"], wall["delta"], wall["change"]) == (70 * US, 50 * US, -20 * US, "faster")
    assert wall["ratio"] == pytest.approx(50 / 70) and wall["count_a"] == -1
    overlap = figures["overlap %"]
    assert (overlap["a"], overlap["b"], overlap["change"]) == (0.0, pytest.approx(100 * 5 / 22), "higher")
    a, b = (s.first_device for s in diff.summaries)
    assert figures["idle %"]["a"] == a.idle_pct and figures["idle %"]["b"] == b.idle_pct
    assert figures["pipeline efficiency"]["b"] == pytest.approx(b.pipeline_efficiency)
    assert figures["pipeline efficiency"]["unit"] == "" and wall["unit"] == "ns"


def test_a_trace_compared_with_itself_has_no_changes(before: Trace):
    diff = gw.compare(before, before)
    assert diff.unchanged
    assert {r["change"] for r in rows(diff.table)} == {"same"}
    assert all(r["delta"] == 0 for r in rows(diff.table))
    assert "no kernel changed" in str(diff) and "(0 of 4; 4 the same)" in str(diff)


def test_tolerance_counts_small_changes_as_the_same(before: Trace, after: Trace):
    changes = {r["item"]: r["change"] for r in kernel_rows(gw.compare(before, after, tolerance=0.6))}
    assert changes == {"saxpy": "same", "old": "removed", "new": "added", "tiny": "same", "steady": "same"}


def test_text_and_html_use_the_labels_and_name_the_kernels(before: Trace, after: Trace):
    diff = gw.compare(before, after, labels=("before", "after <fix>"))
    text = str(diff)
    assert text.startswith("before → after <fix>")
    assert "count before" in text and "saxpy" in text and "faster" in text
    assert "steady" not in text  # the same: counted, not listed
    page = diff._repr_html_()
    assert "after &lt;fix&gt;" in page and "saxpy" in page and "new" in page and "<link" not in page
    assert repr(diff) == "<Comparison 'before' → 'after <fix>': 1 added, 1 removed, 1 slower, 1 faster, 1 same>"


def test_kernels_are_compared_per_device():
    a = Trace.from_records([span("kernel", 0, 0, 10, name="k"), span("kernel", 0, 0, 10, device=1, name="k")])
    b = Trace.from_records([span("kernel", 0, 0, 10, name="k"), span("kernel", 0, 0, 30, device=1, name="k")])
    got = [(r["device"], r["item"], r["change"]) for r in kernel_rows(gw.compare(a, b))]
    assert got == [(1, "k", "slower"), (0, "k", "same")]
    assert "device 1 · wall time" in str(gw.compare(a, b))


def test_an_empty_trace_against_a_full_one(before: Trace):
    empty = Trace.from_records([])
    diff = gw.compare(empty, before)
    assert {r["change"] for r in kernel_rows(diff)} == {"added"}
    assert {r["change"] for r in trace_rows(diff).values()} == {"n/a"}
    assert np.isnan(trace_rows(diff)["wall time"]["a"])
    assert "n/a" in str(diff)
    both = gw.compare(empty, empty)
    assert len(both.table) == 0 and both.unchanged
    assert "no spans in either" in str(both) and "no kernels in either" in str(both)
    Document().add_root(both.figure())


def test_without_pandas_the_table_is_a_dict_of_numpy_columns(monkeypatch: pytest.MonkeyPatch, before, after):
    expected = rows(gw.compare(before, after).table)
    monkeypatch.setitem(sys.modules, "pandas", None)
    table = gw.compare(before, after).table
    assert isinstance(table, dict) and tuple(table) == COLUMNS
    assert all(isinstance(v, np.ndarray) for v in table.values())
    assert [r["item"] for r in rows(table)] == [r["item"] for r in expected]
    np.testing.assert_array_equal(table["delta"], [r["delta"] for r in expected])


# --- the figure -------------------------------------------------------------------------------------------------------


def test_figure_is_two_timelines_sharing_one_x_range(before: Trace, after: Trace):
    layout = gw.compare(before, after, labels=("before", "after")).figure()
    assert isinstance(layout, Column)
    top, bottom = layout.children
    assert isinstance(top, figure_type) and isinstance(bottom, figure_type)
    assert top.x_range is bottom.x_range and isinstance(top.x_range, Range1d)
    assert top.x_range.start == 0 and top.x_range.end >= 0.070  # the longer run, in ms
    assert top.title.text.startswith("before") and bottom.title.text.startswith("after")
    for fig, records in ((top, BEFORE), (bottom, AFTER)):
        data = fig.select_one({"name": "spans", "type": GlyphRenderer}).data_source.data
        assert len(data["left"]) == len(records)
        assert min(data["left"]) == 0  # each run from its own first span, so that the two line up
    Document().add_root(layout)
    assert "<html" in file_html(layout, INLINE)


def test_traces_read_by_load_trace_compare(before: Trace, after: Trace, tmp_path):
    path = tmp_path / "before.json"
    before.to_chrome_trace(str(path))
    loaded = gw.load_trace(str(path))
    assert gw.compare(before, loaded).unchanged
    diff = gw.compare(loaded, after)
    assert [(r["item"], r["change"]) for r in kernel_rows(diff)][:2] == [("saxpy", "faster"), ("old", "removed")]
    layout = diff.figure()
    assert layout.children[0].x_range is layout.children[1].x_range


# --- bad input --------------------------------------------------------------------------------------------------------


def test_anything_but_a_trace_is_refused_by_name(before: Trace):
    with pytest.raises(gw.InvalidArgument, match=r"a is a list \(\[1, 2\]\)"):
        gw.compare([1, 2], before)
    with pytest.raises(gw.InvalidArgument, match="b is a dict"):
        gw.compare(before, before.table())
    with pytest.raises(gw.InvalidArgument, match="two names"):
        gw.compare(before, before, labels="ab")
    with pytest.raises(gw.InvalidArgument, match="tolerance"):
        gw.compare(before, before, tolerance=-1)
