"""Tests of pykernel/: ``@gw.kernel`` functions checked against NumPy on every backend, refusals, sources, traces.

The same kernel objects run on cpu (NumPy), opencl (PoCL), webgpu (lavapipe) and cuda (marked gpu); WebGPU has no
f64 or i64, so those cases skip there.
"""

import importlib.util
import math
import os
import tempfile

import numpy as np
import pytest
from support import WITH_WEBGPU

import gpuworkbench as gw
from gpuworkbench.pykernel import ScalarType

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # quiets Mesa's loader
every_backend = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)
NO_WIDE_ON_WEBGPU = "WebGPU (WGSL) has 32-bit types only: no f64, no i64"


@gw.kernel
def saxpy(i: gw.index, y: gw.f32[:], x: gw.f32[:], a: gw.f32, n: gw.i32):
    """y = a·x + y over the first n elements."""
    if i < n:
        y[i] = a * x[i] + y[i]


@gw.kernel
def fold_clip(i: gw.index, out: gw.f32[:], x: gw.f32[:], lo: gw.f32, hi: gw.f32):
    v = x[i]
    if v < lo:
        out[i] = lo
    elif v > hi:
        out[i] = hi
    else:
        out[i] = v * 2 if v > 0 else -v


@gw.kernel
def row_sum(i: gw.index, out: gw.f32[:], a: gw.f32[:, gw.width.w], w: gw.i32, rows: gw.i32):
    if i >= rows:
        return
    total = 0.0
    for k in range(w):
        total += a[i, k]
    out[i] = total


@gw.kernel
def laplace(x: gw.index, y: gw.index, out: gw.f32[:, :], a: gw.f32[:, :]):
    out[y, x] = a.at(-1, 0) + a.at(1, 0) + a.at(0, -1) + a.at(0, 1) - 4 * a[y, x]


@gw.kernel
def math_mix(i: gw.index, out: gw.f32[:, gw.width.k], x: gw.f32[:], k: gw.i32):
    v = x[i]
    out[i, 0] = math.sqrt(abs(v)) + np.exp(v * 0.1)
    out[i, 1] = math.log(1.0 + v * v) + math.log10(1.0 + abs(v)) + math.log2(2.0 + v * v)
    out[i, 2] = math.sin(v) * math.cos(v) + np.tanh(v)
    out[i, 3] = math.floor(v) + math.ceil(v) + math.trunc(v)
    out[i, 4] = min(v, 0.5) + max(v, -0.5, v * 0.25)
    out[i, 5] = math.atan2(v, 2.0) + v**2 + pow(abs(v), 1.5)
    out[i, 6] = v // 0.75 + v % 0.75 + v / 3


