"""A CUDA device's counters (``trace/counter_nvml.py``): NVML's GPM path and its plain path on a fake libnvidia-ml
(the real pynvml's structs, constants and errors, its calls into the library replaced: runs without a GPU wherever
nvidia-ml-py is installed), and on a real GPU (marked ``gpu``): a busy CuPy loop's SM activity and memory in use.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from support import cuda_devices

import gpuworkbench as gw
from gpuworkbench.trace import counter_nvml
from gpuworkbench.trace.counter_nvml import MIB, pm_sampling_note
from gpuworkbench.trace.counter_offer import offer
from gpuworkbench.trace.counter_sources import HOST
from gpuworkbench.trace.counters import Sampler

HOST_DESCRIPTION = "psutil, 10 Hz"
GPM_COUNTERS = [
    ("GPU busy", "%"),
    ("SM active", "%"),
    ("SM occupancy", "%"),
    ("DRAM bandwidth used", "%"),
    ("PCIe TX", "bytes/s"),
    ("PCIe RX", "bytes/s"),
]
COMMON = [("power", "W"), ("SM clock", "MHz"), ("memory used", "bytes")]


class FakeGpu:
    """One device of the fake library: what it supports and the figures it gives."""

    def __init__(self, bus: str, *, gpm: bool = True, nvlink: bool = False, instant_power: bool = True) -> None:
        self.bus, self.gpm, self.nvlink, self.instant_power = bus, gpm, nvlink, instant_power
        self.memory_v2 = True
        self.used = 3 << 30
        self.time_us = 1_000_000  # the NVLink counters' clock, 50 ms on per read
        self.nvlink_kib = [0, 0]  # TX, RX since the driver loaded: 1000 and 3000 KiB more per read


class FakeNvml:
    """The calls into libnvidia-ml that counter_nvml makes, on ``gpus``; CuPy answers each ordinal's PCI bus id."""

    CALLS = (
        "nvmlInit nvmlDeviceGetHandleByPciBusId nvmlGpmQueryDeviceSupport nvmlGpmSampleAlloc nvmlGpmSampleFree "
        "nvmlGpmSampleGet nvmlGpmMetricsGet nvmlDeviceGetNvLinkState nvmlDeviceGetFieldValues nvmlDeviceGetPowerUsage "
        "nvmlDeviceGetClockInfo nvmlDeviceGetMemoryInfo nvmlDeviceGetUtilizationRates nvmlDeviceGetPcieThroughput"
    ).split()

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], buses: list[str] | None = None) -> None:
        self.nvml = nvml = pytest.importorskip("pynvml")
        self.gpus = {g.bus: g for g in gpus}
        self.live: set[int] = set()  # GPM samples allocated and not freed
        self.taken: dict[int, int] = {}  # sample -> the order it was last taken in
        self.order = 0
        for name in self.CALLS:
            monkeypatch.setattr(nvml, name, getattr(self, name))
        # a fresh process for NVML: not started, no device probed (monkeypatch puts the real state back after)
        monkeypatch.setattr(counter_nvml, "_STARTED", None)
        monkeypatch.setattr(counter_nvml, "_DEVICES", {})
        runtime = SimpleNamespace(deviceGetPCIBusId=lambda i: (buses or [g.bus for g in gpus])[i])
        monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))

    def error(self, code: int) -> Exception:
        return self.nvml.NVMLError(code)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> FakeGpu:
        if bus not in self.gpus:
            raise self.error(self.nvml.NVML_ERROR_NOT_FOUND)
        return self.gpus[bus]

    def nvmlGpmQueryDeviceSupport(self, gpu: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=int(gpu.gpm))

    def nvmlGpmSampleAlloc(self) -> object:
        address = 0x1000 + 0x10 * (len(self.live) + len(self.taken) + 1)
        self.live.add(address)
        return ctypes.cast(ctypes.c_void_p(address), self.nvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: object) -> None:
        self.live.remove(ctypes.cast(sample, ctypes.c_void_p).value)

    def nvmlGpmSampleGet(self, gpu: FakeGpu, sample: object) -> object:
        self.order += 1
        self.taken[ctypes.cast(sample, ctypes.c_void_p).value] = self.order
        return sample

    def nvmlGpmMetricsGet(self, get: object) -> object:
        nvml = self.nvml
        first, second = (self.taken[ctypes.cast(s, ctypes.c_void_p).value] for s in (get.sample1, get.sample2))
        assert first < second, "metrics between a sample and a later one"
        figures = {
            nvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0,
            nvml.NVML_GPM_METRIC_SM_UTIL: 80.0,
            nvml.NVML_GPM_METRIC_SM_OCCUPANCY: 40.0,
            nvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
            nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 1000.0,  # MiB/s
            nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 2000.0,
            nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 0.0,  # as a GPU without active links may answer
            nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 0.0,
        }
        for i in range(get.numMetrics):
            metric = get.metrics[i]
            known = metric.metricId in figures
            metric.value = figures.get(metric.metricId, 0.0)
            metric.nvmlReturn = 0 if known else nvml.NVML_ERROR_NOT_SUPPORTED
        return get

    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        if not gpu.nvlink:
            raise self.error(self.nvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 4:
            raise self.error(self.nvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.nvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, ids: list[int]) -> object:
        nvml = self.nvml
        values = (nvml.c_nvmlFieldValue_t * len(ids))()
        gpu.time_us += 50_000
        gpu.nvlink_kib = [gpu.nvlink_kib[0] + 1000, gpu.nvlink_kib[1] + 3000]
        links = [nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        for value, field in zip(values, ids):
            value.fieldId, value.timestamp = field, gpu.time_us
            if field == nvml.NVML_FI_DEV_POWER_INSTANT and gpu.instant_power:
                value.valueType, value.value.uiVal = nvml.NVML_VALUE_TYPE_UNSIGNED_INT, 350_000  # mW
            elif field in links and gpu.nvlink:
                value.valueType = nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = gpu.nvlink_kib[links.index(field)]
            else:
                value.nvmlReturn = nvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return 300_000  # mW

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        assert clock == self.nvml.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> SimpleNamespace:
        if version and not gpu.memory_v2:
            raise self.error(self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(used=gpu.used + (0 if version else 1 << 20))  # v1 counts reserved memory as used

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=70, memory=20)

    def nvmlDeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> int:
        return 2000 if counter == self.nvml.NVML_PCIE_UTIL_TX_BYTES else 5000  # KB/s


def by_name(source: counter_nvml.NvmlSource, values: list[float]) -> dict[str, float]:
    return {c.name: v for c, v in zip(source.counters, values)}


def test_gpm_gives_each_counter_in_its_unit_and_names_what_the_device_lacks(monkeypatch):
    fake = FakeNvml(monkeypatch, [FakeGpu("0000:3B:00.0")])
    source = counter_nvml.open_source(2, 0)
    assert [(c.name, c.unit) for c in source.counters] == GPM_COUNTERS + COMMON
    assert source.device == 2 and source.rate_hz == counter_nvml.GPM_RATE_HZ == 10
    first = by_name(source, source.sample())
    assert all(math.isnan(first[name]) for name, _ in GPM_COUNTERS)  # a GPM figure needs an interval
    assert (first["power"], first["SM clock"], first["memory used"]) == (350.0, 1980.0, 3 << 30)
    second = by_name(source, source.sample())
    assert (second["GPU busy"], second["SM active"], second["SM occupancy"], second["DRAM bandwidth used"]) == (
        90.0,
        80.0,
        40.0,
        30.0,
    )
    assert (second["PCIe TX"], second["PCIe RX"]) == (1000 * MIB, 2000 * MIB)
    assert source.describe() == (
        f"NVML GPM, 10 Hz ({pm_sampling_note()}); not on this device: NVLink TX, NVLink RX (no active NVLink)"
    )
    assert pm_sampling_note().startswith("CUPTI PM sampling: ")
    assert len(fake.live) == 2
    source.close()
    assert not fake.live  # both GPM samples freed (and the probe's)


def test_without_gpm_nvml_rates_stand_in_and_nvlink_counts_per_second(monkeypatch):
    gpu = FakeGpu("0000:3B:00.0", gpm=False, nvlink=True, instant_power=False)
    gpu.memory_v2 = False
    FakeNvml(monkeypatch, [gpu])
    source = counter_nvml.open_source(0, 0)
    assert [(c.name, c.unit) for c in source.counters] == [
        ("GPU busy", "%"),
        ("memory busy", "%"),
        ("PCIe TX", "bytes/s"),
        ("PCIe RX", "bytes/s"),
        ("NVLink TX", "bytes/s"),
        ("NVLink RX", "bytes/s"),
        *COMMON,
    ]
    assert source.rate_hz == counter_nvml.PLAIN_RATE_HZ == 6
    first = by_name(source, source.sample())
    assert math.isnan(first["NVLink TX"]) and math.isnan(first["NVLink RX"])  # a rate needs the counter before
    second = by_name(source, source.sample())
    assert (second["GPU busy"], second["memory busy"]) == (70.0, 20.0)
    assert (second["PCIe TX"], second["PCIe RX"]) == (2000 * 1024, 5000 * 1024)
    assert second["NVLink TX"] == pytest.approx(1000 * 1024 / 0.05) and second["NVLink RX"] == pytest.approx(
        3000 * 1024 / 0.05
    )
    assert (second["power"], second["memory used"]) == (300.0, (3 << 30) + (1 << 20))  # 1 s average; v1 memory
    assert source.describe() == (
        f"NVML, 6 Hz (no GPM on this GPU; {pm_sampling_note()}; power: NVML's power usage (a 1 s average on recent"
        " GPUs))"
    )
    source.close()


def test_a_cuda_device_is_found_in_nvml_by_its_pci_bus_id(monkeypatch):
    first, second = FakeGpu("0000:1A:00.0"), FakeGpu("0000:3B:00.0")
    second.used = 5 << 30
    FakeNvml(monkeypatch, [first, second], buses=["0000:3B:00.0", "0000:1A:00.0"])  # CUDA's order is not NVML's
    source = counter_nvml.open_source(0, 0)
    assert by_name(source, source.sample())["memory used"] == 5 << 30
    source.close()


def test_offer_gives_a_cuda_device_its_nvml_source_or_says_why_not(monkeypatch):
    FakeNvml(monkeypatch, [FakeGpu("0000:3B:00.0")], buses=["0000:3B:00.0", "0000:AA:00.0"])
    found = offer(1, "cuda:0", "NVIDIA H200", HOST_DESCRIPTION)
    assert found.source is not None and found.source.device == 1 and found.note == ""
    assert found.says == found.source.describe() and found.says.startswith("NVML GPM, 10 Hz (CUPTI PM sampling: ")
    found.source.close()
    missing = offer(2, "cuda:1", "NVIDIA H200", HOST_DESCRIPTION)
    assert missing.source is None
    assert missing.says == "none: NVML has no device at PCI bus 0000:AA:00.0 (Not Found)"
    assert missing.note == (
        "counters: cuda:1 (NVIDIA H200) has none: NVML has no device at PCI bus 0000:AA:00.0 (Not Found);"
        " the host's CPU and memory are sampled instead"
    )


def test_the_sampler_samples_a_cuda_device_beside_the_host(monkeypatch):
    FakeNvml(monkeypatch, [FakeGpu("0000:3B:00.0")])
    warnings: list[str] = []
    sampler = Sampler("gpuworkbench-counters-test", lambda: [(0, "cuda:0", "NVIDIA H200")], warnings.append)
    started = time.perf_counter_ns()
    sampler.start()
    time.sleep(0.3)
    stopped = time.perf_counter_ns()
    sampler.stop(stopped)
    sampler.join()
    c = sampler.table()
    assert warnings == [] and set(c["device"].tolist()) == {HOST, 0}
    on_gpu = c["device"] == 0
    assert {(n, u) for n, u in zip(c["name"][on_gpu], c["unit"][on_gpu])} == set(GPM_COUNTERS + COMMON)
    active = c["value"][on_gpu & (c["name"] == "SM active")]
    assert 3 <= active.size <= 0.3 * 20 + 3 and (active[1:] == 80.0).all()
    assert (c["time_ns"] >= started).all() and (c["time_ns"] <= stopped).all()
    assert sampler.sources["cuda:0"].startswith("NVML GPM, 10 Hz")


# ---------------------------------------------------------------------------------------------- on a real GPU

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


@pytest.fixture(scope="module")
def busy_trace():
    """A trace with counters around ~1.5 s of a CuPy kernel that keeps every SM of cuda:0 busy, with 256 MiB held;
    (trace, the busy loop's host start and end in ns)."""
    (dev,) = cuda_devices(1)
    pytest.importorskip("pynvml")
    import cupy as cp

    spin = cp.RawKernel(SPIN, "spin")
    sms = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    held = cp.zeros(256 << 20, cp.uint8)
    spin((sms * 4,), (128,), (np.int64(1000),))  # compiled and loaded before the trace
    cp.cuda.Device(0).synchronize()
    with gw.trace(counters=True) as t:
        buffer = dev.alloc(1024, "float32")  # our op: cuda:0 joins the trace, and its counters start
        buffer.copy_from_host(np.ones(1024, np.float32))
        time.sleep(0.2)  # the source opens (NVML, GPM's probe) while the device idles
        busy_from = time.perf_counter_ns()
        for _ in range(150):
            spin((sms * 4,), (128,), (np.int64(20_000_000),))  # ~10 ms each at ~2 GHz
        cp.cuda.Device(0).synchronize()
        busy_to = time.perf_counter_ns()
    buffer.free()
    del held
    return t, busy_from, busy_to


def cuda0_number(t: gw.Trace) -> int:
    return next(number for number, clock in t.devices.items() if clock.key == "cuda:0")


@pytest.mark.gpu
def test_a_busy_cupy_loop_shows_sm_activity_and_memory_in_use(busy_trace):
    t, busy_from, busy_to = busy_trace
    c = t.counters()
    on_gpu = c["device"] == cuda0_number(t)
    names = set(c["name"][on_gpu].tolist())
    busy = "SM active" if "SM active" in names else "GPU busy"  # NVML's rates where the GPU has no GPM
    assert t.counter_sources["cuda:0"].startswith("NVML"), t.counter_sources
    period_ns = 1e9 / (counter_nvml.GPM_RATE_HZ if busy == "SM active" else counter_nvml.PLAIN_RATE_HZ)
    inside = on_gpu & (c["name"] == busy) & (c["time_ns"] > busy_from + 2 * period_ns) & (c["time_ns"] <= busy_to)
    values = c["value"][inside]
    assert values.size >= 3 and np.median(values) > 50, (busy, values)
    used = c["value"][on_gpu & (c["name"] == "memory used")]
    assert used.size and (used > 256 << 20).all()
    assert (c["time_ns"] >= t.started_ns).all() and (c["time_ns"] <= t.stopped_ns).all()
    assert not [w for w in t.stats.warnings if w.startswith("counters")], t.stats.warnings


@pytest.mark.gpu
def test_each_cuda_counter_is_sampled_or_named_as_left_out(busy_trace):
    t, _, _ = busy_trace
    c = t.counters()
    says = t.counter_sources["cuda:0"]
    sampled = set(c["name"][c["device"] == cuda0_number(t)].tolist())
    for name in ("GPU busy", "PCIe TX", "PCIe RX", "NVLink TX", "NVLink RX", "power", "SM clock", "memory used"):
        assert (name in sampled) != (name in says.partition("not on this device: ")[2]), (name, says)
    assert "CUPTI PM sampling" in says
