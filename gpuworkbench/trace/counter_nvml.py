"""A CUDA device's counters from NVML (nvidia-ml-py's ``pynvml``, imported when a trace first meets a CUDA device).

Where the GPU has GPM (NVML's GPU performance monitoring, Hopper and later) a sample reads the metrics between it and
the sample before: the share of time the GPU was busy, of SMs busy, SM occupancy, DRAM bandwidth used, PCIe and
NVLink traffic each way. Elsewhere NVML's utilization rates (GPU and memory busy) and PCIe throughput stand in, at
the slower rate those change at. Both read power, the SM clock and device memory in use. Counters the device does not
support are left out and named in ``describe()``, never reported as zeros; NVLink counts only with an active link.

CUPTI's PM sampling would sample faster, but the cupti-python this package installs (13.0, for CUDA 13.0 drivers)
has no PM-sampling API (``cupti.pm_sampling`` came in 13.3): ``describe()`` says so, from the installed cupti-python.
A trace's CUDA device is found in NVML by its PCI bus id (CUDA and NVML number devices differently, and
``CUDA_VISIBLE_DEVICES`` renumbers CUDA's). NVML is initialized once per process and kept, as CUDA keeps its
context; what each device supports is probed once and kept.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import BackendUnavailable
from .counter_sources import BYTES, Counter
from .cupti import binding

#: GPM's rate. Its metrics cover the interval between two samples, but the counters behind them advance only about
#: every 100 ms: measured on an H200 at 20 Hz, every other interval of a busy loop read 0 % and the next ~100 %.
GPM_RATE_HZ = 10.0
#: The rate without GPM: nvmlDeviceGetUtilizationRates covers the driver's own sample period (1/6 s to 1 s by
#: product), so sampling it faster than 6 Hz repeats values; each PCIe throughput read measures over 20 ms.
PLAIN_RATE_HZ = 6.0
PERCENT, PER_S, WATTS, MHZ = "%", "bytes/s", "W", "MHz"
MIB, KIB = 1 << 20, 1 << 10
NAN = float("nan")
#: Fields of nvmlDeviceGetFieldValues read (pynvml's names): instantaneous power (mW), NVLink data counters (KiB).
POWER_FIELD = "NVML_FI_DEV_POWER_INSTANT"
NVLINK_FIELDS = ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
#: GPM metrics read (pynvml's names): counter, metric, factor to the unit (GPM gives traffic in MiB/s).
GPM_METRICS = (
    (Counter("GPU busy", PERCENT), "NVML_GPM_METRIC_GRAPHICS_UTIL", 1.0),
    (Counter("SM active", PERCENT), "NVML_GPM_METRIC_SM_UTIL", 1.0),
    (Counter("SM occupancy", PERCENT), "NVML_GPM_METRIC_SM_OCCUPANCY", 1.0),
    (Counter("DRAM bandwidth used", PERCENT), "NVML_GPM_METRIC_DRAM_BW_UTIL", 1.0),
    (Counter("PCIe TX", PER_S), "NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    (Counter("PCIe RX", PER_S), "NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
    (Counter("NVLink TX", PER_S), "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    (Counter("NVLink RX", PER_S), "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
)
NVLINK = ("NVLink TX", "NVLink RX")
RATES = (Counter("GPU busy", PERCENT), Counter("memory busy", PERCENT))
PCIE = (Counter("PCIe TX", PER_S), Counter("PCIe RX", PER_S))
NO_NVLINK = "no active NVLink"

_LOCK = threading.Lock()
_STARTED: Any = None  # the pynvml module once nvmlInit succeeded in this process
_DEVICES: dict[str, _Device] = {}  # by PCI bus id: what each device supports


@dataclass
class _Device:
    """One NVML device and how each of its counters is read: built once per process by ``_probe``."""

    handle: Any
    gpm: list[tuple[Counter, int, float]]  # GPM metrics that answered (empty: no GPM)
    rates: bool  # without GPM: "GPU busy" and "memory busy" from nvmlDeviceGetUtilizationRates
    pcie: bool  # without GPM: "PCIe TX" and "PCIe RX" from nvmlDeviceGetPcieThroughput
    fields: list[tuple[Counter, int]]  # read with nvmlDeviceGetFieldValues: power and, without GPM, NVLink
    power_usage: bool  # power from nvmlDeviceGetPowerUsage (no instantaneous power field)
    clock: bool
    memory_version: int | None  # nvmlDeviceGetMemoryInfo's struct version: nvmlMemory_v2, 0 (v1), None (neither)
    left_out: dict[str, list[str]]  # reason -> counters not read on this device


class NvmlSource:
    """One CUDA device's counters through NVML (GPM where the GPU has it); ``device`` is the trace's number."""

    def __init__(self, device: int, ordinal: int) -> None:
        nvml = _start_nvml()
        self.device = device
        self._nvml = nvml
        self._info = info = _device_info(nvml, ordinal)
        self._gpm = _Gpm(nvml, info.handle, [(m, f) for _, m, f in info.gpm]) if info.gpm else None
        self.rate_hz = GPM_RATE_HZ if info.gpm else PLAIN_RATE_HZ
        self._last_fields: list[tuple[float, float]] | None = None  # NVLink counters and their times (s)
        reads: list[tuple[list[Counter], Callable[[], list[float]]]] = []
        if self._gpm is not None:
            reads.append(([c for c, _, _ in info.gpm], self._gpm.read))
        if info.rates:
            reads.append((list(RATES), self._read_rates))
        if info.pcie:
            reads.append((list(PCIE), self._read_pcie))
        if info.fields:
            reads.append(([c for c, _ in info.fields], self._read_fields))
        if info.power_usage:
            reads.append(([Counter("power", WATTS)], self._read_power))
        if info.clock:
            reads.append(([Counter("SM clock", MHZ)], self._read_clock))
        if info.memory_version is not None:
            reads.append(([Counter("memory used", BYTES)], self._read_memory))
        self.counters = tuple(c for counters, _ in reads for c in counters)
        self._reads = [read for _, read in reads]

    def sample(self) -> list[float]:
        values: list[float] = []
        for read in self._reads:
            values += read()
        return values

    def describe(self) -> str:
        info = self._info
        what = "NVML GPM" if info.gpm else "NVML"
        notes = [pm_sampling_note()] if info.gpm else ["no GPM on this GPU", pm_sampling_note()]
        if info.power_usage:
            notes.append("power: NVML's power usage (a 1 s average on recent GPUs)")
        text = f"{what}, {self.rate_hz:g} Hz ({'; '.join(notes)})"
        if info.left_out:
            text += "; not on this device: " + "; ".join(f"{', '.join(n)} ({why})" for why, n in info.left_out.items())
        return text

    def close(self) -> None:
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None

    def _read_rates(self) -> list[float]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self._info.handle)
        return [float(rates.gpu), float(rates.memory)]

    def _read_pcie(self) -> list[float]:
        """TX and RX; NVML's documentation says KB/s: KiB, as NVML counts memory."""
        nvml, handle = self._nvml, self._info.handle
        return [
            nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES) * KIB,
            nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES) * KIB,
        ]

    def _read_power(self) -> list[float]:
        return [self._nvml.nvmlDeviceGetPowerUsage(self._info.handle) / 1000]

    def _read_clock(self) -> list[float]:
        return [float(self._nvml.nvmlDeviceGetClockInfo(self._info.handle, self._nvml.NVML_CLOCK_SM))]

    def _read_fields(self) -> list[float]:
        """Power (mW) as W; NVLink data counters (KiB since the driver loaded) as bytes/s since the sample before."""
        values = self._nvml.nvmlDeviceGetFieldValues(self._info.handle, [f for _, f in self._info.fields])
        out, now, counts = [], time.perf_counter(), []
        for (counter, _), field in zip(self._info.fields, values):
            value = _field_value(self._nvml, field) if field.nvmlReturn == 0 else NAN
            if counter.unit == WATTS:
                out.append(value / 1000)
                continue
            at = field.timestamp / 1e6 if field.timestamp else now  # NVML's µs: the counter's own time
            counts.append((value * KIB, at))
            before = self._last_fields[len(counts) - 1] if self._last_fields else None
            out.append((value * KIB - before[0]) / (at - before[1]) if before and at > before[1] else NAN)
        self._last_fields = counts
        return out

    def _read_memory(self) -> list[float]:
        version = self._info.memory_version
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._info.handle, version=version or None)
        return [float(memory.used)]


