"""How a CUPTI trace tags records with its ops without pushing ids: each API call CUPTI records (thread, start) is
placed in the window of host time in which that thread enqueued one of our ops. Hand-made columns and buffers: runs
without a GPU (no libcupti is loaded). On a GPU, tests/backends/test_cuda.py checks the same end to end."""

from __future__ import annotations

import struct
import time

import numpy as np
from cupti_fakes import fake_cupti_module

from gpuworkbench.trace import cupti
from gpuworkbench.trace.cupti.join import ExternalIdJoin
from gpuworkbench.trace.cupti.ops import CuptiOps
from gpuworkbench.trace.cupti.walk import RecordWalker
from gpuworkbench.trace.spans import KIND_CODE

MAIN, OTHER = 0x7F92_2C5C_2140, 0x7F8F_B4CE_F6C0  # pthread_self() values; CUPTI reports their low 32 bits
LOW = 0xFFFF_FFFF


class Done:
    def done(self):
        return True


def launch(ops: CuptiOps, op_id: int, t0: int, t1: int, thread: int = MAIN, kind: str = "kernel") -> None:
    ops.add(op_id, 0, 7, KIND_CODE[kind], 64, f"op{op_id}", -1, t0, Done(), False, t1, thread)


def test_a_call_is_placed_in_the_window_of_its_threads_op():
    ops = CuptiOps()
    launch(ops, 1, 100, 200)
    launch(ops, 2, 300, 400)
    launch(ops, 3, 150, 250, thread=OTHER)  # overlaps op 1 in time, on another thread
    ops.take_rows(1)
    thread = np.array([MAIN & LOW, MAIN & LOW, OTHER & LOW, MAIN & LOW, MAIN & LOW, 12345])
    start = np.array([120, 399, 160, 250, 50, 160])  # 250: between op 1 and 2 (another library's launch); 50: before
    assert ops.resolve(thread, start).tolist() == [1, 2, 3, -1, -1, -1]


def test_a_thread_id_matches_on_its_low_32_bits_only():
    ops = CuptiOps()
    launch(ops, 1, 100, 200, thread=(5 << 32) | 77)
    ops.take_rows(1)
    assert ops.resolve(np.array([77, 5]), np.array([150, 150])).tolist() == [1, -1]


def test_a_call_delivered_before_its_op_is_handed_over_waits_then_others_are_dropped():
    ops, join = CuptiOps(), ExternalIdJoin(hold_flushes=2)
    calls = {"thread": np.array([MAIN & LOW] * 2), "start": np.array([150, 900]), "correlation_id": np.array([41, 42])}
    kernels = {
        "start": np.array([1000, 2000]),
        "end": np.array([1010, 2010]),
        "correlation_id": np.array([41, 42]),
        "runtime_correlation_id": np.zeros(2, np.int64),
    }
    # Flush 1: CUPTI delivered both calls and their kernels; the op's row was not cut yet.
    assert join.join(kernels, calls=calls, resolve=ops.resolve) is None
    launch(ops, 1, 100, 200)
    ops.take_rows(2)
    out = join.join(None, resolve=ops.resolve)  # flush 2: call 41 is placed, its kernel released with op 1's id
    assert out["correlation_id"].tolist() == [41] and out["external_id"].tolist() == [1]
    out = join.join(None, resolve=ops.resolve)  # flush 3: call 42 was in no window: dropped, its kernel released
    assert out["correlation_id"].tolist() == [42] and out["external_id"].tolist() == [-1]
    assert join.unplaced_calls == 1 and join.join(None, resolve=ops.resolve) is None


def test_a_flush_with_no_call_beside_held_calls_keeps_them():
    """A flush whose API calls were all dropped (cut off, or the primer's) gives empty columns: the calls held from
    before stay held and are placed later (this raised KeyError('born') in the harvester)."""
    ops, join = CuptiOps(), ExternalIdJoin(hold_flushes=3)
    calls = {"thread": np.array([MAIN & LOW]), "start": np.array([150]), "correlation_id": np.array([41])}
    empty = {k: v[:0] for k, v in calls.items()}
    kernel = {
        "start": np.array([1000]),
        "end": np.array([1010]),
        "correlation_id": np.array([41]),
        "runtime_correlation_id": np.zeros(1, np.int64),
    }
    assert join.join(kernel, calls=calls, resolve=ops.resolve) is None  # the op is not handed over yet: held
    assert join.join(None, calls=empty, resolve=ops.resolve) is None
    launch(ops, 1, 100, 200)
    ops.take_rows(2)
    out = join.join(None, calls=empty, resolve=ops.resolve)
    assert out["correlation_id"].tolist() == [41] and out["external_id"].tolist() == [1]


