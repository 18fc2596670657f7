"""Tests of viz/: real Bokeh documents from hand-built and CPU-backend traces; the live dashboard without a browser."""

from __future__ import annotations

import functools
import gc
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import support

pytest.importorskip("bokeh")
pytest.importorskip("jupyter_bokeh")

from bokeh.document import Document  # noqa: E402
from bokeh.document.events import ColumnDataChangedEvent, ColumnsStreamedEvent  # noqa: E402
from bokeh.embed import file_html  # noqa: E402
from bokeh.models import GlyphRenderer, HoverTool  # noqa: E402
from bokeh.resources import INLINE  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.trace.analysis import STATES  # noqa: E402
from gpuworkbench.trace.recorder import Trace  # noqa: E402
from gpuworkbench.trace.spans import KIND_CODE, empty_memory_table, empty_table  # noqa: E402
from gpuworkbench.viz import WEBGL_THRESHOLD, inline_setup, memory_figure, timeline_figure  # noqa: E402
from gpuworkbench.viz.dashboard import Live  # noqa: E402
from gpuworkbench.viz.palette import STYLES  # noqa: E402

US = 1_000


span = functools.partial(support.span, unit=US)  # span records with their times in µs


RECORDS = [
    span("alloc", -1, 0, 1, bytes=4096, name="alloc 4 kB"),
    span("h2d", 1, 10, 30, bytes=2_000_000, name="upload", pinned=True),
    span("kernel", 2, 20, 60, name="saxpy"),
    span("d2h", 1, 60, 70, bytes=1_000_000, name="download", pinned=True),
    span("kernel", 0, 5, 25, device=1, name="other device"),
    span("marker", -1, 40, 40, name="mark"),
]


def detail(view):
    """The timeline figure of ``Trace.timeline()``'s column (the overview strip is the second child)."""
    return view.children[0]


def spans_renderer(fig):
    return fig.select_one({"name": "spans", "type": GlyphRenderer})


def states_renderer(fig):
    return fig.select_one({"name": "states", "type": GlyphRenderer})


