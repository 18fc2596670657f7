"""Persistent kernels: the ring protocol on the CPU emulation and on CUDA (marked ``gpu``), and that shutting down
always ends the kernel: after an error, an interrupt, an exception in the ``with`` block, at exit, on Device.close."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from support import open_device, release_leftovers

import gpuworkbench as gw
from gpuworkbench.persistent import kernel as persistent
from gpuworkbench.persistent import ring

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def dev(request: pytest.FixtureRequest) -> Iterator[gw.Device]:
    """A device with nothing allocated on entry; on exit no persistent kernel may run and no buffer may be left."""
    device = open_device(request.param)
    release_leftovers(device)
    yield device
    if device.closed:
        return
    alive = [k for k in persistent._RUNNING if k.device is device]
    for k in alive:
        k.stop()
    assert not alive, "the test left a persistent kernel running"
    assert not release_leftovers(device), "the test left buffers behind"
    assert device.held_bytes == 0


def _upload(dev: gw.Device, values: np.ndarray) -> gw.Buffer:
    buf = dev.alloc(values.size, values.dtype)
    buf.copy_from_host(values)
    return buf


def _slow_cpu_commands(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = ring.cpu_execute

    def slow(*args):
        time.sleep(seconds)
        return real(*args)

    monkeypatch.setattr(ring, "cpu_execute", slow)


# ---------------------------------------------------------------------------------------------------------- results
def test_echo_scale_sum(dev):
    with dev.persistent() as pk:
        assert pk.running and pk.emulated == (dev.backend_kind is gw.BackendKind.CPU)
        assert pk.echo(1.5, 2.25) == 3.75
        assert pk.call("echo", -1, 1) == 0.0
        with _upload(dev, np.arange(1000, dtype=np.float32)) as buf:
            assert pk.sum(buf) == 499500.0
            assert pk.scale(buf, 2.0, n=10) is None
            expected = np.arange(1000, dtype=np.float32)
            expected[:10] *= 2
            assert np.array_equal(buf.copy_to_host(), expected)  # read back while the kernel still runs
            assert pk.sum(buf, n=10) == 90.0
    assert not pk.running and pk.processed == 5


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_results_match_numpy(dev, dtype):
    values = (np.arange(-500, 1500) % 97 - 40).astype(dtype)
    with dev.persistent(threads=128) as pk, _upload(dev, values) as buf:
        total = pk.sum(buf)
        assert total == values.sum(dtype=np.float64 if values.dtype.kind == "f" else np.int64)
        assert isinstance(total, float if values.dtype.kind == "f" else int)
        pk.scale(buf, 1.5, n=777)
        expected = values.copy()
        if expected.dtype.kind == "f":
            expected[:777] *= expected.dtype.type(1.5)
        else:
            expected[:777] = (expected[:777].astype(np.float64) * 1.5).astype(dtype)  # truncated, as C converts
        assert np.array_equal(buf.copy_to_host(), expected)
        assert pk.sum(buf) == pytest.approx(float(expected.sum(dtype=np.float64)))


def test_commands_run_in_order_through_a_wrapping_ring(dev):
    with dev.persistent(capacity=4) as pk, _upload(dev, np.ones(100, np.float32)) as buf:
        tickets = []
        for _ in range(20):  # 40 commands through 4 slots, no answer read until the end
            pk.submit("scale", buf, 2.0)
            tickets.append(pk.submit("sum", buf))
        assert [pk.result(t) for t in tickets] == [100.0 * 2**k for k in range(1, 21)]
        echoes = [pk.submit(pk.ECHO, i, 0.5) for i in range(10)]
        assert [pk.result(t) for t in reversed(echoes)] == [i + 0.5 for i in reversed(range(10))]


def test_threads_share_one_kernel(dev):
    failures: list[BaseException] = []
    with dev.persistent(capacity=8) as pk:

        def work(k: int) -> None:
            try:
                for i in range(40):
                    assert pk.echo(k, i) == k + i
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not failures and pk.processed == 160


# ---------------------------------------------------------------------------------------------------------- misuse
def test_arguments_are_checked(dev):
    with pytest.raises(gw.InvalidArgument, match="capacity"):
        dev.persistent(capacity=1)
    with pytest.raises(gw.InvalidArgument, match="arena_bytes"):
        dev.persistent(arena_bytes=-1)
    with pytest.raises(gw.InvalidArgument, match="power of two"):
        dev.persistent(threads=100)
    with dev.persistent() as pk, dev.alloc(10, "uint8") as bytes_, dev.alloc(10, "float32") as floats:
        with pytest.raises(gw.InvalidArgument, match="unknown command"):
            pk.submit("fill", floats)
        with pytest.raises(gw.InvalidArgument, match="uint8"):
            pk.sum(bytes_)
        with pytest.raises(gw.InvalidArgument, match="n must be 0 to 10"):
            pk.scale(floats, 2.0, n=11)
        with pytest.raises(gw.InvalidArgument, match="Buffer"):
            pk.sum(np.zeros(10, np.float32))
        with pytest.raises(gw.InvalidArgument, match="SCALE takes"):
            pk.submit("scale", floats)
        with pytest.raises(gw.InvalidArgument, match="number"):
            pk.echo("1", 2)
        ticket = pk.submit("echo", 1, 2)
        assert pk.result(ticket) == 3.0
        with pytest.raises(gw.InvalidArgument, match="already read"):
            pk.result(ticket)
        with pytest.raises(gw.InvalidArgument, match="not issued"):
            pk.result(12345)
    with pytest.raises(gw.InvalidArgument, match="stopped"):
        pk.echo(1, 2)


def test_other_backends_say_why(opencl):
    with pytest.raises(gw.BackendUnavailable, match="persistent kernels need"):
        opencl.persistent()


# ---------------------------------------------------------------------------------------------------------- shutdown
def test_stop_is_idempotent_and_ends_the_kernel(dev):
    pk = dev.persistent()
    pk.echo(1, 1)
    pk.stop()
    pk.stop()
    assert not pk.running and pk.stream.closed and pk not in persistent._RUNNING
    with pytest.raises(gw.InvalidArgument, match="stopped"):
        pk.submit("echo", 1, 1)
    if dev.backend_kind is gw.BackendKind.CPU:  # the stream's worker thread, which ran the loop, has ended too
        worker = pk.stream.raw.thread
        worker.join(5)
        assert not worker.is_alive()


def test_stop_answers_what_was_submitted_before_it(dev):
    pk = dev.persistent(capacity=16)
    tickets = [pk.submit("echo", i, 1) for i in range(12)]
    pk.stop()
    assert [pk.result(t) for t in tickets] == [i + 1.0 for i in range(12)]


def test_a_failed_command_is_reported_and_the_kernel_goes_on(dev):
    with dev.persistent() as pk:
        bad = pk._post(99, None, 0, 0.0, 0.0, 0)  # a command the kernel does not know
        with pytest.raises(gw.GpuError, match="unknown command 99"):
            pk.result(bad)
        assert pk.echo(2, 3) == 5.0
    assert not pk.running


def test_a_command_that_raises_on_the_cpu(cpu, monkeypatch):
    real = ring.cpu_execute

    def failing(op, *args):
        if op == gw.PersistentKernel.SUM:
            raise RuntimeError("boom")
        return real(op, *args)

    monkeypatch.setattr(ring, "cpu_execute", failing)
    with cpu.persistent() as pk, cpu.alloc(4) as buf:
        with pytest.raises(gw.GpuError, match="RuntimeError: boom"):
            pk.sum(buf)
        assert pk.echo(1, 2) == 3.0
    assert not pk.running


def test_an_exception_in_the_with_block_stops_the_kernel(dev):
    with pytest.raises(ValueError, match="user code"):
        with dev.persistent() as pk:
            pk.echo(1, 2)
            raise ValueError("user code")
    assert not pk.running and pk.stream.closed


def _stall(dev: gw.Device, monkeypatch: pytest.MonkeyPatch, pk: gw.PersistentKernel) -> gw.Buffer | None:
    """Make the next command take long enough that a wait for it reaches ``_pause``."""
    if dev.backend_kind is gw.BackendKind.CPU:
        _slow_cpu_commands(monkeypatch, 0.3)
        return None
    return dev.alloc(1 << 25, "float32")  # 128 MiB summed by one block: milliseconds


def test_an_interrupt_while_waiting_still_ends_the_kernel(dev, monkeypatch):
    pk = dev.persistent()
    big = _stall(dev, monkeypatch, pk)

    def interrupt(waited_s: float) -> None:
        raise KeyboardInterrupt

    pk._pause = interrupt  # the first time the wait yields, as if Ctrl-C came then
    with pytest.raises(KeyboardInterrupt):
        with pk:
            pk.sum(big) if big is not None else pk.echo(1, 2)
    assert not pk.running and pk.stream.closed
    if big is not None:
        big.free()


def test_an_interrupt_during_stop_leaves_it_stopping_and_stop_finishes(dev, monkeypatch):
    pk = dev.persistent()
    big = _stall(dev, monkeypatch, pk)
    pk.submit("sum", big) if big is not None else pk.submit("echo", 1, 2)

    def interrupted() -> bool:
        raise KeyboardInterrupt

    pk._exited = interrupted  # Ctrl-C while stop() waits for the kernel to exit
    with pytest.raises(KeyboardInterrupt):
        pk.stop()
    del pk._exited
    assert pk._state == "stopping" and pk.running  # the flag is set: the kernel exits on its own
    pk.stop()
    assert not pk.running
    if big is not None:
        big.free()


def test_a_wait_times_out_and_the_answer_comes_later(cpu, monkeypatch):
    _slow_cpu_commands(monkeypatch, 0.3)
    with cpu.persistent() as pk:
        ticket = pk.submit("echo", 1, 2)
        with pytest.raises(gw.DeviceTimeout, match="after 0.05 s"):
            pk.result(ticket, timeout_s=0.05)
        assert pk.result(ticket) == 3.0


def test_a_dead_loop_is_reported_not_waited_for(cpu, monkeypatch):
    monkeypatch.setattr(ring.CpuLoop, "__call__", lambda self, ring, capacity: None)
    pk = cpu.persistent()
    ticket = pk.submit("echo", 1, 2)
    start = time.monotonic()
    with pytest.raises(gw.GpuError, match="no longer running"):
        pk.result(ticket, timeout_s=10)
    assert time.monotonic() - start < 2
    pk.stop()


def test_exit_hook_and_device_close_stop_running_kernels(cpu):
    pk = cpu.persistent()
    persistent._stop_all()
    assert not pk.running
    pk = cpu.persistent()
    cpu.close()
    assert not pk.running and cpu.closed


# ---------------------------------------------------------------------------------------------------------- hazards
def test_device_synchronize_skips_the_persistent_stream(dev):
    with dev.persistent() as pk, _upload(dev, np.ones(64, np.float32)) as buf:
        pk.submit("scale", buf, 3.0)
        dev.synchronize()  # returns: the persistent stream is not waited for
        with pytest.raises(gw.InvalidArgument, match="wait forever"):
            pk.stream.synchronize()
        assert np.array_equal(buf.copy_to_host(), np.full(64, 3, np.float32))  # ordered after the command


def test_buffers_come_and_go_while_the_kernel_runs(dev, monkeypatch):
    with dev.persistent() as pk:
        held = dev.held_bytes
        buf = _upload(dev, np.ones(256, np.float32))  # allocated while the kernel loops
        if dev.backend_kind is gw.BackendKind.CPU:
            _slow_cpu_commands(monkeypatch, 0.2)
        ticket = pk.submit("scale", buf, 2.0)
        buf.free()  # waits for the command's answer first, then frees (deferred or stream-ordered on CUDA)
        assert pk.processed >= ticket and dev.held_bytes == held
        assert pk.result(ticket) is None
        assert pk.echo(1, 1) == 2.0


@pytest.mark.concurrent
def test_two_kernels_on_one_device(dev):
    with dev.persistent(label="a") as a, dev.persistent(label="b") as b:
        assert (a.echo(1, 2), b.echo(3, 4)) == (3.0, 7.0)
        a.stop()
        assert b.echo(5, 6) == 11.0


@pytest.mark.gpu
def test_cuda_hazards_are_refused_or_deferred():
    dev = open_device("cuda")
    backend = dev.backend_device
    before = dev.alloc(1 << 10, "float32")
    with dev.persistent(arena_bytes=8 << 20) as pk:
        with pytest.raises(gw.InvalidArgument, match="compile"):
            dev.compile('extern "C" __global__ void k() {}', "k")
        kept = dev.alloc(1 << 20, "float32")  # 4 MiB pieces of the arena made before the launch
        meanwhile = dev.alloc(1 << 20, "float32")
        assert backend.arena_info()[:2] == (8 << 20, 8 << 20) and not backend._async_ptrs
        outside = dev.alloc(1 << 20, "float32")  # the arena is full: cudaMallocAsync on a private stream
        assert len(backend._async_ptrs) == 1
        with pytest.raises(gw.InvalidArgument, match="outside its arena"):
            pk.submit("sum", outside)  # CUDA does not promise a running kernel memory allocated after its launch
        kept.copy_from_host(np.ones(1 << 20, np.float32))
        assert pk.echo(1, 2) == 3.0 and pk.sum(kept) == float(1 << 20)
        before.free()  # back to the pool, with no CUDA call (cudaFree could wait for the kernel)
        assert dev.empty_cache() == 0  # its cudaFree would wait for the kernel too: nothing given back meanwhile
        meanwhile.free()  # back into the arena
        outside.free()  # stream-ordered
        assert not backend._deferred and not backend._async_ptrs
        assert backend.arena_info()[1] == 4 << 20
    assert not backend._deferred
    assert backend.arena_info()[0] == 8 << 20  # kept while a piece of it lives
    kept.free()
    assert backend.arena_info() == (0, 0, 0) and dev.held_bytes == 0


@pytest.mark.gpu
@pytest.mark.concurrent
def test_a_kernel_launched_later_may_read_what_was_allocated_beside_an_earlier_one():
    dev = open_device("cuda")
    with dev.persistent(arena_bytes=0) as first:
        late = _upload(dev, np.ones(256, np.float32))  # no arena: cudaMallocAsync, after first's launch
        with pytest.raises(gw.InvalidArgument, match="allocate it before starting the kernel"):
            first.sum(late)
        with dev.persistent(label="second") as second:  # launched after the allocation: it may read it
            assert second.sum(late) == 256.0
    late.free()
    assert dev.held_bytes == 0


@pytest.mark.gpu
def test_a_trace_started_while_a_persistent_kernel_runs_uses_events():
    dev = open_device("cuda")
    with dev.persistent() as pk, _upload(dev, np.ones(256, np.float32)) as buf:
        with gw.trace() as t:
            pk.scale(buf, 2.0)
            assert np.array_equal(buf.copy_to_host(), np.full(256, 2, np.float32))
        assert t.wait_pending(timeout_s=10)
        clock = next(iter(t.devices.values()))
        assert clock.source == "events" and "persistent kernel" in clock.note  # CUPTI would have waited for it
