"""Tests of the fast launch path: what is cached (per buffer, per kernel and signature, per elementwise plan) keeps
every check, completions made without a threading primitive per op (CPU) or on demand (CUDA, against a fake CuPy),
and the stream's lock-free tracking keeping host arrays alive until their op is done."""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import types
import weakref

import numpy as np
import pytest
from support import sample

import gpuworkbench as gw
from gpuworkbench.backends.base import DONE, BufferArg, DeviceInfo, LazyCompletion, StreamMarks
from gpuworkbench.kernels.raw import _PREPARING


def add_one(x: np.ndarray, y: np.ndarray) -> None:
    y[...] = x + 1


# ------------------------------------------------------------------ raw kernels: the per-buffer and per-count caches
def test_kernel_new_signature_after_cached_launches_is_checked(cpu):
    k = cpu.compile(add_one, "add_one")
    x, y = cpu.alloc(4, "float32"), cpu.alloc(4, "float32")
    try:
        x.copy_from_host(np.arange(4, dtype=np.float32))
        for _ in range(200):
            k(1, 1, (x, y))
        np.testing.assert_array_equal(y.copy_to_host(), np.arange(4) + 1)
        with pytest.raises(gw.InvalidArgument, match="do not fit its signature"):
            k(1, 1, (x, y, x))  # a new argument count: bound again, refused
        with pytest.raises(gw.InvalidArgument, match="pass a Buffer or a number"):
            k(1, 1, (x, "y"))
        with pytest.raises(gw.InvalidArgument, match="1 to 3 positive ints"):
            k(0, 1, (x, y))
        with pytest.raises(gw.InvalidArgument, match="must be a gpuworkbench Stream"):
            k(1, 1, (x, y), stream="s")
        k(1, 1, (y, x)).wait()  # buffers swapped: each converted on its own
        np.testing.assert_array_equal(x.copy_to_host(), np.arange(4) + 2)
    finally:
        x.free()
        y.free()


def test_kernel_scalars_keep_their_conversion_after_many_launches(cpu):
    seen = []
    k = cpu.compile(lambda y, a: seen.append(type(a)), "scalar")
    y = cpu.alloc(1, "float32")
    try:
        for value in (1, 2.0, np.float64(3), 2**40, True):
            k(1, 1, (y, value)).wait()
        assert seen == [np.int32, np.float32, np.float64, np.int64, np.int32]
    finally:
        y.free()


def test_freed_buffer_after_many_launches_raises_buffer_closed(device):
    if device.caps.kernel_language not in ("python", "opencl"):
        pytest.skip("raw kernel source for the CPU and OpenCL backends here")
    f = gw.elementwise("float32 x, float32 y", "y = x + 1", name="freed_after")
    x, y = device.alloc(8, "float32"), device.alloc(8, "float32")
    x.copy_from_host(np.zeros(8, np.float32))
    for _ in range(100):
        f(x, y)
    y.copy_to_host()
    x.free()
    try:
        with pytest.raises(gw.BufferClosed):
            f(x, y)
    finally:
        y.free()


def test_buffer_on_another_device_after_cached_launches(cpu, opencl):
    k = cpu.compile(add_one, "add_one")
    x, y, z = cpu.alloc(2, "float32"), cpu.alloc(2, "float32"), opencl.alloc(2, "float32")
    try:
        for _ in range(50):
            k(1, 1, (x, y))
        with pytest.raises(gw.InvalidArgument, match="kernel argument 1 is a buffer on opencl"):
            k(1, 1, (x, z))
        cpu.default_stream.synchronize()
    finally:
        for b in (x, y, z):
            b.free()


# ------------------------------------------------------------------ repeated launches: prepared once, checked by id
def _write_scalar(out: np.ndarray, n: np.generic) -> None:
    out[...] = n


