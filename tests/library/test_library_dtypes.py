"""``gw.library`` on every dtype: each op against NumPy (computed in float64) for float16, bfloat16, float32, float64,
int32 and int64 on cpu, opencl (PoCL), webgpu (lavapipe) and cuda (marked gpu); NumPy's result dtypes; float16 and
bfloat16 within float32 accumulation's rounding; the errors that name a backend and what it lacks."""

import os
import tempfile
import types

import numpy as np
import pytest
from support import WITH_WEBGPU

import gpuworkbench as gw
from gpuworkbench import library as lib
from gpuworkbench.trace.spans import KIND_CODE

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # quiets Mesa's loader
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)

try:
    from ml_dtypes import bfloat16
except ImportError:  # bfloat16 has no NumPy dtype without ml_dtypes
    bfloat16 = None

BF16 = pytest.param("bfloat16", marks=pytest.mark.skipif(bfloat16 is None, reason="bfloat16 needs ml_dtypes"))
FLOATS = ["float16", BF16, "float32", "float64"]
NUMBERS = [*FLOATS, "int32", "int64"]
#: relative tolerance of each float dtype's results (one rounding to the dtype after float32 accumulation)
RTOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def dtype_of(name):
    return np.dtype(bfloat16) if name == "bfloat16" else np.dtype(name)


def data(shape, name, seed=0):
    """Whole numbers for integers; for floats, values the dtype holds exactly, spread so that ties are rare."""
    rng = np.random.default_rng(seed)
    if name.startswith("int"):
        return rng.integers(-50, 50, shape).astype(name)
    return rng.normal(0, 3, shape).astype(dtype_of(name))


def holds(device, name):
    """Whether ``device``'s kernels hold ``name``: WebGPU has no 64-bit types nor bfloat16 (f16 with shader-f16)."""
    return not device.backend_device.lacks_type(name)


def close(got, want, name):
    got = np.asarray(got).astype(np.float64)
    if name.startswith("int"):
        return np.array_equal(got, want)
    scale = np.abs(want).max() if np.size(want) else 1.0
    return np.allclose(got, want, rtol=RTOL[name], atol=RTOL[name] * scale)


@every_backend
@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("axis", [None, -1])
def test_sum_max_argmax_cumsum_as_numpy(device, name, axis):
    x = data((3, 300), name, 1)
    x64 = x.astype(np.float64)
    if not holds(device, name):
        pytest.skip(f"{device.spec} has no {name} (tested in test_what_a_device_lacks_is_named)")
    ops = [("max", lib.max, np.max), ("argmax", lib.argmax, np.argmax)]
    if holds(device, "int64") or name.startswith("float"):  # the sum and scan of int32 are int64
        ops += [("sum", lib.sum, np.sum), ("cumsum", lib.cumsum, np.cumsum)]
    for op, ours, numpy in ops:
        got = ours(x, axis=axis, device=device)
        assert np.asarray(got).dtype == np.asarray(numpy(x, axis=axis)).dtype, op  # NumPy's promotion
        if op == "argmax":
            assert np.array_equal(got, np.argmax(x64, axis=axis)), op
        else:
            assert close(got, numpy(x64, axis=axis), name), op
    if axis is None:
        assert np.ndim(lib.max(x, device=device)) == 0  # a scalar, as NumPy gives


@every_backend
@pytest.mark.parametrize("name", FLOATS)
def test_softmax_log_softmax_layer_norm(device, name):
    if not holds(device, name):
        pytest.skip(f"{device.spec} has no {name}")
    x = data((4, 300), name, 2)
    gamma, beta = data((300,), name, 3), data((300,), name, 4)
    x64, g64, b64 = (v.astype(np.float64) for v in (x, gamma, beta))
    shifted = x64 - x64.max(-1, keepdims=True)
    total = np.exp(shifted).sum(-1, keepdims=True)
    normed = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    for got, want in [
        (lib.softmax(x, device=device), np.exp(shifted) / total),
        (lib.log_softmax(x, device=device), shifted - np.log(total)),
        (lib.layer_norm(x, gamma, beta, device=device), normed * g64 + b64),
        (lib.layer_norm(x, device=device), normed),
    ]:
        assert got.dtype == x.dtype and close(got, want, name)


@every_backend
@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("method", ["naive", "tiled"])
def test_matmul_accumulates_in_float32_or_wider(device, name, method):
    if not holds(device, name):
        pytest.skip(f"{device.spec} has no {name}")
    a, b = data((33, 70), name, 5), data((70, 29), name, 6)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = lib.matmul(a, b, method=method, device=device)
    assert got.dtype == a.dtype
    # one rounding of each output: a float16 accumulation would be off by far more over 70 products
    assert np.allclose(got.astype(np.float64), want, rtol=RTOL[name], atol=RTOL[name] * np.abs(want).max())


@every_backend
@pytest.mark.parametrize("name", NUMBERS)
def test_transpose_moves_the_bits(device, name):
    if not holds(device, name):
        pytest.skip(f"{device.spec} has no {name}")
    x = data((17, 33), name, 7)
    got = lib.transpose(x, device=device)
    assert got.dtype == x.dtype and np.array_equal(got.view(np.uint8), np.ascontiguousarray(x.T).view(np.uint8))


