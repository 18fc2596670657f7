"""Tests of trace/analysis/: exact figures on hand-built traces; the interval algebra against a brute-force grid."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import span

from gpuworkbench.trace.analysis import (
    GAP_CAUSES,
    STATES,
    Summary,
    clip,
    difference,
    gap_causes,
    intersection,
    state_segments,
    summarize,
    total_length,
    union,
)
from gpuworkbench.trace.spans import empty_table, table_from_records


def trace(*records: dict) -> dict[str, np.ndarray]:
    return table_from_records(records)


def pairs(intervals: tuple[np.ndarray, np.ndarray]) -> list[tuple[int, int]]:
    return [(int(s), int(e)) for s, e in zip(*intervals, strict=True)]


def codes(summary: Summary) -> list[str]:
    return [a.code for a in summary.advice]


def assert_consistent(summary: Summary) -> None:
    """The 8 states sum to the window, and the named figures agree with them."""
    for ds in summary.devices.values():
        assert list(ds.states) == list(STATES)
        assert all(isinstance(ns, int) and ns >= 0 for ns in ds.states.values())
        assert sum(ds.states.values()) == ds.window_ns == ds.window_end_ns - ds.window_start_ns


# --- interval algebra -------------------------------------------------------------------------------------------------


def test_union_merges_nested_disjoint_touching_and_drops_empty():
    assert pairs(union([0, 2], [10, 5])) == [(0, 10)]  # nested
    assert pairs(union([20, 0], [30, 10])) == [(0, 10), (20, 30)]  # disjoint, unsorted input
    assert pairs(union([0, 5], [5, 10])) == [(0, 10)]  # touching
    assert pairs(union([3, 0], [3, 1])) == [(0, 1)]  # zero-length dropped
    assert pairs(union([3], [3])) == []
    assert pairs(union([], [])) == []


def test_intersection_difference_clip_and_length():
    a = union([0, 20], [10, 30])
    b = union([5], [25])
    assert pairs(intersection(a, b)) == [(5, 10), (20, 25)]
    assert pairs(difference(a, b)) == [(0, 5), (25, 30)]
    assert pairs(difference(b, a)) == [(10, 20)]
    assert pairs(intersection(union([0], [5]), union([5], [10]))) == []  # touching intervals share no time
    assert pairs(clip(a, 5, 25)) == [(5, 10), (20, 25)]
    assert pairs(clip(a, 40, 50)) == []
    assert total_length(a) == 20
    # Inputs need not be unions: they are normalised first.
    assert pairs(intersection((np.array([0, 2]), np.array([10, 5])), (np.array([4]), np.array([6])))) == [(4, 6)]


_interval = st.tuples(st.integers(0, 40), st.integers(0, 40)).map(sorted)
_intervals = st.lists(_interval, max_size=8)


def _arrays(intervals: list) -> tuple[np.ndarray, np.ndarray]:
    return np.array([s for s, _ in intervals], dtype=np.int64), np.array([e for _, e in intervals], dtype=np.int64)


def _grid(intervals: list) -> np.ndarray:
    cells = np.zeros(41, dtype=bool)
    for start, end in intervals:
        cells[start:end] = True
    return cells


@settings(max_examples=300, deadline=None)
@given(a=_intervals, b=_intervals, window=_interval)
def test_interval_algebra_matches_integer_grid(a, b, window):
    ua, ub = union(*_arrays(a)), union(*_arrays(b))
    starts, ends = ua
    assert np.all(ends > starts) and np.all(starts[1:] > ends[:-1])  # sorted, disjoint, non-touching, non-empty
    assert np.array_equal(_grid(pairs(ua)), _grid(a))
    assert total_length(ua) == _grid(a).sum()
    assert total_length(intersection(ua, ub)) == (_grid(a) & _grid(b)).sum()
    assert total_length(intersection(_arrays(a), _arrays(b))) == (_grid(a) & _grid(b)).sum()
    assert total_length(difference(ua, ub)) == (_grid(a) & ~_grid(b)).sum()
    assert total_length(clip(ua, *window)) == (_grid(a) & _grid([window])).sum()


_work_kinds = st.sampled_from(["h2d", "d2h", "kernel", "d2d", "memset", "alloc", "marker"])
_random_span = st.builds(
    lambda kind, stream, start, length: span(kind, stream, start, start + length),
    _work_kinds,
    st.integers(0, 2),
    st.integers(0, 30),
    st.integers(0, 10),
)


@settings(max_examples=200, deadline=None)
@given(records=st.lists(_random_span, max_size=10), window=st.none() | _interval)
def test_states_match_integer_grid(records, window):
    table = trace(*records)
    summary = summarize(table, window=window)
    assert_consistent(summary)
    if not records:
        return
    ds = summary.first_device
    w0, w1 = ds.window_start_ns, ds.window_end_ns
    inside = np.zeros(41, dtype=bool)
    inside[max(w0, 0) : max(w1, 0)] = True

    def grid(*kinds: str) -> np.ndarray:
        return _grid([(r["start_ns"], r["end_ns"]) for r in records if r["kind"] in kinds]) & inside

    h, d, k = grid("h2d"), grid("d2h"), grid("kernel", "d2d", "memset")
    assert ds.h2d_ns == h.sum() and ds.d2h_ns == d.sum() and ds.kernel_ns == k.sum()
    assert ds.states["H+D+K"] == (h & d & k).sum()
    assert ds.states["idle"] == ds.window_ns - (h | d | k).sum()
    assert ds.exposed_copy_ns == ((h | d) & ~k).sum()
    segments = state_segments(table, window=window)
    assert np.array_equal(segments["start_ns"][1:], segments["end_ns"][:-1])  # contiguous
    assert np.all(segments["state"][1:] != segments["state"][:-1])  # each boundary changes the state
    for state in STATES:
        mine = segments["state"] == state
        assert (segments["end_ns"][mine] - segments["start_ns"][mine]).sum() == ds.states[state]


# --- summarize: exact figures -------------------------------------------------------------------------------------


def test_nested_copy_inside_kernel():
    summary = summarize(trace(span("kernel", 1, 0, 100), span("h2d", 2, 20, 40, bytes=2000, pinned=True)))
    assert_consistent(summary)
    assert summary.window_ns == 100 and summary.window_source == "ops"
    assert summary.states == {**dict.fromkeys(STATES, 0), "K": 80, "H+K": 20}
    assert summary.overlap_pct == 100.0 and summary.exposed_copy_ns == 0
    assert summary.h2d_overlap_pct == 100.0 and summary.d2h_overlap_pct is None
    assert summary.idle_pct == 0.0
    assert summary.pipeline_efficiency == 1.0
    assert summary.stream_busy == {1: 1.0, 2: 0.2}
    assert summary.bandwidth_gbps == {"h2d": 100.0, "d2h": None}
    assert summary.op_counts == {"h2d": 1, "kernel": 1}
    assert summary.advice == []


def counter_rows(*rows: tuple[int, int, str, float]) -> dict[str, np.ndarray]:
    """A counters table (``Trace.counters()``) of (time_ns, device, name, value) rows, all in %."""
    t, d, n, v = zip(*rows)
    return {
        "time_ns": np.array(t, np.int64),
        "device": np.array(d, np.int16),
        "name": np.array(n, object),
        "unit": np.array(["%"] * len(rows), object),
        "value": np.array(v, np.float64),
    }


def test_counters_say_how_busy_the_sms_were_while_copies_overlapped():
    table = trace(span("kernel", 1, 0, 1000), span("h2d", 2, 0, 900, bytes=9000, pinned=True))
    counters = counter_rows(
        (100, 0, "SM active", 10.0),
        (600, 0, "SM active", 14.0),
        (600, 0, "GPU busy", 90.0),  # "SM active" is preferred where both were sampled
        (1500, 0, "SM active", 99.0),  # after W: not counted
        (600, 1, "SM active", 80.0),  # another device
        (700, 0, "SM active", float("nan")),  # no value (a first sample): not counted
    )
    ds = summarize(table, counters=counters).devices[0]
    assert ds.sm_active_pct == 12.0 and ds.sm_counter == "SM active"
    text = str(summarize(table, counters=counters))
    assert "SMs active (counters)" in text and "the copies bound this work, not the kernels" in text
    busy = summarize(table, counters=counter_rows((500, 0, "GPU busy", 70.0))).devices[0]
    assert (busy.sm_active_pct, busy.sm_counter) == (70.0, "GPU busy")
    assert "the copies bound" not in str(summarize(table, counters=counter_rows((500, 0, "GPU busy", 70.0))))
    assert summarize(table).devices[0].sm_active_pct is None  # no counters: no row
    assert "SMs active" not in str(summarize(table, counters=counter_rows((500, 0, "host CPU", 5.0))))


def test_disjoint_spans_do_not_overlap():
    summary = summarize(trace(span("h2d", 1, 0, 100), span("kernel", 2, 200, 300), span("d2h", 1, 300, 350)))
    assert_consistent(summary)
    assert summary.window_ns == 350
    assert summary.states == {**dict.fromkeys(STATES, 0), "idle": 100, "H": 100, "K": 100, "D": 50}
    assert summary.overlap_pct == 0.0 and summary.exposed_copy_ns == 150
    assert summary.idle_pct == pytest.approx(100 * 100 / 350)
    assert summary.pipeline_efficiency == pytest.approx(100 / 350)
    assert (summary.copy_ns, summary.active_ns) == (150, 250)


def test_touching_copies_merge_and_bandwidth_uses_summed_durations():
    table = trace(
        span("h2d", 1, 0, 100, bytes=1000, pinned=1, enqueue_ns=0),
        span("h2d", 2, 100, 200, bytes=3000, pinned=1, enqueue_ns=0),
        span("kernel", 3, 0, 200, enqueue_ns=0),
    )
    summary = summarize(table)
    assert_consistent(summary)
    assert summary.h2d_ns == 200 and summary.states["H+K"] == 200
    assert summary.bandwidth_gbps["h2d"] == 20.0
    assert summary.stream_busy == {1: 0.5, 2: 0.5, 3: 1.0}
    segments = state_segments(table)
    assert (list(segments["start_ns"]), list(segments["end_ns"]), list(segments["state"])) == ([0], [200], ["H+K"])
    assert summary.advice == []  # copies serialise but hide behind the kernel: nothing to fix


def test_zero_length_spans_add_no_busy_time_but_bound_the_window():
    summary = summarize(trace(span("h2d", 1, 0, 100), span("kernel", 1, 50, 50), span("kernel", 2, 150, 150)))
    assert_consistent(summary)
    assert summary.window_ns == 150
    assert summary.states == {**dict.fromkeys(STATES, 0), "idle": 50, "H": 100}
    assert summary.overlap_pct == 0.0 and summary.exposed_copy_ns == 100
    assert summary.stream_busy == {1: pytest.approx(100 / 150), 2: 0.0}
    assert summary.op_counts == {"h2d": 1, "kernel": 2}


def test_multi_stream_kernels_count_as_a_union_not_a_sum():
    summary = summarize(trace(span("kernel", 1, 0, 100), span("kernel", 2, 50, 150), span("kernel", 3, 0, 150)))
    assert_consistent(summary)
    assert summary.kernel_ns == 150 and summary.states["K"] == 150
    assert summary.pipeline_efficiency == 1.0
    assert summary.stream_busy == {1: pytest.approx(2 / 3), 2: pytest.approx(2 / 3), 3: 1.0}


def test_multi_device_summaries_are_independent():
    table = trace(
        span("h2d", 1, 0, 100, device=0, pinned=1),
        span("kernel", 2, 50, 150, device=0),
        span("kernel", 1, 1000, 1100, device=1),
        span("h2d", 1, 1100, 1200, device=1, pinned=0, bytes=4096),
    )
    summary = summarize(table)
    assert_consistent(summary)
    assert sorted(summary.devices) == [0, 1]
    assert summary.first_device is summary.devices[0]
    assert summary.window_ns == 150 and summary.overlap_pct == 50.0  # forwarded from device 0
    one = summary.devices[1]
    assert (one.window_start_ns, one.window_end_ns, one.overlap_pct) == (1000, 1200, 0.0)
    assert [(a.code, a.device) for a in summary.advice] == [("pageable-memory", 1), ("one-stream", 1)]
    text = str(summary)
    assert "device 0" in text and "device 1" in text and "device 1: " in text


def test_explicit_window_clips_and_is_labelled():
    table = trace(
        span("h2d", 1, 0, 100, bytes=1000),
        span("kernel", 2, 50, 300),
        span("kernel", 2, 400, 500),
    )
    summary = summarize(table, window=(-100, 200))
    assert_consistent(summary)
    assert (summary.window_source, summary.window_start_ns, summary.window_ns) == ("cell", -100, 300)
    assert summary.states == {**dict.fromkeys(STATES, 0), "idle": 100, "H": 50, "H+K": 50, "K": 100}
    assert summary.overlap_pct == 50.0
    assert summary.idle_pct == pytest.approx(100 / 3)
    assert summary.stream_busy == {1: pytest.approx(1 / 3), 2: 0.5}
    assert summary.op_counts == {"h2d": 1, "kernel": 1}
    assert summary.bandwidth_gbps["h2d"] == 10.0  # whole copy: bytes over its own duration
    empty = summarize(table, window=(1000, 2000))
    assert empty.states == {**dict.fromkeys(STATES, 0), "idle": 1000}
    assert empty.idle_pct == 100.0 and empty.overlap_pct is None


def test_no_copies_means_no_overlap_figure():
    summary = summarize(trace(span("kernel", 1, 0, 100), span("kernel", 2, 0, 50)))
    assert summary.overlap_pct is None
    assert summary.h2d_overlap_pct is None and summary.d2h_overlap_pct is None
    assert summary.exposed_copy_ns == 0
    assert summary.bandwidth_gbps == {"h2d": None, "d2h": None}
    assert "n/a" in str(summary)


def test_host_bookkeeping_is_not_device_work():
    summary = summarize(
        trace(
            span("alloc", 0, -1000, -900),
            span("kernel", 1, 0, 100),
            span("marker", 1, 500, 500),
            span("free", 0, 2000, 2100),
        )
    )
    assert_consistent(summary)
    assert (summary.window_start_ns, summary.window_end_ns) == (0, 100)
    assert summary.idle_pct == 0.0
    assert summary.stream_busy == {1: 1.0}
    assert summary.op_counts == {"kernel": 1, "alloc": 1, "free": 1, "marker": 1}
    assert summary.gap_counts == dict.fromkeys(GAP_CAUSES, 0)


def test_device_copies_and_memsets_count_as_kernels():
    summary = summarize(trace(span("h2d", 1, 0, 100), span("d2d", 2, 0, 50), span("memset", 3, 50, 100)))
    assert summary.overlap_pct == 100.0 and summary.states["H+K"] == 100


def test_empty_table():
    summary = summarize(empty_table())
    assert summary.devices == {} and summary.advice == []
    assert str(summary) == "no spans traced"
    with pytest.raises(ValueError, match="no spans"):
        summary.overlap_pct  # noqa: B018


def test_bad_arguments_raise_value_errors():
    table = trace(span("kernel", 1, 0, 10))
    with pytest.raises(ValueError, match="before it starts"):
        summarize(table, window=(10, 0))
    with pytest.raises(ValueError, match="lacks column"):
        summarize({"kind": table["kind"]})


# --- state segments ----------------------------------------------------------------------------------------------


def test_state_segments_cover_the_window_idle_included():
    table = trace(span("h2d", 1, 0, 100), span("kernel", 2, 50, 150), span("d2h", 1, 200, 300))
    segments = state_segments(table)
    assert list(zip(segments["start_ns"], segments["end_ns"], segments["state"], strict=True)) == [
        (0, 50, "H"),
        (50, 100, "H+K"),
        (100, 150, "K"),
        (150, 200, "idle"),
        (200, 300, "D"),
    ]
    framed = state_segments(table, window=(-10, 310))
    assert (framed["start_ns"][0], framed["end_ns"][0], framed["state"][0]) == (-10, 0, "idle")
    assert (framed["start_ns"][-1], framed["end_ns"][-1], framed["state"][-1]) == (300, 310, "idle")
    assert state_segments(table, device=7)["start_ns"].size == 0


# --- gap causes ----------------------------------------------------------------------------------------------------


def _gappy_trace() -> dict[str, np.ndarray]:
    return trace(
        span("kernel", 1, 0, 10_000, enqueue_ns=0),
        span("kernel", 1, 12_000, 20_000, enqueue_ns=0),  # 2 µs gap, enqueued early: launch
        span("kernel", 1, 30_000, 40_000, enqueue_ns=25_000),  # enqueued after the previous end: host-wait
        span("marker", 1, 50_000, 50_000),  # not an op: does not split the next gap
        span("kernel", 1, 60_000, 70_000, enqueue_ns=0),  # 20 µs gap, enqueued early: other
        span("kernel", 1, 90_000, 95_000),  # enqueue unknown: other
        span("kernel", 2, 0, 5_000, enqueue_ns=0),
    )


def test_gap_causes_classifies_each_gap():
    gaps = gap_causes(_gappy_trace())
    assert list(gaps["start_ns"]) == [10_000, 20_000, 40_000, 70_000]
    assert list(gaps["end_ns"]) == [12_000, 30_000, 60_000, 90_000]
    assert list(gaps["cause"]) == ["launch", "host-wait", "other", "other"]
    assert list(gaps["op_index"]) == [1, 2, 4, 5]
    assert list(gaps["stream"]) == [1, 1, 1, 1] and list(gaps["device"]) == [0, 0, 0, 0]
    assert gap_causes(_gappy_trace(), theta_ns=1_000)["cause"][0] == "other"


def test_gap_totals_in_summary_are_per_stream():
    summary = summarize(_gappy_trace())
    assert summary.gap_counts == {"host-wait": 1, "launch": 1, "other": 2}
    assert summary.gap_ns == {
        1: {"host-wait": 10_000, "launch": 2_000, "other": 40_000},
        2: dict.fromkeys(GAP_CAUSES, 0),
    }


def test_gaps_never_span_devices():
    table = trace(span("kernel", 1, 0, 10, device=0), span("kernel", 1, 20, 30, device=1))
    assert gap_causes(table)["start_ns"].size == 0


# --- advice -------------------------------------------------------------------------------------------------------


def _clean_pipeline() -> list[dict]:
    """Three batches on three streams, pinned, enqueued up front: copies hide behind kernels."""
    records = []
    for batch in range(3):
        s, k0 = batch + 1, 10_000 + 40_000 * batch
        records += [
            span("h2d", s, 10_000 * batch, 10_000 * (batch + 1), bytes=1 << 20, pinned=1, enqueue_ns=0),
            span("kernel", s, k0, k0 + 40_000, enqueue_ns=0),
            span("d2h", s, k0 + 40_000, k0 + 50_000, bytes=1 << 20, pinned=1, enqueue_ns=0),
        ]
    return records


def test_clean_pipeline_gets_no_advice():
    summary = summarize(trace(*_clean_pipeline()))
    assert_consistent(summary)
    assert summary.advice == []


def test_pageable_memory():
    records = _clean_pipeline()
    records[0] = {**records[0], "pinned": 0}
    advice = summarize(trace(*records)).advice
    assert [a.code for a in advice] == ["pageable-memory"]
    assert advice[0].severity == "warning" and "pinned" in advice[0].message
    records[0] = {**records[0], "pinned": None}  # unknown is not flagged
    assert codes(summarize(trace(*records))) == []


def test_one_stream():
    serial = [span("h2d", 1, 0, 100), span("kernel", 1, 100, 200), span("d2h", 1, 200, 300)]
    assert codes(summarize(trace(*serial))) == ["one-stream"]
    assert codes(summarize(trace(span("kernel", 1, 0, 100), span("kernel", 1, 100, 200)))) == []


def test_host_wait():
    table = trace(span("kernel", 1, 0, 10_000, enqueue_ns=0), span("kernel", 1, 50_000, 60_000, enqueue_ns=45_000))
    advice = summarize(table).advice
    assert [a.code for a in advice] == ["host-wait"]
    assert "stream 1" in advice[0].message
    early = trace(span("kernel", 1, 0, 10_000, enqueue_ns=0), span("kernel", 1, 50_000, 60_000, enqueue_ns=5_000))
    assert codes(summarize(early)) == []


def _kernels(count: int, duration: int, gap: int) -> dict[str, np.ndarray]:
    step = duration + gap
    return trace(*(span("kernel", 1, i * step, i * step + duration, enqueue_ns=0) for i in range(count)))


def test_launch_bound():
    assert codes(summarize(_kernels(30, 2_000, 3_000))) == ["launch-bound"]
    assert codes(summarize(_kernels(30, 2_000, 0))) == []  # back to back: the device never waits
    assert codes(summarize(_kernels(30, 50_000, 3_000))) == []  # long kernels: launches are hidden
    assert codes(summarize(_kernels(10, 2_000, 3_000))) == []  # too few to call


def test_same_direction_copies():
    split = [span("h2d", s, 25_000 * (s - 1), 25_000 * s, pinned=1, enqueue_ns=0) for s in (1, 2, 3, 4)]
    advice = summarize(trace(*split)).advice
    assert [a.code for a in advice] == ["same-direction-copies"]
    assert advice[0].severity == "info" and "H2D" in advice[0].message
    hidden = [*split, span("kernel", 5, 0, 100_000, enqueue_ns=0)]
    assert codes(summarize(trace(*hidden))) == []
    one_stream = [{**r, "stream": 1} for r in split]
    assert codes(summarize(trace(*one_stream))) == []
    concurrent = [span("h2d", s, 0, 100_000, pinned=1, enqueue_ns=0) for s in (1, 2)]  # e.g. the CPU backend
    assert codes(summarize(trace(*concurrent))) == []


# --- rendering ------------------------------------------------------------------------------------------------------


def test_text_html_and_dict_name_the_figures():
    summary = summarize(trace(*_clean_pipeline(), span("h2d", 9, 200_000, 210_000, pinned=0)))
    text = str(summary)
    names = ["overlap %", "exposed copy time", "H2D overlap %", "D2H overlap %", "idle %", "pipeline efficiency"]
    names += ["8-state breakdown", "stream busy", "bandwidth", "gap causes", "[pageable-memory]"]
    assert all(name in text for name in names)
    lines = text.splitlines()
    figures = lines[1 : lines.index("advice")]
    page = summary._repr_html_()
    assert page.startswith("<table") and "<th>device 0</th>" in page and "pageable-memory" in page
    assert page.count("<tr>") == 1 + len(figures)  # a header row, then one row per figure
    assert str(summary.first_device) == text
    data = json.loads(json.dumps(summary.to_dict()))
    device = data["devices"]["0"]
    assert device["overlap_pct"] == summary.overlap_pct and device["states"] == summary.states
    assert device["advice"][0]["code"] == "pageable-memory"