def test_a_repeated_launch_is_prepared_and_sees_every_change(cpu):
    k = cpu.compile(_write_scalar, "write_scalar")
    a, b = cpu.alloc(1, "float32"), cpu.alloc(1, "float32")
    s = cpu.create_stream("repeat")
    three, four = np.float32(3), np.float32(4)
    try:
        for _ in range(3):
            k(1, 1, (a, three), stream=s)
        assert len(k._repeats) == 1  # the second launch of the same objects prepared it
        k(1, 1, (a, three), stream=s).wait()
        assert a.copy_to_host()[0] == 3
        k(1, 1, (a, four), stream=s)  # another scalar object: not the prepared launch
        k(1, 1, (b, three), stream=s).wait()  # another buffer
        assert a.copy_to_host()[0] == 4 and b.copy_to_host()[0] == 3
        for i in range(300):  # a fresh scalar every launch, ids reused by the allocator: each value lands
            k(1, 1, (a, np.float32(i)), stream=s)
        s.synchronize()
        assert a.copy_to_host()[0] == 299
        assert k._skip > 0  # misses in a row: no key is made for a while
        for _ in range(600):  # then a repeat is found again
            k(1, 1, (a, four), stream=s)
        assert k._skip == 0 and any(hit[3][1] is four for hit in k._repeats.values())
        grid = [1]
        for _ in range(3):
            k(grid, 1, (a, three), stream=s)
        grid[0] = 0  # changed in place under the same id: checked again, refused
        with pytest.raises(gw.InvalidArgument, match="1 to 3 positive ints"):
            k(grid, 1, (a, three), stream=s)
        b.free()
        with pytest.raises(gw.BufferClosed):
            k(1, 1, (b, three), stream=s)  # a prepared launch of a freed buffer is not repeated
        with gw.trace() as t:  # a trace sees every launch, repeats included
            for _ in range(3):
                k(1, 1, (a, three), stream=s)
            s.synchronize()
        assert sum(1 for sp in t.spans if sp.kind == "kernel") == 3
        with gw.trace() as outer, gw.trace() as inner:  # two traces at once: each sees every repeat
            for _ in range(3):
                k(1, 1, (a, three), stream=s)
            s.synchronize()
        assert [sum(1 for sp in x.spans if sp.kind == "kernel") for x in (outer, inner)] == [3, 3]
        s.close()
        with pytest.raises(gw.InvalidArgument, match="closed"):
            k(1, 1, (a, three), stream=s)
    finally:
        a.free()
        b.free()


def test_a_repeated_launch_keeps_no_buffer_alive(cpu):
    k = cpu.compile(_write_scalar, "write_scalar")
    one = np.float32(1)
    x = cpu.alloc(1, "float32")
    for _ in range(3):
        k(1, 1, (x, one)).wait()
    assert k._repeats
    ref, memory = weakref.ref(x), weakref.ref(x.handle)  # the CPU backend's array behind the buffer
    cpu.default_stream.synchronize()  # the stream lets go of its finished ops' arguments
    del x
    gc.collect()
    assert ref() is None and cpu.held_bytes == 0  # freed by its finaliser, as without the repeat
    assert memory() is None and not k._repeats  # no prepared launch holds a view of the freed memory


def test_a_freed_buffer_leaves_no_memory_in_its_streams_queues(cpu):
    k = cpu.compile(_write_scalar, "write_scalar")
    s = cpu.create_stream("queue")
    one = np.float32(1)
    try:
        x = cpu.alloc(1 << 16, "float32")
        for _ in range(5):  # the queue keeps each launch's arguments (here a view of x's memory) until pruned
            k(1, 1, (x, one), stream=s)
        memory = weakref.ref(x.handle)
        x.free()  # no synchronize: free waits for x's ops, and its streams let go of their arguments
        del x
        gc.collect()
        assert memory() is None
        y = cpu.alloc(16, "float32")
        k(1, 1, (y, one), stream=s).wait()
        freed = threading.Event()
        with s._lock:  # a finaliser freeing y while this thread prunes s: the free must not wait for the lock
            worker = threading.Thread(target=lambda: (y.free(), freed.set()))
            worker.start()
            worker.join(10)
        assert freed.is_set() and y.closed
    finally:
        s.close()