def test_enqueue_time_is_the_window_start_on_the_trace_clock():
    ops = CuptiOps()
    launch(ops, 1, 5_000, 6_000)
    ops.take_rows(1)
    ops.add_records({"external_id": np.array([1]), "start": np.array([7_000]), "end": np.array([8_000])}, 1)
    rows = ops.harvest(1, np.array([100]), window_offsets=np.array([40]))
    assert (rows["start_ns"].tolist(), rows["enqueue_ns"].tolist()) == ([6_900], [4_960])


# -- from raw activity bytes, through CuptiSource's decode and join --------------------------------------------------

API, KERNEL = 5, 10  # CUPTI_ACTIVITY_KIND_RUNTIME, CONCURRENT_KERNEL
SIZES = {API: 40, KERNEL: 200, 39: 24}


def api_record(start: int, thread: int, corr: int) -> bytes:
    return struct.pack("<IIQQIIII", API, 211, start, start + 500, 4242, thread, corr, 0)


def kernel_record(start: int, end: int, corr: int) -> bytes:
    rec = bytearray(SIZES[KERNEL])
    struct.pack_into("<I", rec, 0, KERNEL)
    struct.pack_into("<QQ", rec, 16, start, end)
    struct.pack_into("<I", rec, 92, corr)
    return bytes(rec)


def offline_source() -> cupti.CuptiSource:
    """A CuptiSource that decodes hand-made buffers by cupti.h's layouts (no libcupti, never flushes CUPTI), on a
    lifecycle of its own: its timestamps are nanoseconds whatever an earlier torch.profiler left the process's."""
    src = cupti.Lifecycle().new_source()
    walker = RecordWalker()  # no libcupti: only the size table the walk reads
    for kind, size in SIZES.items():
        walker.size_words[kind] = size // 4
    src._raw = walker
    src._setup_tables(fake_cupti_module())  # CUPTI's kind codes; no dtypes: cupti.h's layouts
    return src


def test_raw_buffers_join_kernels_to_the_ops_whose_windows_hold_their_calls():
    src, ops = offline_source(), CuptiOps()
    launch(ops, 1, 1_000, 2_000)
    launch(ops, 2, 3_000, 4_000)
    ops.take_rows(1)
    data = b"".join(
        [
            api_record(1_500, MAIN & LOW, 7),
            api_record(2_500, MAIN & LOW, 8),  # a launch made between our ops: not ours
            api_record(3_100, MAIN & LOW, 9),
            kernel_record(10_000, 10_100, 7),
            kernel_record(10_200, 10_300, 8),
            kernel_record(10_400, 10_900, 9),
        ]
    )
    src.ingest(data)
    out = src.flush_columns(eager=True, full=False, resolve=ops.resolve)
    assert out["start"].tolist() == [10_000, 10_200, 10_400]
    assert out["external_id"].tolist() == [1, -1, 2]
    ops.add_records(out, 1)
    rows = ops.harvest(1, np.array([0]))
    assert rows["name"].tolist() == ["op1", "op2"] and rows["end_ns"].tolist() == [10_100, 10_900]
    assert src.unplaced_calls == 1


def test_a_source_taking_over_parked_kinds_drops_records_of_work_that_ended_before():
    """A source that takes over kinds left on (``cupti.LINGER_S``) may receive records from before its start, still in
    CUPTI's buffers: API calls that started and work that ended before its cutoff are dropped."""
    src, ops = offline_source(), CuptiOps()
    src.decoder.cutoff = 3_000
    launch(ops, 1, 3_050, 3_200)
    ops.take_rows(1)
    data = b"".join(
        [
            api_record(1_500, MAIN & LOW, 7),  # parked time: dropped with its kernel
            api_record(3_100, MAIN & LOW, 9),
            kernel_record(2_000, 2_900, 7),
            kernel_record(2_950, 3_400, 8),  # ran across the take-over: kept
            kernel_record(10_400, 10_900, 9),
        ]
    )
    src.ingest(data)
    out = src.flush_columns(eager=True, full=False, resolve=ops.resolve)
    assert out["start"].tolist() == [2_950, 10_400] and out["external_id"].tolist() == [-1, 1]
    assert src.incomplete_records == 0  # dropped for the cutoff, not counted as incomplete


