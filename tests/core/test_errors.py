"""Bad input: each raises the narrowest GpuError subclass with a message naming the problem, and leaves the device
unharmed: no bytes or buffers leaked, every stream still usable, the trace consistent."""

from __future__ import annotations

import numpy as np
import pytest
from support import pocl_index, sample

import gpuworkbench as gw
from gpuworkbench.backends.cpu import CpuDevice
from gpuworkbench.trace.spans import KINDS


class Unharmed:
    """Around a bad call: records a trace, and on exit checks that nothing leaked and everything still works."""

    def __init__(self, device: gw.Device) -> None:
        self.device = device

    def __enter__(self) -> Unharmed:
        self.held = self.device.held_bytes
        self.live = {id(b) for b in self.device.live_buffers}
        self.trace = gw.trace().start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.trace.stop()
            return
        dev = self.device
        assert dev.held_bytes == self.held, f"{dev.held_bytes - self.held} B leaked"
        assert {id(b) for b in dev.live_buffers} == self.live, "a buffer leaked"
        free, total = dev.memory_info()
        assert 0 <= free <= total
        data = sample(1000, "float32", seed=3)
        fresh = dev.create_stream("after-error")
        for stream in [dev.default_stream, fresh]:  # streams still usable: a round trip on each
            with dev.alloc(1000) as buf:
                buf.copy_from_host_async(data, stream)
                out = np.empty_like(data)
                buf.copy_to_host_async(out, stream).wait()
                assert np.array_equal(out, data)
        fresh.close()
        dev.synchronize()  # no stream is stuck (nor holding an unreported failure)
        self.trace.stop()
        assert self.trace.wait_pending(timeout_s=10)
        stats = self.trace.stats
        assert stats.pending == 0 and stats.lost == 0 and not stats.warnings
        table = self.trace.table()
        kinds = [KINDS[k] for k in table["kind"]]
        assert sum(k not in ("alloc", "free") for k in kinds) == stats.ops  # every recorded op has its span
        assert kinds.count("alloc") == kinds.count("free"), [  # and every allocation in it was freed
            (k, n, s) for k, n, s in zip(kinds, table["name"], table["start_ns"]) if k in ("alloc", "free")
        ] + [self.trace.started_ns, self.trace.stopped_ns]
        assert np.all(table["start_ns"] <= table["end_ns"])
        memory = self.trace.memory_table()
        if len(memory["held_bytes"]):
            assert memory["held_bytes"][-1] == self.held


@pytest.fixture
def unharmed(device):
    return Unharmed(device)


# ----------------------------------------------------------------------------------------------------- sizes, dtypes
def test_wrong_size(device):
    with device.alloc(10) as buf, Unharmed(device):
        with pytest.raises(gw.InvalidArgument, match="holds 10 float32, host array has 11"):
            buf.copy_from_host(np.zeros(11, np.float32))
        with pytest.raises(gw.InvalidArgument, match="holds 10 float32, host array has 9"):
            buf.copy_from_host_async(np.zeros(9, np.float32), device.default_stream)
        with pytest.raises(gw.InvalidArgument, match="holds 10 float32, host array has 12"):
            buf.copy_to_host(np.empty(12, np.float32))
        with pytest.raises(gw.InvalidArgument, match="host array has 0"):
            buf.copy_to_host_async(np.empty(0, np.float32), device.default_stream)
        with device.alloc(11) as other:
            with pytest.raises(gw.InvalidArgument, match="sizes differ"):
                buf.copy_from(other)


def test_wrong_dtype(device):
    with device.alloc(10, "int32") as buf, Unharmed(device):
        with pytest.raises(gw.InvalidArgument, match=r"holds int32, host array is float64; convert with \.astype"):
            buf.copy_from_host(np.zeros(10))
        with pytest.raises(gw.InvalidArgument, match="holds int32, host array is int64"):
            buf.copy_to_host(np.empty(10, np.int64))
        with pytest.raises(gw.InvalidArgument, match="holds int32, host array is uint32"):
            buf.copy_from_host_async(np.zeros(10, np.uint32), device.default_stream)