def test_a_new_buffer_each_launch_prepares_nothing_and_every_value_lands(cpu, monkeypatch):
    """alloc, launch, free in a loop: the new buffer often gets the freed one's id, so two launches in a row have
    equal keys; with a free between them nothing is prepared (the free would drop it), and each launch writes its own
    buffer."""
    k = cpu.compile(_write_scalar, "write_scalar")
    s = cpu.create_stream("churn")
    prepared = []
    real = k._prepare  # the backend's prepare_launch, bound when the kernel was made
    monkeypatch.setattr(k, "_prepare", lambda *a: prepared.append(a) or real(*a))
    seven, ids = np.float32(7), set()
    try:
        for _ in range(12):  # fewer than the misses after which no key is made for a while
            x = cpu.alloc(4, "float32")
            ids.add(id(x))
            k(1, 1, (x, seven), stream=s).wait()
            assert x.copy_to_host()[0] == 7
            x.free()
            del x  # its id free for the next buffer
        assert len(ids) < 12  # ids were reused: keys repeated across frees
        assert not prepared and not k._repeats
        y = cpu.alloc(4, "float32")
        for _ in range(3):  # no free between: the second launch prepares the repeat
            k(1, 1, (y, seven), stream=s)
        s.synchronize()
        assert len(prepared) == 1 and len(k._repeats) == 1
        y.free()
        # the CPU backend has no slots for varying launches: stand-ins that launch through its full path
        backend = cpu.backend_device
        slots = []  # each preparation of varying slots, as the backend would make them
        monkeypatch.setattr(k, "_prepare_varying", lambda raw, g, b, types: slots.append(1) or (raw, g, b))
        monkeypatch.setattr(k, "_launch_varying", lambda v, raw, values: backend.launch(*v, values, raw, False))
        for _ in range(40):  # past the misses after which launches keep their shapes: none kept across a free
            x = cpu.alloc(4, "float32")
            k(1, 1, (x, seven), stream=s).wait()
            assert x.copy_to_host()[0] == 7
            x.free()
            del x
        assert k._skip > 0 and not slots and not k._shapes and k not in _PREPARING
        z = cpu.alloc(4, "float32")
        for i in range(5):  # a scalar that changes, no free between: the shape is kept and used
            k(1, 1, (z, np.float32(i)), stream=s)
        s.synchronize()
        assert z.copy_to_host()[0] == 4 and len(k._shapes) == 1 and k in _PREPARING
        z.free()
        assert not k._shapes and k not in _PREPARING  # dropped by the free
    finally:
        s.close()


def test_the_last_repeat_is_found_by_identity_and_sees_every_change(cpu):
    k = cpu.compile(_write_scalar, "write_scalar")
    a, b = cpu.alloc(1, "float32"), cpu.alloc(1, "float32")
    s1, s2 = cpu.create_stream("one"), cpu.create_stream("two")
    three, four = np.float32(3), np.float32(4)
    try:
        for _ in range(3):
            k(1, 1, (a, three), stream=s1)
        assert k._hot is not None  # the last repeat, kept for launches that repeat it
        args = [a, three]
        assert k(1, 1, args, stream=s1).stream is s1
        args[1] = four  # the same list changed in place: its items are compared, not the list
        k(1, 1, args, stream=s1).wait()
        assert a.copy_to_host()[0] == 4
        for stream in (s1, s2, s1, s2):  # another stream object: its own launch, on its own stream
            assert k(1, 1, (a, three), stream=stream).stream is stream
        for _ in range(3):
            k(1, 1, (b, four))  # no stream given: the default stream, also when repeated
        assert k(1, 1, (b, four)).stream is cpu.default_stream
        cpu.synchronize()
        assert b.copy_to_host()[0] == 4
        b.free()  # every repeat is stale: the freed buffer is refused, a new one is written
        with pytest.raises(gw.BufferClosed):
            k(1, 1, (b, four))
        c = cpu.alloc(1, "float32")
        for _ in range(3):
            k(1, 1, (c, three)).wait()
        assert c.copy_to_host()[0] == 3
        c.free()
        with gw.trace() as t:  # a trace sees the repeats the last one stands for
            for _ in range(4):
                k(1, 1, (a, three), stream=s1)
            s1.synchronize()
        assert sum(1 for sp in t.spans if sp.kind == "kernel") == 4
    finally:
        a.free()
        s1.close()
        s2.close()


