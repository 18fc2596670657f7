"""Tests of kernels/: raw kernels in each backend's language, and ``gw.elementwise`` on every backend."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support import sample

import gpuworkbench as gw

SAXPY = {
    "opencl": """
__kernel void saxpy(__global float* y, __global const float* x, const float a, const long n) {
    long i = get_global_id(0);
    if (i < n) y[i] = a * x[i] + y[i];
}
""",
    "cuda": """
extern "C" __global__ void saxpy(float* y, const float* x, float a, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
""",
}


def saxpy_cpu(y: np.ndarray, x: np.ndarray, a: np.float32, n: np.int64) -> None:
    y[:n] = a * x[:n] + y[:n]


def compile_saxpy(device: gw.Device) -> gw.Kernel:
    language = device.caps.kernel_language
    return device.compile(saxpy_cpu if language == "python" else SAXPY[language], "saxpy")


# ----------------------------------------------------------------------------------------------------------- raw
@pytest.mark.parametrize(("n", "block"), [(1, 1), (1, 128), (1000, 128), (4097, 256), (300, 7)])
def test_raw_kernel_saxpy(device, n, block):
    kernel = compile_saxpy(device)
    assert kernel.name == "saxpy" and kernel.device is device and "saxpy" in repr(kernel)
    x, y = sample(n, "float32", seed=1), sample(n, "float32", seed=2)
    s = device.create_stream("k")
    with device.alloc(n) as bx, device.alloc(n) as by:
        bx.copy_from_host(x)
        by.copy_from_host(y)
        grid = (n + block - 1) // block  # not a multiple of the block: the kernel bounds-checks
        ev = kernel(grid, block, (by, bx, 2.0, np.int64(n)), stream=s)
        assert isinstance(ev, gw.Event) and ev.stream is s
        ev.wait()
        assert np.array_equal(by.copy_to_host(), 2 * x + y)
        kernel((grid,), (block,), [by, bx, np.float32(-1), np.int64(n)]).wait()  # default stream, list args
        assert np.array_equal(by.copy_to_host(), x + y)
    s.close()


def test_opencl_kernel_in_two_dimensions(opencl):
    source = """
__kernel void index2d(__global int* out, const int width) {
    out[get_global_id(1) * width + get_global_id(0)] = get_global_id(1) * 100 + get_global_id(0);
}
"""
    kernel = opencl.compile(source, "index2d")
    with opencl.alloc(8 * 6, "int32") as out:
        kernel((2, 3), (4, 2), (out, 8)).wait()  # a Python int is passed as int32
        rows, cols = np.mgrid[0:6, 0:8]
        assert np.array_equal(out.copy_to_host().reshape(6, 8), rows * 100 + cols)


def test_opencl_kernel_with_build_options(opencl):
    source = "__kernel void fill(__global int* out) { out[get_global_id(0)] = VALUE; }"
    kernel = opencl.compile(source, "fill", options=["-DVALUE=42"])
    with opencl.alloc(64, "int32") as out:
        kernel(4, 16, (out,)).wait()
        assert (out.copy_to_host() == 42).all()


def test_cpu_kernel_sees_grid_block_and_scalar_types(cpu):
    seen = {}

    def probe(out, count, scale, big, grid, block):
        seen.update(grid=grid, block=block, types=(type(count), type(scale), type(big)))
        out[:] = np.arange(len(out)) * scale

    kernel = cpu.compile(probe, "probe")
    with cpu.alloc(5) as out:
        kernel((2, 3), 4, (out, 7, 0.5, 2**40)).wait()
        assert np.array_equal(out.copy_to_host(), np.arange(5) * 0.5)
    assert seen == {"grid": (2, 3), "block": (4,), "types": (np.int32, np.float32, np.int64)}


def test_cpu_kernel_from_python_source(cpu):
    source = "def double(x):\n    x *= 2\n"
    kernel = cpu.compile(source, "double")
    data = sample(50, "int32")
    with cpu.alloc(50, "int32") as buf:
        buf.copy_from_host(data)
        kernel(1, 1, (buf,)).wait()
        assert np.array_equal(buf.copy_to_host(), 2 * data)


def test_blocking_read_back_waits_for_a_kernel_on_another_stream(cpu, gate):
    s = cpu.create_stream("compute")
    kernel = cpu.compile(lambda out: out.fill(5), "five")
    with cpu.alloc(1000) as buf:
        buf.fill_bytes(0).wait()
        gate.close_on(s)
        kernel(1, 1, (buf,), stream=s)
        threading.Timer(0.02, gate.open).start()
        assert (buf.copy_to_host() == 5).all()
    s.close()


# ------------------------------------------------------------------------------------------------------- elementwise
AXPB = gw.elementwise("float32 x, float32 a, float32 b, float32 y", "y = a * x + b", name="axpb")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1000])
def test_elementwise_sizes_dtypes_and_scalars(device, dtype, n):
    f = gw.elementwise(f"{dtype} x, {dtype} a, {dtype} b, {dtype} y", "y = a * x + b", name=f"axpb_{dtype}")
    x = sample(n, dtype)
    with device.alloc(n, dtype) as bx, device.alloc(n, dtype) as by:
        bx.copy_from_host(x)
        by.fill_bytes(0).wait()
        f(bx, 3, -2, by).wait()
        expected = (3 * x - 2).astype(dtype)
        assert np.array_equal(by.copy_to_host(), expected)


@pytest.mark.parametrize("block", [1, 64, 100, 256])
def test_elementwise_block_sizes(device, block):
    n = 1000
    x = sample(n, "float32")
    s = device.create_stream()
    with device.alloc(n) as bx, device.alloc(n) as by:
        bx.copy_from_host(x)
        ev = AXPB(bx, np.float32(0.5), 1, by, stream=s, block=block)
        assert ev.stream is s
        ev.wait()
        assert np.array_equal(by.copy_to_host(), np.float32(0.5) * x + 1)
    s.close()


def test_elementwise_array_for_a_scalar_parameter(device):
    n = 300
    x, a = sample(n, "float32", 1), sample(n, "float32", 2)
    with device.alloc(n) as bx, device.alloc(n) as ba, device.alloc(n) as by:
        bx.copy_from_host(x)
        ba.copy_from_host(a)
        AXPB(bx, ba, 0.0, by).wait()  # a is a buffer here, b a number: another specialisation
        assert np.array_equal(by.copy_to_host(), a * x)


def test_elementwise_several_outputs(device):
    f = gw.elementwise("float64 x, float64 y, float64 z", "y = x + 1; z = y * 2", name="two_outputs")
    assert f.outputs == ["y", "z"]
    x = sample(777, "float64")
    with device.alloc(777, "float64") as bx, device.alloc(777, "float64") as by, device.alloc(777, "float64") as bz:
        bx.copy_from_host(x)
        f(bx, by, bz).wait()
        assert np.array_equal(by.copy_to_host(), x + 1)
        assert np.array_equal(bz.copy_to_host(), (x + 1) * 2)


def test_elementwise_functions(device):
    f = gw.elementwise(
        "float32 x, float32 y",
        "y = where(x > 0, sqrt(x), abs(x)) + min(x, 2.5) - max(floor(x / 3), -4.0)",
        name="functions",
    )
    x = (sample(500, "float32") / 7).astype(np.float32)
    expected = np.where(x > 0, np.sqrt(np.abs(x)), np.abs(x)) + np.minimum(x, 2.5) - np.maximum(np.floor(x / 3), -4)
    with device.alloc(500) as bx, device.alloc(500) as by:
        bx.copy_from_host(x)
        f(bx, by).wait()
        np.testing.assert_allclose(by.copy_to_host(), expected, rtol=1e-6, atol=1e-6)


def test_elementwise_integer_arithmetic_is_c_arithmetic(device):
    """``/`` truncates toward zero and ``%`` keeps the dividend's sign, on every backend (as in C)."""
    f = gw.elementwise("int32 x, int32 d, int32 q, int32 r, int32 t", "q = x / d; r = x % d; t = (x / 2) * 2")
    x = np.array([-7, -6, -1, 0, 1, 6, 7, -2147483647, 2147483647], np.int32)
    d = np.array([2, -4, 3, 5, -3, 4, -2, 10, -10], np.int32)
    with device.alloc(9, "int32") as bx, device.alloc(9, "int32") as bd:
        bx.copy_from_host(x)
        bd.copy_from_host(d)
        outs = [device.alloc(9, "int32") for _ in range(3)]
        f(bx, bd, *outs).wait()
        q, r, t = (o.copy_to_host() for o in outs)
        for o in outs:
            o.free()
    assert q.tolist() == [int(a / b) for a, b in zip(x.tolist(), d.tolist())]
    assert r.tolist() == np.fmod(x, d).tolist()
    assert t.tolist() == [int(a / 2) * 2 for a in x.tolist()]


def test_elementwise_float_modulo_and_truth_values(device):
    f = gw.elementwise(
        "float32 x, int32 k, float32 m, int32 sign, int32 logic",
        "m = x % 3; sign = (k > 0) - (k < 0); logic = 4 * (k & (k + 1)) + 2 * (k | (k - 1)) + ~k",
        name="c_truth",
    )
    x = np.array([-7.5, -3, -0.5, 0, 2.25, 6, 7.5], np.float32)
    k = np.array([-5, -1, 0, 1, 2, 3, 0], np.int32)
    with device.alloc(7) as bx, device.alloc(7, "int32") as bk:
        bx.copy_from_host(x)
        bk.copy_from_host(k)
        with device.alloc(7) as m, device.alloc(7, "int32") as sign, device.alloc(7, "int32") as logic:
            f(bx, bk, m, sign, logic).wait()
            assert m.copy_to_host().tolist() == np.fmod(x, 3).tolist()
            assert sign.copy_to_host().tolist() == np.sign(k).tolist()
            # & | ~ are logical (&& || !), giving 0 or 1
            expected = [4 * int(bool(v and v + 1)) + 2 * int(bool(v or v - 1)) + int(not v) for v in k.tolist()]
            assert logic.copy_to_host().tolist() == expected


def test_elementwise_parameters_may_be_named_like_the_index(device):
    f = gw.elementwise("float32 i, int32 n, float32 y", "y = i * n", name="named_i_n")
    with device.alloc(10) as bi, device.alloc(10) as by:
        bi.copy_from_host(np.arange(10, dtype=np.float32))
        f(bi, 3, by).wait()
        assert np.array_equal(by.copy_to_host(), np.arange(10, dtype=np.float32) * 3)


def test_elementwise_compiles_once_per_device_and_specialisation(device):
    f = gw.elementwise("float32 x, float32 y", "y = x * x", name="square")
    with device.alloc(16) as bx, device.alloc(16) as by:
        bx.copy_from_host(np.arange(16, dtype=np.float32))
        f(bx, by).wait()
        kernel = f._kernel_for(device, (True, True))
        f(by, bx).wait()
        assert f._kernel_for(device, (True, True)) is kernel
        assert np.array_equal(bx.copy_to_host(), np.arange(16, dtype=np.float32) ** 4)


def test_elementwise_generated_source():
    f = gw.elementwise("float64 x, float32 a, float64 y", "y = a * x", name="scale")
    cl = f.source("opencl", (True, False, True))
    assert "__kernel void scale(" in cl and "cl_khr_fp64" in cl and "const float a" in cl and "a * x[" in cl
    cu = f.source("cuda")
    assert 'extern "C" __global__ void scale(' in cu and "const double* __restrict__ x" in cu
