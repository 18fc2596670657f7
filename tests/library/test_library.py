"""Tests of ``gw.library``: each op against NumPy on awkward sizes, on cpu, opencl (PoCL), webgpu (lavapipe) and
cuda (marked gpu); NumPy inputs with ``device=`` and shaped Buffers; errors that name both mismatched inputs."""

import os
import tempfile

import numpy as np
import pytest
from support import WITH_WEBGPU

import gpuworkbench as gw
from gpuworkbench import library as lib

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # quiets Mesa's loader
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)


def ints(shape, seed=0, low=-9, high=10):
    """Small whole numbers as float32: sums and products are exact, so results compare exactly."""
    return np.random.default_rng(seed).integers(low, high, shape).astype(np.float32)


@every_backend
@pytest.mark.parametrize("method", ["naive", "tiled"])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (17, 17, 17), (33, 29, 31), (5, 40, 3), (64, 1, 7)])
def test_matmul(device, method, mnk):
    m, n, k = mnk
    a, b = ints((m, k), 1, -4, 5), ints((k, n), 2, -4, 5)
    assert np.array_equal(lib.matmul(a, b, method=method, device=device), a @ b)


@every_backend
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 300), (4, 1000)])
def test_softmax_and_log_softmax(device, shape):
    x = np.random.default_rng(3).normal(0, 4, shape).astype(np.float32)
    x.reshape(-1)[::7] += 500  # large values: the maximum must be subtracted first
    shifted = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    expected = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    assert np.allclose(lib.softmax(x, device=device), expected, rtol=1e-5, atol=1e-7)
    log_expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    assert np.allclose(lib.log_softmax(x, device=device), log_expected, rtol=1e-5, atol=1e-4)


@every_backend
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 513)])
def test_layer_norm(device, shape):
    x = np.random.default_rng(4).normal(3, 2, shape).astype(np.float32)
    gamma, beta = ints(shape[-1:], 5, 1, 4), ints(shape[-1:], 6)
    x64 = x.astype(np.float64)
    normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    assert np.allclose(lib.layer_norm(x, gamma, beta, device=device), normed * gamma + beta, rtol=1e-4, atol=1e-4)
    assert np.allclose(lib.layer_norm(x, device=device), normed, rtol=1e-4, atol=1e-4)


@every_backend
@pytest.mark.parametrize("shape", [(1,), (7,), (5, 300), (3, 4, 1000)])
def test_sum_max_argmax(device, shape):
    x = ints(shape, 7, -3, 4)  # few values: ties, so argmax must take the first
    for axis in (None, -1):
        assert np.array_equal(lib.sum(x, axis=axis, device=device), x.sum(axis=axis))
        assert np.array_equal(lib.max(x, axis=axis, device=device), x.max(axis=axis))
        got = lib.argmax(x, axis=axis, device=device)
        assert np.array_equal(got, x.argmax(axis=axis)) and np.asarray(got).dtype == np.int64  # NumPy's intp
    assert isinstance(lib.sum(x, device=device), np.float32)  # axis=None: a scalar, as NumPy gives


@every_backend
def test_max_and_argmax_take_nan_as_numpy_does(device):
    if device.backend_kind is gw.BackendKind.WEBGPU:
        pytest.skip("WGSL lets implementations assume no NaN (lavapipe folds x != x to false)")
    x = ints((4, 300), 8)
    x[1, 17] = x[1, 290] = np.nan
    x[3, 299] = np.nan
    got_max = lib.max(x, axis=-1, device=device)
    assert np.array_equal(got_max, x.max(axis=-1), equal_nan=True)
    assert np.array_equal(lib.argmax(x, axis=-1, device=device), x.argmax(axis=-1))


@every_backend
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 700), (2, 2, 256)])
def test_cumsum(device, shape):
    x = ints(shape, 9)
    assert np.array_equal(lib.cumsum(x, axis=-1, device=device), np.cumsum(x, axis=-1))
    assert np.array_equal(lib.cumsum(x, device=device), np.cumsum(x))


@every_backend
@pytest.mark.parametrize("shape", [(1, 1), (17, 33), (33, 29), (5, 1)])
def test_transpose(device, shape):
    x = ints(shape, 10)
    assert np.array_equal(lib.transpose(x, device=device), x.T)


