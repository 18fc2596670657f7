"""Tests of trace/recorder.py, spans.py and export.py on real devices: the spans are true, and tracing never syncs."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from support import Gate, sample

import gpuworkbench as gw
from gpuworkbench.trace import active
from gpuworkbench.trace.export import HOST_PID, STREAM_OFFSET
from gpuworkbench.trace.spans import COLUMNS, spans_of

SOURCES = {"cpu": {"perf_counter"}, "opencl": {"profiling"}, "cuda": {"cupti", "events"}, "rocm": {"events"}}
TWICE = gw.elementwise("float32 x, float32 y", "y = 2 * x", name="twice")


def only_ops(spans: list) -> list:
    return [s for s in spans if s.kind not in ("alloc", "free")]


def test_every_op_becomes_a_span_on_the_host_clock(device):
    n = 100_000
    nbytes = 4 * n
    data = sample(n, "float32")
    out = np.empty_like(data)
    times: dict[str, tuple[int, int]] = {}

    def timed(label: str, op):  # host time before the op is enqueued and after it has been waited for
        t0 = time.perf_counter_ns()
        result = op()
        if isinstance(result, gw.Event):
            result.wait()
        times[label] = (t0, time.perf_counter_ns())
        return result

    with gw.trace() as t:
        s = device.create_stream("traced")
        a = timed("alloc a", lambda: device.alloc(n))
        b = timed("alloc b", lambda: device.alloc(n))
        timed("h2d", lambda: a.copy_from_host_async(data, s))
        timed("d2d", lambda: b.copy_from(a, stream=s))
        timed("memset", lambda: a.fill_bytes(0, stream=s))
        timed("kernel", lambda: TWICE(b, a, stream=s))
        timed("d2h", lambda: a.copy_to_host_async(out, s))
        timed("free a", a.free)
        timed("free b", b.free)
    assert np.array_equal(out, 2 * data)

    spans = t.spans  # waits for pending spans once the trace has stopped
    assert [sp.kind for sp in spans if sp.kind in ("alloc", "free")] == ["alloc", "alloc", "free", "free"]
    assert [sp.kind for sp in only_ops(spans)] == ["h2d", "d2d", "memset", "kernel", "d2h"]
    clock = t.devices[0]
    assert list(t.devices) == [0] and clock.key == device.spec
    assert clock.source in SOURCES[device.backend_kind.value]
    err = clock.error_ns
    labels = ["alloc a", "alloc b", "h2d", "d2d", "memset", "kernel", "d2h", "free a", "free b"]
    by_label = dict(zip(labels, [sp for sp in spans if sp.kind in ("alloc", "free")][:2] + only_ops(spans)))
    by_label["free a"], by_label["free b"] = [sp for sp in spans if sp.kind == "free"]
    for label, sp in by_label.items():
        t0, t1 = times[label]
        assert sp.device == 0
        assert sp.start_ns <= sp.end_ns, label
        assert t0 - err <= sp.start_ns and sp.end_ns <= t1 + err, (label, t0, sp, t1, err)
        if sp.kind in ("alloc", "free"):
            assert sp.stream == -1 and sp.bytes == nbytes
        else:
            assert sp.stream == s.id and t0 <= sp.enqueue_ns <= t1
            assert sp.enqueue_ns <= sp.start_ns + err
            assert sp.bytes == (0 if sp.kind == "kernel" else nbytes)
    assert by_label["kernel"].name == "twice"
    copies = [by_label[k] for k in ("h2d", "d2d", "d2h")]
    assert all(sp.name.startswith(sp.kind) for sp in copies)
    ops = only_ops(spans)  # one stream, in order: no op starts before the previous one ended
    assert all(prev.end_ns <= nxt.start_ns + 2 * err for prev, nxt in zip(ops, ops[1:]))
    assert t.stats.ops == len(ops) and t.stats.lost == 0 and t.stats.pending == 0 and t.stats.dropped == 0
    assert t.stream_labels[(0, s.id)] == "traced"
    memory = t.memory_table()
    assert memory["held_bytes"].tolist() == [nbytes, 2 * nbytes, nbytes, 0]
    assert np.all(np.diff(memory["t_ns"]) >= 0)
    s.close()


def test_ops_outside_the_trace_are_not_recorded(device):
    data = sample(1000, "float32")
    with device.alloc(1000) as buf:
        buf.copy_from_host(data)
        with gw.trace() as t:
            buf.copy_to_host()
        buf.copy_from_host(data)
    assert [sp.kind for sp in t.spans] == ["d2h"]
    assert not t.recording and t not in active()


def test_two_traces_see_the_same_ops(device):
    with device.alloc(100) as buf:
        with gw.trace() as outer:
            buf.fill_bytes(0).wait()
            with gw.trace() as inner:
                buf.fill_bytes(1).wait()
    assert [sp.kind for sp in outer.spans] == ["memset", "memset"]
    assert [sp.kind for sp in inner.spans] == ["memset"]
    # each trace aligns the device clock itself: the same op, within both alignment errors
    err = inner.devices[0].error_ns + outer.devices[0].error_ns
    if inner.devices[0].source != outer.devices[0].source:
        # On CUDA only one trace can hold CUPTI; the other falls back to events, which mark when the stream
        # reached the op (DESIGN §5: several µs early or late), so the same op differs by that bias too.
        err += 50_000
    assert abs(inner.spans[0].start_ns - outer.spans[1].start_ns) <= err
    if inner.devices[0].source == outer.devices[0].source:
        assert inner.spans[0].enqueue_ns == outer.spans[1].enqueue_ns
    else:  # a CUPTI trace reads the enqueue time on CUPTI's clock, as its spans, and maps both alike
        assert abs(inner.spans[0].enqueue_ns - outer.spans[1].enqueue_ns) <= err + 20_000


def test_pinned_flag_of_copies(device):
    pinned = device.empty_pinned(1000, "float32")
    pageable = np.zeros(1000, np.float32)
    s = device.create_stream()
    with device.alloc(1000) as buf, gw.trace() as t:
        buf.copy_from_host_async(pinned, s)
        buf.copy_from_host_async(pageable, s)
        s.synchronize()
    flags = [sp.pinned for sp in t.spans if sp.kind == "h2d"]
    assert flags == ([1, 0] if device.caps.pinned_memory else [-1, -1])
    s.close()


def test_cpu_async_copies_on_two_streams_overlap(cpu):
    n = 64 << 20  # bytes per copy
    hosts = [np.full(n, i + 1, np.uint8) for i in range(2)]
    streams = [cpu.create_stream(f"copy-{i}") for i in range(2)]
    bufs = [cpu.alloc(n, "uint8") for _ in range(2)]
    for b in bufs:
        b.fill_bytes(0).wait()  # touch the pages first: first-touch page faults are not what we measure
    with gw.trace() as t:
        events = [b.copy_from_host_async(h, s) for b, h, s in zip(bufs, hosts, streams)]
        for ev in events:
            ev.wait()
    first, second = sorted((sp for sp in t.spans if sp.kind == "h2d"), key=lambda sp: sp.stream)
    assert (first.stream, second.stream) == (streams[0].id, streams[1].id)
    assert first.bytes == second.bytes == n
    overlap = min(first.end_ns, second.end_ns) - max(first.start_ns, second.start_ns)
    assert overlap > 0, f"copies on two CPU streams ran one after the other: {first} {second}"
    for b, h in zip(bufs, hosts):
        assert b.copy_to_host()[:: 1 << 20].tolist() == h[:: 1 << 20].tolist()
        b.free()
    for s in streams:
        s.close()


def test_wait_event_ordering_is_visible_in_the_spans(device):
    a, b = device.create_stream("a"), device.create_stream("b")
    data = sample(1 << 20, "float32")
    with device.alloc(1 << 20) as src, device.alloc(1 << 20) as dst, gw.trace() as t:
        up = src.copy_from_host_async(data, a)
        b.wait_event(up)
        dst.copy_from(src, stream=b).wait()
    err = t.devices[0].error_ns
    h2d, d2d = (next(sp for sp in t.spans if sp.kind == k) for k in ("h2d", "d2d"))
    assert (h2d.stream, d2d.stream) == (a.id, b.id)
    assert h2d.end_ns <= d2d.start_ns + 2 * err
    a.close()
    b.close()


def test_exiting_the_trace_never_waits_for_pending_ops(cpu):
    with Gate(cpu) as gate:
        s = cpu.create_stream("held")
        with gw.trace() as t:
            held = gate.close_on(s)
            cpu.alloc(10).free()
            t_exit = time.perf_counter_ns()
        exit_ns = time.perf_counter_ns() - t_exit
        assert not held.done and exit_ns < 100_000_000  # left at once although the op is still running
        assert [sp.kind for sp in spans_of(t.table(wait=False))] == ["alloc", "free"]  # no span for the op yet
        assert t.stats.ops == 1
        released = time.perf_counter_ns()
        gate.open()
        held.wait()
    kernel = [sp for sp in t.spans if sp.kind == "kernel"]  # arrives in the background once the op is done
    assert len(kernel) == 1 and kernel[0].name == "gate" and kernel[0].stream == s.id
    assert kernel[0].enqueue_ns < t_exit < released <= kernel[0].end_ns
    assert t.stats.pending == 0 and t.stats.lost == 0
    s.close()


def test_a_stopped_trace_drains_its_last_ops_at_a_gentle_pace(cpu):
    """Once stopped, the harvester polls the ops still running every ~10 ms (not in a busy loop); it says its CPU."""
    with Gate(cpu) as gate:
        s = cpu.create_stream("held")
        with gw.trace() as t:
            gate.close_on(s)
        cycles = t.stats.harvest_cycles
        time.sleep(0.3)
        polled = t.stats.harvest_cycles - cycles
        assert 5 <= polled <= 60, f"{polled} harvests in 0.3 s while one op was pending"
        gate.open()
    assert t.wait_pending(10) and t.stats.pending == 0
    assert 0 < t.stats.harvest_cpu_s < 0.3
    s.close()


def test_tracing_while_a_stream_is_blocked_does_not_block_other_streams(cpu):
    with Gate(cpu) as gate:
        blocked, free = cpu.create_stream("blocked"), cpu.create_stream("free")
        with cpu.alloc(1000) as buf, gw.trace() as t:
            gate.close_on(blocked)
            buf.fill_bytes(3, stream=free).wait()  # would hang if the trace synchronized the device
            deadline = time.monotonic() + 5
            while not any(sp.kind == "memset" for sp in spans_of(t.table(wait=False))):
                assert time.monotonic() < deadline, "the harvester never reported the finished memset"
                time.sleep(0.005)
            gate.open()
        blocked.close()
        free.close()
    assert sorted(sp.kind for sp in only_ops(t.spans)) == ["kernel", "memset"]


def test_capacity_keeps_the_newest_spans(device):
    with device.alloc(16) as buf:
        with gw.trace(capacity=4) as t:
            for byte in range(10):
                buf.fill_bytes(byte).wait()
        assert t.wait_pending()
        assert len(t) == 4 and t.stats.dropped == 6 and t.stats.ops == 10
        assert [sp.kind for sp in t.spans] == ["memset"] * 4
        assert np.all(buf.copy_to_host().view(np.uint8) == 9)


def test_stream_created_inside_the_trace_is_labelled(device):
    with gw.trace() as t:
        with device.alloc(4) as buf:
            s = device.create_stream("late")
            buf.fill_bytes(0, stream=s).wait()
    assert t.stream_labels[(0, s.id)] == "late"
    s.close()


def test_dataframe(device):
    pytest.importorskip("pandas")
    with gw.trace() as t:
        with device.alloc(1000) as buf:
            buf.fill_bytes(0).wait()
    frame = t.to_dataframe().sort_values("start_ns")  # rows come in completion order
    assert list(frame["kind"]) == ["alloc", "memset", "free"]
    assert frame["bytes"].tolist() == [4000, 4000, 4000]
    assert set(COLUMNS) <= set(frame.columns) and (frame["duration_ns"] >= 0).all()


def test_chrome_trace_export(device, tmp_path):
    n = 1 << 18
    data = sample(n, "float32")
    s1, s2 = device.create_stream("up"), device.create_stream("down")
    with gw.trace() as t:
        with device.alloc(n) as buf:
            buf.copy_from_host_async(data, s1).wait()
            TWICE(buf, buf, stream=s1).wait()
            buf.copy_to_host_async(np.empty(n, np.float32), s2).wait()
    path = tmp_path / "run.json"
    doc = t.to_chrome_trace(str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    spans = t.spans
    # metadata: one process per device (pid = device number) and the host; one thread per stream used
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert set(processes) == {0, HOST_PID} and processes[0].startswith(f"{device.spec} {device.name}")
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {k: v for k, v in threads.items() if k[0] == 0} == {
        (0, s1.id + STREAM_OFFSET): f"stream {s1.id} up",
        (0, s2.id + STREAM_OFFSET): f"stream {s2.id} down",
    }, (t.stats, [(c.source, c.note[:80]) for c in t.devices.values()])
    assert any(e["name"] == "process_labels" and e["pid"] == 0 for e in meta)
    # complete events: each device span on its device and stream row, allocations on the host row
    xs = [e for e in events if e["ph"] == "X"]
    origin = doc["gpuworkbench"]["origin_host_ns"]
    assert origin <= min(sp.start_ns for sp in spans)
    device_xs = [e for e in xs if e["pid"] == 0]
    assert len(device_xs) == len(only_ops(spans)) == 3
    host_xs = [e for e in xs if e["pid"] == HOST_PID]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in xs)
    for sp in spans:
        ts, dur = round((sp.start_ns - origin) / 1000, 3), round((sp.end_ns - sp.start_ns) / 1000, 3)
        if sp.kind in ("alloc", "free"):
            (e,) = [e for e in host_xs if e["name"] == sp.name and e["ts"] == ts and e["dur"] == dur]
            assert e["args"]["bytes"] == 4 * n
            continue
        (e,) = [e for e in device_xs if e["ts"] == ts and e["dur"] == dur]
        assert e["tid"] == sp.stream + STREAM_OFFSET and e["args"]["device"] == 0
        if sp.kind == "kernel":
            assert e["cat"] == "kernel" and e["name"] == "twice"
        else:
            assert e["cat"] == "gpu_memcpy" and e["args"]["bytes"] == 4 * n
            assert e["args"]["copy kind"] == {"h2d": "HtoD", "d2h": "DtoH"}[sp.kind]
            assert e["args"]["memory bandwidth (GB/s)"] == round(4 * n / (sp.end_ns - sp.start_ns), 3)
    s1.close()
    s2.close()


def test_sequential_traces_reuse_their_harvest_threads():
    """A trace's harvest loop runs on an idle pooled thread: sequential traces start no new OS thread each."""
    import threading

    def harvesters() -> int:
        return sum(1 for th in threading.enumerate() if th.name.startswith("gpuworkbench-trace"))

    dev = gw.Device(0, backend="cpu")
    buf = dev.alloc(16, "float32")
    try:
        counts = []
        for _ in range(6):
            with gw.trace() as t:
                buf.fill_bytes(0)
            assert t.wait_pending(10)
            t._thread.join(10)
            assert not t._thread.is_alive() and len(t.spans) >= 1
            counts.append(harvesters())
        assert counts[-1] == counts[1], counts  # the same idle thread(s) every time
    finally:
        buf.free()