class _Gpm:
    """Two GPM samples taken in turn; each read gives the metrics between it and the read before (NaN the first)."""

    def __init__(self, nvml: Any, handle: Any, metrics: list[tuple[int, float]]) -> None:
        self._nvml, self._handle = nvml, handle
        self._scales = [factor for _, factor in metrics]
        self._samples = [nvml.nvmlGpmSampleAlloc()]
        try:
            self._samples.append(nvml.nvmlGpmSampleAlloc())
        except Exception:
            self.close()
            raise
        self._get = get = nvml.c_nvmlGpmMetricsGet_t()
        get.version, get.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(metrics)
        for i, (metric, _) in enumerate(metrics):
            get.metrics[i].metricId = metric
        self._turn, self._primed = 0, False
        self.returns: list[int] = []  # each metric's nvmlReturn in the last read (0: success)

    def read(self) -> list[float]:
        now = self._samples[self._turn]
        self._nvml.nvmlGpmSampleGet(self._handle, now)
        self._turn ^= 1  # the other sample is now the one before
        if not self._primed:
            self._primed = True
            return [NAN] * len(self._scales)
        get = self._get
        get.sample1, get.sample2 = self._samples[self._turn], now
        self._nvml.nvmlGpmMetricsGet(get)
        metrics = [get.metrics[i] for i in range(len(self._scales))]
        self.returns = [int(m.nvmlReturn) for m in metrics]
        return [m.value * f if r == 0 else NAN for m, f, r in zip(metrics, self._scales, self.returns)]

    def close(self) -> None:
        while self._samples:
            self._nvml.nvmlGpmSampleFree(self._samples.pop())


