"""Tests of buffer.py: round trips for dtypes and sizes, async copies on several streams, d2d, fill, lifetime."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
from support import sample

import gpuworkbench as gw

DTYPES = ["float32", "float64", "int32", "uint8", "int64", "int16", "complex64"]
SIZES = [0, 1, 7, 1000, 4097]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_round_trip(device, dtype, n):
    data = sample(n, dtype, seed=n)
    with gw.Buffer.allocate(device, n, dtype) as buf:
        assert len(buf) == buf.len == n
        assert buf.dtype == np.dtype(dtype) and buf.size_bytes == n * np.dtype(dtype).itemsize
        buf.copy_from_host(data)
        back = buf.copy_to_host()
        assert back.dtype == np.dtype(dtype) and back.shape == (n,)
        assert np.array_equal(back, data)
        out = np.full(n, 3, dtype)
        assert buf.copy_to_host(out) is out and np.array_equal(out, data)
    assert buf.closed


def test_multidimensional_and_strided_sources(device):
    grid = sample(60, "float32").reshape(6, 10)
    with device.alloc(60) as buf:
        buf.copy_from_host(grid)  # same element count: shape does not matter
        assert np.array_equal(buf.copy_to_host(), grid.ravel())
        strided = sample(120, "float32")[::2]
        buf.copy_from_host(strided)  # a blocking copy may take a strided view; it is made contiguous first
        assert np.array_equal(buf.copy_to_host(), strided)
        out2d = np.empty((6, 10), np.float32)
        buf.copy_to_host(out2d)
        assert np.array_equal(out2d.ravel(), strided)


@pytest.mark.parametrize("n", [0, 1, 3333])
def test_async_copies_on_several_streams(device, n):
    streams = [device.create_stream(f"copy-{i}") for i in range(4)]
    data = [sample(n, "float64", seed=i) for i in range(4)]
    bufs = [device.alloc(n, "float64") for _ in range(4)]
    back = [device.empty_pinned(n, "float64") for _ in range(4)]
    ups = [b.copy_from_host_async(d, s) for b, d, s in zip(bufs, data, streams)]
    downs = [b.copy_to_host_async(h, s) for b, h, s in zip(bufs, back, streams)]  # in order after each upload
    for ev in downs:
        ev.wait()
    assert all(ev.done for ev in ups + downs)
    for h, d in zip(back, data):
        assert np.array_equal(h, d)
    for b in bufs:
        b.free()
    for s in streams:
        s.close()


def test_pinned_and_pageable_async_copies(device):
    n = 10_000
    pinned = device.empty_pinned(n, "int32")
    pinned[:] = sample(n, "int32", seed=1)
    pageable = sample(n, "int32", seed=2)
    s = device.create_stream()
    with device.alloc(n, "int32") as a, device.alloc(n, "int32") as b:
        a.copy_from_host_async(pinned, s)
        b.copy_from_host_async(pageable, s)
        s.synchronize()
        assert np.array_equal(a.copy_to_host(), pinned)
        assert np.array_equal(b.copy_to_host(), pageable)
    s.close()


def test_async_copy_keeps_host_array_alive_until_done(cpu, gate):
    s = cpu.create_stream("blocked")
    gate.close_on(s)
    host = sample(1000, "float32")
    expected = host.copy()
    alive = weakref.ref(host)
    with cpu.alloc(1000) as buf:
        ev = buf.copy_from_host_async(host, s)
        del host
        gc.collect()
        assert alive() is not None and not ev.done  # the pending copy holds it
        gate.open()
        ev.wait()
        s.synchronize()
        assert np.array_equal(buf.copy_to_host(), expected)
        del ev
        gc.collect()
        assert alive() is None  # and lets it go once the copy is done
    s.close()


def test_blocking_copies_order_after_pending_work_on_other_streams(cpu, gate):
    s = cpu.create_stream("writer")
    data = sample(5000, "float32")
    with cpu.alloc(5000) as buf:
        buf.copy_from_host(np.zeros(5000, np.float32))
        gate.close_on(s)
        buf.copy_from_host_async(data, s)  # waits behind the gate
        threading.Timer(0.02, gate.open).start()  # opens while the read-back below is already enqueued
        assert np.array_equal(buf.copy_to_host(), data)  # ordered after the upload on the other stream
    s.close()


def test_device_to_device_copy(device):
    data = sample(2049, "int32")
    s = device.create_stream("d2d")
    with device.alloc(2049, "int32") as src, device.alloc(2049, "int32") as dst, device.alloc(2049, "int32") as dst2:
        src.copy_from_host(data)
        dst.copy_from(src).wait()
        assert np.array_equal(dst.copy_to_host(), data)
        dst2.copy_from(dst, stream=s).wait()
        assert np.array_equal(dst2.copy_to_host(), data)
    with device.alloc(2049, "float32") as same_bytes, device.alloc(2049, "int32") as src:
        src.copy_from_host(data)
        same_bytes.copy_from(src).wait()  # a byte copy: same size in bytes is enough
        assert np.array_equal(same_bytes.copy_to_host().view(np.int32), data)
    with device.alloc(0) as e1, device.alloc(0) as e2:
        e1.copy_from(e2).wait()
    s.close()


@pytest.mark.parametrize("byte", [0, 1, 0x7F, 0xFF])
def test_fill_bytes(device, byte):
    s = device.create_stream()
    with device.alloc(1001, "uint16") as buf:
        buf.copy_from_host(np.full(1001, 12345, np.uint16))
        buf.fill_bytes(byte, stream=s).wait()
        assert np.array_equal(buf.copy_to_host().view(np.uint8), np.full(2002, byte, np.uint8))
        buf.fill_bytes().wait()  # default: zeros on the default stream
        assert not buf.copy_to_host().any()
    with device.alloc(0) as empty:
        empty.fill_bytes(9).wait()
    s.close()


def test_free_is_idempotent_and_context_manager_frees(device):
    buf = device.alloc(256, "float64")
    assert device.held_bytes == 2048
    buf.free()
    buf.free()
    assert buf.closed and device.held_bytes == 0
    with device.alloc(4) as b2:
        assert not b2.closed
    assert b2.closed and device.held_bytes == 0
    assert "freed" in repr(b2) and device.spec in repr(b2)


def test_free_waits_for_the_buffers_pending_ops(cpu, gate):
    s = cpu.create_stream()
    host = np.empty(100, np.float32)
    buf = cpu.alloc(100)
    buf.fill_bytes(0, stream=s).wait()
    gate.close_on(s)
    ev = buf.copy_to_host_async(host, s)
    threading.Timer(0.02, gate.open).start()
    buf.free()  # may not release memory a queued copy still reads: waits for it
    assert ev.done and cpu.held_bytes == 0
    assert not host.any()
    s.close()


def test_no_cuda_array_interface_without_device_pointers(device):
    with device.alloc(8) as buf:
        if device.caps.device_pointers:
            cai = buf.__cuda_array_interface__
            assert cai["shape"] == (8,) and cai["typestr"] == "<f4" and cai["data"][0] != 0
        else:
            assert not hasattr(buf, "__cuda_array_interface__")
    if not device.caps.device_pointers:
        assert not hasattr(buf, "__cuda_array_interface__")  # freed: still absent, not an error


LEFT_BEHIND = """
import numpy as np
import gpuworkbench as gw

@gw.kernel
def scale(i: gw.index, y: gw.f32[:], x: gw.f32[:], a: gw.f32, n: gw.i32):
    if i < n:
        y[i] = a * x[i]

dev = gw.Device("cpu")
x, y = dev.alloc(1 << 16), dev.alloc(1 << 16)
for _ in range(20):
    scale.launch(1 << 16, y, x, 2.0, 1 << 16)
print("returned")
"""


def test_a_script_that_leaves_buffers_with_pending_ops_ends(tmp_path):
    """Buffers never freed, ops maybe still queued: the interpreter's exit neither waits on the streams' gone
    workers nor hangs (it did, most runs, when the finaliser waited for their ops)."""
    script = tmp_path / "left_behind.py"
    script.write_text(LEFT_BEHIND)
    for _ in range(3):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "returned" in done.stdout, done.stderr