def test_host_arrays_that_do_not_fit(device):
    with device.alloc(10) as buf, Unharmed(device):
        with pytest.raises(gw.InvalidArgument, match="must be a NumPy array, not list"):
            buf.copy_from_host([0.0] * 10)
        read_only = np.zeros(10, np.float32)
        read_only.flags.writeable = False
        with pytest.raises(gw.InvalidArgument, match="read-only"):
            buf.copy_to_host(read_only)
        strided = np.zeros(20, np.float32)[::2]
        with pytest.raises(gw.InvalidArgument, match="C-contiguous"):
            buf.copy_from_host_async(strided, device.default_stream)
        with pytest.raises(gw.InvalidArgument, match="C-contiguous"):
            buf.copy_to_host(strided)
        stream = device.default_stream  # the async copies' checks, with valid copies of the same arrays between
        with pytest.raises(gw.InvalidArgument, match="read-only"):
            buf.copy_to_host_async(read_only, stream)
        buf.copy_from_host_async(read_only, stream).wait()  # reading from it is fine
        pinned = device.empty_pinned(20, "float32")
        buf.copy_to_host_async(pinned[:10], stream).wait()
        with pytest.raises(gw.InvalidArgument, match="C-contiguous"):
            buf.copy_to_host_async(pinned[::2], stream)
        with pytest.raises(gw.InvalidArgument, match="host array is >f4"):
            buf.copy_from_host_async(np.zeros(10, ">f4"), stream)
        with pytest.raises(gw.InvalidArgument, match="host array has 20"):
            buf.copy_to_host_async(pinned, stream)


@pytest.mark.parametrize(
    ("n", "dtype", "match"),
    [
        (-1, "float32", "non-negative int, got -1"),
        (1.5, "float32", "non-negative int, got 1.5"),
        (True, "float32", "non-negative int, got True"),
        ("8", "float32", "non-negative int, got '8'"),
        (8, "floot", "'floot' is not a NumPy dtype"),
        (8, object, "objects and empty types"),
    ],
)
def test_bad_allocation_arguments(device, n, dtype, match):
    with Unharmed(device):
        with pytest.raises(gw.InvalidArgument, match=match):
            device.alloc(n, dtype)
        with pytest.raises(gw.InvalidArgument, match="non-negative ints"):
            device.empty_pinned((4, -1))


# ------------------------------------------------------------------------------------------------------ freed buffer
def test_freed_buffer(device, unharmed):
    kernel = gw.elementwise("float32 x", "x = 1", name="ones")
    with device.alloc(10) as alive, unharmed:
        buf = device.alloc(10)
        buf.free()
        host = np.zeros(10, np.float32)
        s = device.default_stream
        calls = [
            lambda: buf.copy_from_host(host),
            lambda: buf.copy_to_host(),
            lambda: buf.copy_from_host_async(host, s),
            lambda: buf.copy_to_host_async(host, s),
            lambda: buf.copy_from(alive),
            lambda: alive.copy_from(buf),
            lambda: buf.fill_bytes(0),
            lambda: kernel(buf),
        ]
        for call in calls:
            with pytest.raises(gw.BufferClosed, match=f"buffer of 10 float32 on {device.spec} was freed"):
                call()
        buf.free()  # freeing twice is fine


# ---------------------------------------------------------------------------------------------------------- backends
def test_unknown_backend(monkeypatch):
    known = "known backends: cuda, rocm, opencl, webgpu, cpu"
    with pytest.raises(gw.InvalidArgument, match=f"unknown backend 'nope'; {known}"):
        gw.Device(0, backend="nope")
    with pytest.raises(gw.InvalidArgument, match="unknown backend 'nope'"):
        gw.Device("nope:1")
    monkeypatch.setenv("GPUWB_DEVICE", "nope:0")
    with pytest.raises(gw.InvalidArgument, match="unknown backend 'nope'"):
        gw.Device()
    monkeypatch.setenv("GPUWB_DEVICE", "opencl:first")
    with pytest.raises(gw.InvalidArgument, match="'opencl:first' is not BACKEND"):
        gw.Device()


def test_backend_or_device_not_here():
    if gw.backend_status()["rocm"]:
        with pytest.raises(gw.BackendUnavailable, match="backend 'rocm' is not available here"):
            gw.Device(0, backend="rocm")
    with pytest.raises(gw.BackendUnavailable, match="cpu has no device 3; devices found: cpu:0"):
        gw.Device(3, backend="cpu")
    if pocl_index() is not None:
        with pytest.raises(gw.BackendUnavailable, match="opencl has no device 99; devices found: .*Portable"):
            gw.Device(99, backend="opencl")
    with pytest.raises(gw.InvalidArgument, match="non-negative int, not -1"):
        gw.Device(-1, backend="cpu")


