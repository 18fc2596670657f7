"""Tests of trace/statistics.py: exact tables on hand-built traces, the NumPy-only path, empty and real CPU traces."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
import support
from hypothesis import given, settings
from hypothesis import strategies as st
from support import rows

import gpuworkbench as gw
from gpuworkbench.trace.analysis import total_length, union
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import empty_table, table_from_records, thread_stream
from gpuworkbench.trace.statistics import (
    API_COLUMNS,
    COPY_COLUMNS,
    KERNEL_COLUMNS,
    LAUNCH_COLUMNS,
    SHOWN_ROWS,
    Statistics,
    factorize,
    kernel_columns,
    statistics,
)

US = 1_000
HOST = thread_stream(0)


span = functools.partial(support.span, unit=US)  # span records with their times in µs


# Device 0: saxpy on streams 1 and 2 overlapping (5-25 and 15-35), reduce 40-50, copies 0-30 and 50-53.
# Device work covers 0-35 and 40-53: |A| = 48 µs. Host kinds (the long alloc, api calls, a range) never count.
RECORDS = [
    span("h2d", 0, 0, 10, bytes=10_000_000, pinned=True, enqueue_ns=0),
    span("h2d", 0, 10, 30, bytes=10_000_000, pinned=False),
    span("kernel", 1, 5, 25, name="saxpy", enqueue_ns=4 * US),
    span("kernel", 2, 15, 35, name="saxpy", enqueue_ns=7 * US),
    span("kernel", 1, 40, 50, name="reduce", enqueue_ns=30 * US),
    span("d2h", 0, 40, 44, bytes=2_000_000, pinned=True),
    span("d2h", 0, 44, 46, bytes=1_000_000),
    span("d2d", 1, 50, 52, bytes=1_000),
    span("memset", 1, 52, 53, bytes=500),
    span("api", HOST, 3, 4, name="cudaLaunchKernel"),
    span("api", HOST, 6, 9, name="cudaLaunchKernel"),
    span("api", HOST, 29, 31, name="cudaLaunchKernel"),
    span("api", HOST, 0, 1, name="cudaMemcpyAsync"),
    span("alloc", -1, 0, 1000, bytes=64),
    span("range", HOST, 0, 900, name="step"),
]


@pytest.fixture
def stats() -> Statistics:
    return Trace.from_records(RECORDS).statistics()


# --- kernels ----------------------------------------------------------------------------------------------------------


def test_kernels_grouped_by_name_with_exact_counts_totals_and_extremes(stats: Statistics):
    kernels = rows(stats.kernels)
    assert [k["name"] for k in kernels] == ["saxpy", "reduce"]  # total descending
    saxpy, reduce = kernels
    assert (saxpy["count"], saxpy["total_ns"], saxpy["min_ns"], saxpy["max_ns"]) == (2, 40 * US, 20 * US, 20 * US)
    assert saxpy["mean_ns"] == pytest.approx(20 * US)
    assert (reduce["count"], reduce["total_ns"], reduce["mean_ns"]) == (1, 10 * US, 10 * US)
    assert list(stats.kernels.columns) == list(KERNEL_COLUMNS)


def test_share_of_device_time_is_a_union_over_the_union_of_device_work(stats: Statistics):
    """saxpy's two instances overlap on two streams: it ran for |5-35| = 30 µs of the device's |A| = 48 µs, not 40."""
    assert stats.device_time_ns == {0: 48 * US}
    saxpy, reduce = rows(stats.kernels)
    assert saxpy["busy_ns"] == 30 * US
    assert saxpy["device_time_pct"] == pytest.approx(100 * 30 / 48)
    assert reduce["device_time_pct"] == pytest.approx(100 * 10 / 48)


def test_host_kinds_never_count_as_device_time():
    only_host = [r for r in RECORDS if r["kind"] in ("alloc", "api", "range")]
    stats = Trace.from_records([*only_host, span("kernel", 0, 100, 110, name="k")]).statistics()
    assert stats.device_time_ns == {0: 10 * US}
    assert rows(stats.kernels)[0]["device_time_pct"] == pytest.approx(100.0)


def test_kernels_of_several_devices_are_grouped_and_shared_per_device():
    stats = Trace.from_records(
        [
            span("kernel", 0, 0, 10, name="k"),
            span("kernel", 0, 0, 30, device=1, name="k"),
            span("kernel", 0, 30, 40, device=1, name="big"),
            span("h2d", 1, 0, 40, device=1, bytes=4),
        ]
    ).statistics()
    assert stats.device_time_ns == {0: 10 * US, 1: 40 * US}
    got = [(k["device"], k["name"], k["total_ns"], round(k["device_time_pct"], 6)) for k in rows(stats.kernels)]
    assert got == [(0, "k", 10 * US, 100.0), (1, "k", 30 * US, 75.0), (1, "big", 10 * US, 25.0)]
    assert "kernels on device 0" in str(stats) and "kernels on device 1" in str(stats)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from("abc"), st.integers(0, 200), st.integers(0, 60)),
        max_size=30,
    )
)
def test_busy_time_is_the_union_of_each_names_spans(spans):
    table = table_from_records(
        {"kind": "kernel", "device": d, "stream": 0, "start_ns": s, "end_ns": s + n, "name": name}
        for d, name, s, n in spans
    )
    got = kernel_columns(table)
    for device, name, busy in zip(got["device"], got["name"], got["busy_ns"]):
        mine = (table["device"] == device) & (table["name"] == name)
        assert busy == total_length(union(table["start_ns"][mine], table["end_ns"][mine]))


def test_busy_time_of_traces_spanning_days_takes_the_sweep_and_agrees():
    day = 86_400 * 10**9
    table = table_from_records(
        [
            {"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 10, "name": "a"},
            {"kind": "kernel", "stream": 1, "start_ns": 5, "end_ns": 20, "name": "a"},
            {"kind": "kernel", "stream": 0, "start_ns": 40 * day, "end_ns": 40 * day + 7, "name": "b"},
        ]
        + [{"kind": "kernel", "stream": 0, "start_ns": i, "end_ns": i, "name": f"n{i}"} for i in range(40_000)]
    )
    got = kernel_columns(table)
    busy = dict(zip(got["name"], got["busy_ns"]))
    assert busy["a"] == 20 and busy["b"] == 7 and busy["n3"] == 0


# --- copies -----------------------------------------------------------------------------------------------------------


def test_copies_split_by_direction_and_host_memory_with_bandwidth(stats: Statistics):
    got = {(c["kind"], c["memory"]): c for c in rows(stats.copies)}
    assert list(got) == [
        ("h2d", "pinned"),
        ("h2d", "pageable"),
        ("d2h", "pinned"),
        ("d2h", "unknown"),
        ("d2d", "n/a"),
        ("memset", "n/a"),
    ]
    pinned, pageable = got["h2d", "pinned"], got["h2d", "pageable"]
    assert (pinned["count"], pinned["bytes"], pinned["total_ns"]) == (1, 10_000_000, 10 * US)
    assert pinned["gbps"] == pytest.approx(1000.0)  # 10 MB in 10 µs
    assert pageable["gbps"] == pytest.approx(500.0)
    assert got["d2h", "unknown"]["bytes"] == 1_000_000
    assert got["memset", "n/a"]["gbps"] == pytest.approx(0.5)
    assert list(stats.copies.columns) == list(COPY_COLUMNS)


def test_copies_of_one_group_add_up_and_zero_length_copies_have_no_bandwidth():
    stats = Trace.from_records(
        [
            span("h2d", 0, 0, 10, bytes=1_000, pinned=True),
            span("h2d", 1, 5, 35, bytes=3_000, pinned=True),
            span("d2h", 0, 40, 40, bytes=8, pinned=True),
        ]
    ).statistics()
    h2d, d2h = rows(stats.copies)
    assert (h2d["count"], h2d["bytes"], h2d["total_ns"], h2d["mean_ns"]) == (2, 4_000, 40 * US, 20 * US)
    assert h2d["gbps"] == pytest.approx(4_000 / 40_000)
    assert np.isnan(d2h["gbps"])
    assert "n/a" in str(stats)


# --- API calls and launch latency -------------------------------------------------------------------------------------


def test_api_calls_grouped_by_name(stats: Statistics):
    api = rows(stats.api)
    assert [(a["name"], a["count"], a["total_ns"], a["min_ns"], a["max_ns"]) for a in api] == [
        ("cudaLaunchKernel", 3, 6 * US, 1 * US, 3 * US),
        ("cudaMemcpyAsync", 1, 1 * US, 1 * US, 1 * US),
    ]
    assert api[0]["mean_ns"] == pytest.approx(2 * US)
    assert list(stats.api.columns) == list(API_COLUMNS)


def test_launch_latency_from_enqueue_times(stats: Statistics):
    """Kernels started 1, 8 and 10 µs after they were enqueued; of the copies only one has an enqueue time."""
    got = {r["kind"]: r for r in rows(stats.launch_latency)}
    assert set(got) == {"h2d", "kernel"}
    kernel = got["kernel"]
    assert kernel["count"] == 3
    assert kernel["median_ns"] == pytest.approx(8 * US)
    assert kernel["p95_ns"] == pytest.approx(np.percentile([1, 8, 10], 95) * US)
    assert kernel["max_ns"] == 10 * US
    assert (got["h2d"]["count"], got["h2d"]["median_ns"]) == (1, 0)
    assert list(stats.launch_latency.columns) == list(LAUNCH_COLUMNS)


# --- results and rendering --------------------------------------------------------------------------------------------


def _nan_free(table: object) -> list[dict]:
    """The table's rows with NaN as a word (NaN != NaN)."""
    return [{k: "NaN" if v != v else v for k, v in row.items()} for row in rows(table)]


