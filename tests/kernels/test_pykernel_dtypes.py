"""``@gw.kernel`` with 16-bit floats: f16 and bf16 arrays, shared arrays and locals hold them, values compute as f32
and every store rounds to the nearest, the same bits as NumPy (ml_dtypes for bfloat16) on cpu, opencl (PoCL, with or
without cl_khr_fp16), webgpu (lavapipe, f16 with shader-f16) and cuda (marked gpu); and the refusals."""

import os
import tempfile

import numpy as np
import pytest
from support import WITH_WEBGPU

import gpuworkbench as gw
from gpuworkbench.pykernel import ktypes

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # quiets Mesa's loader
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)
BF16 = pytest.param("bf16", marks=pytest.mark.skipif(ktypes.bfloat16() is None, reason="bfloat16 needs ml_dtypes"))
HALVES = ["f16", BF16]


def kernels(t):
    """Two kernels of element type ``t``: a scale through a 16-bit local, and a block reversal through shared memory."""
    T = getattr(gw, t)

    @gw.kernel(name=f"scale_{t}")
    def scale(i: gw.index, y: T[:], x: T[:], a: gw.f32, n: gw.i32):
        if i < n:
            r: T = 0
            r = x[i] * a  # rounds to t here ...
            y[i] = r + 1  # ... and here

    @gw.kernel(name=f"reverse_{t}", block=64)
    def reverse(i: gw.index, y: T[:], x: T[:]):
        tile = gw.shared(64, T)
        lid = gw.local_id(0)
        tile[lid] = x[i]
        gw.barrier()
        y[i] = tile[63 - lid] + T(0.1)  # T(0.1): 0.1 rounded to t

    return scale, reverse


def skip_unheld(device, t):
    why = device.backend_device.lacks_type(ktypes.NUMPY_TYPES[t])
    if why:
        pytest.skip(f"{device.spec} has no {t}: {why}")


def same_bits(got, want):
    """The same 16-bit patterns, any NaN matching any NaN (a NaN's payload is the backend's)."""
    nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    return bool(np.all((got.view(np.uint16) == want.view(np.uint16)) | nan))


@every_backend
@pytest.mark.parametrize("t", HALVES)
def test_every_store_rounds_as_numpy_does(device, t):
    skip_unheld(device, t)
    dt = ktypes.numpy_dtype(t)
    scale, reverse = kernels(t)
    x = (np.arange(256) / 7 - 9).astype(dt)
    x[:3] = [np.inf, -np.inf, np.nan]
    a = np.float32(3.3)
    with device.alloc(256, dt) as bx, device.alloc(256, dt) as by:
        bx.copy_from_host(x)
        scale.launch(256, by, bx, a, 256)
        want = ((x.astype(np.float32) * a).astype(dt).astype(np.float32) + 1).astype(dt)
        assert same_bits(by.copy_to_host(), want)
        reverse.launch(256, by, bx)
        flipped = x.reshape(4, 64)[:, ::-1].reshape(-1).astype(np.float32)
        assert same_bits(by.copy_to_host(), (flipped + np.float32(dt.type(0.1))).astype(dt))


def test_sources_convert_through_f32():
    scale, _ = kernels("f16")
    assert "gw_f16_to_f32" in scale.source("cuda") and 'asm("cvt.rn.f16.f32' in scale.source("cuda")
    assert "unsigned short* y" in scale.source("cuda")
    opencl = scale.source("opencl")
    assert "vstore_half_rte" in opencl and "vload_half" in opencl and "cl_khr_fp16" not in opencl  # no extension
    wgsl = scale.source("wgsl")
    assert wgsl.splitlines()[1] == "enable f16;" and "array<f16>" in wgsl and "var r: f16 = 0.0h;" in wgsl
    numpy = scale.source("numpy")
    assert "np.float16(np.float32(x[" in numpy


def test_bfloat16_sources():
    pytest.importorskip("ml_dtypes")
    scale, _ = kernels("bf16")
    assert "__uint_as_float(((unsigned int)h) << 16)" in scale.source("cuda")
    assert "as_float(((uint)h) << 16)" in scale.source("opencl")
    assert "gw_rt.bfloat16(" in scale.source("numpy")
    with pytest.raises(gw.InvalidArgument, match="WebGPU .* f16 only"):
        scale.source("wgsl")


def test_a_16_bit_scalar_parameter_is_refused():
    with pytest.raises(gw.CompileError, match=r"a scalar cannot be gw.f16 .*declare it gw.f32"):

        @gw.kernel
        def bad(i: gw.index, y: gw.f16[:], a: gw.f16):
            y[i] = a


def test_reads_compute_as_f32():
    """A 16-bit value in arithmetic is f32: the sum of two f16 reads is an f32 local."""

    @gw.kernel
    def add(i: gw.index, y: gw.f32[:], a: gw.f16[:], b: gw.bf16[:]):
        s = a[i] + b[i]
        y[i] = s

    assert next(v for v in add.ir.locals if v.name == "s").type == "f32"
    assert {"f16", "bf16"} <= add.ir.types_used


def test_bfloat16_without_ml_dtypes_says_what_to_install(monkeypatch):
    monkeypatch.setattr(ktypes, "bfloat16", lambda: None)
    with pytest.raises(gw.InvalidArgument, match="bfloat16 has no NumPy dtype without the ml_dtypes package"):
        ktypes.numpy_dtype("bf16")


def test_importing_the_package_leaves_ml_dtypes_until_a_bfloat16_is_asked_for():
    import subprocess
    import sys

    code = (
        "import sys, gpuworkbench; from gpuworkbench.pykernel import ktypes; before = 'ml_dtypes' in sys.modules; "
        "ktypes.numpy_dtype('bf16'); print(before, 'ml_dtypes' in sys.modules)"
    )
    assert subprocess.check_output([sys.executable, "-c", code], text=True).split() == ["False", "True"]


def test_a_device_that_lacks_a_type_is_named(cpu, monkeypatch):
    scale, _ = kernels("f16")
    monkeypatch.setattr(
        type(cpu.backend_device), "lacks_type", lambda self, n: "it is a test" if n == "float16" else ""
    )
    with cpu.alloc(4, "float16") as b:
        with pytest.raises(gw.InvalidArgument, match=r"scale_f16: cpu:0 \(.*\) has no float16: it is a test"):
            scale.launch(4, b, b, 1.0, 4)


def test_constant_and_or_fold_away():
    """``FLAG and x`` with FLAG a constant from outside drops out of the tree: one kernel body serves types with and
    without NaN."""
    NANS = False

    @gw.kernel
    def top(i: gw.index, out: gw.i32[:], x: gw.i32[:]):
        v = x[i]
        out[i] = 1 if v > 3 or (NANS and v != v) else 0

    assert "out[i] = v > 3 ? 1 : 0;" in top.source("opencl")