def _finished_trace(buf) -> gw.Trace:
    """A trace of one op on ``buf``'s device whose harvest loop has ended."""
    with gw.trace() as t:
        buf.fill_bytes(0)
    assert t.wait_pending(10)
    t._thread.join(10)
    return t


def test_an_idle_harvest_thread_does_not_keep_the_last_trace_alive():
    """Once its loop has ended, a trace the user drops is freed: the pooled thread that ran the loop keeps no reference
    while it waits for the next one (it used to, freeing the trace when the next trace's loop arrived, beside that
    trace's first ops)."""
    import gc
    import weakref

    dev = gw.Device(0, backend="cpu")
    buf = dev.alloc(16, "float32")
    try:
        t = _finished_trace(buf)
        gone = weakref.ref(t)
        gc.disable()  # freed by its reference count, not by a collection
        try:
            del t
            assert gone() is None
        finally:
            gc.enable()
    finally:
        buf.free()


def test_a_warmed_harvest_thread_serves_the_next_trace():
    """``%load_ext`` starts one idle harvest thread (``THREADS.warm``), so that the first trace starts none."""
    import threading

    from gpuworkbench.trace.harvest_threads import THREADS

    THREADS.warm()
    THREADS.warm()  # one idle thread is enough: a second call starts none
    idle = list(THREADS._idle)
    assert len(idle) >= 1
    before = {th.ident for th in threading.enumerate()}
    with gw.trace() as t:
        pass
    assert t.wait_pending(10)
    t._thread.join(10)
    assert {th.ident for th in threading.enumerate()} <= before  # the trace ran on a thread that was waiting