@every_backend
def test_float16_buffers_give_buffers_of_numpys_dtypes(device):
    if not holds(device, "float16"):
        pytest.skip(f"{device.spec} has no float16")
    x = data((5, 40), "float16", 8)
    with device.alloc(x.shape, "float16") as bx:
        bx.copy_from_host(x)
        sums, where = lib.sum(bx, axis=-1), lib.argmax(bx, axis=-1)
        try:
            assert sums.dtype == np.float16 and close(sums.copy_to_host(), x.astype(np.float64).sum(-1), "float16")
            index = np.int64 if holds(device, "int64") else np.int32  # WebGPU's Buffers: int32 indices
            assert where.dtype == index and np.array_equal(where.copy_to_host(), x.argmax(-1))
        finally:
            sums.free()
            where.free()


@every_backend
def test_integer_sums_do_not_wrap_around(device):
    """The sum of int32 is int64, added in int64: 2**31 - 1 twice does not wrap."""
    if not holds(device, "int64"):
        pytest.skip(f"{device.spec} has no int64")
    x = np.full((2, 3), 2**31 - 1, np.int32)
    assert lib.sum(x, device=device) == 6 * (2**31 - 1)
    assert np.array_equal(lib.cumsum(x, axis=-1, device=device), np.cumsum(x, axis=-1))
    big = np.array([2**40, -(2**62), 5], np.int64)
    assert lib.max(big, device=device) == 2**40 and lib.argmax(big, device=device) == 0


@every_backend
def test_what_a_device_lacks_is_named(device):
    """WebGPU has no 64-bit types nor bfloat16; elsewhere every dtype runs (PoCL has cl_khr_fp64)."""
    lacks = {n: device.backend_device.lacks_type(n) for n in ("float16", "bfloat16", "float64", "int64")}
    if device.backend_kind is not gw.BackendKind.WEBGPU:
        assert not any(lacks.values())
        return
    assert lacks == {"float16": lacks["float16"], "bfloat16": "WGSL has no bfloat16",
                     "float64": "WGSL has no 64-bit types", "int64": "WGSL has no 64-bit types"}  # fmt: skip
    where = rf"{device.spec} \(.*\) has no"
    with pytest.raises(gw.InvalidArgument, match=rf"softmax: {where} float64: WGSL has no 64-bit types"):
        lib.softmax(np.ones((2, 3)), device=device)
    with pytest.raises(gw.InvalidArgument, match=rf"sum: {where} int64: .*\(the sum of int32 is int64, as in NumPy\)"):
        lib.sum(np.ones(3, np.int32), device=device)
    assert lib.argmax(np.arange(5, dtype=np.int32), device=device) == 4  # int32 in, int64 back (host side)


def test_opencl_without_fp64_is_named(opencl, monkeypatch):
    """A device without cl_khr_fp64 refuses float64 naming the extension, before uploading anything."""
    before = list(opencl.live_buffers)
    device = opencl.backend_device
    extensions = types.SimpleNamespace(extensions="cl_khr_byte_addressable_store cl_khr_fp16")
    monkeypatch.setattr(device, "_dev", extensions)  # other library: the backend's own cl.Device, as reported
    with pytest.raises(gw.InvalidArgument, match=r"opencl:\d+ \(.*\) has no float64: its device lacks cl_khr_fp64"):
        lib.sum(np.ones(3), device=opencl)
    assert list(opencl.live_buffers) == before
    assert device.lacks_type("float16") == device.lacks_type("int64") == ""


def test_dtypes_an_op_does_not_take_are_named(cpu):
    with pytest.raises(gw.InvalidArgument, match=r"softmax: x is int32 \(3,\); it takes float16, bfloat16, float32 or "
                       "float64"):  # fmt: skip
        lib.softmax(np.arange(3, dtype=np.int32), device=cpu)
    with pytest.raises(gw.InvalidArgument, match=r"sum: x is int16 \(3,\); it takes .*, int32 or int64"):
        lib.sum(np.arange(3, dtype=np.int16), device=cpu)
    with pytest.raises(gw.InvalidArgument, match=r"a is float16 \(3, 4\), b is float32 \(4, 2\); they must have one"):
        lib.matmul(np.ones((3, 4), np.float16), np.ones((4, 2), np.float32), device=cpu)
    with pytest.raises(gw.InvalidArgument, match=r"out is int32 \(3,\); the result is int64 \(3,\)"):
        lib.cumsum(np.ones(3, np.int32), out=np.empty(3, np.int32), device=cpu)


def test_kernels_of_other_dtypes_carry_the_type_and_their_bytes(cpu):
    """A trace tells a float16 sum from a float32 one, and its ``bytes`` counts 2-byte elements and int64 sums."""
    with gw.trace() as t:
        lib.sum(np.ones((4, 100), np.float32), axis=-1, device=cpu)
        lib.sum(np.ones((4, 100), np.float16), axis=-1, device=cpu)
        lib.sum(np.ones((4, 100), np.int32), axis=-1, device=cpu)
        lib.argmax(np.ones((4, 100), np.float64), axis=-1, device=cpu)
    t.wait_pending()
    spans = t.table()
    kernel = KIND_CODE["kernel"]
    kernels = {str(n): int(b) for n, b, kind in zip(spans["name"], spans["bytes"], spans["kind"]) if kind == kernel}
    assert kernels == {"row_sum": 4 * 400 + 4 * 4, "row_sum_f16": 2 * 400 + 2 * 4, "row_sum_i32": 4 * 400 + 8 * 4,
                       "row_argmax_f64": 8 * 400 + 8 * 4}  # fmt: skip
