"""Tests of streams.py: Stream, Event (done, wait, await), StreamPool rules, StreamSet indexing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support import sample

import gpuworkbench as gw


def test_stream_pending_record_and_synchronize(cpu, gate):
    s = cpu.create_stream("work")
    assert s.pending == 0
    gate.close_on(s)
    with cpu.alloc(100) as buf:
        buf.fill_bytes(1, stream=s)
        marker = s.record()
        assert s.pending == 3 and not marker.done
        gate.open()
        s.synchronize()
        assert s.pending == 0 and marker.done
    s.close()


def test_record_is_done_after_earlier_work(device):
    s = device.create_stream()
    data = sample(100_000, "float32")
    host = np.empty_like(data)
    with device.alloc(100_000) as buf:
        buf.copy_from_host_async(data, s)
        copy = buf.copy_to_host_async(host, s)
        marker = s.record()
        marker.wait()
        assert copy.done  # in-order stream: the marker completes after the copy
        assert np.array_equal(host, data)
    s.close()


def test_wait_event_orders_across_streams_without_blocking_the_host(cpu, gate):
    first, second = cpu.create_stream("first"), cpu.create_stream("second")
    data = sample(1000, "int32")
    host = np.zeros(1000, np.int32)
    with cpu.alloc(1000, "int32") as buf:
        gate.close_on(first)
        upload = buf.copy_from_host_async(data, first)
        second.wait_event(upload)  # returns at once
        download = buf.copy_to_host_async(host, second)
        assert not upload.done and not download.done and second.pending == 1
        gate.open()
        download.wait()
        assert upload.done and np.array_equal(host, data)
    first.close()
    second.close()


def test_wait_event_on_a_done_event_is_a_no_op(device):
    s1, s2 = device.create_stream(), device.create_stream()
    ev = s1.record()
    ev.wait()
    s2.wait_event(ev)
    s2.record().wait()
    s1.close()
    s2.close()


def test_event_wait_timeout_and_await(cpu, gate):
    s = cpu.create_stream()
    ev = gate.close_on(s)
    assert not ev.done and "pending" in repr(ev)
    with pytest.raises(TimeoutError):
        ev.wait(timeout_s=0.05)
    gate.open()
    ev.wait(timeout_s=10)
    assert ev.done and "done" in repr(ev) and ev.stream is s
    s.close()


def test_events_are_awaitable(device):
    s = device.create_stream()
    data = sample(5000, "float64")
    host = np.empty_like(data)

    async def round_trip(buf: gw.Buffer) -> np.ndarray:
        await buf.copy_from_host_async(data, s)
        await buf.copy_to_host_async(host, s)
        return host

    with device.alloc(5000, "float64") as buf:
        assert np.array_equal(asyncio.run(round_trip(buf)), data)
    s.close()


def test_await_does_not_block_the_event_loop(cpu, gate):
    s = cpu.create_stream()
    ev = gate.close_on(s)
    ticks = []

    async def main() -> None:
        async def ticker() -> None:
            for i in range(3):
                ticks.append(i)
                await asyncio.sleep(0)
            assert not ev.done  # the loop runs this while main() awaits the pending op ...
            gate.open()  # ... and only this lets it finish

        task = asyncio.create_task(ticker())
        await ev
        await task

    asyncio.run(main())
    assert ticks == [0, 1, 2] and ev.done
    s.close()


def test_stream_context_manager_synchronizes(device):
    data = sample(20_000, "int16")
    host = np.empty_like(data)
    with device.alloc(20_000, "int16") as buf:
        with device.create_stream("ctx") as s:
            buf.copy_from_host_async(data, s)
            buf.copy_to_host_async(host, s)
        assert s.pending == 0 and np.array_equal(host, data)
    s.close()
    assert s.closed
    s.close()  # idempotent
    with pytest.raises(gw.InvalidArgument, match="closed"):
        s.record()


def test_failed_op_raises_on_wait_and_the_stream_goes_on(cpu):
    s = cpu.create_stream()
    bad = cpu.compile(lambda: 1 / 0, "divide_by_zero")
    ev = bad(1, 1, (), stream=s)
    with pytest.raises(gw.GpuError, match="ZeroDivisionError"):
        ev.wait()
    with cpu.alloc(10) as buf:  # the stream still works
        data = sample(10, "float32")
        buf.copy_from_host_async(data, s).wait()
        out = np.empty_like(data)
        buf.copy_to_host_async(out, s).wait()
        assert np.array_equal(out, data)
    s.synchronize()  # the failure was reported by wait(): not again
    s.close()


def test_unwaited_failure_is_raised_once_by_synchronize(cpu):
    s = cpu.create_stream()
    cpu.compile(lambda: [][1], "index_error")(1, 1, (), stream=s)
    with pytest.raises(gw.GpuError, match="IndexError"):
        s.synchronize()
    s.synchronize()
    s.record().wait()
    s.close()


# --------------------------------------------------------------------------------------------------------- StreamPool
def test_round_robin_cycles(device):
    pool = device.stream_pool(3, gw.StreamAssignment.ROUND_ROBIN, label="rr")
    assert len(pool) == 3 and [s.label for s in pool.streams] == ["rr-0", "rr-1", "rr-2"]
    picked = [pool.next() for _ in range(7)]
    assert picked == [pool.streams[i % 3] for i in range(7)]
    with pool.acquire() as a:
        with pool.acquire() as b:
            assert (a, b) == (pool.streams[1], pool.streams[2])  # the rule goes on where next() left off
            assert pool.load() == [0, 1, 1]
    assert pool.load() == [0, 0, 0]


def test_least_pending_picks_the_least_loaded_stream(cpu, gate):
    pool = cpu.stream_pool(3, gw.StreamAssignment.LEAST_PENDING)
    gate.close_on(pool.streams[0])  # one op that stays pending until the gate opens
    assert pool.load() == [1, 0, 0]
    with pool.acquire() as a:
        assert a is pool.streams[1]  # ties go to the lowest index among the least loaded
        with pool.acquire() as b:
            assert b is pool.streams[2]
            assert pool.load() == [1, 1, 1]
            with pool.acquire() as c:
                assert c is pool.streams[0]
                assert pool.load() == [2, 1, 1]
            assert pool.next() is pool.streams[0]  # loads [1, 1, 1] again
    assert pool.load() == [1, 0, 0]
    gate.open()
    pool.synchronize_all()
    assert pool.load() == [0, 0, 0]
    assert pool.next() is pool.streams[0]


def test_least_pending_spreads_leases(device):
    pool = device.stream_pool(2, gw.StreamAssignment.LEAST_PENDING)
    with pool.acquire() as first:
        with pool.acquire() as second:
            assert first is not second
    assert pool.load() == [0, 0]


def test_acquire_releases_the_lease_on_exception(device):
    pool = device.stream_pool(2, gw.StreamAssignment.LEAST_PENDING)
    with pytest.raises(RuntimeError, match="inside"):
        with pool.acquire() as s:
            assert pool.load()[pool.streams.index(s)] == 1
            raise RuntimeError("inside the with block")
    assert pool.load() == [0, 0]


def test_pool_synchronize_all(device):
    pool = device.stream_pool(4)
    data = sample(4096, "float32")
    outs = [np.empty_like(data) for _ in range(8)]
    with device.alloc(4096) as buf:
        buf.copy_from_host(data)
        for out in outs:
            with pool.acquire() as s:
                buf.copy_to_host_async(out, s)
        pool.synchronize_all()
        assert all(s.pending == 0 for s in pool.streams)
    assert all(np.array_equal(o, data) for o in outs)


# ---------------------------------------------------------------------------------------------------------- StreamSet
def test_stream_set_get_is_index_modulo_depth(device):
    ss = device.stream_set(3, "compute")
    assert len(ss) == 3 and [s.label for s in ss] == ["compute-0", "compute-1", "compute-2"]
    for i in range(10):
        assert ss.get(i) is ss.streams[i % 3]
    assert len({s.id for s in ss}) == 3


def test_stream_set_synchronize_all(device):
    ss = device.stream_set(2)
    data = [sample(3000, "int64", seed=i) for i in range(5)]
    bufs = [device.alloc(3000, "int64") for _ in data]
    outs = [np.empty(3000, np.int64) for _ in data]
    for i, (b, d, o) in enumerate(zip(bufs, data, outs)):
        b.copy_from_host_async(d, ss.get(i))
        b.copy_to_host_async(o, ss.get(i))
    ss.synchronize_all()
    assert all(np.array_equal(o, d) for o, d in zip(outs, data))
    for b in bufs:
        b.free()


@pytest.mark.parametrize("group", ["pool", "set"])
def test_closing_a_group_finishes_its_work_and_releases_its_streams(device, group):
    make = {"pool": lambda: device.stream_pool(3, label="g"), "set": lambda: device.stream_set(3, label="g")}
    g = make[group]()
    data = sample(5000, "float32")
    out = np.empty_like(data)
    with device.alloc(5000) as buf:
        first = g.streams[0]
        buf.copy_from_host_async(data, first)
        buf.copy_to_host_async(out, first)
        labels_before = set(device.stream_labels().values())
        g.close()
        assert np.array_equal(out, data)  # close waited for the work
    assert g.closed and all(s.closed for s in g.streams)
    assert {"g-0", "g-1", "g-2"} <= labels_before
    assert not {"g-0", "g-1", "g-2"} & set(device.stream_labels().values())
    use = {"pool": lambda: g.next(), "set": lambda: g.get(0)}[group]
    with pytest.raises(gw.InvalidArgument, match="'g' is closed"):
        use()
    g.close()  # idempotent
