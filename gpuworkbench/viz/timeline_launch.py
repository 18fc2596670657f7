"""How a kernel was launched, as the timeline's tooltip says it: grid, block, registers per thread, shared memory per
block and the theoretical occupancy they allow on the span's device, with the limit that binds below 100 %.

Each distinct (device, grid, block, registers, shared bytes) is written once and indexed (``distinct_rows``: one sort),
so that 1 000 kernel spans of 19 shapes cost under a millisecond on the 2-core development machine.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpuworkbench._format import binary_bytes
from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.kernel_shapes import distinct_rows
from gpuworkbench.trace.occupancy import LIMITERS, block_threads, occupancy
from gpuworkbench.trace.spans import KIND_CODE, unpack_dim3

from .coded import coded

_KERNEL = KIND_CODE["kernel"]


def launch_text(table: Mapping[str, np.ndarray], limits: Mapping[int, DeviceLimits | None] | None = None) -> np.ndarray:
    """Every span's launch as text ("grid 128×1×1 · block 256×1×1 · 202 registers · 48.0 KiB shared · occupancy
    12.5 % (registers)"); "" for spans that are no kernel or whose launch is not known. A ``Coded`` column where
    any span's launch is known (each distinct text once)."""
    n = len(table["kind"])
    if "grid" not in table or "block" not in table:
        return np.full(n, "", dtype=object)
    rows = np.flatnonzero((np.asarray(table["kind"]) == _KERNEL) & (np.asarray(table["block"], np.int64) > 0))
    if not rows.size:
        return np.full(n, "", dtype=object)
    unknown = np.full(rows.size, -1, np.int64)
    columns = [
        np.asarray(table["device"], np.int64)[rows],
        np.asarray(table["grid"], np.int64)[rows],
        np.asarray(table["block"], np.int64)[rows],
        np.asarray(table["registers"], np.int64)[rows] if "registers" in table else unknown,
        np.asarray(table["shared_bytes"], np.int64)[rows] if "shared_bytes" in table else unknown,
    ]
    first, inverse = distinct_rows(columns)
    device, grid, block, registers, shared = (c[first] for c in columns)
    pct, limiter = np.full(first.size, np.nan), np.zeros(first.size, np.int64)
    for number, device_limits in (limits or {}).items():
        mine = np.flatnonzero(device == number)
        if device_limits is not None and mine.size:
            occ = occupancy(block_threads(block[mine]), registers[mine], shared[mine], device_limits)
            pct[mine], limiter[mine] = occ.pct, occ.limiter
    texts = [
        _text(*shape)
        for shape in zip(grid.tolist(), block.tolist(), registers.tolist(), shared.tolist(), pct.tolist(), limiter)
    ]
    codes = np.zeros(n, np.int64)
    codes[rows] = np.asarray(inverse).reshape(-1) + 1
    return coded(["", *texts], codes)


def _text(grid: int, block: int, registers: int, shared: int, pct: float, limiter: int) -> str:
    """One launch shape's text: what is known of it, joined by " · "."""
    parts = []
    for label, packed in (("grid", grid), ("block", block)):
        xyz = unpack_dim3(packed)
        if xyz is not None:
            parts.append(f"{label} {'×'.join(map(str, xyz))}")
    if registers >= 0:
        parts.append(f"{registers} registers")
    if shared >= 0:
        parts.append(f"{binary_bytes(shared)} shared")
    if pct == pct:  # known: the device's limits, the registers and the shared bytes
        why = f" ({LIMITERS[int(limiter)]})" if pct < 100 else ""
        parts.append(f"occupancy {pct:.1f} %{why}")
    return " · ".join(parts)
