"""``gw.library``'s row kernels on rows long enough for their unrolled steps (several steps of ``unroll`` loads per
thread, then a tail), on cpu, opencl (PoCL), webgpu (lavapipe) and cuda (marked gpu): against NumPy in float64, with
-inf over the first steps of a row (softmax's running sum must not turn them into NaN) and a NaN in another; results
written over the input; transpose's tiles on sizes that cut them; ``@gw.kernel(distinct=True)``."""

import os
import tempfile

import numpy as np
import pytest
from support import WITH_WEBGPU

import gpuworkbench as gw
from gpuworkbench import library as lib
from gpuworkbench.errors import InvalidArgument

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # quiets Mesa's loader
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)

COLS = 2 * 2048 + 77  # two whole steps of 8 × 256 (16-bit types), four of 4 × 256, and a tail
RTOL = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}


def rows(name: str, specials: bool) -> np.ndarray:
    """Three rows: row 0 -inf over its first 2 100 values (where the float ops take specials), row 1 a NaN at 3 000."""
    rng = np.random.default_rng(11)
    if name.startswith("int"):
        return rng.integers(-50, 50, (3, COLS)).astype(name)
    x = rng.normal(0, 3, (3, COLS)).astype(name)
    if specials:
        x[0, :2100] = -np.inf
        x[1, 3000] = np.nan
    return x


def close(got, want, name):
    got = np.asarray(got).astype(np.float64)
    if name.startswith("int"):
        return np.array_equal(got, want)
    finite, nan = np.isfinite(want), np.isnan(want)
    infinite = ~finite & ~nan
    if not np.array_equal(np.isnan(got), nan) or not np.array_equal(got[infinite], want[infinite]):
        return False
    scale = np.abs(want[finite]).max() if finite.any() else 1.0
    return np.allclose(got[finite], want[finite], rtol=RTOL[name], atol=RTOL[name] * scale)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def skip_unheld(device, name):
    """Skip where the device cannot hold ``name`` (integers: their int64 sums either)."""
    lacks = device.backend_device.lacks_type(name) or (
        name.startswith("int") and device.backend_device.lacks_type("int64")
    )
    if lacks:
        pytest.skip(lacks)


@every_backend
@pytest.mark.parametrize("name", ["float16", "float32", "float64", "int32"])
def test_long_rows_as_numpy(device, name):
    skip_unheld(device, name)
    specials = device.backend_kind is not gw.BackendKind.WEBGPU  # WGSL may assume there is no NaN nor infinity
    x = rows(name, specials)
    wide = x.astype(np.float64 if name.startswith("float") else np.int64)
    want = {
        "sum": wide.sum(-1),
        "max": wide.max(-1),
        "argmax": wide.argmax(-1),
        "cumsum": wide.cumsum(-1),
        "transpose": wide.T,
    }
    if name.startswith("float"):
        with np.errstate(invalid="ignore"):
            want["softmax"] = softmax(wide)
            want["log_softmax"] = np.log(want["softmax"])
        with np.errstate(invalid="ignore"):
            want["layer_norm"] = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)
    for op, expected in want.items():
        fn = getattr(lib, op)
        got = fn(x, axis=-1, device=device) if op in ("sum", "max", "argmax", "cumsum") else fn(x, device=device)
        if op == "layer_norm" and specials:  # rows with -inf or NaN are NaN; the third row is the test
            got, expected = np.asarray(got)[2:], expected[2:]
        if op in ("sum", "cumsum") and name.startswith("float"):
            tol = {"float16": 2e-2, "float32": 1e-4, "float64": 1e-10}[name]  # thousands of rounded values added
            if specials:
                got, expected = np.asarray(got)[2:], expected[2:]
            assert np.allclose(np.asarray(got, np.float64), expected, rtol=tol, atol=tol * np.abs(expected).max()), op
            continue
        assert close(got, expected, name), op


@every_backend
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("two_level", [False, True])
def test_every_way_the_scan_is_built_scans_as_numpy(device, direct, two_level):
    """``row_cumsum`` read through shared memory or into registers, its rakes' sums in rounds or in two levels (the
    library takes one pair per type; the probe measures them all): rows of several chunks and a tail."""
    from gpuworkbench.library import _row_kernels as rk

    x = rows("float32", False)
    with device.alloc(x.shape) as bx, device.alloc(x.shape) as out:
        bx.copy_from_host(x.reshape(-1))
        rk.row_cumsum("f32", True, direct, two_level, None).launch(3 * rk.ROW, out, bx, COLS).wait()
        got = out.copy_to_host().reshape(x.shape).astype(np.float64)
    want = x.astype(np.float64).cumsum(-1)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@every_backend
def test_16bit_layer_norm_over_a_shift_far_from_the_mean(device):
    """16-bit rows take sums shifted by their first value: right as NumPy where that value is an outlier, where the
    mean is far from zero, with 32 values per thread and step (rows of 8192 and more) and a tail."""
    skip_unheld(device, "float16")
    cols = 2 * 8192 + 77
    rng = np.random.default_rng(16)
    x = rng.normal(0, 3, (4, cols))
    x[1] += 1000
    x[2, 0] = 400
    x[3, 0] = -30000
    x = x.astype(np.float16)
    wide = x.astype(np.float64)
    want = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)
    assert close(lib.layer_norm(x, device=device), want, "float16")