def synthetic_table(n: int, devices: int = 1, streams: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    table = empty_table(n)
    table["kind"][:] = rng.choice([KIND_CODE["h2d"], KIND_CODE["d2h"], KIND_CODE["kernel"]], n)
    table["device"][:] = rng.integers(0, devices, n)
    table["stream"][:] = rng.integers(0, streams, n)
    start = np.sort(rng.integers(0, 10**9, n))
    table["start_ns"][:] = start
    table["end_ns"][:] = start + rng.integers(1_000, 50_000, n)
    table["bytes"][:] = np.where(table["kind"] == KIND_CODE["kernel"], 0, 1 << 20)
    table["name"][:] = "op"
    return table


@pytest.fixture
def hand_trace() -> Trace:
    return Trace.from_records(RECORDS, device_names={0: "gpu A", 1: "gpu B"})


@pytest.fixture(scope="module")
def cpu_trace() -> Trace:
    dev = gw.Device("cpu")
    gc.collect()  # the memory plot's figures start from what is held: nothing of another test's
    for buf in dev.live_buffers:
        buf.free()
    t = support.traced_rounds(dev, keep_y=True)
    t.wait_pending()
    return t


# --- timeline ---------------------------------------------------------------------------------------------------------


def test_timeline_rows_top_to_bottom_with_state_strip_per_device(hand_trace: Trace):
    fig = detail(hand_trace.timeline())
    assert fig.y_range.factors[::-1] == [
        "gpu A · workbench",
        "gpu A · stream 1",
        "gpu A · stream 2",
        "gpu A · states",
        "gpu B · stream 0",
        "gpu B · states",
    ]


def test_timeline_glyph_data_has_one_row_per_span(hand_trace: Trace):
    fig = detail(hand_trace.timeline())
    data = spans_renderer(fig).data_source.data
    assert all(len(col) == len(RECORDS) for col in data.values())
    assert list(data["kind"]) == [r["kind"] for r in RECORDS]
    assert list(data["row"])[:2] == ["gpu A · workbench", "gpu A · stream 1"]
    # ms from the first span; GB/s = bytes / ns for copies, NaN for everything else
    assert data["left"][1] == pytest.approx(0.010) and data["right"][1] == pytest.approx(0.030)
    assert data["gbps"][1] == pytest.approx(2_000_000 / 20_000)
    assert np.isnan(data["gbps"][2]) and np.isnan(data["gbps"][0])
    assert data["duration_us"][2] == pytest.approx(40.0)


def test_timeline_hover_names_the_fields(hand_trace: Trace):
    fig = detail(hand_trace.timeline())
    hover = fig.select_one({"name": "span hover", "type": HoverTool})
    fields = dict(hover.tooltips)
    assert {"name", "kind", "bytes", "GB/s", "duration"} <= set(fields)
    assert "@gbps" in fields["GB/s"] and "@duration_us" in fields["duration"]
    assert hover.renderers == [spans_renderer(fig)]


def test_timeline_zooms_and_pans_on_time_only(hand_trace: Trace):
    fig = detail(hand_trace.timeline())
    assert fig.toolbar.active_scroll.dimensions == "width"
    assert fig.toolbar.active_drag.dimensions == "width"
    assert fig.xaxis[0].axis_label.endswith("(ms)")


def test_timeline_uses_stream_labels_and_keeps_rows_unique():
    table = Trace.from_records([span("kernel", 1, 0, 1), span("kernel", 2, 1, 2), span("h2d", 3, 0, 2)]).table()
    labels = {(0, 1): "compute", (0, 2): "compute", (0, 3): "states"}
    fig = timeline_figure(table, {0: "dev"}, labels)
    rows = fig.y_range.factors[::-1]
    assert rows == ["dev · compute", "dev · compute (2)", "dev · states (3)", "dev · states"]
    assert len(set(rows)) == len(rows)


def test_state_strip_covers_each_device_window_with_the_8_states(hand_trace: Trace):
    data = states_renderer(detail(hand_trace.timeline())).data_source.data
    assert set(data["row"]) == {"gpu A · states", "gpu B · states"}
    assert set(data["state"]) <= set(STATES)
    for row, window_us in (("gpu A · states", 60.0), ("gpu B · states", 20.0)):
        mine = np.asarray(data["row"]) == row
        assert np.asarray(data["duration_us"])[mine].sum() == pytest.approx(window_us)
    gpu_a = [s for s, r in zip(data["state"], data["row"]) if r == "gpu A · states"]
    assert gpu_a == ["H", "H+K", "K", "D"]  # H2D 10-30, kernel 20-60, D2H 60-70 (times from 10 µs)


def test_webgl_switches_on_above_the_threshold():
    small = timeline_figure(synthetic_table(100))
    large = timeline_figure(synthetic_table(WEBGL_THRESHOLD + 1))
    assert small.output_backend == "canvas"
    assert large.output_backend == "webgl"
    assert len(spans_renderer(large).data_source.data["left"]) == WEBGL_THRESHOLD + 1


def test_timeline_of_100k_spans_builds_within_a_second():
    table = synthetic_table(100_000, devices=2)
    start = time.perf_counter()
    fig = timeline_figure(table)
    elapsed = time.perf_counter() - start
    raw = fig.select_one({"name": "timeline raw"}).data  # above DETAIL_LIMIT: every span in compact arrays
    spans = raw["style"] < len(STYLES)
    assert spans.sum() == 100_000 and np.all(np.diff(raw["start"]) >= 0)
    assert len(spans_renderer(fig).data_source.data["left"]) == 0  # the browser fills it with the spans in view
    cells = fig.select_one({"name": "cells", "type": GlyphRenderer}).data_source.data
    assert sum(cells["count"]) == len(raw["start"])  # the first view: every span and busy state segment, once
    assert len(fig.y_range.factors) == 2 * (4 + 1)
    assert elapsed < 1.0, f"building a 10^5-span timeline took {elapsed:.2f} s"


def test_empty_timeline_is_a_valid_document():
    fig = timeline_figure(empty_table())
    assert fig.y_range.factors == []
    Document().add_root(fig)
    assert "<html" in file_html(fig, INLINE)


def test_cpu_trace_timeline_has_a_row_per_stream_and_every_span(cpu_trace: Trace):
    fig = detail(cpu_trace.timeline())
    rows = fig.y_range.factors[::-1]
    assert rows == ["cpu:0 · workbench", "cpu:0 · upload", "cpu:0 · compute", "cpu:0 · states"]
    data = spans_renderer(fig).data_source.data
    assert len(data["left"]) == len(cpu_trace) == 3 * 3 + 3  # copies + kernels, 2 allocs + 1 free
    assert min(data["left"]) >= 0  # ms from the trace's start
    kinds = set(data["kind"])
    assert {"h2d", "d2h", "kernel", "alloc", "free"} == kinds


# --- memory -----------------------------------------------------------------------------------------------------------


def test_memory_figure_draws_a_held_line_per_device_and_used_where_known():
    memory = empty_memory_table(5)
    memory["device"][:] = [0, 1, 0, 1, 0]
    memory["t_ns"][:] = [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000]
    memory["held_bytes"][:] = [100, 50, 300, 0, 200]
    memory["used_bytes"][:] = [1_000, -1, 1_200, -1, 1_100]  # device 1 cannot tell its used total
    fig = memory_figure(memory, {0: "gpu A", 1: "gpu B"})
    names = sorted(r.name for r in fig.renderers)
    assert names == ["held:0", "held:1", "used:0"]
    held0 = fig.select_one({"name": "held:0"}).data_source.data
    assert list(held0["t_ms"]) == [0.0, 2.0, 4.0] and list(held0["bytes"]) == [100, 300, 200]


def test_memory_plot_of_a_cpu_trace(cpu_trace: Trace):
    fig = cpu_trace.memory_plot()
    held = fig.select_one({"name": "held:0"}).data_source.data
    assert list(held["bytes"]) == [16384, 32768, 16384]  # two allocs of 4096 float32, one free
    assert fig.select_one({"name": "used:0"}) is not None


def test_memory_plot_without_samples_says_so(hand_trace: Trace):
    fig = hand_trace.memory_plot()
    assert "no memory samples" in fig.title.text
    assert [r.name for r in fig.renderers] == ["empty"]  # only the "nothing traced" text, no data lines


# --- show and offline output ------------------------------------------------------------------------------------------


def test_show_outside_a_notebook_returns_the_layout(cpu_trace: Trace):
    layout = cpu_trace.show()
    timeline, memory, overview, summary = layout.children
    assert timeline.x_range is memory.x_range
    assert overview.select_one({"name": "overview range"}).x_range is timeline.x_range
    assert "overlap %" in summary.text and "(from ops)" in summary.text
    table = cpu_trace.table()
    window = (int(table["start_ns"].min()) - 1_000_000, int(table["end_ns"].max()))
    assert "(from cell)" in cpu_trace.show(window=window).children[3].text  # %%gpu passes the cell's wall time


def test_output_embeds_bokehjs_inline_never_from_a_cdn(cpu_trace: Trace):
    html = file_html(cpu_trace.show(), INLINE)
    assert "cdn.bokeh.org" not in html
    assert not re.search(r"<script[^>]*\ssrc=[\"']https?://", html)
    assert not re.search(r"<link[^>]*\shref=[\"']https?://", html)
    assert "Bokeh" in html and len(html) > 500_000  # BokehJS itself is in the page


def test_inline_setup_is_a_no_op_outside_a_notebook():
    assert inline_setup() is False


def test_importing_gpuworkbench_does_not_import_bokeh():
    code = (
        "import sys, gpuworkbench as gw; gw.live; "
        "print(any(m.split('.')[0] in ('bokeh', 'ipywidgets') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- live dashboard ---------------------------------------------------------------------------------------------------


def run_ops(seconds: float, pause_s: float = 0.0005) -> int:
    """Small CPU-backend ops on two streams for ``seconds``; returns how many were enqueued."""
    dev = gw.Device("cpu")
    a, b = dev.create_stream("live-a"), dev.create_stream("live-b")
    kernel = gw.elementwise("float32 x, float32 y", "y = x + 1", name="inc")
    host = dev.empty_pinned(256, "float32")
    x, y = dev.alloc(256), dev.alloc(256)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        x.copy_from_host_async(host, a)
        kernel(x, y, stream=b)
        n += 2
        time.sleep(pause_s)
    a.synchronize()
    b.synchronize()
    x.free()
    y.free()
    return n


def test_live_streams_new_spans_as_bounded_deltas():
    dev = gw.Device("cpu")
    with gw.trace() as t:
        live = Live(t, dev, rate_hz=20, summary_hz=4)
        streamed_rows = []
        replaced = []

        def watch(event):
            if isinstance(event, ColumnsStreamedEvent) and event.model is live.source:
                streamed_rows.append(len(event.data["left"]))
            if isinstance(event, ColumnDataChangedEvent) and event.model is live.source:
                replaced.append(event)

        live.source.document.on_change(watch)
        ops = run_ops(1.5)
        t.wait_pending()
        time.sleep(0.3)
    live.stop()
    assert not live.running
    total = len(t)
    assert total >= ops
    assert sum(streamed_rows) == live.spans_streamed == total
    assert len(streamed_rows) > 5 and not replaced  # many small deltas, never a full replacement
    assert len(live.source.data["left"]) == min(total, live.rollover)
    assert 1 <= live.max_pushes_per_second() <= 20
    assert {"cpu:0 · live-a", "cpu:0 · live-b"} <= set(live._figure.y_range.factors)
    assert "spans/s" in live._numbers.value and "overlap" in live._numbers.value
    assert "held" in live._gauge_text.value and " of " in live._gauge_text.value
    assert live.errors == []
    assert 0 < live.cpu_s < 1.5


def test_live_push_rate_never_exceeds_30_per_second():
    with gw.trace() as t:
        live = Live(t, rate_hz=30, summary_hz=30)
        run_ops(2.0, pause_s=0.0)
    live.stop()
    assert live.pushes > 10
    assert live.max_pushes_per_second() <= 30


def test_live_rollover_bounds_the_source():
    with gw.trace() as t:
        live = Live(t, rollover=100, summary_spans=50, rate_hz=10)
        run_ops(0.6)
        t.wait_pending()
        time.sleep(0.2)
    live.stop()
    assert live.spans_streamed > 100
    assert len(live.source.data["left"]) == 100
    assert len(live._retained["kind"]) == 50
    assert "numbers over the newest 50 spans" in live._numbers.value


def test_live_refuses_more_than_30_pushes_a_second():
    with pytest.raises(ValueError, match="rate_hz"):
        Live(Trace(), rate_hz=60)


def test_gw_live_owns_its_trace_and_stop_ends_both():
    first = gw.live()
    assert first.owns_trace and first.trace.recording and first.running
    second = gw.live(device="cpu")  # a new own-trace dashboard stops the previous one
    assert not first.running and not first.trace.recording
    run_ops(0.3)
    second.stop()
    assert not second.running and not second.trace.recording
    assert second.spans_streamed == len(second.trace) > 0


def test_live_shows_the_newest_counters_of_its_own_trace():
    live = gw.live(device="cpu", counters=True, summary_hz=10)
    try:
        assert live.trace.counting
        run_ops(0.6)
        time.sleep(0.3)  # a few host samples (10 Hz) and a refresh of the numbers (10 Hz)
        text = live._numbers.value
        assert "gpuworkbench-live-counters" in text and "host CPU" in text and "process RSS" in text
        assert " MiB" in text or " GiB" in text  # memory in its unit
    finally:
        live.stop()
    assert not live.trace.recording and live.errors == []


def test_live_refuses_counters_for_a_trace_recorded_without_them():
    with gw.trace() as t:
        with pytest.raises(gw.InvalidArgument, match="recorded without them"):
            gw.live(t, counters=True)
        with pytest.raises(gw.InvalidArgument, match="True or False"):
            gw.live(counters="yes")


def test_live_applies_front_end_changes_under_its_lock():
    with gw.trace() as t:
        live = Live(t)
        x_range = live._figure.x_range
        event = {"event": "jsevent", "kind": "ModelChanged", "model": {"id": x_range.id}, "attr": "start", "new": 5.0}
        with live._doc_lock:  # the thread cannot stream meanwhile; the main thread (re-entrant lock) still applies it
            live._bokeh._sync_model(live._bokeh, dict(event), [])
    live.close()
    assert x_range.start == 5.0
    live._bokeh.close()  # a second close (ipywidgets does it from __del__) is harmless


def test_live_display_refreshes_the_view_state():
    with gw.trace() as t:
        live = Live(t, rate_hz=10)
        run_ops(0.4)
        t.wait_pending()
        time.sleep(0.3)
        bundle = live._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        docs = live._bokeh.render_bundle["docs_json"]
        assert f"'shape': [{len(live.source.data['left'])}]" in str(docs)  # every span shown so far
        assert "live-a" in str(docs)  # the rows found since construction are in what a new view renders
    live.close()
    assert not live.running


# --- in a real kernel -------------------------------------------------------------------------------------------------

KERNEL_CELL_LIVE = """
import time
import gpuworkbench as gw
from IPython.display import display
dev = gw.Device("cpu")
live = gw.live(device=dev)
display(live)
a, b = dev.create_stream("k-a"), dev.create_stream("k-b")
kernel = gw.elementwise("float32 x, float32 y", "y = x + 1", name="inc")
x, y = dev.alloc(256), dev.alloc(256)
end = time.monotonic() + 3.0
while time.monotonic() < end:  # the cell stays busy: only the dashboard's thread can update the view
    kernel(x, y, stream=a)
    kernel(y, x, stream=b)
    time.sleep(0.001)
live.stop()
print("streamed", live.spans_streamed)
"""

KERNEL_CELL_SHOW = """
with gw.trace() as t:
    x.copy_from_host_async(dev.empty_pinned(256), a)
    kernel(x, y, stream=b)
    a.synchronize(); b.synchronize()
t.show()
"""


def _execute(client, code: str) -> list[dict]:
    msg_id = client.execute(code)
    messages = []
    while True:
        msg = client.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages


@pytest.mark.slow
def test_live_pushes_reach_the_front_end_while_the_cell_is_busy():
    """In a real kernel, the dashboard's patches leave on IOPub during a busy cell; nothing loads from a CDN."""
    manager = pytest.importorskip("jupyter_client.manager")
    pytest.importorskip("ipykernel")
    km, kc = manager.start_new_kernel(kernel_name="python3")
    try:
        live_msgs = _execute(kc, KERNEL_CELL_LIVE)
        errors = [m["content"] for m in live_msgs if m["msg_type"] == "error"]
        assert not errors, errors
        shown = [m for m in live_msgs if m["msg_type"] == "display_data"]
        assert any("application/vnd.jupyter.widget-view+json" in m["content"]["data"] for m in shown)
        patches = [
            m
            for m in live_msgs
            if m["msg_type"] == "comm_msg" and m["content"]["data"].get("content", {}).get("msg") == "patch"
        ]
        assert len(patches) > 20  # several ColumnsStreamed patches a second, sent while the cell ran
        show_msgs = _execute(kc, KERNEL_CELL_SHOW)
        assert not [m["content"] for m in show_msgs if m["msg_type"] == "error"]
        outputs = str([m["content"] for m in live_msgs + show_msgs if m["msg_type"] == "display_data"])
        assert "cdn.bokeh.org" not in outputs
        assert "application/vnd.bokehjs_exec.v0+json" in outputs  # t.show() displayed a Bokeh document
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