# ------------------------------------------------------------------------------------------------------ Buffers
@every_backend
def test_shaped_buffers_in_and_out_on_a_stream(device):
    a, b = ints((33, 20), 11), ints((20, 29), 12)
    s = device.create_stream("library")
    with device.alloc(a.shape) as ba, device.alloc(b.shape) as bb, device.alloc((33, 29)) as bc:
        ba.copy_from_host(a)
        bb.copy_from_host(b)
        assert ba.shape == (33, 20) and ba.ndim == 2 and len(ba) == 33 * 20
        assert lib.matmul(ba, bb, bc, stream=s) is bc
        made = lib.transpose(bc, stream=s)  # a new Buffer, shaped (29, 33)
        try:
            assert made.shape == (29, 33)
            assert np.array_equal(made.copy_to_host(), (a @ b).T)  # copy_to_host waits for the stream's work
            sums = lib.sum(made, axis=-1, stream=s)
            assert sums.shape == (29,) and np.array_equal(sums.copy_to_host(), (a @ b).sum(axis=0))
            sums.free()
        finally:
            made.free()
    s.close()


def test_buffer_shape(cpu):
    with cpu.alloc(12, "int32") as buf:
        assert buf.shape == (12,)
        buf.shape = (3, 4)
        buf.copy_from_host(np.arange(12, dtype=np.int32))
        assert buf.copy_to_host().shape == (3, 4) and "3 × 4" in repr(buf)
        with pytest.raises(gw.InvalidArgument, match="does not hold the 12 elements"):
            buf.shape = (5, 3)
    with pytest.raises(gw.InvalidArgument, match="non-negative ints"):
        cpu.alloc((3, -1))


def test_out_arrays(cpu):
    x = ints((4, 9), 13)
    out = np.empty((4, 9), np.float32)
    assert lib.cumsum(x, axis=-1, out=out, device=cpu) is out and np.array_equal(out, np.cumsum(x, axis=-1))
    with pytest.raises(gw.InvalidArgument, match=r"out is float32 \(9, 4\); the result is float32 \(4, 9\)"):
        lib.softmax(x, out=np.empty((9, 4), np.float32), device=cpu)


# -------------------------------------------------------------------------------------------------------- errors
def test_mismatches_name_both(cpu):
    a, b = ints((3, 4)), ints((5, 2))
    with pytest.raises(gw.InvalidArgument, match=r"a \(3, 4\) and b \(5, 2\) do not chain"):
        lib.matmul(a, b, device=cpu)
    with pytest.raises(gw.InvalidArgument, match=r"a is float32 \(3, 4\), b is float64 \(4, 2\)"):
        lib.matmul(a, np.ones((4, 2)), device=cpu)
    with pytest.raises(gw.InvalidArgument, match=r"x is int32 \(3,\); it takes float16, bfloat16, float32 or float64"):
        lib.softmax(np.arange(3, dtype=np.int32), device=cpu)
    with pytest.raises(gw.InvalidArgument, match=r"x is \(3, 4\), gamma is \(3,\)"):
        lib.layer_norm(a, ints((3,)), device=cpu)
    with cpu.alloc((3, 4)) as buf:
        with pytest.raises(gw.InvalidArgument, match="a is a NumPy array, b is a Buffer"):
            lib.matmul(ints((2, 3)), buf, device=cpu)
    with pytest.raises(gw.InvalidArgument, match="need device="):
        lib.softmax(a)
    with pytest.raises(gw.InvalidArgument, match="axis=-1"):
        lib.sum(a, axis=0, device=cpu)
    with pytest.raises(gw.InvalidArgument, match="no elements"):
        lib.max(np.zeros((2, 0), np.float32), axis=-1, device=cpu)
    with pytest.raises(gw.InvalidArgument, match="method 'fast'"):
        lib.matmul(a, ints((4, 2)), method="fast", device=cpu)


def test_import_gpuworkbench_leaves_the_library_until_first_use():
    """The library translates its kernels as it loads: ``import gpuworkbench`` does not pay for that."""
    import subprocess
    import sys

    code = (
        "import sys, gpuworkbench as gw; assert 'gpuworkbench.library' not in sys.modules; "
        "assert 'gpuworkbench.library.crossover_measure' not in sys.modules; "
        "gw.library.softmax; gw.crossover; assert 'gpuworkbench.library' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