@every_backend
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "cumsum"])
def test_result_written_over_the_input(device, op):
    x = np.random.default_rng(12).normal(0, 2, (3, COLS)).astype(np.float32)
    want = {
        "softmax": softmax(x.astype(np.float64)),
        "layer_norm": (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
        "cumsum": x.astype(np.float64).cumsum(-1),
    }[op]
    with device.alloc(x.shape) as buf:
        buf.copy_from_host(x.reshape(-1))
        s = device.create_stream("in-place")
        fn = getattr(lib, op)
        result = fn(buf, axis=-1, out=buf, stream=s) if op == "cumsum" else fn(buf, out=buf, stream=s)
        s.synchronize()
        assert result is buf
        got = buf.copy_to_host().reshape(x.shape).astype(np.float64)
        s.close()
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@every_backend
@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(70, 130), (1, 65), (129, 3)])
def test_transpose_tiles_cut_by_the_edges(device, name, shape):
    skip_unheld(device, name)
    x = np.random.default_rng(13).integers(-100, 100, shape).astype(name)
    assert np.array_equal(lib.transpose(x, device=device), x.T)


@every_backend
def test_distinct_kernel_refuses_one_buffer_twice(device):
    @gw.kernel(distinct=True)
    def add(i: gw.index, out: gw.f32[:], a: gw.f32[:], n: gw.i32):
        if i < n:
            out[i] = a[i] + 1.0

    assert "__restrict__ out" in add.source("cuda").replace("* __restrict__", " __restrict__")
    assert "restrict a" in add.source("opencl").replace("* restrict", " restrict")
    with device.alloc(8) as a, device.alloc(8) as out:
        a.copy_from_host(np.arange(8, dtype=np.float32))
        add.launch(8, out, a, 8)
        assert np.array_equal(out.copy_to_host(), np.arange(8) + 1.0)
        with pytest.raises(InvalidArgument, match="'out' and 'a' are the same buffer"):
            add.launch(8, a, a, 8)


@pytest.mark.parametrize("device", ["webgpu"], indirect=True)
def test_webgpu_refuses_a_written_buffer_bound_twice(device):
    @gw.kernel
    def double(i: gw.index, out: gw.f32[:], a: gw.f32[:], n: gw.i32):
        if i < n:
            out[i] = a[i] * 2.0

    with device.alloc(4) as a:
        with pytest.raises(InvalidArgument, match="WebGPU cannot bind a written buffer twice"):
            double.launch(4, a, a, 4)


@every_backend
@pytest.mark.parametrize("name", ["float32", "float64"])
@pytest.mark.parametrize("cols", [300, 2000])
def test_held_rows_as_the_online_kernels(device, name, cols):
    """The kernels that hold a row in shared memory (``_held_rows``) give what the online ones give, and NumPy."""
    skip_unheld(device, name)
    from gpuworkbench.library import _held_rows as hr
    from gpuworkbench.library import _row_kernels as rk
    from gpuworkbench.pykernel.ktypes import kernel_type

    t = kernel_type(np.dtype(name))
    hold = hr.hold_bytes(t, cols)
    assert hold >= cols * np.dtype(name).itemsize
    if hold + rk.ROW * 8 > device.backend_device.kernel_limits().shared_bytes:
        pytest.skip(f"{device.spec} has {device.backend_device.kernel_limits().shared_bytes} B of shared memory")
    x = np.random.default_rng(14).normal(0, 3, (3, cols)).astype(name)
    wide = x.astype(np.float64)
    want = {0: softmax(wide), 1: np.log(softmax(wide))}
    norm = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)
    with device.alloc(x.shape, name) as bx, device.alloc(x.shape, name) as out:
        bx.copy_from_host(x.reshape(-1))
        with device.alloc(cols, name) as g, device.alloc(cols, name) as b:
            g.copy_from_host(np.ones(cols, name))
            b.copy_from_host(np.zeros(cols, name))
            for kernel in (hr.row_layer_norm_held(t, hold), rk.row_layer_norm(t)):
                kernel.launch(3 * rk.ROW, out, bx, g, b, cols, 1e-5)
                assert close(out.copy_to_host().reshape(x.shape), norm, name), kernel
        for take_log, expected in want.items():
            for kernel in (hr.row_softmax_held(t, hold), rk.row_softmax(t)):
                kernel.launch(3 * rk.ROW, out, bx, cols, take_log)
                assert close(out.copy_to_host().reshape(x.shape), expected, name), (kernel, take_log)


def test_rows_past_what_shared_memory_holds_go_online():
    """A row longer than ``MOST_HELD`` bytes is not held, nor one of a 16-bit type: the library takes the online
    kernels, right as NumPy."""
    from gpuworkbench.library import _held_rows as hr

    cols = hr.MOST_HELD // 4 + 1
    assert hr.hold_bytes("f32", cols) == 0 and hr.hold_bytes("f32", cols - 1) == hr.MOST_HELD
    assert hr.hold_bytes("f16", 100) == 0
    x = np.random.default_rng(15).normal(0, 3, (2, cols)).astype(np.float32)
    got = lib.softmax(x, device="cpu")
    assert close(got, softmax(x.astype(np.float64)), "float32")


def test_the_library_holds_the_rows_that_fit():
    """Which kernel ran, told by its span's shared bytes: a float32 row of 300 values held (4 KiB and the block's
    reduction), a float16 row and a float32 row past ``MOST_HELD`` online (the reduction only)."""
    from gpuworkbench.library import _held_rows as hr

    cases = [(np.float32, 300, True), (np.float16, 300, False), (np.float32, hr.MOST_HELD // 4 + 1, False)]
    for dtype, cols, held in cases:
        x = np.random.default_rng(16).normal(0, 1, (2, cols)).astype(dtype)
        with gw.trace() as t:
            lib.softmax(x, device="cpu")
        table = t.table()
        shared = [int(b) for n, b in zip(table["name"], table["shared_bytes"]) if str(n).startswith("row_softmax")]
        reduction = 256 * 4  # ROW float32 accumulators
        assert shared == [hr.hold_bytes("f32", cols) + reduction if held else reduction], (dtype, cols)
