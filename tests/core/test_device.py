"""Tests of device.py: selection (auto, by name, by GPUWB_DEVICE), facts, memory, factories and closing."""

from __future__ import annotations

import numpy as np
import pytest
from support import pocl_index, sample

import gpuworkbench as gw
from gpuworkbench.backends.base import Caps, DeviceInfo


def test_devices_lists_every_backend_found():
    infos = gw.devices()
    assert all(isinstance(i, DeviceInfo) for i in infos)
    assert [i.backend for i in infos if i.backend == "cpu"] == ["cpu"]  # the CPU is always there, once
    status = gw.backend_status()
    assert status["cpu"] == ""
    for name in {i.backend for i in infos}:
        assert status[name] == "", f"{name} lists devices but says it is unusable"
    for name, why in status.items():
        if why:
            assert name not in {i.backend for i in infos}
    by_backend: dict[str, list[int]] = {}
    for i in infos:
        by_backend.setdefault(i.backend, []).append(i.index)
    assert all(indices == list(range(len(indices))) for indices in by_backend.values())


def test_stub_is_the_cpu():
    dev = gw.Device(0, backend="stub")
    assert dev.backend_kind is gw.BackendKind.CPU
    assert dev is gw.Device(0, backend="cpu") is gw.Device("cpu:0") is gw.Device.with_backend(0, gw.BackendKind.CPU)
    assert gw.Device("stub") is dev


def test_auto_selection_takes_no_cpu_type_opencl_device(monkeypatch):
    monkeypatch.delenv("GPUWB_DEVICE", raising=False)
    dev = gw.Device()
    gpus = [i for i in gw.devices() if i.is_gpu]
    if gpus:
        assert dev.backend_kind.value == gpus[0].backend and dev.info.is_gpu
    else:
        assert dev.backend_kind is gw.BackendKind.CPU
    if pocl_index() is not None:
        pocl = gw.Device(pocl_index(), backend="opencl")
        assert not pocl.info.is_gpu  # PoCL is a CPU-type OpenCL device: used when named, never picked
        assert dev is not pocl


def test_env_variable_picks_the_device(monkeypatch):
    index = pocl_index()
    if index is None:
        pytest.skip("no PoCL device")
    monkeypatch.setenv("GPUWB_DEVICE", f"opencl:{index}")
    dev = gw.Device()
    assert dev.backend_kind is gw.BackendKind.OPENCL and dev.index == index
    assert dev.spec == f"opencl:{index}"
    assert "Portable Computing Language" in dev.name
    monkeypatch.setenv("GPUWB_DEVICE", "cpu")
    assert gw.Device().backend_kind is gw.BackendKind.CPU


def test_device_facts(device):
    assert isinstance(device.caps, Caps)
    assert device.name == device.info.name and device.name
    assert device.spec == f"{device.backend_kind.value}:{device.index}"
    assert device.spec in repr(device)
    assert gw.Device(device.spec) is device
    assert device.caps.kernel_language in ("python", "opencl", "cuda")


def test_memory_info_follows_allocations(device):
    free0, total = device.memory_info()
    assert 0 < free0 <= total
    nbytes = 1 << 20
    with device.alloc(nbytes, "uint8"):
        assert device.held_bytes == nbytes
        free1, total1 = device.memory_info()
        assert total1 == total
        if device.info.is_gpu:
            assert free1 <= free0  # other processes share a real GPU's memory
        else:  # the CPU budget, and OpenCL's total minus what we hold, are exact
            assert free1 == free0 - nbytes
    assert device.held_bytes == 0
    if not device.info.is_gpu:
        assert device.memory_info()[0] == free0


def test_empty_cache_gives_back_only_what_a_backend_caches(device):
    with device.alloc(1 << 20, "uint8"):
        pass
    given = device.empty_cache()
    if device.backend_kind is not gw.BackendKind.CUDA:
        assert given == 0  # no cache: every free went back at once
    assert given >= 0 and device.empty_cache() == 0  # nothing cached is left to give back


def test_live_buffers_and_gc_free(device):
    a, b = device.alloc(10), device.alloc(20, "int64")
    assert set(map(id, device.live_buffers)) == {id(a), id(b)}
    assert device.held_bytes == 10 * 4 + 20 * 8
    del a  # dropped without free(): the finaliser gives the memory back
    import gc

    gc.collect()
    assert device.live_buffers == [b] and device.held_bytes == 160
    b.free()
    assert device.live_buffers == [] and device.held_bytes == 0


def test_create_stream_ids_and_labels(device):
    s1, s2 = device.create_stream("one"), device.create_stream()
    assert s1.id != s2.id and s1.id != device.default_stream.id
    assert s1.label == "one" and s2.label == f"stream-{s2.id}"
    assert s1.device is device
    s1.close()
    s2.close()


def test_empty_pinned(device):
    host = device.empty_pinned((3, 5), "float64")
    assert host.shape == (3, 5) and host.dtype == np.float64 and host.flags.c_contiguous and host.flags.writeable
    assert device.is_pinned(host) is device.caps.pinned_memory
    assert not device.is_pinned(np.zeros(15))
    empty = device.empty_pinned(0, "int32")
    assert empty.shape == (0,) and empty.dtype == np.int32
    host[:] = 7
    assert host.sum() == 105


def test_synchronize_waits_for_every_stream(device):
    streams = [device.create_stream(f"sync-{i}") for i in range(3)]
    host = [np.empty(50_000, np.float32) for _ in streams]
    data = sample(50_000, "float32")
    with device.alloc(50_000) as buf:
        buf.copy_from_host(data)
        events = [buf.copy_to_host_async(h, s) for h, s in zip(host, streams)]
        device.synchronize()
        assert all(e.done for e in events) and all(s.pending == 0 for s in streams)
    assert all(np.array_equal(h, data) for h in host)
    for s in streams:
        s.close()


def test_close_frees_everything_and_reopens():
    cpu = gw.Device("cpu")
    cpu.close()
    assert cpu.closed
    cpu.close()  # idempotent
    dev = gw.Device("cpu")
    assert dev is not cpu and not dev.closed
    buf = dev.alloc(100)
    stream = dev.create_stream("x")
    dev.close()
    assert buf.closed and dev.held_bytes == 0 and dev.live_buffers == []
    with pytest.raises(gw.BufferClosed, match="freed"):
        buf.copy_to_host()
    buf.free()  # still idempotent
    with pytest.raises(gw.InvalidArgument, match="closed"):
        dev.alloc(4)
    with pytest.raises(gw.InvalidArgument, match="closed"):
        stream.record()
    assert gw.Device("cpu") is not dev