# ----------------------------------------------------------------------------------------------------- compile errors
def test_opencl_compile_error_carries_the_build_log(opencl):
    source = "__kernel void broken(__global float* x) {\n    x[0] = undeclared_thing;\n}\n"
    with Unharmed(opencl):
        with pytest.raises(gw.CompileError) as info:
            opencl.compile(source, "broken")
    err = info.value
    assert err.name == "broken" and err.source == source
    assert "undeclared_thing" in err.log and "error" in err.log  # the compiler's own words
    assert "kernel 'broken' failed to compile" in str(err) and "   2 |     x[0] = undeclared_thing;" in str(err)
    with pytest.raises(gw.CompileError, match=r"no kernel named 'other' in the program \(it has: ok\)"):
        opencl.compile("__kernel void ok(__global int* x) { x[0] = 1; }", "other")
    with pytest.raises(gw.InvalidArgument, match="compiles OpenCL C source"):
        opencl.compile(lambda x: x, "callable")


def test_cpu_compile_errors(cpu):
    with Unharmed(cpu):
        with pytest.raises(gw.CompileError) as info:
            cpu.compile("def k(x):\n    x[:] = = 1\n", "k")
        assert info.value.log.startswith("line 2:") and "invalid syntax" in info.value.log
        with pytest.raises(gw.CompileError, match="line 3: NameError: name 'undefined_thing' is not defined"):
            cpu.compile("def k(x):\n    pass\nundefined_thing\n", "k")
        with pytest.raises(gw.CompileError, match="the source defines no function named 'k'"):
            cpu.compile("def j(x):\n    pass\n", "k")
        with pytest.raises(gw.InvalidArgument, match="Python callable or Python source"):
            cpu.compile(42, "k")
        with pytest.raises(gw.InvalidArgument, match="non-empty string"):
            cpu.compile(lambda: None, "")


def test_elementwise_expressions_that_do_not_fit():
    cases = [
        (("float32", "y = 1"), "must read 'dtype name'"),
        (("float32 x, int32 x", "x = 1"), "repeat a name"),
        (("complex64 x", "x = 1"), "not supported on devices"),
        (("float32 x", "x = y + 1"), "'y', which is not a declared parameter"),
        (("float32 x", "z = x"), "assigns 'z', which is not a declared parameter"),
        (("float32 x", "x = erf(x)"), "function 'erf' is not supported"),
        (("float32 x", "x = 0 < x < 1"), "chained comparison"),
        (("float32 x", "x = x ** 2"), "not supported in elementwise expressions"),
        (("float32 x", "x = 'a'"), "is not a number"),
        (("float32 x", "x = (x"), "is not valid"),
        (("float32 x", ""), "assigns nothing"),
    ]
    for (params, body), match in cases:
        with pytest.raises(gw.InvalidArgument, match=match):  # when it is made, before any device sees it
            gw.elementwise(params, body)


def test_elementwise_arguments_that_do_not_fit(device, unharmed):
    f = gw.elementwise("float32 x, float32 a, float32 y", "y = a * x", name="scale")
    with device.alloc(8) as x, device.alloc(8) as y, device.alloc(9) as longer, device.alloc(8, "int32") as ints:
        with unharmed:
            with pytest.raises(
                gw.InvalidArgument, match=r"scale takes 3 arguments \(float32 x, float32 a, float32 y\)"
            ):
                f(x, y)
            with pytest.raises(gw.InvalidArgument, match="parameter 'x' is float32, buffer holds int32"):
                f(ints, 2, y)
            with pytest.raises(gw.InvalidArgument, match=r"buffers differ in length \(8 and 9 for 'y'\)"):
                f(x, 2, longer)
            with pytest.raises(gw.InvalidArgument, match="output 'y' must be a Buffer, not float"):
                f(x, 2, 3.0)
            with pytest.raises(gw.InvalidArgument, match="needs at least one buffer"):
                gw.elementwise("float32 a", "a = 1")(1.0)
            with pytest.raises(gw.InvalidArgument, match="stream must be a Stream"):
                f(x, 2, y, stream="default")