def test_elementwise_repeats_skip_the_checks_until_a_buffer_is_freed(cpu, monkeypatch):
    f = gw.elementwise("float32 x, float32 y", "y = x + 1", name="hot_elementwise")
    x, y, z = cpu.alloc(4, "float32"), cpu.alloc(4, "float32"), cpu.alloc(4, "float32")
    s = cpu.create_stream("other")
    x.copy_from_host(np.arange(4, dtype=np.float32))
    looked = []
    plans = f._plans

    class Counting(dict):
        def get(self, key, default=None):
            looked.append(key)
            return dict.get(self, key, default)

    monkeypatch.setattr(f, "_plans", Counting(plans))
    try:
        for _ in range(5):
            f(x, y)
        assert len(looked) == 1  # checked once; the repeats skip to the kernel
        assert f(x, y, stream=s).stream is s and len(looked) == 2  # another stream: checked
        f(x, z, stream=s).wait()  # another buffer: checked, and written
        assert len(looked) == 3 and np.array_equal(z.copy_to_host(), np.arange(4) + 1)
        f(x, z, block=128)  # another block: checked
        assert len(looked) == 4
        z.free()
        with pytest.raises(gw.BufferClosed):
            f(x, z)
        with pytest.raises(gw.InvalidArgument, match="takes 2 arguments"):
            f(x, y, y)
        f(y, x).wait()
        assert np.array_equal(x.copy_to_host(), np.arange(4) + 2)
    finally:
        x.free()
        y.free()
        s.close()