def _start_nvml() -> Any:
    """pynvml, NVML initialized (once per process); BackendUnavailable saying why not."""
    global _STARTED
    try:
        import pynvml
    except ImportError:
        raise BackendUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    with _LOCK:
        if _STARTED is not pynvml:
            try:
                pynvml.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - NVMLError: no driver, no library; said in the offer
                raise BackendUnavailable(f"NVML did not start ({exc})") from None
            _STARTED = pynvml
    return pynvml


def _device_info(nvml: Any, ordinal: int) -> _Device:
    """What CUDA device ``ordinal`` supports, probed once per process (found in NVML by its PCI bus id)."""
    bus = pci_bus_id(ordinal)
    with _LOCK:
        info = _DEVICES.get(bus)
    if info is None:
        try:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(bus)
        except nvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML has no device at PCI bus {bus} ({exc})") from None
        info = _probe(nvml, handle)
        with _LOCK:
            info = _DEVICES.setdefault(bus, info)
    return info


def pci_bus_id(ordinal: int) -> str:
    """CUDA device ``ordinal``'s PCI bus id ("0000:3B:00.0") from CuPy or cuda-python; BackendUnavailable without."""
    cupy = sys.modules.get("cupy")
    try:
        if cupy is None:
            try:
                from cuda.bindings import runtime

                err, bus = runtime.cudaDeviceGetPCIBusId(16, ordinal)
                if int(err) == 0:
                    return bus.split(b"\0", 1)[0].decode() if isinstance(bus, bytes) else str(bus)
            except ImportError:
                pass
            import cupy
        return str(cupy.cuda.runtime.deviceGetPCIBusId(ordinal))
    except ImportError:
        raise BackendUnavailable(f"cannot tell cuda:{ordinal}'s PCI bus id (neither CuPy nor cuda-python)") from None
    except Exception as exc:  # noqa: BLE001 - a CUDA error: said in the offer
        raise BackendUnavailable(f"cannot tell cuda:{ordinal}'s PCI bus id ({exc})") from None