def test_elementwise_buffers_on_two_devices(cpu, opencl):
    f = gw.elementwise("float32 x, float32 y", "y = x")
    with cpu.alloc(4) as a, opencl.alloc(4) as b, Unharmed(cpu), Unharmed(opencl):
        with pytest.raises(gw.InvalidArgument, match="buffers are on different devices"):
            f(a, b)


# ------------------------------------------------------------------------------------------------------- out of memory
def test_cpu_budget_out_of_memory_in_the_backend():
    backend = CpuDevice(0, budget=1000)
    held = backend.alloc(600)
    with pytest.raises(gw.OutOfMemory) as info:
        backend.alloc(500)
    err = info.value
    assert (err.asked, err.free, err.total) == (500, 400, 1000)
    assert "cannot allocate 500 B on cpu:0 (budget): 400 B free of 1000 B" in str(err)
    assert isinstance(err, MemoryError) and backend.memory_info() == (400, 1000)
    backend.free(held)
    backend.free(backend.alloc(1000))  # the whole budget fits again
    assert backend.memory_info() == (1000, 1000)


@pytest.fixture
def small_cpu(monkeypatch):
    """A fresh CPU device with a 1 MiB budget (GPUWB_CPU_MEMORY is read when the device opens)."""
    gw.Device("cpu").close()
    monkeypatch.setenv("GPUWB_CPU_MEMORY", str(1 << 20))
    dev = gw.Device("cpu")
    yield dev
    dev.close()


def test_cpu_out_of_memory(small_cpu):
    dev = small_cpu
    assert dev.memory_info() == (1 << 20, 1 << 20)
    with dev.alloc(100_000, "float64") as big, Unharmed(dev):  # 800 kB of 1 MiB
        with pytest.raises(gw.OutOfMemory, match=r"cannot allocate 781\.2 KiB on cpu:0 \(budget\): 242\.8 KiB free"):
            dev.alloc(100_000, "float64")
        assert dev.memory_info() == ((1 << 20) - 800_000, 1 << 20)
        big.fill_bytes(0).wait()
    with dev.alloc(131_072, "float64"):  # exactly the budget, once the first is gone
        assert dev.memory_info()[0] == 0


def test_opencl_out_of_memory(opencl):
    free, total = opencl.memory_info()
    with Unharmed(opencl):
        with pytest.raises(gw.OutOfMemory, match=rf"on {opencl.spec}") as info:
            opencl.alloc(total + 1, "uint8")
        assert info.value.asked == total + 1 and info.value.total == total
        limit = opencl.backend_device._max_alloc
        if limit < total:
            with pytest.raises(gw.OutOfMemory, match=f"one allocation may be at most {limit} B"):
                opencl.alloc(limit + 1, "uint8")
        assert opencl.memory_info() == (free, total)