def test_a_record_whose_call_came_after_the_cutoff_is_kept_though_its_device_time_reads_before_it():
    """CUPTI maps the GPU's timestamps onto its host clock: a kernel launched after a take-over can read as ending
    before the cutoff where that mapping is behind. Correlation ids grow with each call, so a record whose call came
    after the first call past the cutoff is kept; one of a call before the cutoff is still dropped and counted."""
    src, ops = offline_source(), CuptiOps()
    src.decoder.cutoff = 3_000
    launch(ops, 1, 3_050, 3_200)
    ops.take_rows(1)
    data = b"".join(
        [
            api_record(1_500, MAIN & LOW, 7),  # parked time
            api_record(3_100, MAIN & LOW, 9),  # the trace's first call
            kernel_record(2_000, 2_900, 7),  # parked work: dropped
            kernel_record(2_700, 2_950, 9),  # the trace's kernel, its device time mapped 150 µs early: kept
        ]
    )
    src.ingest(data)
    out = src.flush_columns(eager=True, full=False, resolve=ops.resolve)
    assert out["correlation_id"].tolist() == [9] and out["external_id"].tolist() == [1]
    assert (src.cut_off_records, src.cut_off_calls) == (1, 1)


def test_records_of_the_primers_streams_are_never_a_traces(monkeypatch):
    """The copy and memset the primer (``cupti/prime.py``) enqueues as a source parks can end after the next source's
    cutoff: their records are dropped by (device, CUPTI stream id), the rest of that device's work kept."""
    from gpuworkbench.trace.cupti.prime import PRIMER

    monkeypatch.setattr(PRIMER, "streams", frozenset({(1, 99)}))
    src = offline_source()
    src.decoder.cutoff = 3_000
    records = []
    for device, stream, corr in ((1, 99, 7), (1, 7, 8), (0, 99, 9)):
        rec = bytearray(kernel_record(3_100, 3_200, corr))
        struct.pack_into("<I", rec, 40, device)
        struct.pack_into("<I", rec, 48, stream)
        records.append(bytes(rec))
    src.ingest(b"".join(records))
    out = src.flush_columns(eager=True, full=True)
    assert sorted(zip(out["device_id"].tolist(), out["stream_id"].tolist())) == [(0, 99), (1, 7)]


class FakeClock:
    """A CUPTI source whose raw clock reads ``rate`` ticks per ns of the window clock (``time.time_ns``), from ``base``
    ticks at window time ``t0``; ``line`` maps ticks to ns as ``cupti.to_ns`` does (identity until set)."""

    def __init__(self, base: int, rate: float = 1.0, t0: int | None = None) -> None:
        self.base, self.rate = base, rate
        self.t0 = time.time_ns() if t0 is None else t0
        self.line = None  # (reference ticks, ticks per ns)
        self.now = None  # the window time the next sample reads (None: the real one)

    def clock_sample(self, host, raw=False):
        now = host() if self.now is None else self.now
        ticks = self.base + round((now - self.t0) * self.rate)
        return (ticks if raw else int(self.to_ns(ticks))), now, 150

    def to_ns(self, ticks):
        if self.line is None:
            return ticks
        ref, rate = self.line
        return ref + np.round((np.asarray(ticks) - ref) / rate).astype(np.int64)


def test_windows_use_cuptis_clock_as_is_when_it_is_the_window_clock_else_a_sampled_offset():
    from gpuworkbench.trace.recorder import Trace

    now = time.time_ns()
    t = Trace()
    t._cupti = FakeClock(now + 40, t0=now)  # CUPTI reads CLOCK_REALTIME: the same clock, within the sample's error
    t._cupti.now = now
    t._window.sample(t._cupti)
    assert not t._window.drifts and t._window.offsets(t._cupti) == 0
    t = Trace()
    t._cupti = FakeClock(now + 5_000_000, t0=now)  # another clock: mapped by offsets sampled at each harvest
    t._cupti.now = now
    t._window.sample(t._cupti)
    assert t._window.drifts and t._window.offsets(t._cupti) == 5_000_000
    launch(t._cupti_ops, 1, 1_000, 2_000)
    t._cupti_ops.take_rows(1)
    assert t._resolve(np.array([MAIN & LOW]), np.array([5_001_500])).tolist() == [1]