def test_a_trace_made_ahead_serves_the_next_trace_with_default_arguments(monkeypatch):
    """A trace's harvester, as it ends, makes the next trace's object (``make_spares``): ``gw.trace()`` with default
    arguments gets it, unstarted, with a new id; other arguments, or ``GPUWB_TRACE_OTHERS`` changed since, get a new
    one."""
    from gpuworkbench.trace import recorder

    dev = gw.Device(0, backend="cpu")
    buf = dev.alloc(16, "float32")
    try:
        first = _finished_trace(buf)
        assert len(recorder._SPARES) == 1
        spare = recorder._SPARES[0]
        assert spare is not first and not spare.recording and len(spare) == 0
        second = gw.trace(capacity=10)  # not the defaults: a new trace, the spare stays
        assert second is not spare and second.capacity == 10 and recorder._SPARES == [spare]
        third = gw.trace()
        assert third is spare and recorder._SPARES == [] and third.id > second.id > first.id
        with third:
            buf.fill_bytes(0)
        assert third.wait_pending(10) and [s.kind for s in third.spans] == ["memset"]
        third._thread.join(10)
        assert len(recorder._SPARES) == 1 and recorder._SPARES[0].others
        spare = recorder._SPARES[0]
        monkeypatch.setenv("GPUWB_TRACE_OTHERS", "0")
        fourth = gw.trace()  # the spare records other libraries' work; this trace must not
        assert fourth is not spare and fourth.others is False
    finally:
        buf.free()