# ------------------------------------------------------------------------------------------- streams, pools, sets
def test_bad_stream_arguments(device, unharmed):
    other = gw.Device("cpu") if device.backend_kind is not gw.BackendKind.CPU else None
    if other is None and pocl_index() is not None:
        other = gw.Device(pocl_index(), backend="opencl")
    kernel = gw.elementwise("float32 x", "x = 2", name="twos")
    host = np.zeros(16, np.float32)
    with device.alloc(16) as buf, unharmed:
        for bad in ["default", 0, device]:
            with pytest.raises(gw.InvalidArgument, match="stream must be a gpuworkbench Stream"):
                buf.copy_from_host_async(host, bad)
            with pytest.raises(gw.InvalidArgument, match="stream must be a gpuworkbench Stream"):
                buf.fill_bytes(0, stream=bad)
            with pytest.raises(gw.InvalidArgument, match="stream must be a"):
                kernel(buf, stream=bad)
        with pytest.raises(gw.InvalidArgument, match="wait_event takes an Event, not str"):
            device.default_stream.wait_event("event")
        closed = device.create_stream("gone")
        closed.close()
        with pytest.raises(gw.InvalidArgument, match="stream 'gone' is closed"):
            buf.copy_to_host_async(host, closed)
        with pytest.raises(gw.InvalidArgument, match="stream 'gone' is closed"):
            closed.wait_event(device.default_stream.record())
        if other is not None:
            foreign = other.create_stream("foreign")
            with pytest.raises(
                gw.InvalidArgument, match=f"stream 'foreign' is on {other.spec}, buffer on {device.spec}"
            ):
                buf.copy_to_host_async(host, foreign)
            with pytest.raises(gw.InvalidArgument, match=f"event from {other.spec} cannot be waited on"):
                device.default_stream.wait_event(foreign.record())
            with pytest.raises(gw.InvalidArgument, match="elementwise|twos"):
                kernel(buf, stream=foreign)
            with other.alloc(16) as elsewhere:
                with pytest.raises(gw.InvalidArgument, match="copy_from needs both buffers on one device"):
                    buf.copy_from(elsewhere)
            foreign.close()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d.stream_pool(0), "at least one stream, got size=0"),
        (lambda d: d.stream_pool("4"), "at least one stream, got size='4'"),
        (lambda d: d.stream_pool(2, "round_robin"), "assignment must be a StreamAssignment"),
        (lambda d: d.stream_set(0), "depth >= 1, got 0"),
        (lambda d: d.stream_set(-2), "depth >= 1, got -2"),
        (lambda d: d.stream_set(2.0), "depth >= 1, got 2.0"),
    ],
)
def test_bad_pool_and_set_arguments(device, unharmed, make, match):
    streams_before = len(device._streams)
    with unharmed:
        with pytest.raises(gw.InvalidArgument, match=match):
            make(device)
    assert len(device._streams) == streams_before  # no half-built pool left streams behind


def test_fill_byte_out_of_range(device, unharmed):
    with device.alloc(4) as buf, unharmed:
        for bad in (-1, 256, 1.0):
            with pytest.raises(gw.InvalidArgument, match="byte value 0..255"):
                buf.fill_bytes(bad)


# ----------------------------------------------------------------------------------------------------------- kernels
def test_bad_launches(device, unharmed):
    language = device.caps.kernel_language
    source = {
        "python": lambda x, a: x.fill(a),
        "opencl": "__kernel void k(__global float* x, const float a) { x[get_global_id(0)] = a; }",
        "cuda": 'extern "C" __global__ void k(float* x, float a) { x[threadIdx.x] = a; }',
    }[language]
    kernel = device.compile(source, "k")
    with device.alloc(16) as buf, unharmed:
        for grid, block in [(0, 16), ((1, 1, 1, 1), 16), (1.0, 16), (1, -4), (1, True)]:
            with pytest.raises(gw.InvalidArgument, match="must be 1 to 3 positive ints"):
                kernel(grid, block, (buf, 1.0))
        with pytest.raises(gw.InvalidArgument, match="args must be a tuple or list"):
            kernel(1, 16, buf)
        with pytest.raises(gw.InvalidArgument, match="kernel argument 1 is a str; pass a Buffer or a number"):
            kernel(1, 16, (buf, "1.0"))
        if language != "cuda":  # CuPy launches CUDA kernels unchecked: a CUDA kernel carries no signature
            with pytest.raises(gw.InvalidArgument, match="kernel 'k': arguments do not fit its signature"):
                kernel(1, 16, (buf,))
        kernel(1, 16, (buf, 1.0)).wait()  # the kernel itself is fine
        assert (buf.copy_to_host() == 1).all()


def test_block_larger_than_the_device_allows(opencl, unharmed):
    kernel = opencl.compile("__kernel void k(__global int* x) { x[get_global_id(0)] = 1; }", "k")
    too_big = opencl.backend_device._dev.max_work_group_size * 2
    with opencl.alloc(too_big, "int32") as buf, unharmed:
        with pytest.raises(gw.InvalidArgument, match=rf"refused grid \(1,\) × block \({too_big},\)"):
            kernel(1, too_big, (buf,))


def test_a_kernel_failing_while_it_runs(cpu, unharmed):
    kernel = cpu.compile(lambda x: x.reshape(3, -1), "bad_shape")
    s = cpu.create_stream("fails")
    with cpu.alloc(10) as buf, unharmed:
        ev = kernel(1, 1, (buf,), stream=s)
        with pytest.raises(gw.GpuError, match="an op on stream 'fails' failed: ValueError"):
            ev.wait()
        with pytest.raises(gw.GpuError):
            _ = ev.done  # asking again says so again
    s.close()