def test_calls_are_placed_through_the_line_their_records_went_through_not_the_one_the_offset_was_sampled_with():
    """After torch.profiler CUPTI's clock is ticks, mapped to ns by a line learned at the flushes. A sample taken while
    the rate was not known yet (read as ns) put an H100's d2h call in its neighbour's window: the op was lost."""
    from gpuworkbench.trace.recorder import Trace

    t0 = 1_800_000_000_000_000_000
    clock = FakeClock(base=500_000_000_000, rate=2.1, t0=t0)
    t = Trace()
    t._cupti = clock
    clock.now = t0
    t._window.sample(clock)  # rate unknown: ticks read as ns
    clock.now = t0 + 200_000
    t._window.sample(clock)
    for op, at in enumerate(range(t0 + 20_000, t0 + 180_000, 40_000), 1):  # 4 ops, 10 µs windows, 40 µs apart
        launch(t._cupti_ops, op, at, at + 10_000)
    t._cupti_ops.take_rows(1)
    clock.line = (clock.base, 2.1)  # the flush learned the rate: calls are read through this line
    calls = np.array([clock.base + round((at + 5_000 - t0) * 2.1) for at in range(t0 + 20_000, t0 + 180_000, 40_000)])
    placed = t._resolve(np.full(4, MAIN & LOW), clock.to_ns(calls))
    assert placed.tolist() == [1, 2, 3, 4]
    clock.line = (clock.base, 2.1 * (1 + 1e-3))  # a rate 0.1 % off: offsets interpolated between the samples hold
    assert t._resolve(np.full(4, MAIN & LOW), clock.to_ns(calls)).tolist() == [1, 2, 3, 4]


# -- a recording trace that nobody reads leaves CUPTI's records undecoded ---------------------------------------------