def math_reference(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    return np.stack(
        [
            np.sqrt(abs(v)) + np.exp(v * 0.1),
            np.log(1 + v * v) + np.log10(1 + abs(v)) + np.log2(2 + v * v),
            np.sin(v) * np.cos(v) + np.tanh(v),
            np.floor(v) + np.ceil(v) + np.trunc(v),
            np.minimum(v, 0.5) + np.maximum(np.maximum(v, -0.5), v * 0.25),
            np.arctan2(v, 2) + v**2 + abs(v) ** 1.5,
            np.floor(v / 0.75) + np.remainder(v, 0.75) + v / 3,
        ],
        axis=1,
    )


def integer_kernel(t: ScalarType) -> gw.pykernel.PythonKernel:
    """One integer kernel per element type: Python's // and %, bitwise operators, shifts, abs/min/max, wrap-around."""

    @gw.kernel(name=f"int_ops_{t.name}")
    def int_ops(i: gw.index, out: t[:, gw.width.k], a: t[:], b: t[:], k: gw.i32):
        out[i, 0] = a[i] // b[i]
        out[i, 1] = a[i] % b[i]
        out[i, 2] = ((a[i] & 0xFF) ^ (b[i] << 2)) + (a[i] >> 1) - ~b[i]
        out[i, 3] = max(a[i], b[i]) - min(a[i], 3) + abs(a[i])
        out[i, 4] = a[i] - b[i] * 3 if a[i] != b[i] else 7

    return int_ops


INT_KERNELS = {name: integer_kernel(getattr(gw, name)) for name in ("i32", "u32", "i64")}


def integer_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    t = a.dtype.type
    return np.stack(
        [
            a // b,
            a % b,
            ((a & t(0xFF)) ^ (b << t(2))) + (a >> t(1)) - ~b,
            np.maximum(a, b) - np.minimum(a, t(3)) + np.abs(a),
            np.where(a != b, a - b * t(3), t(7)),
        ],
        axis=1,
    )


@gw.kernel
def triangle(i: gw.index, out: gw.i32[:]):
    total = 0
    for k in range(i):  # bounds that differ per index: the CPU loops over indices
        total += k // 3 - k % 5
    out[i] = total


@gw.kernel
def prefix_in_one_thread(i: gw.index, y: gw.f32[:], n: gw.i32):
    if i == 0:
        for k in range(1, n):
            y[k] += y[k - 1]


@gw.kernel
def next_difference(i: gw.index, out: gw.f32[:], x: gw.f32[:], n: gw.i32):
    ahead = x[i + 1] if i + 1 < n else x[i]  # the read past the end is never taken
    out[i] = ahead - x[i] if i + 1 < n and ahead > -1000.0 else 0.0


@gw.kernel
def scale64(i: gw.index, out: gw.f64[:], x: gw.f64[:], a: gw.f64):
    out[i] = math.sqrt(x[i]) * a + math.exp(-x[i]) / 3


def upload(device: gw.Device, host: np.ndarray) -> gw.Buffer:
    buf = device.alloc(host.size, host.dtype)
    buf.copy_from_host(np.ascontiguousarray(host).reshape(-1))
    return buf


def skip_wide_on_webgpu(device: gw.Device, *dtypes: str) -> None:
    if device.backend_kind is gw.BackendKind.WEBGPU and set(dtypes) & {"float64", "int64", "i64", "f64"}:
        pytest.skip(NO_WIDE_ON_WEBGPU)


# ------------------------------------------------------------------------------------------------------ every backend
@every_backend
@pytest.mark.parametrize("n", [1, 300, 1000])
def test_saxpy_launch_and_explicit_grid(device, n):
    rng = np.random.default_rng(n)
    x, y = rng.integers(-50, 50, n).astype(np.float32), rng.integers(-50, 50, n).astype(np.float32)
    s = device.create_stream("py")
    with upload(device, x) as bx, upload(device, y) as by:
        ev = saxpy.launch(n, by, bx, 2.0, n - 1, stream=s)
        assert isinstance(ev, gw.Event) and ev.stream is s
        ev.wait()
        expected = y.copy()
        expected[: n - 1] += 2 * x[: n - 1]
        assert np.array_equal(by.copy_to_host(), expected)
        saxpy((n + 63) // 64, 64, (by, bx, -1.0, n)).wait()  # grid × block covers n; the kernel checks i < n
        expected -= x
        assert np.array_equal(by.copy_to_host(), expected)
    s.close()


@every_backend
def test_if_elif_else_and_conditional_expression(device):
    x = np.linspace(-5, 5, 501).astype(np.float32)
    with upload(device, x) as bx, device.alloc(x.size) as out:
        fold_clip.launch(x.size, out, bx, -2.0, 3.0).wait()
        expected = np.where(x < -2, -2, np.where(x > 3, 3, np.where(x > 0, x * 2, -x))).astype(np.float32)
        assert np.array_equal(out.copy_to_host(), expected)


@every_backend
def test_loop_reduction_per_row(device):
    rows, w = 40, 37
    a = np.random.default_rng(3).integers(-9, 9, (rows, w)).astype(np.float32)
    with upload(device, a) as ba, device.alloc(rows + 5) as out:
        out.fill_bytes(0).wait()
        row_sum.launch(rows + 5, out, ba, w, rows).wait()  # the extra indices return early
        result = out.copy_to_host()
        assert np.array_equal(result[:rows], a.sum(axis=1)) and not result[rows:].any()


@every_backend
@pytest.mark.parametrize("shape", [(13, 17), (1, 5), (32, 16)])
def test_five_point_stencil_with_clamped_edges(device, shape):
    img = np.random.default_rng(4).integers(-9, 9, shape).astype(np.float32)
    padded = np.pad(img, 1, mode="edge")
    expected = padded[1:-1, :-2] + padded[1:-1, 2:] + padded[:-2, 1:-1] + padded[2:, 1:-1] - 4 * img
    with upload(device, img) as bi, device.alloc(img.size) as out:
        laplace.launch(img.shape, out, bi).wait()
        assert np.array_equal(out.copy_to_host().reshape(shape), expected)


@every_backend
def test_stencil_with_explicit_grid_and_block(device):
    img = np.arange(16 * 8, dtype=np.float32).reshape(8, 16) % 7
    padded = np.pad(img, 1, mode="edge")
    expected = padded[1:-1, :-2] + padded[1:-1, 2:] + padded[:-2, 1:-1] + padded[2:, 1:-1] - 4 * img
    with upload(device, img) as bi, device.alloc(img.size) as out:
        laplace((2, 2), (8, 4), (out, bi)).wait()  # x: 2 blocks of 8 columns, y: 2 blocks of 4 rows
        assert np.array_equal(out.copy_to_host().reshape(8, 16), expected)


@every_backend
def test_math_functions(device):
    x = np.linspace(-3.7, 4.1, 203).astype(np.float32)
    k = 7
    with upload(device, x) as bx, device.alloc(x.size * k) as out:
        math_mix.launch(x.size, out, bx, k).wait()
        result = out.copy_to_host().reshape(-1, k)
    expected = math_reference(x)
    for col in range(k):
        assert np.allclose(result[:, col], expected[:, col], rtol=2e-5, atol=2e-5), col


@every_backend
@pytest.mark.parametrize("type_name", ["i32", "u32", "i64"])
def test_integer_types(device, type_name):
    skip_wide_on_webgpu(device, type_name)
    kernel = INT_KERNELS[type_name]
    dtype = getattr(gw, type_name).dtype
    rng = np.random.default_rng(5)
    low = 0 if dtype.kind == "u" else -60
    a, b = rng.integers(low, 60, 257).astype(dtype), rng.integers(1, 9, 257).astype(dtype)
    if dtype.kind == "i":
        b[::2] *= dtype.type(-1)  # negative divisors: Python's floor and sign-of-divisor rules
    with upload(device, a) as ba, upload(device, b) as bb, device.alloc(a.size * 5, dtype) as out:
        kernel.launch(a.size, out, ba, bb, 5).wait()
        result = out.copy_to_host().reshape(-1, 5)
    with np.errstate(over="ignore"):
        expected = integer_reference(a, b)
    for col in range(5):
        assert np.array_equal(result[:, col], expected[:, col]), col


@every_backend
def test_float64(device):
    skip_wide_on_webgpu(device, "f64")
    x = np.linspace(0, 9, 100)
    with upload(device, x) as bx, device.alloc(x.size, "float64") as out:
        scale64.launch(x.size, out, bx, 1.5).wait()
        assert np.allclose(out.copy_to_host(), np.sqrt(x) * 1.5 + np.exp(-x) / 3, rtol=1e-12)


@every_backend
def test_per_index_loop_bounds(device):
    with device.alloc(50, "int32") as out:
        triangle.launch(50, out).wait()
        assert np.array_equal(out.copy_to_host(), [sum(k // 3 - k % 5 for k in range(i)) for i in range(50)])


@every_backend
def test_one_thread_writes_many_elements(device):
    y = np.arange(1, 41, dtype=np.float32)
    with upload(device, y) as by:
        prefix_in_one_thread.launch(64, by, y.size).wait()
        assert np.array_equal(by.copy_to_host(), np.cumsum(y))


@every_backend
def test_conditional_reads_past_the_end_are_not_taken(device):
    x = (np.arange(100, dtype=np.float32) ** 2) % 17
    with upload(device, x) as bx, device.alloc(x.size) as out:
        next_difference.launch(x.size, out, bx, x.size).wait()
        assert np.array_equal(out.copy_to_host(), np.append(np.diff(x), 0))


THIRD, OFFSET = 1 / 3, np.float32(2)  # numbers from outside the kernel: read when it is decorated


@gw.kernel
def smooth(i: gw.index, out: gw.f32[:], x: gw.f32[:]):
    out[i] = (x.at(-1) + x[i] + x.at(1)) * THIRD + OFFSET


@every_backend
def test_one_dimensional_neighbours_and_outside_constants(device):
    x = (np.arange(50, dtype=np.float32) * 7) % 11
    padded = np.pad(x, 1, mode="edge")
    expected = (padded[:-2] + x + padded[2:]) / np.float32(3) + np.float32(2.0)
    with upload(device, x) as bx, device.alloc(x.size) as out:
        smooth.launch(x.size, out, bx).wait()
        assert np.allclose(out.copy_to_host(), expected, rtol=1e-6)


@every_backend
def test_launch_appears_in_the_trace_by_name(device):
    x = np.ones(64, np.float32)
    with upload(device, x) as bx, upload(device, x) as by, gw.trace() as t:
        saxpy.launch(64, by, bx, 1.0, 64).wait()
    kernels = [sp for sp in t.spans if sp.kind == "kernel"]
    assert [sp.name for sp in kernels] == ["saxpy"]


@every_backend
def test_compiles_lazily_once_per_device(device):
    @gw.kernel
    def fill(i: gw.index, out: gw.i32[:], v: gw.i32):
        out[i] = v + i

    assert not fill._cache
    with device.alloc(10, "int32") as out:
        fill.launch(10, out, 3).wait()
        first = fill.compile(device)
        fill.launch(10, out, 4).wait()
        assert fill.compile(device) is first and len(fill._cache) == 1
        assert np.array_equal(out.copy_to_host(), np.arange(10) + 4)


# ------------------------------------------------------------------------------------------------ CPU strategy, sources
def test_cpu_strategy_vectorised_or_loop():
    for k in (saxpy, fold_clip, row_sum, laplace, math_mix, prefix_in_one_thread, next_difference):
        assert k.cpu_strategy == "vectorised" and k.cpu_strategy_reason == "", k.name
    assert triangle.cpu_strategy == "loop"
    line = triangle.__wrapped__.__code__.co_firstlineno + 3  # the for statement
    assert f"line {line}" in triangle.cpu_strategy_reason
    assert "loop: one index at a time" in triangle.source("numpy") and "vectorised" in saxpy.source("numpy")

    @gw.kernel
    def early_exit(i: gw.index, out: gw.f32[:], x: gw.f32[:], n: gw.i32):
        for k in range(n):
            if x[k] > 0:
                return  # a return inside a loop cannot be folded into if/else
        out[i] = 1.0

    assert early_exit.cpu_strategy == "loop" and "return" in early_exit.cpu_strategy_reason


def test_cpu_loop_fallback_runs_return_inside_a_loop(cpu):
    @gw.kernel
    def first_positive(i: gw.index, out: gw.i32[:], x: gw.f32[:, gw.width.w], w: gw.i32):
        out[i] = -1
        for k in range(w):
            if x[i, k] > 0:
                out[i] = k
                return

    x = np.array([[0, 0, 2], [1, 0, 0], [0, 0, 0]], np.float32)
    with upload(cpu, x) as bx, cpu.alloc(3, "int32") as out:
        first_positive.launch(3, out, bx, 3).wait()
        assert out.copy_to_host().tolist() == [2, 0, -1]


@pytest.mark.parametrize("language", ["cuda", "opencl", "wgsl", "numpy"])
def test_source_is_viewable(language):
    for k in (saxpy, laplace, triangle):
        text = k.source(language)
        assert k.name in text and __file__ in text
    assert "@workgroup_size(8, 4)" in laplace.source("wgsl", block=(8, 4))


def test_source_refuses_what_a_language_lacks():
    with pytest.raises(gw.InvalidArgument, match=r"WebGPU \(WGSL\) has f32, i32, u32 and .*f16 only"):
        scale64.source("wgsl")
    with pytest.raises(gw.InvalidArgument, match="not one of"):
        saxpy.source("metal")
    assert "cl_khr_fp64" in scale64.source("opencl") and "double" in scale64.source("cuda")


def test_generated_c_keeps_python_semantics_explicit():
    cuda, opencl = INT_KERNELS["i32"].source("cuda"), INT_KERNELS["i32"].source("opencl")
    assert "gw_floordiv_i32" in cuda and "gw_mod_i32" in opencl  # Python's floor and sign-of-divisor rules
    assert "__device__" in cuda and 'extern "C" __global__ void int_ops_i32(' in cuda
    assert "__kernel void int_ops_i32(" in opencl
    assert "gw_floordiv" not in INT_KERNELS["u32"].source("cuda")  # unsigned: C's / is already the floor


def test_string_annotations_and_keyword_name():
    @gw.kernel(name="doubled")
    def twice(i: "gw.index", out: "gw.f32[:]", x: "gw.f32[:]"):
        out[i] = 2 * x[i]

    assert twice.name == "doubled" and "void doubled(" in twice.source("opencl")
    assert "doubled" in repr(twice) and "vectorised" in repr(twice)


def test_names_that_clash_with_generated_code_are_renamed(cpu):
    @gw.kernel
    def kernel(i: gw.index, float: gw.f32[:], int: gw.i32):  # noqa: A002 - clashing on purpose
        float[i] = int

    for language in ("cuda", "opencl", "wgsl"):
        text = kernel.source(language)
        assert "float_[i]" in text and " kernel(" not in text
    with cpu.alloc(4) as out:
        kernel.launch(4, out, 3).wait()
        assert (out.copy_to_host() == 3).all()


def test_constants_are_read_when_decorated(cpu):
    scale = 3

    @gw.kernel
    def scaled(i: gw.index, out: gw.i32[:]):
        out[i] = i * scale + int(math.pi)

    scale = 100  # too late: the kernel already holds 3
    with cpu.alloc(5, "int32") as out:
        scaled.launch(5, out).wait()
        assert out.copy_to_host().tolist() == [3, 6, 9, 12, 15] and scale == 100


# ------------------------------------------------------------------------------------------------------ argument checks
def test_argument_errors(cpu):
    with cpu.alloc(10) as bf, cpu.alloc(10, "int32") as bi, cpu.alloc(6) as small:
        with pytest.raises(gw.InvalidArgument, match="takes 4 arguments"):
            saxpy.launch(10, bf, bf, 1.0)
        with pytest.raises(gw.InvalidArgument, match="the buffer holds int32"):
            saxpy.launch(10, bi, bf, 1.0, 10)
        with pytest.raises(gw.InvalidArgument, match="pass a Buffer"):
            saxpy.launch(10, np.zeros(10, np.float32), bf, 1.0, 10)
        with pytest.raises(gw.InvalidArgument, match="not a whole number"):
            saxpy.launch(10, bf, bf, 1.0, 2.5)
        with pytest.raises(gw.InvalidArgument, match="does not fit"):
            saxpy.launch(10, bf, bf, 1.0, 2**40)
        with pytest.raises(gw.InvalidArgument, match="2-D kernel"):
            laplace.launch(10, bf, bf)
        with pytest.raises(gw.InvalidArgument, match="holds 6 elements"):
            laplace.launch((3, 3), bf, small)
        with pytest.raises(gw.InvalidArgument, match="grid"):
            laplace(4, (2, 2), (bf, bf))
        empty = saxpy.launch(0, bf, bf, 1.0, 0)  # nothing to run: only a marker on the stream
        empty.wait()
        assert empty.done


# ------------------------------------------------------------------------------------------------------------ refusals
PRELUDE = """\
import math
import gpuworkbench as gw

LIMITS = [1, 2]
SCALE = 2.5


def helper(v):
    return v


@gw.kernel
def bad(i: gw.index, y: gw.f32[:], n: gw.i32):
"""
REFUSED = {
    "while": (["while y[i] < 1.0:  # <-", "    y[i] += 1.0"], "while loops are not supported"),
    "try": (["try:  # <-", "    y[i] = 1.0", "except ValueError:", "    pass"], "try/except"),
    "unknown call": (["y[i] = helper(y[i])  # <-"], "calls to 'helper' are not supported"),
    "print": (["print(i)  # <-"], "calls to 'print'"),
    "global list": (["t = LIMITS  # <-"], "'LIMITS' refers to a list"),
    "list comprehension": (["t = [k for k in range(3)]  # <-"], "list comprehensions"),
    "lambda": (["f = lambda v: v  # <-"], "lambdas"),
    "break": (["for k in range(n):", "    break  # <-"], "break is not supported"),
    "assign a parameter": (["n = 3  # <-"], "parameter 'n' cannot be assigned"),
    "float into an int local": (["t = 0", "t = y[i] * SCALE  # <-"], "would be truncated"),
    "slice": (["y[0:2] = 1.0  # <-"], "slices are not supported"),
    "return a value": (["return 1  # <-"], "kernels return nothing"),
    "string": (["t = 'a'  # <-"], "not a number"),
    "loop variable after its loop": (["for k in range(n):", "    y[k] = 0.0", "y[i] = k  # <-"], "inside its loop"),
    "undefined": (["y[i] = missing  # <-"], "'missing' is not defined"),
    "used before assigned": (["y[i] = t  # <-", "t = 1.0"], "used before it is assigned"),
    "array without index": (["t = y  # <-"], "must be indexed"),
    "wrong dimensions": (["y[i, 0] = 1.0  # <-"], "is 1-D"),
    "float index": (["y[i * 0.5] = 1.0  # <-"], "an index must be an integer"),
    "with": (["with open('x'):  # <-", "    pass"], "with blocks"),
    # cooperative kernels: barriers every thread of a block must reach, shared arrays, block indices
    "barrier under an if on the index": (["if i < n:", "    gw.barrier()  # <-"], "under the if at line"),
    "barrier in an else": (["if i < n:", "    y[i] = 1.0", "else:", "    gw.barrier()  # <-"], "depends on the thread"),
    "barrier under an if on local_id": (["if gw.local_id(0) == 0:", "    gw.barrier()  # <-"], "depends on the thread"),
    "barrier under an if on array data": (["if y[0] > 0.0:", "    gw.barrier()  # <-"], "depends on the thread"),
    "barrier under a local from the index": (
        ["t = i * 2", "if t > 4:", "    gw.barrier()  # <-"],
        "depends on the thread",
    ),
    "barrier under a local set in a branch": (
        ["t = 0", "if i > 2:", "    t = 1", "if t > 0:", "    gw.barrier()  # <-"],
        "depends on the thread",
    ),
    "barrier in a per-thread loop": (["for k in range(i):", "    gw.barrier()  # <-"], "in the loop at line"),
    "barrier after a divergent return": (["if i >= n:", "    return", "gw.barrier()  # <-"], "after a return"),
    "barrier in a loop with a divergent return": (
        ["for k in range(n):", "    gw.barrier()  # <-", "    if y[i] > 0.0:", "        return"],
        "in a loop with a return",
    ),
    "barrier with arguments": (["gw.barrier(1)  # <-"], "takes no arguments"),
    "barrier as a value": (["t = gw.barrier()  # <-"], "a statement on its own line"),
    "shared inside an if": (["if n > 0:", "    s = gw.shared(64, gw.f32)  # <-"], "at the top level"),
    "shared of a variable size": (["s = gw.shared(n, gw.f32)  # <-"], "positive constant ints"),
    "shared in three dimensions": (["s = gw.shared((2, 2, 2), gw.f32)  # <-"], "1 or 2 dimensions"),
    "shared of an unknown type": (["s = gw.shared(64, 'complex64')  # <-"], "a shared array's type"),
    "shared assigned": (["s = gw.shared(64, gw.f32)", "s = 1.0  # <-"], "is declared once"),
    "shared declared twice": (["s = gw.shared(64, gw.f32)", "s = gw.shared(8, gw.f32)  # <-"], "already"),
    "shared inside an expression": (["t = gw.shared(64, gw.f32) + 1  # <-"], "on its own line"),
    "shared without an index": (["s = gw.shared(64, gw.f32)", "t = s[0] + s  # <-"], "must be indexed"),
    "shared neighbour read": (["s = gw.shared(64, gw.f32)", "y[i] = s.at(1)  # <-"], "not shared arrays"),
    "axis 1 in a 1-D kernel": (["t = gw.local_id(1)  # <-"], "the axis is 0"),
    "axis not a constant": (["t = gw.group_id(n)  # <-"], "the axis is 0"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_python_is_refused_at_decoration_pointing_at_the_line(tmp_path, case):
    body, message = REFUSED[case]
    path = tmp_path / "user_kernels.py"
    path.write_text(PRELUDE + "".join(f"    {line}\n" for line in body))
    marked = next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.endswith("# <-"))
    spec = importlib.util.spec_from_file_location("user_kernels", path)
    with pytest.raises(gw.CompileError) as info:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    error = info.value
    assert message in str(error)
    assert (error.filename, error.lineno) == (str(path), marked)
    assert f"{path}:{marked}:" in str(error) and error.line in str(error) and error.line.endswith("# <-")


def test_refused_signatures():
    with pytest.raises(gw.CompileError, match="needs a type annotation"):

        @gw.kernel
        def untyped(i: gw.index, y):
            y[i] = 1.0

    with pytest.raises(gw.CompileError, match="thread index"):

        @gw.kernel
        def no_index(y: gw.f32[:]):
            y[0] = 1.0

    with pytest.raises(gw.CompileError, match="row width"):

        @gw.kernel
        def flat_2d(i: gw.index, y: gw.f32[:, :]):
            y[i, 0] = 1.0

    with pytest.raises(gw.CompileError, match="launch shape"):

        @gw.kernel
        def narrow_at(x: gw.index, y: gw.index, a: gw.f32[:, gw.width.w], w: gw.i32):
            a[y, x] = a.at(1, 0)

    with pytest.raises(gw.InvalidArgument, match="is not one of"):
        gw.f32[1:2]
    assert gw.f32[:, "w"].width == gw.f32[:, gw.width.w].width == "w"  # the string says the same, linters aside


def test_wgsl_keeps_a_compound_row_index_one_operand():
    """A 2-D read whose row is an expression: WGSL's flat index is ``(y + 1) * w + x`` (its index type needs no cast,
    and the missing cast once dropped the parentheses: ``y + 1 * w + x`` read the wrong element)."""

    @gw.kernel
    def shift_down(x: gw.index, y: gw.index, out: gw.f32[:, :], a: gw.f32[:, :], rows: gw.i32):
        if y + 1 < rows:
            out[y, x] = a[y + 1, x]

    source = shift_down.source("wgsl")
    assert "a[(y + 1i) * gw_args.gw_nx + x]" in source, source


@every_backend
def test_a_repeated_launch_skips_the_checks_until_a_buffer_is_freed(device, monkeypatch):
    @gw.kernel
    def scale(i: gw.index, y: gw.f32[:], x: gw.f32[:], a: gw.f32, n: gw.i32):
        if i < n:
            y[i] = a * x[i]

    checks = []
    full = scale._prepare
    monkeypatch.setattr(scale, "_prepare", lambda *a: checks.append(1) or full(*a))
    x, y = device.alloc(8), device.alloc(8)
    x.copy_from_host(np.arange(8, dtype=np.float32))
    for _ in range(3):
        scale.launch(8, y, x, 2.0, 8)
    assert len(checks) == 1 and np.array_equal(y.copy_to_host(), 2 * np.arange(8))
    scale.launch(8, y, x, 3.0, 8)  # another scalar value: checked again
    assert len(checks) == 2 and np.array_equal(y.copy_to_host(), 3 * np.arange(8))
    x.free()  # every entry is stale now: the next launch is checked, and a freed buffer is refused
    with pytest.raises(gw.GpuError):
        scale.launch(8, y, x, 3.0, 8)
    z = device.alloc(8)
    z.copy_from_host(np.ones(8, np.float32))
    scale.launch(8, y, z, 3.0, 8)
    assert np.array_equal(y.copy_to_host(), np.full(8, 3.0))
    with pytest.raises(gw.InvalidArgument, match="the buffer holds int32"):
        scale.launch(8, y, device.alloc(8, "int32"), 3.0, 8)
    y.free()
    z.free()