def test_without_pandas_every_table_is_a_dict_of_numpy_columns(monkeypatch: pytest.MonkeyPatch):
    with_pandas = Trace.from_records(RECORDS).statistics()
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    stats = Trace.from_records(RECORDS).statistics()
    for name, columns in (
        ("kernels", KERNEL_COLUMNS),
        ("copies", COPY_COLUMNS),
        ("api", API_COLUMNS),
        ("launch_latency", LAUNCH_COLUMNS),
    ):
        table = getattr(stats, name)
        assert isinstance(table, dict) and tuple(table) == columns
        assert all(isinstance(v, np.ndarray) for v in table.values())
        assert _nan_free(table) == _nan_free(getattr(with_pandas, name))
    assert str(stats) == str(with_pandas)
    assert stats._repr_html_() == with_pandas._repr_html_()


def test_empty_trace_gives_a_clear_empty_result():
    stats = Trace.from_records([]).statistics()
    assert stats.empty and stats.device_time_ns == {}
    assert str(stats).startswith("no spans traced")
    assert "no spans traced" in stats._repr_html_()
    assert len(stats.kernels) == len(stats.copies) == len(stats.api) == len(stats.launch_latency) == 0
    assert list(stats.kernels.columns) == list(KERNEL_COLUMNS)
    assert "0 spans" in repr(stats)


