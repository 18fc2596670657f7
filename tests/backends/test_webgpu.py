"""WebGPU backend on lavapipe (Mesa's software Vulkan): copies, WGSL kernels, elementwise, errors and traced spans.

Skipped cleanly where wgpu or a Vulkan adapter is missing (``apt-get install mesa-vulkan-drivers libvulkan1``).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

import gpuworkbench as gw

# Mesa's loader warns about a missing XDG_RUNTIME_DIR; a private one keeps test output clean.
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))
pytest.importorskip("wgpu")

SAXPY = """
struct Args { a: f32, n: u32 }
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<uniform> args: Args;

@compute @workgroup_size(64)
fn saxpy(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < args.n) { y[id.x] = args.a * x[id.x] + y[id.x]; }
}
"""
SPIN = """
@group(0) @binding(0) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn spin(@builtin(global_invocation_id) id: vec3<u32>) {
    var v = y[id.x];
    for (var k = 0; k < 2000; k++) { v = v * 0.999 + 0.001; }
    y[id.x] = v;
}
"""


def _lavapipe_spec() -> str:
    ok, why = gw.backends.get("webgpu").available()
    if not ok:
        pytest.skip(f"no WebGPU adapter: {why}")
    found = [d for d in gw.devices() if d.backend == "webgpu"]
    soft = [d for d in found if "llvmpipe" in d.name]
    return f"webgpu:{(soft or found)[0].index}"


@pytest.fixture(scope="module")
def dev():
    return gw.Device(_lavapipe_spec())


@pytest.fixture(autouse=True)
def no_leak(dev):
    held = dev.held_bytes
    yield
    assert dev.held_bytes == held, "a test leaked device memory"


def test_caps_and_info(dev):
    assert not dev.caps.concurrent_streams  # one queue: streams serialise
    assert dev.caps.timestamps == "timestamp-query"
    assert dev.caps.kernel_language == "wgsl"
    assert not dev.caps.memory_free_known
    free, total = dev.memory_info()
    assert total == dev.info.total_memory and free <= total
    if "llvmpipe" in dev.name:
        assert "(CPU)" in dev.name and not dev.info.is_gpu  # auto-selection must never pick a software adapter


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8"])
@pytest.mark.parametrize("n", [0, 1, 1000, 3 * (1 << 20) + 7])
def test_round_trip(dev, dtype, n):
    a = (np.arange(n) % 251).astype(dtype)
    with dev.alloc(n, dtype) as buf:
        buf.copy_from_host(a)
        assert np.array_equal(buf.copy_to_host(), a)
        host = dev.empty_pinned(n, dtype)
        s = dev.create_stream()
        buf.copy_to_host_async(host, s)
        s.synchronize()  # synchronize alone must deliver the data
        assert np.array_equal(host, a)


def test_later_op_delivers_earlier_read_back(dev):
    a = np.arange(1000, dtype=np.float32)
    host = np.zeros_like(a)
    with dev.alloc(1000) as buf:
        buf.copy_from_host(a)
        s = dev.create_stream()
        buf.copy_to_host_async(host, s)  # its Event is never looked at
        s.record().wait()  # a later op on the same stream: everything before it is done, read-backs included
        assert np.array_equal(host, a)
        s.close()


def test_device_copy_and_fill(dev):
    n = 1001  # not a whole number of 4-byte words
    a = (np.arange(n) % 200).astype(np.uint8)
    with dev.alloc(n, "uint8") as src, dev.alloc(n, "uint8") as dst:
        src.copy_from_host(a)
        dst.copy_from(src).wait()
        assert np.array_equal(dst.copy_to_host(), a)
        dst.fill_bytes(0).wait()
        assert not dst.copy_to_host().any()
        dst.fill_bytes(7).wait()
        assert (dst.copy_to_host() == 7).all()
        assert np.array_equal(src.copy_to_host(), a)


def test_raw_wgsl_kernel(dev):
    n = 100_003
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    with dev.alloc(n) as bx, dev.alloc(n) as by:
        bx.copy_from_host(x)
        by.copy_from_host(np.ones(n, np.float32))
        k = dev.compile(SAXPY, "saxpy")
        k((n + 63) // 64, 64, (by, bx, 2.0, np.uint32(n))).wait()
        assert np.allclose(by.copy_to_host(), 2 * x + 1)
        with pytest.raises(gw.InvalidArgument, match="WGSL scalars"):
            k(1, 64, (by, bx, np.float64(2.0), np.uint32(n)))


def test_elementwise_matches_numpy(dev):
    n = 70_001
    rng = np.random.default_rng(1)
    x = rng.random(n, dtype=np.float32)
    i = rng.integers(-1000, 1000, n).astype(np.int32)
    u = rng.integers(0, 9, n).astype(np.uint32)
    f = gw.elementwise("float32 x, float32 a, float32 y", "y = where(x > 0.5, sqrt(x), -x) + a * x")
    body = "out = i / 3 + (i % 5) * (u > 2) - min(i, 7) + where(i & u, 1, 2)"
    g = gw.elementwise("int32 i, uint32 u, int32 out", body)
    with dev.alloc(n) as bx, dev.alloc(n) as by, dev.alloc(n, "int32") as bi, dev.alloc(n, "uint32") as bu:
        with dev.alloc(n, "int32") as bo:
            bx.copy_from_host(x)
            bi.copy_from_host(i)
            bu.copy_from_host(u)
            f(bx, 3.0, by).wait()
            g(bi, bu, bo).wait()
            assert np.allclose(by.copy_to_host(), np.where(x > 0.5, np.sqrt(x), -x) + 3 * x, rtol=1e-6)
            expected = np.trunc(i / 3).astype(np.int32) + np.fmod(i, 5) * (u > 2) - np.minimum(i, 7)
            expected += np.where((i != 0) & (u != 0), 1, 2)
            assert np.array_equal(bo.copy_to_host(), expected)
    with dev.alloc(4, "float64") as a, dev.alloc(4, "float64") as b:
        with pytest.raises(gw.InvalidArgument, match="float64"):
            gw.elementwise("float64 a, float64 b", "b = a")(a, b)


def test_elementwise_past_one_grid_dimension(dev):
    n = 65535 * 256 + 5  # more workgroups than one dimension may hold: the rest go to y
    with dev.alloc(n, "uint32") as y:
        gw.elementwise("uint32 y", "y = 5")(y).wait()
        assert (y.copy_to_host() == 5).all()


def test_shader_error_raises_compile_error(dev):
    with pytest.raises(gw.CompileError) as info:
        dev.compile("@compute @workgroup_size(1) fn main() { undefined_fn(); }", "main")
    assert "undefined_fn" in info.value.log and "undefined_fn" in str(info.value)
    with pytest.raises(gw.CompileError, match="entry point"):
        dev.compile(SAXPY, "not_there")


def test_spans_have_device_timestamps_and_streams_serialise(dev):
    n = 64 * 256
    host = np.ones(n, np.float32)
    spin = dev.compile(SPIN, "spin")
    with dev.alloc(n) as a, dev.alloc(n) as b:
        s1, s2 = dev.create_stream("one"), dev.create_stream("two")
        with gw.trace() as t:
            a.copy_from_host_async(host, s1)
            b.copy_from_host_async(host, s2)
            for _ in range(3):
                spin(256, 64, (a,), stream=s1)
                spin(256, 64, (b,), stream=s2)
            a.copy_to_host_async(np.empty(n, np.float32), s1)
            s1.synchronize()
            s2.synchronize()
        spans = t.spans
        clock = t.devices[0]
        assert clock.source == "timestamp-query"
        ops = [s for s in spans if s.stream >= 0]
        assert sorted(s.kind for s in ops) == ["d2h", "h2d", "h2d"] + ["kernel"] * 6
        assert all(t.started_ns - 5_000_000 <= s.start_ns <= s.end_ns <= t.stopped_ns + 5_000_000 for s in ops)
        kernels = sorted((s for s in ops if s.kind == "kernel"), key=lambda s: s.start_ns)
        assert {s.stream for s in kernels} == {s1.id, s2.id}
        assert all(s.end_ns > s.start_ns for s in kernels)
        for earlier, later in zip(kernels, kernels[1:]):
            assert later.start_ns >= earlier.end_ns  # one queue: never two kernels at once
        s1.close()
        s2.close()
