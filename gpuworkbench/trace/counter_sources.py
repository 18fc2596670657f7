"""What a counter source is (``CounterSource``, ``Counter``) and the host's source; ``counter_offer.py`` says what each
device offers.

A source says which device it samples (a trace device number; ``HOST`` for the host), its counters (name, unit), its
rate and what it is ("psutil, 10 Hz"), and returns one value per counter from ``sample()``. The host's source reads
the host's CPU and memory and this process's share of them (psutil, imported when a trace first samples). Devices of
the CPU backend run on the host: the host's counters are theirs. A CUDA device's source is NVML (``counter_nvml``:
GPM where the GPU has it), where nvidia-ml-py is installed and NVML starts.
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


def host_source() -> CounterSource:
    """The host's source, which every trace with counters samples (psutil)."""
    return HostSource()
