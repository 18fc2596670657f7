"""Property test: random sequences of device operations agree with a NumPy model and leak no bytes.

Each example allocates, uploads, downloads (blocking and async, on random streams), copies device to device, fills,
runs an elementwise kernel and frees, in a random order, sometimes with bad arguments mixed in, sometimes under a
trace. Async ops on different streams are ordered the way a user must order them: each op makes its stream wait for
the last event of every buffer it touches. Blocking copies and ``copy_from`` without a stream order themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuworkbench as gw
from gpuworkbench.trace.spans import KINDS

DTYPES = ["float32", "int32", "float64"]
FILL_BYTES = [0, 1, 0x3F, 0x40]  # patterns that are ordinary numbers in every dtype (no NaN, no denormals)
SCALE = {dt: gw.elementwise(f"{dt} x, {dt} a, {dt} y", "y = a * x", name=f"scale_{dt}") for dt in DTYPES}

slot = st.integers(0, 7)
stream_index = st.integers(0, 2)
ALLOC = st.tuples(st.just("alloc"), st.sampled_from([0, 1, 5, 16, 33]), st.sampled_from(DTYPES))  # sizes that meet
OPS = st.one_of(
    ALLOC,
    st.tuples(st.just("upload"), slot, st.booleans(), stream_index, st.integers(0, 2**31)),
    st.tuples(st.just("download"), slot, st.booleans(), stream_index),
    st.tuples(st.just("d2d"), slot, slot, st.integers(-1, 2)),
    st.tuples(st.just("fill"), slot, st.sampled_from(FILL_BYTES), stream_index),
    st.tuples(st.just("scale"), slot, slot, st.integers(-3, 3), stream_index),
    st.tuples(st.just("free"), slot),
    st.tuples(st.just("use_freed"), slot),
)


@dataclass
class Entry:
    """A live buffer, what it must hold, and the last async op that touched it."""

    buf: gw.Buffer
    model: np.ndarray
    last: gw.Event | None = None


@dataclass
class Run:
    device: gw.Device
    streams: list[gw.Stream]
    live: list[Entry] = field(default_factory=list)
    freed: list[gw.Buffer] = field(default_factory=list)
    checks: list[tuple[gw.Event, np.ndarray, np.ndarray]] = field(default_factory=list)  # async downloads

    def entry(self, i: int) -> Entry | None:
        return self.live[i % len(self.live)] if self.live else None

    def order(self, stream: gw.Stream, *entries: Entry) -> None:
        """Make ``stream`` wait for the last op on each buffer (what a user must do across streams)."""
        for e in entries:
            if e.last is not None and e.last.stream is not stream:
                stream.wait_event(e.last)

    def apply(self, op: tuple) -> None:
        kind, *args = op
        dev = self.device
        if kind == "alloc":
            n, dtype = args
            buf = dev.alloc(n, dtype)
            buf.fill_bytes(0).wait()
            self.live.append(Entry(buf, np.zeros(n, dtype)))
            return
        if kind == "use_freed":
            if self.freed:
                with pytest.raises(gw.BufferClosed, match="was freed"):
                    self.freed[args[0] % len(self.freed)].copy_to_host()
            return
        e = self.entry(args[0])
        if e is None:
            return
        if kind == "upload":
            _, asynchronous, si, seed = args
            data = np.random.default_rng(seed).integers(-1000, 1000, len(e.model)).astype(e.model.dtype)
            if asynchronous:
                s = self.streams[si]
                self.order(s, e)
                e.last = e.buf.copy_from_host_async(data.copy(), s)  # the only reference: the copy keeps it alive
            else:
                e.buf.copy_from_host(data)
                e.last = None  # a blocking copy waited for everything before it on this buffer
            e.model[:] = data
        elif kind == "download":
            _, asynchronous, si = args
            if asynchronous:
                s = self.streams[si]
                self.order(s, e)
                host = np.empty_like(e.model)
                e.last = e.buf.copy_to_host_async(host, s)
                self.checks.append((e.last, host, e.model.copy()))
            else:
                assert_same(e.buf.copy_to_host(), e.model)
                e.last = None
        elif kind == "d2d":
            src = self.entry(args[1])
            if src.buf.size_bytes != e.buf.size_bytes:
                with pytest.raises(gw.InvalidArgument, match="sizes differ"):
                    e.buf.copy_from(src.buf)
                return
            if args[2] < 0:  # default stream, ordered by the buffers themselves
                ev = e.buf.copy_from(src.buf)
            else:
                s = self.streams[args[2]]
                self.order(s, e, src)
                ev = e.buf.copy_from(src.buf, stream=s)
            e.model[:] = src.model.view(e.model.dtype)
            e.last = src.last = ev
        elif kind == "fill":
            _, byte, si = args
            s = self.streams[si]
            self.order(s, e)
            e.last = e.buf.fill_bytes(byte, stream=s)
            e.model.view(np.uint8)[:] = byte
        elif kind == "scale":
            _, src_slot, factor, si = args
            src = self.entry(src_slot)
            f = SCALE.get(e.model.dtype.name)
            if src.model.dtype != e.model.dtype or len(src.model) != len(e.model):
                with pytest.raises(gw.InvalidArgument, match="buffer holds|differ in length"):
                    f(src.buf, factor, e.buf)
                return
            s = self.streams[si]
            self.order(s, e, src)
            e.last = src.last = f(src.buf, factor, e.buf, stream=s)
            e.model[:] = src.model * e.model.dtype.type(factor)
        elif kind == "free":
            e.buf.free()  # waits for the buffer's own pending ops
            self.live.remove(e)
            self.freed.append(e.buf)

    def finish(self) -> None:
        for ev, host, expected in self.checks:
            ev.wait()
            assert_same(host, expected)
        for e in self.live:
            assert_same(e.buf.copy_to_host(), e.model)
            e.buf.free()
        self.live.clear()


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.view(np.uint8).tobytes() == expected.view(np.uint8).tobytes(), f"{actual} != {expected}"


def test_random_operation_sequences_match_numpy(device):
    streams = [device.default_stream, device.create_stream("prop-1"), device.create_stream("prop-2")]
    free0, total0 = device.memory_info()

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        allocs=st.lists(ALLOC, min_size=1, max_size=4), ops=st.lists(OPS, min_size=4, max_size=30), traced=st.booleans()
    )
    def check(allocs: list[tuple], ops: list[tuple], traced: bool) -> None:
        run = Run(device, streams)
        trace = gw.trace().start() if traced else None
        try:
            for op in allocs + ops:
                run.apply(op)
                assert device.held_bytes == sum(e.buf.size_bytes for e in run.live)
            run.finish()
        finally:
            for e in run.live:
                e.buf.free()
            if trace is not None:
                trace.stop()
        assert device.held_bytes == 0 and device.live_buffers == []
        if device.info.is_gpu:
            assert device.memory_info()[1] == total0
        else:
            assert device.memory_info() == (free0, total0)
        if trace is not None:
            assert trace.wait_pending(timeout_s=10)
            kinds = [KINDS[k] for k in trace.table()["kind"]]
            assert sum(k not in ("alloc", "free") for k in kinds) == trace.stats.ops
            assert trace.stats.lost == 0 and kinds.count("alloc") == kinds.count("free")

    check()
    for s in streams[1:]:
        s.close()
