"""Where a trace's counters come from: a source per device that offers some, and what each device offers.

A source says which device it samples (a trace device number; ``HOST`` for the host), its counters (name, unit), its
rate and what it is ("psutil, 10 Hz"), and returns one value per counter from ``sample()``. The host's source reads
the host's CPU and memory and this process's share of them (psutil, imported when a trace first samples). Devices of
the CPU backend run on the host: the host's counters are theirs. OpenCL (PyOpenCL) and WebGPU (wgpu-py) expose no
utilization or memory counter; CUDA and ROCm devices have no source in this build yet: ``offer`` says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

#: The ``device`` of counters that describe the host (its CPU and memory), not one of the trace's devices.
HOST = -1
#: The host source's sampling rate (~80 us a sample). Linux counts the host's CPU time in ticks of 10 ms per core:
#: at 10 Hz one sample of a 2-core host resolves 5 % of its CPU, at 20 Hz only 10 %.
HOST_RATE_HZ = 10.0
#: The unit of CPU busy figures: 100 is every core of the host busy.
CPU_UNIT = "% of all cores"
BYTES = "bytes"


@dataclass(frozen=True)
class Counter:
    """One counter a source samples: its name ("host CPU") and the unit of its values ("bytes")."""

    name: str
    unit: str


class CounterSource(Protocol):
    """What the sampler needs of a source (``trace/counters.py``)."""

    device: int  # the trace's device number, or HOST
    counters: tuple[Counter, ...]
    rate_hz: float

    def sample(self) -> Sequence[float]:
        """One value per counter, now; raising stops this source (the trace warns once)."""
        ...

    def describe(self) -> str:
        """What the source is and how often it samples, in a few words ("psutil, 10 Hz")."""
        ...

    def close(self) -> None:
        """Release what the source holds (a library handle); called once, as the sampler stops."""
        ...


class HostSource:
    """The host: its CPU busy share, this process's CPU share, its memory in use, this process's resident memory.

    CPU shares cover the time since the sample before (the first sample has none before it: NaN): the host's from
    ``psutil.cpu_times()`` (as ``psutil.cpu_percent`` computes it, without its module-wide baseline, which a user's own
    calls would reset; NaN where less than one tick of 10 ms passed), this process's from ``time.process_time()``
    over the wall time times the cores.
    Memory in use is total minus available (what other programs could not get without swapping)."""

    counters = (
        Counter("host CPU", CPU_UNIT),
        Counter("process CPU", CPU_UNIT),
        Counter("host memory used", BYTES),
        Counter("process RSS", BYTES),
    )

    def __init__(self, rate_hz: float = HOST_RATE_HZ, device: int = HOST) -> None:
        import psutil  # a trace without counters never imports it

        self.device, self.rate_hz = device, rate_hz
        self._psutil = psutil
        self._process = psutil.Process()
        self._cores = psutil.cpu_count() or os.cpu_count() or 1
        self._last: tuple[float, float, float, float] | None = None

    def _cpu_now(self) -> tuple[float, float, float, float]:
        """(host busy seconds, host total seconds, both summed over cores; this process's CPU seconds; wall), now."""
        times = self._psutil.cpu_times()
        total = sum(times)
        # Linux counts guest time inside user and nice as well: count it once, as psutil does
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        return total - idle, total, time.process_time(), time.perf_counter()

    def sample(self) -> list[float]:
        busy, total, process, wall = now = self._cpu_now()
        last_busy, last_total, last_process, last_wall = self._last or now  # the first: no interval, NaN shares
        self._last = now
        ticks = total - last_total  # seconds of all cores together, in 10 ms ticks
        host_cpu = 100.0 * (busy - last_busy) / ticks if ticks > 0 else float("nan")  # under one tick: unknown
        elapsed = (wall - last_wall) * self._cores
        process_cpu = 100.0 * (process - last_process) / elapsed if elapsed > 0 else float("nan")
        memory = self._psutil.virtual_memory()
        return [
            float(np.clip(host_cpu, 0.0, 100.0)),  # NaN stays NaN
            float(np.clip(process_cpu, 0.0, 100.0)),
            float(memory.total - memory.available),
            float(self._process.memory_info().rss),
        ]

    def describe(self) -> str:
        return f"psutil, {self.rate_hz:g} Hz"

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Offer:
    """What a device offers: its own source (None: none), what ``Trace.counter_sources`` says of it, and a note for
    the trace's warnings ("" where none is due)."""

    source: CounterSource | None
    says: str
    note: str = ""


def offer(number: int, key: str, name: str, host: str) -> Offer:
    """What the trace's device ``number`` (``key`` "opencl:0", named ``name``) offers, a source of its own sampling
    it as ``number``; ``host``: what the host's source is, as its ``describe`` says it."""
    backend = key.partition(":")[0]
    if backend == "cpu":
        return Offer(None, f"the host's counters ({host}): the CPU backend runs on the host's cores")
    if backend in ("opencl", "webgpu"):
        library = "PyOpenCL" if backend == "opencl" else "wgpu-py"
        on_host = _runs_on_host(name)
        says = f"none ({library} exposes no utilization or memory counter)"
        if on_host:
            says += f"; it runs on the host's cores, whose counters are sampled ({host})"
        note = f"counters: {key} ({_short(name)}) offers none; the host's CPU and memory are sampled instead"
        return Offer(None, says, note + (" (this device runs on them)" if on_host else ""))
    return Offer(
        None,
        "none: no source for this device in this build",
        f"counters: no source for {key} in this build; the host's CPU and memory are sampled instead",
    )


def _runs_on_host(name: str) -> bool:
    """Whether a device is a CPU implementation on the host (PoCL's pthread device, Mesa's llvmpipe)."""
    lowered = name.lower()
    return any(word in lowered for word in ("portable computing language", "pthread", "llvmpipe", "(cpu)"))


def _short(name: str) -> str:
    """A device's name as a note shows it: PoCL for the Portable Computing Language, else the name up to 40 chars."""
    if "portable computing language" in name.lower():
        return "PoCL"
    return name if len(name) <= 40 else name[:39] + "…"


def host_source() -> CounterSource:
    """The host's source, which every trace with counters samples (psutil)."""
    return HostSource()
