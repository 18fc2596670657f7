"""CUPTI's API-call timestamps on the window clock (``time.time_ns``) that ops' enqueue windows are read on.

CUPTI's clock is CLOCK_REALTIME, the window clock itself, until another tool's timestamp callback makes it the CPU's
time-stamp counter (PyTorch's profiler leaves Kineto's registered). CUPTI's timestamps are then mapped to ns by a line
(``cupti.to_ns``) that each flush refines, and the offset to the window clock must go through the line the calls it
places went through. So samples are kept raw, converted with the current line at each use, and a call is placed by the
offset interpolated between the samples around it. An offset converted when sampled, with the line a few ms old, put
a d2h's call in its neighbour's window (~115 µs off, on an H100) and the d2h was counted lost.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

#: Raw samples kept: they cover the calls a join still holds (``cupti.HOLD_FLUSHES``) at one sample per harvest.
KEEP = 8


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