def test_cupti_clocks_are_sampled_on_first_need_and_reach_clocks_made_before():
    """A CUPTI trace samples CUPTI's clock at its first harvest (or read), not on its start: a device clock aligned
    before that gets the offset then."""
    from gpuworkbench.trace.recorder import DeviceClock, Trace

    class FakeClock:
        calls = 0

        def clock_sample(self, host=time.perf_counter_ns, raw=False):
            FakeClock.calls += 1
            now = host()
            return now + 7_000_000, now, 150

        def to_ns(self, ticks):
            return ticks

    t = Trace()
    t._cupti = FakeClock()
    t._devices[0] = DeviceClock(key="cuda:0", name="early", source="cupti")  # as ``_align`` leaves it
    t._devices[1] = DeviceClock(key="cpu:0", name="cpu", source="perf_counter")
    assert t._devices[0].offset_ns == 0 and FakeClock.calls == 0
    clocks = t.devices
    assert clocks[0].offset_ns == 7_000_000 and clocks[0].error_ns == 150 and clocks[1].offset_ns == 0
    assert FakeClock.calls == 2  # once against the host clock, once against the window clock
    t._sample_clocks()
    t._devices[2] = DeviceClock(key="cuda:1", name="late", source="cupti")
    assert FakeClock.calls == 2 and t.devices[2].offset_ns == 0  # once per trace: later clocks take it from _align


def test_a_trace_made_ahead_serves_explicit_arguments_equal_to_its_own(monkeypatch):
    """The trace made ahead is matched by what it was made with, not by whether the caller left the defaults: an
    explicit ``others=True`` gets it; a spare that no call with the defaults could get any more is dropped."""
    from gpuworkbench.trace import recorder

    monkeypatch.setattr(recorder, "_SPARES", [])
    recorder.make_spares()
    spare = recorder._SPARES[0]
    assert gw.trace(others=True, capacity=1_000_000) is spare and recorder._SPARES == []
    recorder.make_spares()
    monkeypatch.setenv("GPUWB_TRACE_OTHERS", "0")
    assert gw.trace().others is False and recorder._SPARES == []  # it recorded others: never a default trace now
