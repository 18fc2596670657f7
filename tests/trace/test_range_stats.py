"""Tests of trace/range_stats.py (``statistics().ranges``): exact tables on hand-made traces, the same answers as a
loop over every (op, range) on random ones, times past the side-by-side limit, and real CPU-backend traces."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest
import support
from hypothesis import given, settings
from hypothesis import strategies as st
from support import rows

import gpuworkbench as gw
from gpuworkbench.trace.analysis import total_length, union
from gpuworkbench.trace.range_stats import RANGE_COLUMNS, plain_range_name, range_columns
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import HOST_KINDS, KIND_CODE, KINDS, table_from_records, thread_stream

US = 1_000
T0, T1 = thread_stream(0), thread_stream(1)
span = functools.partial(support.span, unit=US)


def by_name(table) -> dict[str, dict]:
    return {r["name"]: r for r in rows(table)}


# Thread 0: "step" 0-100 holding "forward" 10-40 and "backward" 50-90; thread 1: "load" 0-100. Kernels are linked to
# their launches (corr) on the thread that launched them; the h2d's thread is unknown (no corr: the workbench's own).
RECORDS = [
    span("range", T0, 0, 100, name="step"),
    span("range", T0, 10, 40, name="forward"),
    span("range", T0, 50, 90, name="backward"),
    span("range", T1, 0, 100, name="load"),
    span("api", T0, 12, 13, name="launch", corr=1),
    span("kernel", 1, 20, 30, name="fwd", corr=1, enqueue_ns=12 * US),
    span("api", T0, 14, 15, name="launch", corr=2),
    span("kernel", 2, 25, 45, name="fwd2", corr=2),  # enqueue unknown: its launch's start (14) places it
    span("api", T1, 52, 53, name="launch", corr=3),
    span("kernel", 1, 60, 70, name="io", corr=3, enqueue_ns=52 * US),  # thread 1 launched it during "backward"
    span("h2d", 3, 80, 85, enqueue_ns=60 * US),  # unknown thread: under every range holding 60 µs
    span("d2h", 3, 200, 210, enqueue_ns=150 * US),  # after every range
    span("kernel", 1, 95, 99, name="lost"),  # no enqueue time, no launch: under no range
]


@pytest.fixture
def ranges() -> dict[str, dict]:
    return by_name(Trace.from_records(RECORDS).statistics().ranges)


def test_nested_ranges_each_count_the_ops_enqueued_inside_them_on_their_thread(ranges):
    assert list(ranges) == ["load", "step", "backward", "forward"]  # host total descending, then name
    step, forward, backward, load = ranges["step"], ranges["forward"], ranges["backward"], ranges["load"]
    assert (forward["ops"], forward["kernels"], forward["copies"]) == (2, 2, 0)
    assert forward["device_ns"] == 25 * US  # fwd 20-30 and fwd2 25-45 on two streams: their union, not 30 µs
    assert (backward["ops"], backward["kernels"], backward["copies"]) == (1, 0, 1)  # the h2d; not thread 1's "io"
    assert backward["device_ns"] == 5 * US
    assert (step["ops"], step["kernels"], step["copies"]) == (3, 2, 1)
    assert step["device_ns"] == 30 * US
    assert (load["ops"], load["kernels"], load["copies"]) == (2, 1, 1)  # "io" and the unknown thread's h2d
    assert load["device_ns"] == 15 * US


def test_host_time_is_the_ranges_own_duration(ranges):
    assert {n: (r["count"], r["host_total_ns"], r["host_median_ns"]) for n, r in ranges.items()} == {
        "step": (1, 100 * US, 100 * US),
        "forward": (1, 30 * US, 30 * US),
        "backward": (1, 40 * US, 40 * US),
        "load": (1, 100 * US, 100 * US),
    }


def test_ops_outside_every_range_or_without_an_enqueue_time_count_nowhere(ranges):
    assert sum(r["ops"] for r in ranges.values() if r["name"] in ("step", "load")) == 5
    only = by_name(
        Trace.from_records([span("range", T0, 0, 10, name="r"), span("kernel", 1, 2, 3, name="k")]).statistics().ranges
    )
    assert (only["r"]["ops"], only["r"]["device_ns"]) == (0, 0)


def test_a_name_nested_in_itself_counts_an_op_once_and_its_instances_each():
    table = table_from_records(
        [
            span("range", T0, 0, 100, name="layer"),
            span("range", T0, 10, 30, name="layer"),
            span("range", T0, 40, 50, name="layer"),
            span("kernel", 1, 20, 25, name="k", enqueue_ns=15 * US),
        ]
    )
    (layer,) = rows(range_columns(table))
    assert (layer["count"], layer["host_total_ns"], layer["host_median_ns"]) == (3, 130 * US, 20 * US)
    assert (layer["ops"], layer["kernels"], layer["device_ns"]) == (1, 1, 5 * US)


def test_range_ends_are_inside_and_device_time_adds_devices():
    table = table_from_records(
        [
            span("range", T0, 10, 20, name="r"),
            span("kernel", 1, 30, 40, name="at start", enqueue_ns=10 * US),
            span("kernel", 1, 30, 40, device=1, name="at end", enqueue_ns=20 * US),
            span("kernel", 1, 50, 60, name="just after", enqueue_ns=20 * US + 1),
        ]
    )
    (r,) = rows(range_columns(table))
    assert (r["ops"], r["device_ns"]) == (2, 20 * US)  # 10 µs on each of two devices at the same time


def test_processes_keep_ops_of_unknown_thread_and_correlation_ids_apart():
    """Devices 0 and 1 are one process's, 2 another's (a Dask trace's workers): the same corr in both links each op to
    its own process's launch, and an op of unknown thread is under its own process's ranges only."""
    table = table_from_records(
        [
            span("range", T0, 0, 100, name="a"),
            span("range", T1, 0, 100, device=2, name="b"),
            span("api", T0, 5, 6, name="launch", corr=9),
            span("api", T1, 5, 6, device=2, name="launch", corr=9),
            span("kernel", 1, 10, 20, device=1, name="k", corr=9),
            span("kernel", 1, 10, 30, device=2, name="k", corr=9),
            span("h2d", 1, 40, 45, device=2, enqueue_ns=40 * US),
        ]
    )
    got = by_name(range_columns(table, {0: 0, 1: 0, 2: 1}))
    assert (got["a"]["ops"], got["a"]["device_ns"]) == (1, 10 * US)
    assert (got["b"]["ops"], got["b"]["copies"], got["b"]["device_ns"]) == (2, 1, 25 * US)
    one_process = by_name(range_columns(table))  # without the map: the first launch takes both kernels
    assert one_process["a"]["ops"] == 3


def test_a_trace_without_host_ranges_has_an_empty_table_and_no_section():
    stats = Trace.from_records([span("kernel", 1, 0, 5, name="k"), span("range", 1, 0, 5, name="on a device row")])
    stats = stats.statistics()
    assert len(stats.ranges) == 0 and list(stats.ranges.columns) == list(RANGE_COLUMNS)
    assert "host ranges" not in str(stats) and "host ranges" not in stats._repr_html_()


def test_text_and_html_show_the_ranges():
    stats = Trace.from_records(RECORDS).statistics()
    text = str(stats)
    assert "host ranges" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("forward"))
    assert line.split()[1:] == ["1", "30", "µs", "30", "µs", "25", "µs", "2", "2", "0"]
    assert "host ranges" in stats._repr_html_() and ">backward<" in stats._repr_html_()


# --- against a loop over every pair -----------------------------------------------------------------------------------


def reference(table: dict, processes: dict[int, int] | None = None) -> dict[str, tuple[int, int, int, int, int]]:
    """name -> (count, ops, kernels, copies, device_ns), one op and one range at a time."""
    n = len(table["kind"])
    proc = [(processes or {}).get(int(d), -1) if processes else 0 for d in table["device"]]
    kinds = [KINDS[int(k)] for k in table["kind"]]
    calls = {}
    for i in range(n):
        if kinds[i] == "api" and table["stream"][i] < 0 and table["corr"][i] >= 0:
            calls.setdefault((proc[i], int(table["corr"][i])), i)
    out = {}
    ranges = [i for i in range(n) if kinds[i] == "range" and table["stream"][i] < 0]
    for name in sorted({table["name"][i] for i in ranges}):
        mine = [i for i in ranges if table["name"][i] == name]
        under = set()
        for op in range(n):
            if kinds[op] in HOST_KINDS:
                continue
            call = calls.get((proc[op], int(table["corr"][op]))) if table["corr"][op] >= 0 else None
            when = int(table["enqueue_ns"][op])
            if when < 0 and call is not None:
                when = int(table["start_ns"][call])
            if when < 0:
                continue
            for r in mine:
                same = table["stream"][r] == table["stream"][call] if call is not None else True
                if proc[r] == proc[op] and same and table["start_ns"][r] <= when <= table["end_ns"][r]:
                    under.add(op)
        device_ns = 0
        for d in {int(table["device"][op]) for op in under}:
            on = [op for op in under if table["device"][op] == d]
            device_ns += total_length(union(table["start_ns"][on], table["end_ns"][on]))
        out[name] = (
            len(mine),
            len(under),
            sum(kinds[op] == "kernel" for op in under),
            sum(kinds[op] in ("h2d", "d2h", "d2d") for op in under),
            device_ns,
        )
    return out


def vectorised(table: dict, processes: dict[int, int] | None = None) -> dict[str, tuple[int, int, int, int, int]]:
    return {
        r["name"]: (r["count"], r["ops"], r["kernels"], r["copies"], r["device_ns"])
        for r in rows(range_columns(table, processes))
    }


@st.composite
def traces(draw: st.DrawFn) -> dict:
    records = []
    for _ in range(draw(st.integers(0, 8))):
        s, n = draw(st.integers(0, 60)), draw(st.integers(0, 40))
        thread = draw(st.integers(0, 2))
        device = draw(st.integers(0, 2))
        records.append(span("range", thread_stream(thread), s, s + n, device=device, name=draw(st.sampled_from("abc"))))
    for corr in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["kernel", "h2d", "d2d", "memset", "d2h"]))
        s, n = draw(st.integers(0, 100)), draw(st.integers(0, 20))
        device = draw(st.integers(0, 2))
        how = draw(st.sampled_from(["enqueue", "launch", "launch without enqueue", "neither"]))
        extra = {"device": device, "name": "op"}
        if how in ("launch", "launch without enqueue"):
            at = draw(st.integers(0, 100))
            call_device = draw(st.integers(0, 2))
            records.append(span("api", thread_stream(draw(st.integers(0, 2))), at, at, device=call_device, corr=corr))
            extra["corr"] = corr
            if how == "launch":
                extra["enqueue_ns"] = draw(st.integers(0, 100)) * US
        elif how == "enqueue":
            extra["enqueue_ns"] = draw(st.integers(0, 100)) * US
        records.append(span(kind, draw(st.integers(0, 3)), s, s + n, **extra))
    return table_from_records(records)


@settings(max_examples=150, deadline=None)
@given(traces(), st.booleans())
def test_the_table_is_what_a_loop_over_every_op_and_range_gives(table, two_processes):
    processes = {0: 0, 1: 0, 2: 1} if two_processes else None
    assert vectorised(table, processes) == reference(table, processes)


def test_times_too_far_apart_to_lay_side_by_side_are_ranked_and_agree():
    """Three threads' ranges each spanning 2^61 ns (beyond the side-by-side limit of 2^62 ns) and kernels of several
    names on two devices that far apart: both the segments and the device-time unions take the ranked path."""
    far = 1 << 61
    records = []
    for thread in range(3):
        records.append({"kind": "range", "stream": thread_stream(thread), "start_ns": 0, "end_ns": far, "name": "all"})
        records.append({"kind": "range", "stream": thread_stream(thread), "start_ns": 5, "end_ns": 9, "name": "n"})
        records.append({"kind": "api", "stream": thread_stream(thread), "start_ns": 6, "end_ns": 7, "corr": thread})
        records.append({"kind": "kernel", "stream": 1, "start_ns": 10, "end_ns": 20, "corr": thread, "device": thread})
        far_kernel = {"kind": "kernel", "stream": 1, "start_ns": far, "end_ns": far + 5, "enqueue_ns": far - 1}
        records.append(far_kernel | {"device": thread})
    table = table_from_records(records)
    got = vectorised(table)
    assert got == reference(table)
    assert got["all"] == (3, 6, 6, 0, 3 * (10 + 5))
    assert got["n"] == (3, 3, 3, 0, 3 * 10)


# --- real traces ------------------------------------------------------------------------------------------------------


def _work(dev: gw.Device, kernel, host: np.ndarray, x: gw.Buffer, y: gw.Buffer) -> None:
    x.copy_from_host(host)
    kernel(x, y)
    dev.synchronize()


def test_a_cpu_backend_trace_with_nested_ranges_counts_our_ops_under_them(tmp_path):
    dev = gw.Device("cpu")
    kernel = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
    host = np.ones(4096, np.float32)
    x, y = dev.alloc(4096, "float32"), dev.alloc(4096, "float32")
    try:
        with gw.trace() as t:
            _work(dev, kernel, host, x, y)  # outside every range
            for _ in range(2):
                with gw.range("step"):
                    with gw.range("forward"):
                        _work(dev, kernel, host, x, y)
                        kernel(y, x)
                        dev.synchronize()
                    y.copy_to_host()
        stats = t.statistics()
    finally:
        x.free()
        y.free()
    got = by_name(stats.ranges)
    assert set(got) == {"step", "forward"}
    step, forward = got["step"], got["forward"]
    assert (step["count"], step["ops"], step["kernels"], step["copies"]) == (2, 8, 4, 4)
    assert (forward["count"], forward["ops"], forward["kernels"], forward["copies"]) == (2, 6, 4, 2)
    table = t.table()
    inside = (table["kind"] == KIND_CODE["range"]) & (table["name"] == "forward")
    assert forward["host_total_ns"] == int((table["end_ns"] - table["start_ns"])[inside].sum())
    assert step["host_total_ns"] >= forward["host_total_ns"] > 0
    enqueued = table["enqueue_ns"]
    work = ~np.isin(table["kind"], [KIND_CODE[k] for k in HOST_KINDS])
    starts, ends = table["start_ns"][inside], table["end_ns"][inside]
    under = work & ((enqueued[:, None] >= starts) & (enqueued[:, None] <= ends)).any(axis=1)
    assert forward["device_ns"] == total_length(union(table["start_ns"][under], table["end_ns"][under])) > 0
    assert "host ranges" in str(stats) and "forward" in stats._repr_html_()
    t.to_chrome_trace(str(tmp_path / "t.json"))
    loaded = by_name(gw.load_trace(tmp_path / "t.json").statistics().ranges)  # user_annotation events, read back
    assert loaded.keys() == got.keys()
    numbers = RANGE_COLUMNS[1:]
    for name, row in got.items():  # the export keeps ns to 3 decimals of a µs: a few ns of rounding at most
        assert [loaded[name][c] for c in numbers] == pytest.approx([row[c] for c in numbers], abs=4)


def test_a_cpu_backend_trace_from_two_threads_places_unknown_thread_ops_by_time():
    """Our ops carry no thread: an op enqueued while another thread's range is open counts under that range too."""
    dev = gw.Device("cpu")
    kernel = gw.elementwise("float32 x, float32 y", "y = x + 1", name="plus_one")
    x, y = dev.alloc(1024, "float32"), dev.alloc(1024, "float32")
    opened, done = threading.Event(), threading.Event()

    def other() -> None:
        with gw.range("waiting"):
            opened.set()
            done.wait(10)

    try:
        with gw.trace() as t:
            thread = threading.Thread(target=other)
            thread.start()
            opened.wait(10)
            with gw.range("main"):
                kernel(x, y)
                dev.synchronize()
            done.set()
            thread.join()
            kernel(x, y)  # after both ranges closed
            dev.synchronize()
    finally:
        x.free()
        y.free()
    got = by_name(t.statistics().ranges)
    assert (got["main"]["kernels"], got["waiting"]["kernels"]) == (1, 1)
    ranges = t.table()["stream"][t.table()["kind"] == KIND_CODE["range"]]
    assert len(set(ranges.tolist())) == 2  # each range on its own thread's row


@pytest.mark.gpu
@pytest.mark.cupti
def test_cupy_launches_are_placed_on_the_thread_that_made_them():
    """CUPTI links each CuPy kernel to its launch (corr) on its thread: a range open on another thread at the same
    time does not count it."""
    cp = support.cupy_with_cupti()
    z = cp.zeros(1 << 16, cp.float32)
    (z + 1).sum()
    cp.cuda.runtime.deviceSynchronize()
    opened, done = threading.Event(), threading.Event()

    def other() -> None:
        with gw.range("idle thread"):
            opened.set()
            done.wait(10)

    with gw.trace(others=True) as t:
        thread = threading.Thread(target=other)
        thread.start()
        opened.wait(10)
        with gw.range("step"):
            with gw.range("inner"):
                for _ in range(3):
                    z += 1
            cp.cuda.runtime.deviceSynchronize()
        done.set()
        thread.join()
    got = by_name(t.statistics().ranges)
    assert got["inner"]["kernels"] == 3 and got["step"]["kernels"] == 3
    assert got["idle thread"]["kernels"] == 0
    assert 0 < got["inner"]["device_ns"] <= got["step"]["device_ns"]


def test_emit_nvtx_instances_of_a_name_are_one_row():
    assert plain_range_name("forward, op_id = 7") == plain_range_name("forward, seq = 3, op_id = 106") == "forward"
    assert plain_range_name("aten::mm, seq = 0, op_id = 2, sizes = [[4, 4]]") == "aten::mm"
    assert plain_range_name("step, with commas, here") == "step, with commas, here"
