"""CUPTI's clock: its timestamps mapped to nanoseconds where another tool made them ticks (``TickClock``), and placed
on the window clock (``time.time_ns``) that ops' enqueue windows are read on (``WindowClock``).

Once PyTorch's profiler has started in this process, Kineto's CUPTI timestamp callback stays registered after its
session: CUPTI's timestamps are then the CPU's time-stamp counter, not nanoseconds (measured on the H100 host: 2.0999
ticks per ns, and a trace's records fell outside its ops' enqueue windows). From then on every timestamp read is mapped
back to nanoseconds by a line through a reference sample and the latest one (``TickClock.calibrate``).

CUPTI's clock is CLOCK_REALTIME, the window clock itself, until then. Once it is ticks, the offset to the window clock
must go through the line the calls it places went through. So window samples are kept raw, converted with the current
line at each use, and a call is placed by the offset interpolated between the samples around it. An offset converted
when sampled, with the line a few ms old, put a d2h's call in its neighbour's window (~115 µs off, on an H100) and the
d2h was counted lost.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

#: Raw window samples kept: they cover the calls a join still holds (``source.HOLD_FLUSHES``) at one sample per
#: harvest.
KEEP = 8


class TickClock:
    """Whether CUPTI's timestamps may be another tool's ticks, and the line that maps them back to nanoseconds."""

    def __init__(self) -> None:
        #: Set once another tool (torch.profiler) may have changed CUPTI's timestamps (``may_change``).
        self.ticks = False
        #: (CUPTI timestamp, perf_counter_ns) of the first sample since; None until one is taken.
        self.ref: tuple[int, int] | None = None
        self.per_ns = 1.0

    def may_change(self) -> None:
        """Another tool takes CUPTI: its timestamp callback may outlive its session; calibrate from now on."""
        self.ticks, self.ref, self.per_ns = True, None, 1.0

    def forget(self) -> None:
        """CUPTI was finalized: another tool's timestamp callback may be gone with it; learn the rate again."""
        self.ref, self.per_ns = None, 1.0

    def calibrate(self, raw: int, host_ns: int) -> None:
        """Learn CUPTI's ticks per nanosecond from a sample (CUPTI timestamp, perf_counter_ns) and the reference one."""
        if self.ref is None:
            self.ref = (raw, host_ns)
            return
        elapsed = host_ns - self.ref[1]
        if elapsed > 1_000_000:  # 1 ms: the samples' error (~1 us) is then below 0.2 % of the span they measure
            rate = (raw - self.ref[0]) / elapsed
            self.per_ns = 1.0 if abs(rate - 1.0) < 1e-4 else rate

    def await_rate(self) -> None:
        """A rate needs a sample over 1 ms after the reference one: a flush sooner waits out the rest (its records
        would otherwise be read as nanoseconds; seen on an H200 as a trace right after torch.profiler missing its
        kernels)."""
        ref = self.ref
        if ref is not None and self.per_ns == 1.0:
            left = 1_100_000 - (time.perf_counter_ns() - ref[1])
            if left > 0:
                time.sleep(left / 1e9)

    def to_ns(self, ticks: Any) -> Any:
        """CUPTI timestamps (an int or an int64 array) in nanoseconds, on the line through the reference sample."""
        if not self.ticks or self.ref is None or self.per_ns == 1.0:
            return ticks
        ref = self.ref[0]
        if isinstance(ticks, np.ndarray):
            zero = ticks == 0  # "no timestamp" stays so
            out = ref + np.round((ticks.astype(np.float64) - ref) / self.per_ns).astype(np.int64)
            out[zero] = 0
            return out
        return ref + round((ticks - ref) / self.per_ns) if ticks else ticks


class WindowClock:
    """Offsets (CUPTI's clock minus the window clock) at CUPTI times, from raw samples taken at each harvest."""

    def __init__(self) -> None:
        self.drifts = False  # False: CUPTI's clock is the window clock (offset 0), known from the first sample
        self._raw: list[tuple[int, int]] = []  # (CUPTI's raw timestamp, window ns), oldest first
        self._sampled = False

    def sample(self, source: Any) -> None:
        """Read CUPTI's clock against the window clock. The first sample says whether they are one clock; later ones
        are kept only where they are not."""
        raw, wall, err = source.clock_sample(time.time_ns, raw=True)
        if not self._sampled:
            self._sampled = True
            self.drifts = abs(int(source.to_ns(raw)) - wall) > err + 1000
        if self.drifts:
            self._raw = [*self._raw[-(KEEP - 1) :], (raw, wall)]

    def offsets(self, source: Any, at: np.ndarray | None = None) -> Any:
        """The offset at each CUPTI time in ``at`` (ns, on the current line), interpolated between the samples and
        held flat beyond them; ``at`` None: the newest sample's offset. 0 where CUPTI's clock is the window clock."""
        samples = self._raw  # one list: a sample taken meanwhile replaces it
        if not self.drifts or not samples:
            return 0 if at is None else np.zeros(np.shape(at), np.int64)
        raw = np.array([r for r, _ in samples], np.int64)
        cupti_ns = np.asarray(source.to_ns(raw), np.int64)
        offset = cupti_ns - np.array([w for _, w in samples], np.int64)
        if at is None:
            return int(offset[-1])
        if offset.size == 1:
            return np.full(np.shape(at), offset[0], np.int64)
        # relative to the first sample: absolute ns (~1.8e18) lose ~256 ns in float64
        x = (cupti_ns - cupti_ns[0]).astype(np.float64)
        y = (offset - offset[0]).astype(np.float64)
        return offset[0] + np.round(np.interp((at - cupti_ns[0]).astype(np.float64), x, y)).astype(np.int64)
