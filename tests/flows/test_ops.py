"""Lazy ops (``gpuworkbench/ops/``) on every backend: results equal NumPy's, ``then`` keeps order on one stream,
``zip`` runs on several streams (and overlaps on the CPU backend), ``shared`` runs once, policies pick as documented,
names reach the trace, and an op frees what it allocated for itself."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time

import numpy as np
import pytest
from support import WITH_WEBGPU, Gate, sample

import gpuworkbench as gw
from gpuworkbench import ops

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # Mesa's loader wants one
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)
cpu_only = pytest.mark.parametrize("device", ["cpu"], indirect=True)  # Python kernels of the CPU backend

TWICE_PLUS_ONE = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="twice_plus_one")
MINUS_THREE = gw.elementwise("float32 x, float32 y", "y = x - 3", name="minus_three")
SCALE = gw.elementwise("float32 x, float32 a, float32 y", "y = a*x", name="scale")
INCREMENT = gw.elementwise("float32 y", "y = y + 1", name="increment")
ADD = gw.elementwise("float32 a, float32 b, float32 y", "y = a + b", name="add")


def spans_named(t: gw.Trace, *names: str) -> list:
    return [s for s in t.spans if s.name in names]


@every_backend
def test_chain_equals_numpy_and_frees_what_it_allocated(device):
    host = sample(10_000, "float32")
    held = device.held_bytes
    op = ops.upload(host, device=device).then(TWICE_PLUS_ONE).then(MINUS_THREE).then(ops.download())
    assert device.held_bytes == held  # building runs nothing
    result = op.sync()
    assert np.array_equal(result, (2 * host + 1) - 3)
    assert device.held_bytes == held
    assert np.array_equal(op.sync(), result)  # an op can run again


@every_backend
def test_then_runs_on_one_stream_in_order_with_names(device):
    host = sample(1 << 16, "float32")
    op = (
        ops.upload(host, device=device, name="load")
        .then(TWICE_PLUS_ONE, name="first")
        .then(MINUS_THREE, name="second")
        .then(ops.download(name="fetch"))
    )
    with gw.trace() as t:
        result = op.sync()
    assert np.array_equal(result, 2 * host - 2)
    spans = spans_named(t, "load", "first", "second", "fetch")
    assert [s.name for s in sorted(spans, key=lambda s: s.start_ns)] == ["load", "first", "second", "fetch"]
    assert len({s.stream for s in spans}) == 1
    ordered = sorted(spans, key=lambda s: s.start_ns)
    for before, after in zip(ordered, ordered[1:]):
        assert after.start_ns >= before.end_ns - 1_000  # 1 µs of clock-alignment slack


@every_backend
def test_then_callable_gets_value_and_stream(device):
    seen = []

    def double_on_device(buf, stream):
        seen.append((len(buf), stream))
        out = device.alloc(len(buf), "float32")
        TWICE_PLUS_ONE(buf, out, stream=stream)
        return out

    host = sample(100, "float32")
    result = ops.upload(host, device=device).then(double_on_device).then(ops.download()).sync()
    assert np.array_equal(result, 2 * host + 1)
    assert seen[0][0] == 100 and isinstance(seen[0][1], gw.Stream)


@every_backend
def test_elementwise_step_extra_args_and_in_place(device):
    host = sample(500, "float32")
    other = sample(500, "float32", seed=1)
    with device.alloc(500, "float32") as b:
        b.copy_from_host(other)
        scaled = ops.upload(host, device=device).then(SCALE, 2.5).then(ops.download()).sync()
        added = ops.upload(host, device=device).then(ADD, b).then(ops.download()).sync()
    assert np.array_equal(scaled, np.float32(2.5) * host)
    assert np.array_equal(added, host + other)
    bumped = ops.upload(host, device=device).then(INCREMENT).then(INCREMENT).then(ops.download()).sync()
    assert np.array_equal(bumped, host + 2)


@every_backend
def test_fill_copy_and_elementwise_ops(device):
    with device.alloc(256, "float32") as a, device.alloc(256, "float32") as b:
        assert np.array_equal(ops.fill(a, 0.0).then(ops.download()).sync(), np.zeros(256, np.float32))
        assert np.array_equal(ops.fill(a, 3.5).then(ops.download()).sync(), np.full(256, 3.5, np.float32))
        copied = ops.copy(b, a).then(ops.download()).sync()
        assert np.array_equal(copied, np.full(256, 3.5, np.float32))
        ran = ops.elementwise(TWICE_PLUS_ONE, a, b).then(ops.download()).sync()
        assert np.array_equal(ran, np.full(256, 8.0, np.float32))
        step = ops.fill(a, 1.0).then(ops.elementwise(TWICE_PLUS_ONE, ops.PREV, b)).then(ops.download()).sync()
        assert np.array_equal(step, np.full(256, 3.0, np.float32))
        assert ops.fill(a, 2.0).sync() is a  # a caller's buffer comes back as it is, not freed


@every_backend
def test_zip_gives_a_tuple_from_different_streams(device):
    x, y = sample(4096, "float32"), sample(4096, "float32", seed=2)
    left = ops.upload(x, device=device, name="left").then(TWICE_PLUS_ONE).then(ops.download())
    right = ops.upload(y, device=device, name="right").then(MINUS_THREE).then(ops.download())
    held = device.held_bytes
    with gw.trace() as t:
        a, b = ops.zip(left, right).sync()
    assert np.array_equal(a, 2 * x + 1) and np.array_equal(b, y - 3)
    assert device.held_bytes == held
    streams = {s.name: s.stream for s in spans_named(t, "left", "right")}
    assert streams["left"] != streams["right"]


@every_backend
def test_zip_then_continues_after_both(device):
    x, y = sample(1000, "float32"), sample(1000, "float32", seed=3)
    op = (
        ops.zip(ops.upload(x, device=device), ops.upload(y, device=device))
        .then(lambda ab, s: ab[0])
        .then(ops.download())
    )
    assert np.array_equal(op.sync(), x)
    with gw.trace() as t:
        fan_out = ops.upload(x, device=device).then(ops.zip(ops.download(name="fan-0"), ops.download(name="fan-1")))
        first, second = fan_out.sync()
    assert np.array_equal(first, x) and np.array_equal(second, x)
    assert len({s.stream for s in spans_named(t, "fan-0", "fan-1")}) == 2


@every_backend
def test_map_and_await(device):
    host = sample(2048, "float32")
    op = ops.upload(host, device=device).then(TWICE_PLUS_ONE).then(ops.download()).map(np.sum)
    assert op.sync() == np.sum(2 * host + 1)

    async def main():
        return await asyncio.gather(op, ops.upload(host, device=device).then(ops.download()))

    total, back = asyncio.run(main())
    assert total == np.sum(2 * host + 1) and np.array_equal(back, host)


@every_backend
def test_shared_runs_once_for_every_consumer(device):
    calls = []

    def counted(buf, stream):
        calls.append(1)
        return buf

    host = sample(1000, "float32")
    base = ops.upload(host, device=device).then(counted).shared()
    held = device.held_bytes
    a, b = ops.zip(base.then(TWICE_PLUS_ONE).then(ops.download()), base.then(MINUS_THREE).then(ops.download())).sync()
    assert np.array_equal(a, 2 * host + 1) and np.array_equal(b, host - 3)
    assert np.array_equal(base.then(ops.download()).sync(), host)

    async def both():
        return await asyncio.gather(base.then(ops.download()), base.then(ops.download()))

    c, d = asyncio.run(both())
    assert np.array_equal(c, host) and np.array_equal(d, host)
    assert len(calls) == 1 and base.runs == 1
    assert device.held_bytes == held + host.nbytes  # the shared result lives until release()
    base.release()
    assert device.held_bytes == held


@every_backend
def test_shared_awaited_concurrently_runs_once(device):
    host = sample(64, "float32")
    base = ops.upload(host, device=device).then(ops.download()).shared()

    async def many():
        return await asyncio.gather(*[base for _ in range(5)])

    results = asyncio.run(many())
    assert base.runs == 1 and all(r is results[0] for r in results)
    base.release()


@every_backend
def test_on_stream_and_sync_on(device):
    s = device.create_stream("mine")
    host = sample(128, "float32")
    with gw.trace() as t:
        ops.upload(host, device=device, name="on-a").then(ops.download()).sync_on(s)
        ops.upload(host, device=device, name="on-b").on(s).sync()
        ops.upload(host, device=device, name="on-c").sync(gw.OnStream(s))
    assert {sp.stream for sp in spans_named(t, "on-a", "on-b", "on-c")} == {s.id}
    other = gw.Device("cpu") if device.backend_kind is not gw.BackendKind.CPU else None
    if other is not None:
        with pytest.raises(gw.InvalidArgument, match="is on"):
            ops.upload(host, device=other).sync(gw.OnStream(s))


def test_the_op_policies_pick_as_a_stream_pool_does(cpu):
    """RoundRobin and LeastPending are the op streams picked by a StreamAssignment, the rule a StreamPool takes."""
    assert gw.RoundRobin(2).assignment is gw.StreamAssignment.ROUND_ROBIN
    assert gw.LeastPending(2).assignment is gw.StreamAssignment.LEAST_PENDING
    rule, round_robin = ops.Assigned(3, gw.StreamAssignment.ROUND_ROBIN), gw.RoundRobin(3)
    assert [rule.pick(cpu) for _ in range(4)] == [round_robin.pick(cpu) for _ in range(4)]
    with pytest.raises(gw.InvalidArgument, match="StreamAssignment"):
        ops.Assigned(2, "round_robin")


@every_backend
def test_round_robin_cycles_and_policies_share_streams(device):
    policy = gw.RoundRobin(3)
    picks = [policy.pick(device) for _ in range(7)]
    assert picks[:3] == picks[3:6] and picks[6] is picks[0]
    assert len({id(s) for s in picks[:3]}) == 3
    assert [s.label for s in picks[:3]] == ["ops-0", "ops-1", "ops-2"]
    assert gw.RoundRobin(3).pick(device) is picks[0]  # a new policy, the same streams
    with gw.trace() as t:
        ops.zip(*[ops.upload(sample(64, "float32"), device=device, name=f"rr-{i}") for i in range(3)]).sync(policy)
    assert len({s.stream for s in spans_named(t, "rr-0", "rr-1", "rr-2")}) == 3


@every_backend
def test_custom_policy(device):
    class Last(gw.Policy):
        def __init__(self):
            self.stream = device.create_stream("custom")
            self.calls = 0

        def pick(self, dev):
            self.calls += 1
            return self.stream

    policy = Last()
    with gw.trace() as t:
        ops.upload(sample(64, "float32"), device=device, name="custom-op").then(ops.download()).sync(policy)
    assert policy.calls == 1  # then stays on the picked stream
    assert {s.stream for s in spans_named(t, "custom-op")} == {policy.stream.id}
    with pytest.raises(gw.InvalidArgument, match="pick"):
        ops.upload(sample(4, "float32"), device=device).sync(object())


@every_backend
def test_errors_say_what_to_do(device):
    with pytest.raises(gw.InvalidArgument, match=r"\.then"):
        ops.download().sync()
    k = TWICE_PLUS_ONE._kernel_for(device, (True, True))
    with pytest.raises(gw.InvalidArgument, match="grid and block"):
        ops.upload(sample(4, "float32"), device=device).then(k)
    with pytest.raises(gw.InvalidArgument, match="upload host data first"):
        ops.upload(sample(4, "float32"), device=device).then(ops.download()).then(TWICE_PLUS_ONE).sync()
    with pytest.raises(gw.InvalidArgument, match="takes 1 more"):
        ops.upload(sample(4, "float32"), device=device).then(SCALE)
    if device.backend_kind is not gw.BackendKind.CPU:
        with gw.Device("cpu").alloc(4, "float32") as elsewhere:
            with pytest.raises(gw.InvalidArgument, match="mixes devices"):
                ops.zip(ops.upload(sample(4, "float32"), device=device), ops.fill(elsewhere, 1.0)).sync()


@every_backend
def test_a_failing_step_frees_what_the_op_allocated(device):
    def boom(buf, stream):
        raise RuntimeError("boom")

    held = device.held_bytes
    with pytest.raises(RuntimeError, match="boom"):
        ops.upload(sample(1000, "float32"), device=device).then(TWICE_PLUS_ONE).then(boom).sync()
    assert device.held_bytes == held


# ---------------------------------------------------------------------------------------------------------- CPU only
@cpu_only
def test_zip_of_two_big_ops_overlaps_in_time(device):
    nap = device.compile(lambda: time.sleep(0.2), "nap")  # stands for a long kernel; the worker releases the GIL
    with gw.trace() as t:
        start = time.perf_counter()
        ops.zip(ops.kernel(nap, 1, 1, name="big-a"), ops.kernel(nap, 1, 1, name="big-b")).sync()
        wall = time.perf_counter() - start
    a, b = sorted(spans_named(t, "big-a", "big-b"), key=lambda s: s.start_ns)
    assert a.stream != b.stream
    overlap = min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns)
    assert overlap > 0.15e9, f"spans overlap by {overlap / 1e6:.1f} ms only"
    assert wall < 0.35


@cpu_only
def test_then_orders_host_visible_effects(device):
    order: list[str] = []
    slow = device.compile(lambda: (time.sleep(0.05), order.append("slow")), "slow")
    fast = device.compile(lambda: order.append("fast"), "fast")
    ops.kernel(slow, 1, 1).then(ops.kernel(fast, 1, 1)).sync()
    assert order == ["slow", "fast"]


@cpu_only
def test_least_pending_picks_the_idle_stream(device):
    policy = gw.LeastPending(2)
    busy, idle = gw.ops.op_streams(device, 2)
    assert policy.pick(device) is busy  # all idle: the lowest index
    with Gate(device) as gate:
        gate.close_on(busy)
        assert policy.pick(device) is idle
        with gw.trace() as t:
            start = time.perf_counter()
            ops.upload(sample(64, "float32"), device=device, name="lp").then(ops.download()).sync(policy)
            assert time.perf_counter() - start < 5  # it did not queue behind the gate
        gate.open()
    assert {s.stream for s in spans_named(t, "lp")} == {idle.id}


@cpu_only
def test_shared_waits_for_a_consumer_in_another_thread(device):
    release = threading.Event()
    slow = device.compile(lambda: release.wait(5), "hold")
    base = ops.kernel(slow, 1, 1).map(lambda _: "value").shared()  # map waits on the host: the op is "running"
    results = []
    first = threading.Thread(target=lambda: results.append(base.sync()))
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=lambda: results.append(base.sync()))
    second.start()
    time.sleep(0.05)
    release.set()
    first.join(5)
    second.join(5)
    assert results == ["value", "value"] and base.runs == 1