def _probe(nvml: Any, handle: Any) -> _Device:
    """Which counters ``handle`` answers, and how each is read."""
    left_out: dict[str, list[str]] = {}

    def answers(counters: tuple[Counter, ...], call: Callable[[], Any]) -> bool:
        try:
            call()
            return True
        except nvml.NVMLError as exc:
            left_out.setdefault(f"NVML: {exc}", []).extend(c.name for c in counters)
            return False

    links = _nvlink_active(nvml, handle)
    gpm_left_out: dict[str, list[str]] = {}
    gpm = _probe_gpm(nvml, handle, links, gpm_left_out)
    if gpm:  # what GPM lacks is left out only where GPM is read
        left_out.update(gpm_left_out)
    rates = pcie = False
    fields: list[tuple[Counter, int]] = []
    if not gpm:
        rates = answers(RATES, lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        pcie = answers(PCIE, lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES))
        if links:
            fields += _answering_fields(nvml, handle, list(zip(NVLINK, NVLINK_FIELDS)), PER_S, left_out)
        else:
            left_out.setdefault(NO_NVLINK, []).extend(NVLINK)
    power = _answering_fields(nvml, handle, [("power", POWER_FIELD)], WATTS, {})
    fields = power + fields
    power_usage = not power and answers((Counter("power", WATTS),), lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    clock = answers((Counter("SM clock", MHZ),), lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
    memory_version = None
    for version in (getattr(nvml, "nvmlMemory_v2", 0), 0):
        try:
            nvml.nvmlDeviceGetMemoryInfo(handle, version=version or None)
            memory_version = version
            break
        except nvml.NVMLError as exc:
            if not version:
                left_out.setdefault(f"NVML: {exc}", []).append("memory used")
    return _Device(handle, gpm, rates, pcie, fields, power_usage, clock, memory_version, left_out)


def _probe_gpm(nvml: Any, handle: Any, links: bool, left_out: dict[str, list[str]]) -> list[tuple[Counter, int, float]]:
    """The GPM metrics that answer over one interval of GPM's period; empty where the GPU has no GPM."""
    try:
        if (
            not hasattr(nvml, "nvmlGpmQueryDeviceSupport")
            or not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice
        ):
            return []
    except nvml.NVMLError:
        return []
    wanted = []
    for counter, name, factor in GPM_METRICS:
        if counter.name in NVLINK and not links:
            left_out.setdefault(NO_NVLINK, []).append(counter.name)
        elif hasattr(nvml, name):
            wanted.append((counter, getattr(nvml, name), factor))
    try:
        gpm = _Gpm(nvml, handle, [(metric, factor) for _, metric, factor in wanted])
    except nvml.NVMLError:
        return []
    try:
        gpm.read()
        time.sleep(1 / GPM_RATE_HZ)
        gpm.read()
    except nvml.NVMLError:
        return []
    finally:
        gpm.close()
    found = []
    for (counter, metric, factor), code in zip(wanted, gpm.returns):
        if code == 0:
            found.append((counter, metric, factor))
        else:
            left_out.setdefault(f"GPM: {nvml.NVMLError(code)}", []).append(counter.name)
    if not any(counter.unit == PERCENT for counter, _, _ in found):
        return []  # no utilization from GPM: NVML's own rates instead
    return found


def _answering_fields(
    nvml: Any, handle: Any, named: list[tuple[str, str]], unit: str, left_out: dict[str, list[str]]
) -> list[tuple[Counter, int]]:
    """The fields (counter name, pynvml's field name) that ``handle`` answers, as (Counter, field id)."""
    present = [(name, getattr(nvml, field)) for name, field in named if hasattr(nvml, field)]
    if not present:
        return []
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, [field for _, field in present])
    except nvml.NVMLError as exc:
        left_out.setdefault(f"NVML: {exc}", []).extend(name for name, _ in present)
        return []
    found = []
    for (name, field), value in zip(present, values):
        if value.nvmlReturn == 0:
            found.append((Counter(name, unit), field))
        else:
            left_out.setdefault(f"NVML: {nvml.NVMLError(value.nvmlReturn)}", []).append(name)
    return found


def _nvlink_active(nvml: Any, handle: Any) -> bool:
    """Whether any of the device's NVLinks is up (a GPU without NVLink answers Not Supported)."""
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                return True
        except nvml.NVMLError_NotSupported:
            return False
        except nvml.NVMLError:
            continue
    return False


def _field_value(nvml: Any, field: Any) -> float:
    """A field value's number, read as its ``valueType`` says."""
    kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(field.valueType)
    return float(getattr(field.value, kind)) if kind else NAN


@functools.cache
def pm_sampling_note() -> str:
    """Why the counters are not CUPTI's PM sampling, from what the installed cupti-python offers (its
    ``cupti.pm_sampling`` came in 13.3)."""
    ok, what = binding.available()
    if not ok:
        return "CUPTI PM sampling: cupti-python does not import here"
    if importlib.util.find_spec("cupti.pm_sampling") is None:
        return f"CUPTI PM sampling: not in {what}"
    return f"CUPTI PM sampling: in {what}, not read by this build"


def open_source(device: int, ordinal: int) -> NvmlSource:
    """The NVML source of CUDA device ``ordinal`` (the trace's ``device``); BackendUnavailable saying why none."""
    try:
        return NvmlSource(device, ordinal)
    except BackendUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - an NVML failure while probing: no counters, said in the offer
        raise BackendUnavailable(f"NVML failed ({exc!r})") from None