def wait_for(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def offline_trace():
    """A recording Trace whose CUPTI source decodes hand-made buffers, on one device whose spans come from it."""
    from gpuworkbench.trace.recorder import DeviceClock, Trace

    t = Trace(interval_s=0.005)
    t._cupti = offline_source()
    t._clocks_sampled = True  # the hand-made records are on the host's clock: offsets 0
    t._devices[0] = DeviceClock(key="cuda:0", name="offline", source="cupti")
    t._cupti_flags.append(True)
    return t.start()


def feed(t, op_id: int, corr: int) -> None:
    """One of our kernels: its op handed over, then CUPTI's API and kernel records of it delivered."""
    base = op_id * 10_000
    launch(t._cupti_ops, op_id, base, base + 1_000)
    t._cupti.ingest(api_record(base + 500, MAIN & LOW, corr) + kernel_record(base + 5_000, base + 5_100, corr))


def test_an_unread_recording_trace_defers_decoding_until_a_read():
    t = offline_trace()
    try:
        feed(t, 1, 7)
        assert wait_for(lambda: t.stats.deferred_harvests >= 3)
        assert len(t) == 0 and t.stats.harvest_cycles == 0 and t._cupti.backlog_bytes > 0
        table = t.table(wait=False)  # a read decodes what was deferred, at once
        assert table["name"].tolist() == ["op1"] and table["start_ns"].tolist() == [15_000]
        # everything deferred was decoded by the read (the harvester's next wake may mark the trace deferred again,
        # with nothing left to defer: the read does not make the trace watched)
        assert t._cupti.backlog_bytes == 0
    finally:
        t.stop()
    assert t.wait_pending(5) and t.stats.lost == 0


def test_a_watched_trace_decodes_at_every_harvest_and_stopping_decodes_the_rest():
    t = offline_trace()
    try:
        feed(t, 1, 7)
        assert wait_for(lambda: t.stats.deferred_harvests >= 2) and len(t) == 0
        assert t.version == 0  # a live view polls the version: from now on the harvester decodes
        assert wait_for(lambda: len(t) == 1)  # no read of the spans themselves
        assert t.version == 1
        t._read_at = -1e9  # nobody watching any more
        deferred = t.stats.deferred_harvests
        feed(t, 2, 8)
        assert wait_for(lambda: t.stats.deferred_harvests >= deferred + 2) and len(t) == 1
    finally:
        t.stop()
    assert t.wait_pending(5)
    assert [s.name for s in t.spans] == ["op1", "op2"] and t.stats.lost == 0


def test_a_stopped_trace_with_nothing_of_its_own_left_harvests_once_after_cuptis_last_flush():
    t = offline_trace()
    t._cupti_session = t._cupti.session  # its own source: stopping ends with CUPTI's stop and a harvest
    try:
        feed(t, 1, 7)
        assert wait_for(lambda: t.stats.deferred_harvests >= 1)
        assert t.table(wait=False)["name"].tolist() == ["op1"]  # the read decodes it: nothing of its own is left
        t._read_at = -1e9  # unwatched: the harvester's wakes while it records leave CUPTI alone
        deferred = t.stats.deferred_harvests
        assert wait_for(lambda: t.stats.deferred_harvests > deferred)  # a harvest begun while watched is over
        before = t.stats.harvest_cycles
    finally:
        t.stop()
    assert t.wait_pending(5)
    assert t.stats.harvest_cycles == before + 1 and [s.name for s in t.spans] == ["op1"]


def test_a_backlog_past_the_bound_is_decoded_even_unread(monkeypatch):
    from gpuworkbench.trace import recorder_harvest

    monkeypatch.setattr(recorder_harvest, "DEFER_OPS", 2)
    t = offline_trace()
    try:
        feed(t, 1, 7)
        assert wait_for(lambda: t.stats.deferred_harvests >= 2) and len(t) == 0
        feed(t, 2, 8)
        assert wait_for(lambda: len(t) == 2)
    finally:
        t.stop()


def test_a_take_over_cutoff_is_kept_in_cuptis_own_timestamps_so_a_later_rate_cannot_move_records_across_it():
    """After torch.profiler, CUPTI's timestamps are ticks mapped to ns by a rate learned from samples. The cutoff of a
    take-over is compared with the records' raw timestamps: a rate learned after it moves both alike."""
    src = offline_source()
    src.clock_sample = lambda *args: (0, 0, 0)  # no calibration against the real clock at the flush (on a GPU host)
    src.decoder.cutoff = 1_000_000  # raw timestamp at the take-over
    clock = src.clock
    clock.ticks, clock.ref, clock.per_ns = True, (0, 0), 2.0  # learned after the cutoff: ns = ticks / 2
    src.ingest(kernel_record(900_000, 999_000, 1) + kernel_record(990_000, 1_001_000, 2))
    out = src.flush_columns(eager=True, full=True)
    assert out["correlation_id"].tolist() == [2]  # ended before the cutoff: dropped, whatever the rate
    assert out["end"].tolist() == [500_500]  # and the span is in ns


def test_a_cupti_traces_harvester_turns_a_take_overs_watch_off_as_it_begins_and_at_every_wake(monkeypatch):
    """A source taken over on a trace's start has its watch's callbacks turned off as the harvest loop begins; one
    taken over later (the trace's first CUDA op started CUPTI) at the loop's next wake."""
    calls = []
    monkeypatch.setattr(cupti, "quiet_taken_over", lambda: calls.append(time.monotonic()))
    t = offline_trace()  # interval 5 ms
    try:
        assert wait_for(lambda: len(calls) >= 3)
    finally:
        t.stop()
    assert t.wait_pending(5)


def test_a_completed_buffer_goes_to_the_source_that_records_and_back_to_the_pool(monkeypatch):
    """CUPTI's buffer callbacks (``RawCupti``): an empty buffer from the pool, and a completed one's valid bytes
    copied to the lifecycle's recording source (dropped where none records), the buffer pooled again."""
    import ctypes
    import types

    from cupti_fakes import Fn

    from gpuworkbench.trace.cupti import binding

    lib = types.SimpleNamespace(
        cuptiActivityRegisterCallbacks=Fn(lambda request, complete: 0),
        cuptiActivityFlushAll=Fn(lambda forced: 0),
        cuptiActivityGetNextRecord=Fn(lambda *args: 1),
    )
    monkeypatch.setattr(binding.ctypes, "CDLL", lambda path: lib)
    life = cupti.Lifecycle()
    raw = binding.RawCupti("libcupti.so", lambda: life.active)
    src = life.new_source()

    def one_buffer(payload: bytes) -> None:
        buf, size, most = (ctypes.c_void_p * 1)(), (ctypes.c_size_t * 1)(), (ctypes.c_size_t * 1)()
        raw._on_request(buf, size, most)
        assert size[0] == binding.BUFFER_BYTES and buf[0] % 8 == 0
        ctypes.memmove(buf[0], payload, len(payload))
        raw._on_complete(None, 0, buf[0], size[0], len(payload))

    one_buffer(b"x" * 12)  # nobody records: dropped
    assert src.backlog_bytes == 0 and len(raw._pool) == 1
    life.start_recording(src)
    one_buffer(b"y" * 12)
    assert src.backlog_bytes == 16 and len(raw._pool) == 1  # padded to 8; the same buffer, pooled again
