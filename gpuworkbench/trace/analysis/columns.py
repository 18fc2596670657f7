"""One device's spans inside a window W, as NumPy columns; the checks of a span table and a window.

Every per-device figure and advice rule reads these columns, so that a table is sliced and clipped to W once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpuworkbench.errors import InvalidArgument
from gpuworkbench.trace.spans import HOST_KINDS, KIND_CODE, KINDS

from .intervals import Intervals

H2D, D2H, KERNEL = KIND_CODE["h2d"], KIND_CODE["d2h"], KIND_CODE["kernel"]
#: By kind code: device work. alloc, free, markers, API calls and host ranges happen on the host: never busy time.
IS_WORK = np.array([name not in HOST_KINDS for name in KINDS])
#: By kind code: what counts in K (kernels, device-to-device copies, memsets).
IS_K = np.array([name in ("kernel", "d2d", "memset") for name in KINDS])

REQUIRED_COLUMNS = ("kind", "device", "stream", "start_ns", "end_ns", "enqueue_ns", "bytes", "pinned")


@dataclass
class DeviceSpans:
    """One device's spans inside its window, start/end clipped to it; ``duration`` is the unclipped duration."""

    device: int
    w0: int
    w1: int
    source: str
    kind: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    end: np.ndarray
    enqueue: np.ndarray
    bytes: np.ndarray
    pinned: np.ndarray
    duration: np.ndarray
    index: np.ndarray  # the rows of the table these spans are

    def rows(self, mask: np.ndarray) -> Intervals:
        """The (clipped) intervals of the spans selected by ``mask``."""
        return self.start[mask], self.end[mask]


def check_table(table: Mapping[str, np.ndarray]) -> None:
    """Raise ``InvalidArgument`` naming the columns a span table lacks."""
    missing = [col for col in REQUIRED_COLUMNS if col not in table]
    if missing:
        raise InvalidArgument(f"span table lacks column(s) {', '.join(missing)}; build it with trace.spans.empty_table")


def check_window(window: tuple[int, int] | None) -> tuple[int, int] | None:
    """The window as two ints; ``InvalidArgument`` when it ends before it starts."""
    if window is None:
        return None
    start, end = int(window[0]), int(window[1])
    if end < start:
        raise InvalidArgument(f"window ends ({end} ns) before it starts ({start} ns)")
    return start, end


def device_spans(table: Mapping[str, np.ndarray], device: int, window: tuple[int, int] | None) -> DeviceSpans:
    """The spans of ``device`` inside ``window``, or inside W = [first op start, last op end] when it is None."""
    rows = np.flatnonzero(np.asarray(table["device"]) == device)
    kind = np.asarray(table["kind"])[rows]
    start = np.asarray(table["start_ns"], dtype=np.int64)[rows]
    end = np.asarray(table["end_ns"], dtype=np.int64)[rows]
    if window is None:
        work = IS_WORK[kind]
        w0, w1 = (int(start[work].min()), int(end[work].max())) if work.any() else (0, 0)
        source = "ops"
        inside = np.ones(rows.size, dtype=bool)
    else:
        w0, w1 = window
        source = "cell"
        inside = (end >= w0) & (start <= w1)
    rows, kind, start, end = rows[inside], kind[inside], start[inside], end[inside]
    return DeviceSpans(
        device=device,
        w0=w0,
        w1=w1,
        source=source,
        kind=kind,
        stream=np.asarray(table["stream"])[rows],
        start=np.clip(start, w0, w1),
        end=np.clip(end, w0, w1),
        enqueue=np.asarray(table["enqueue_ns"], dtype=np.int64)[rows],
        bytes=np.asarray(table["bytes"], dtype=np.int64)[rows],
        pinned=np.asarray(table["pinned"])[rows],
        duration=end - start,
        index=rows,
    )