def test_the_queue_of_ops_is_pruned_rarely_but_large_host_arrays_often(cpu):
    from gpuworkbench.streams import KEEP_LARGE, PRUNE_MASK

    s = cpu.create_stream("prune")
    small = cpu.alloc(16, "float32")
    large = cpu.alloc(KEEP_LARGE // 4, "float32")
    try:
        s.synchronize()
        start = s.appended
        for _ in range(PRUNE_MASK + 1 - start % (PRUNE_MASK + 1) - 1):
            last = small.copy_from_host_async(np.zeros(16, np.float32), s)
        last.wait()  # every op done; waiting on one prunes nothing
        assert len(s.inflight) >= 64  # small arrays: kept until the 1024th op, not pruned every 64
        small.copy_from_host_async(np.zeros(16, np.float32), s).wait()
        assert len(s.inflight) <= 1  # the 1024th op pruned every finished one
        for _ in range(64 * 3):  # fresh large arrays: the queue is pruned every 64 ops
            large.copy_from_host_async(np.zeros(KEEP_LARGE // 4, np.float32), s).wait()
        assert len(s.inflight) <= 64
    finally:
        small.free()
        large.free()
        s.close()


def test_a_prune_after_a_wait_on_the_newest_op_asks_no_completion(cpu):
    """A freed buffer's streams are pruned with the completion its free waited for: where that is the newest op's,
    the whole queue is done without a query (on CUDA a query records and asks an event)."""

    class Asked:
        def __init__(self, done: bool) -> None:
            self.answer, self.asked = done, 0

        def done(self) -> bool:
            self.asked += 1
            return self.answer

    s = cpu.create_stream("waited")
    try:
        s.synchronize()
        older, newest = Asked(True), Asked(True)
        s.inflight.extend([(older, None), (newest, None)])
        s.prune_if_free(newest)
        assert not s.inflight and older.asked == newest.asked == 0
        waited, running = Asked(True), Asked(False)
        s.inflight.extend([(waited, None), (running, None)])
        s.prune_if_free(waited)  # a newer op than the one waited for: asked, and kept while it runs
        assert [c for c, _ in s.inflight] == [running] and running.asked > 0
        s.inflight.clear()
    finally:
        s.close()


# ------------------------------------------------------------------ elementwise: launch plans per signature
def test_elementwise_plan_per_length_and_mask(device):
    f = gw.elementwise("float32 x, float32 a, float32 y", "y = a * x + 1", name="plans")
    for n in (3, 1000, 3):
        x, y = device.alloc(n, "float32"), device.alloc(n, "float32")
        try:
            host = sample(n, "float32")
            x.copy_from_host(host)
            for _ in range(20):
                f(x, 2, y)
            np.testing.assert_array_equal(y.copy_to_host(), 2 * host + 1)
            a = device.alloc(n, "float32")  # the scalar parameter given as a buffer: another specialisation
            a.copy_from_host(np.full(n, 3, np.float32))
            f(x, a, y)
            np.testing.assert_array_equal(y.copy_to_host(), 3 * host + 1)
            a.free()
        finally:
            x.free()
            y.free()


def test_elementwise_bad_arguments_after_cached_launches(device):
    f = gw.elementwise("float32 x, float32 y", "y = x + 1", name="bad_after")
    x, y = device.alloc(4, "float32"), device.alloc(4, "float32")
    other_len, other_type = device.alloc(5, "float32"), device.alloc(4, "int32")
    try:
        x.copy_from_host(np.zeros(4, np.float32))
        for _ in range(100):
            f(x, y)
        with pytest.raises(gw.InvalidArgument, match="differ in length"):
            f(x, other_len)
        with pytest.raises(gw.InvalidArgument, match="buffer holds int32"):
            f(x, other_type)
        with pytest.raises(gw.InvalidArgument, match="output 'y' must be a Buffer"):
            f(x, 1.0)
        with pytest.raises(gw.InvalidArgument, match="at least one buffer"):
            f(1.0, 2.0)
        with pytest.raises(gw.InvalidArgument, match="takes 2 arguments"):
            f(x)
        with pytest.raises(gw.InvalidArgument, match="block must be a positive int"):
            f(x, y, block=0)
        with pytest.raises(gw.InvalidArgument, match="block must be a positive int"):
            f(x, y, block=[256])
        with pytest.raises(gw.InvalidArgument, match="stream must be a Stream"):
            f(x, y, stream=object())
        np.testing.assert_array_equal(y.copy_to_host(), np.ones(4, np.float32))
    finally:
        for b in (x, y, other_len, other_type):
            b.free()


def test_elementwise_scalar_that_is_not_a_number_is_invalid_argument(cpu):
    f = gw.elementwise("float32 x, float32 a, float32 y", "y = a * x", name="bad_scalar")
    x, y = cpu.alloc(2, "float32"), cpu.alloc(2, "float32")
    try:
        with pytest.raises(gw.InvalidArgument, match="parameter 'a' is float32, got str"):
            f(x, "two", y)
    finally:
        x.free()
        y.free()


# ------------------------------------------------------------------ CPU completions without a primitive per op
@pytest.fixture
def gated(cpu, gate):
    """A CPU stream whose ops wait behind the gate until ``gate.open()``; closed after the test."""
    s = cpu.create_stream("gated")
    gate.close_on(s)
    yield s
    s.close()


def test_cpu_completion_wait_done_and_errors_across_threads(cpu, gate, gated):
    boom = cpu.compile(lambda: 1 / 0, "boom")
    failed = boom(1, 1, (), stream=gated)
    after = gated.record()
    assert not failed.done and not after.done
    woke = []
    waiters = [threading.Thread(target=lambda: (after.completion.wait(), woke.append(1))) for _ in range(3)]
    for t in waiters:
        t.start()
    gate.open()
    for t in waiters:
        t.join(10)
    assert woke == [1, 1, 1]
    with pytest.raises(gw.GpuError, match="ZeroDivisionError"):
        failed.wait()
    after.wait()
    gated.synchronize()  # the failure was reported by failed.wait(): not again


def test_async_copy_keeps_the_host_array_alive_until_done(cpu, gate, gated):
    with cpu.alloc(1024, "float32") as b:
        host = np.arange(1024, dtype=np.float32)
        alive = weakref.ref(host)
        b.copy_from_host_async(host, gated)
        del host
        nop = cpu.compile(lambda: None, "nop")
        for _ in range(200):  # enough ops to prune the stream's list now and then, all still pending
            nop(1, 1, (), stream=gated)
        gc.collect()
        assert alive() is not None  # the stream holds it while the copy waits behind the gate
        gate.open()
        gated.synchronize()
        gc.collect()
        assert alive() is None
        np.testing.assert_array_equal(b.copy_to_host(), np.arange(1024, dtype=np.float32))


def test_stream_prune_keeps_pending_ops_and_their_arrays(cpu, gate, gated):
    with cpu.alloc(16, "float32") as b:
        refs = []
        for i in range(300):  # past several prunes (every 64 ops), none finished
            host = np.full(16, i, np.float32)
            refs.append(weakref.ref(host))
            b.copy_from_host_async(host, gated)
            del host
        gc.collect()
        assert all(r() is not None for r in refs)
        assert gated.pending == 301
        gate.open()
        gated.synchronize()
        assert gated.pending == 0
        np.testing.assert_array_equal(b.copy_to_host(), np.full(16, 299, np.float32))


def test_ops_enqueued_from_threads_are_all_tracked(cpu):
    s = cpu.create_stream("threads")
    k = cpu.compile(lambda y: None, "nop")
    y = cpu.alloc(1, "float32")
    events: list[gw.Event] = []
    lock = threading.Lock()

    def launch() -> None:
        for _ in range(500):
            e = k(1, 1, (y,), stream=s)
            with lock:
                events.append(e)

    try:
        threads = [threading.Thread(target=launch) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s.synchronize()
        assert len(events) == 1500 and all(e.done for e in events)
        assert s.pending == 0
    finally:
        y.free()
        s.close()


# ------------------------------------------------------------------ on-demand markers (StreamMarks)
class _Mark:
    """A marker completion of the fake stream below: done once every op before it is."""

    def __init__(self, stream: _FakeStream) -> None:
        self.stream, self.upto = stream, len(stream.ops)

    def done(self) -> bool:
        return self.stream.finished >= self.upto

    def wait(self) -> None:
        assert self.done(), "a fake marker is waited on only once done"

    def times_ns(self) -> None:
        return None


class _FakeStream:
    def __init__(self) -> None:
        self.ops: list[str] = []
        self.finished = 0
        self.marks = 0

    def record(self) -> _Mark:
        self.marks += 1
        return _Mark(self)


def test_stream_marks_record_only_when_asked_and_never_too_early():
    stream = _FakeStream()
    marks = StreamMarks(stream.record)

    def op(name: str) -> LazyCompletion:
        stream.ops.append(name)
        return marks.enqueued()

    a, b = op("a"), op("b")
    assert stream.marks == 0  # nothing recorded at enqueue
    assert not b.done() and stream.marks == 1
    assert not a.done() and stream.marks == 1  # covered by b's marker: no new one
    c = op("c")
    stream.finished = 2
    assert a.done() and b.done()
    assert not c.done() and stream.marks == 2  # c came after the marker: a new one
    stream.finished = 3
    assert c.done()
    d = op("d")
    marks.freeze()  # a capture begins: one marker for every op so far, none while frozen
    assert stream.marks == 3
    assert not d.done() and stream.marks == 3
    marks.thaw()
    marks.closed = True
    e = op("e")
    assert e.resolve() is DONE  # released stream: its work was synchronized


def test_stream_marks_from_threads_cover_every_op():
    stream = _FakeStream()
    marks = StreamMarks(stream.record)
    lock = threading.Lock()
    made: list[tuple[int, LazyCompletion]] = []

    def enqueue() -> None:
        for _ in range(2000):
            with lock:  # the fake stream's list stands for the device queue: appends are its enqueue order
                stream.ops.append("op")
                position = len(stream.ops)
            completion = marks.enqueued()
            made.append((position, completion))
            if position % 7 == 0:
                completion.done()

    threads = [threading.Thread(target=enqueue) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for position, completion in made:
        mark = completion.resolve()
        assert mark.upto >= position  # every marker was recorded after the op it stands for


# ------------------------------------------------------------------ the CUDA backend's on-demand events, fake CuPy
class _FakeEvent:
    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self.stream: _FakeCudaStream | None = None
        self.upto = 0

    def record(self, stream: _FakeCudaStream) -> None:
        self.stream, self.upto = stream, len(stream.ops)
        stream.records += 1

    @property
    def done(self) -> bool:
        return self.stream is not None and self.stream.finished >= self.upto

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.finished = max(self.stream.finished, self.upto)


class _FakeCudaStream:
    count = 0

    def __init__(self, non_blocking: bool = True) -> None:
        _FakeCudaStream.count += 1
        self.ptr = 0x1000 * _FakeCudaStream.count
        self.ops: list[object] = []
        self.finished = 0
        self.records = 0
        self.waits: list[_FakeEvent] = []

    def synchronize(self) -> None:
        self.finished = len(self.ops)

    def wait_event(self, event: _FakeEvent) -> None:
        self.waits.append(event)


class _FakeRuntime:
    is_hip = False
    CUDARuntimeError = RuntimeError

    def __init__(self) -> None:
        self.device = 0
        self.streams: dict[int, _FakeCudaStream] = {}

    def setDevice(self, device: int) -> None:  # noqa: N802 - CuPy's names
        self.device = device

    def getDevice(self) -> int:  # noqa: N802
        return self.device

    def memcpyAsync(self, dst, src, nbytes, kind, stream_ptr) -> None:  # noqa: N802
        self.streams[stream_ptr].ops.append(("copy", nbytes))


class _FakeDriver:
    """cuLaunchKernel as the direct launcher calls it: reads the packed argument slots back from memory."""

    def __init__(self, runtime: _FakeRuntime) -> None:
        self.runtime = runtime
        self.launches: list[tuple[int, tuple[int, ...], int]] = []  # (function, grid + block, kernelParams)

    def launchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream_ptr, params, extra) -> None:  # noqa: N802
        assert shared == 0 and extra == 0
        self.runtime.streams[stream_ptr].ops.append("kernel")
        self.launches.append((f, (gx, gy, gz, bx, by, bz), params))

    @staticmethod
    def slot(params: int, i: int, ctype: type) -> object:
        """Argument ``i`` of a launch, read as ``ctype`` from where its kernelParams entry points."""
        return ctype.from_address(ctypes.c_uint64.from_address(params + 8 * i).value).value


class _FakeFunction:
    """A compiled kernel: its pointer for the driver, and CuPy's call for what the driver path does not take."""

    ptr = 0xF00

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, grid, block, args, stream) -> None:
        self.calls.append(args)
        stream.ops.append("kernel")


@pytest.fixture
def fake_cuda(monkeypatch):
    runtime = _FakeRuntime()

    def make_stream(non_blocking: bool = True) -> _FakeCudaStream:
        s = _FakeCudaStream(non_blocking)
        runtime.streams[s.ptr] = s
        return s

    cuda = types.SimpleNamespace(runtime=runtime, Stream=make_stream, Event=_FakeEvent, driver=_FakeDriver(runtime))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    from gpuworkbench.backends.cuda import device as backend

    info = DeviceInfo("cuda", 0, "fake", True, 1 << 30)
    return backend, backend.CudaDevice(info, backend.CAPS)


def test_cuda_untimed_launch_records_no_event_until_asked(fake_cuda):
    backend, dev = fake_cuda
    s = dev.create_stream()
    kernel = _FakeFunction()
    ptr = dev.kernel_arg(BufferArg(0xABC, np.dtype("float32"), 1))
    assert type(ptr) is np.uint64 and ptr == 0xABC
    first = [dev.launch(kernel, (1,), (32,), [ptr, np.float32(2)], s, False) for _ in range(100)]
    driver = sys.modules["cupy"].cuda.driver
    assert s.records == 0 and not kernel.calls and len(driver.launches) == 100  # packed, not through CuPy's call
    assert driver.slot(driver.launches[-1][2], 1, ctypes.c_float) == 2.0
    assert not first[0].done() and s.records == 1  # one event, after the 100th launch, covers all of them
    assert all(not c.done() for c in first) and s.records == 1
    s.finished = 100
    assert all(c.done() for c in first)
    copy = dev.copy_h2d(0x10, 0, np.zeros(4, np.float32), s, False)
    other = dev.create_stream()
    dev.wait_event(other, copy)  # another stream's wait resolves it: an event after the copy
    assert s.records == 2 and other.waits[-1].upto == 101
    timed = dev.launch(kernel, (1,), (32,), [], s, True)
    assert type(timed) is backend.CudaCompletion and s.records == 4  # timed ops keep their two events
    marker = dev.record(s)
    assert type(marker) is backend.CudaCompletion and s.records == 5  # an explicit marker is recorded at once
    unasked = dev.copy_d2h(np.zeros(4, np.float32), 0x10, 0, s, False)
    dev.destroy_stream(s)  # synchronizes the stream: what was never asked about needs no event now
    assert unasked.resolve() is DONE and s.records == 5


def test_a_launch_with_a_new_scalar_each_time_packs_it_into_the_slots_per_call(fake_cuda):
    """Not a repeat (the scalar changes): the backend still skips CuPy's call, packing each call's arguments into
    slots kept per kernel, dims and argument types."""
    backend, dev = fake_cuda
    s = dev.create_stream()
    kernel, driver = _FakeFunction(), sys.modules["cupy"].cuda.driver
    ptr = np.uint64(0xABC)
    for i in range(5):
        dev.launch(kernel, (4,), (32,), [ptr, np.int32(i - 2)], s, False)
        f, dims, params = driver.launches[-1]
        assert driver.slot(params, 0, ctypes.c_uint64) == 0xABC and driver.slot(params, 1, ctypes.c_int32) == i - 2
    assert f == 0xF00 and dims == (4, 1, 1, 32, 1, 1) and not kernel.calls and s.ops == ["kernel"] * 5
    dev.launch(kernel, (4,), (32,), [ptr, np.float64(0.5)], s, False)  # other types: slots of their own
    assert driver.slot(driver.launches[-1][2], 1, ctypes.c_double) == 0.5 and len(dev._packed) == 2
    odd = np.zeros(1, dtype=[("a", "i4"), ("b", "f4")])[0]  # a structured scalar fits no slot: CuPy's call
    dev.launch(kernel, (4,), (32,), [ptr, odd], s, False)
    assert len(kernel.calls) == 1 and len(driver.launches) == 6
    shared = dev.prepare_varying(kernel, (4,), (32,), (np.uint64, np.int32))  # the front end's shapes: the same slots
    assert shared is dev._packed[(kernel, (4,), (32,), np.uint64, np.int32)] and len(dev._packed) == 3


def test_a_prepared_launch_packs_each_scalar_type_into_its_slot(fake_cuda):
    backend, dev = fake_cuda
    s = dev.create_stream()
    kernel, driver = _FakeFunction(), sys.modules["cupy"].cuda.driver
    values = [np.int8(-3), np.bool_(True), np.float16(1.5), np.int32(-7), np.uint32(7), np.float64(0.25)]
    values += [np.int64(-(1 << 40)), np.uint64(1 << 63)]
    prepared = dev.prepare_launch(kernel, (2, 3), (4, 5, 6), values)
    values[0] = np.int8(100)  # packed when prepared: later changes to the list do not reach it
    first = [dev.launch_prepared(prepared, s) for _ in range(10)]
    assert len(driver.launches) == 10 and not kernel.calls and s.ops == ["kernel"] * 10
    assert s.records == 0 and not first[-1].done() and s.records == 1  # lazy completions, as launch's
    f, dims, params = driver.launches[-1]
    assert f == 0xF00 and dims == (2, 3, 1, 4, 5, 6)
    ctypes_of = [ctypes.c_int8, ctypes.c_bool, ctypes.c_uint16, ctypes.c_int32, ctypes.c_uint32, ctypes.c_double]
    ctypes_of += [ctypes.c_int64, ctypes.c_uint64]
    got = [driver.slot(params, i, c) for i, c in enumerate(ctypes_of)]
    assert got[:2] + got[3:] == [-3, True, -7, 7, 0.25, -(1 << 40), 1 << 63]
    assert got[2] == int(np.float16(1.5).view(np.uint16))  # half-precision bits
    # wider than a slot, or not a NumPy scalar: prepared as launch's own arguments, CuPy launches them
    for odd in ([np.complex128(1 + 2j)], [np.uint64(1), 3]):
        dev.launch_prepared(dev.prepare_launch(kernel, (1,), (1,), odd), s)
        assert kernel.calls[-1] == tuple(odd)
    assert len(driver.launches) == 10


def test_cuda_capture_freezes_markers(fake_cuda):
    backend, dev = fake_cuda
    s = dev.create_stream()
    s.begin_capture = lambda mode: None
    s.end_capture = lambda: "graph"
    dev._rt.streamCaptureModeRelaxed = 0
    before = dev.copy_d2d(0x20, 0, 0x10, 0, 8, s, False)
    dev.begin_capture(s)
    assert s.records == 1  # one marker before the capture begins
    inside = dev.copy_d2d(0x20, 0, 0x10, 0, 8, s, False)
    assert inside is backend.IN_GRAPH
    assert not before.done() and s.records == 1  # asked during the capture: the marker made before it
    assert dev.end_capture(s) == "graph"
    after = dev.copy_d2d(0x20, 0, 0x10, 0, 8, s, False)
    assert not after.done() and s.records == 2