def test_a_trace_of_host_spans_only_says_there_are_no_kernels():
    stats = Trace.from_records([span("api", HOST, 0, 5, name="cudaMalloc")]).statistics()
    assert not stats.empty
    text = str(stats)
    assert "no device work: no kernels" in text and "cudaMalloc" in text and "no copies or memsets" in text


def test_text_and_html_name_the_kernels_and_escape_them():
    stats = Trace.from_records(
        [span("kernel", 0, 0, 10, name="void scale<float>(float*)"), span("kernel", 0, 10, 12, name="x" * 200)]
    ).statistics()
    page = stats._repr_html_()
    assert "void scale&lt;float&gt;(float*)" in page and "<float>" not in page
    assert "<table" in page and "<link" not in page and "stylesheet" not in page
    text = str(stats)
    assert "void scale<float>(float*)" in text
    assert "x" * 59 + "…" in text and "x" * 61 not in text  # long names are cut in the text


def test_long_tables_show_their_first_rows_and_say_how_many_more():
    records = [span("kernel", 0, i, i + 1, name=f"k{i:03d}") for i in range(SHOWN_ROWS + 5)]
    stats = Trace.from_records(records).statistics()
    assert len(stats.kernels) == SHOWN_ROWS + 5
    assert "… and 5 more rows" in str(stats) and "… and 5 more rows" in stats._repr_html_()


def test_a_table_without_the_needed_columns_is_refused():
    table = empty_table(1)
    del table["pinned"]
    with pytest.raises(gw.InvalidArgument, match="pinned"):
        statistics(table)


def test_factorize_groups_equal_strings_in_order_of_first_appearance():
    values = np.array(["b", "a", "b", "c", "a"], dtype=object)
    codes, uniques = factorize(values)
    assert list(uniques[codes]) == list(values) and list(uniques) == ["b", "a", "c"]
    assert codes.dtype == np.intp and list(codes) == [0, 1, 0, 2, 1]
    codes, uniques = factorize(values, leading=("", "a"))  # leading strings first, present or not
    assert list(uniques) == ["", "a", "b", "c"] and list(codes) == [2, 1, 2, 3, 1]
    unhashable = np.empty(3, object)
    unhashable[:] = [["x"], "y", ["x"]]  # grouped by their text
    codes, uniques = factorize(unhashable)
    assert codes[0] == codes[2] != codes[1] and len(uniques) == 2


# --- a real trace -----------------------------------------------------------------------------------------------------


def test_statistics_of_a_cpu_backend_trace():
    t = support.traced_rounds(gw.Device(backend="cpu"), wait_each=True)
    stats = t.statistics()
    kernels = rows(stats.kernels)
    assert [(k["name"], k["count"]) for k in kernels] == [("scale_add", 3)]
    assert 0 < kernels[0]["device_time_pct"] <= 100
    assert sum(c["count"] for c in rows(stats.copies)) == 6
    assert {(c["kind"], c["bytes"]) for c in rows(stats.copies)} == {("h2d", 3 * 4096 * 4), ("d2h", 3 * 4096 * 4)}
    launch = {r["kind"]: r for r in rows(stats.launch_latency)}
    assert launch["kernel"]["count"] == 3 and launch["kernel"]["median_ns"] >= 0
    assert "scale_add" in stats._repr_html_() and "scale_add" in str(stats)
    assert stats.device_names == {0: "cpu:0"}
