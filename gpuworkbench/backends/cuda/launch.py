"""Prepared kernel launches: the arguments packed once into a block whose address ``cuLaunchKernel`` takes, so that
repeating the launch is one driver call with no per-argument work.

CuPy's ``Function.__call__`` builds a pointer object per argument on every launch (about 1.1 µs of an empty
kernel's 4.3 µs on an H200 host: benchmarks/probes/launch_layers.py). The front end repeats a launch whose grid,
block, stream and argument objects are those of an earlier one (``Kernel.__call__``); a prepared block is never
written again, so threads may share it. Arguments that do not fit an 8-byte slot, or are not NumPy scalars, are not
prepared: CuPy launches them as before.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

CONTEXT_ERROR = 201  # CUDA_ERROR_INVALID_CONTEXT: this thread has no current context yet
#: The ``cudaDeviceProp`` fields theoretical occupancy is computed from (``CudaDevice.occupancy_properties``).
OCCUPANCY_PROPERTIES = frozenset(
    "major minor multiProcessorCount warpSize maxThreadsPerBlock maxThreadsPerMultiProcessor regsPerMultiprocessor "
    "maxBlocksPerMultiProcessor regsPerBlock sharedMemPerMultiprocessor sharedMemPerBlockOptin sharedMemPerBlock "
    "reservedSharedMemPerBlock".split()
)
_CODES = {"?": "?", "b": "b", "B": "B", "h": "h", "H": "H", "i": "i", "I": "I", "l": "q", "L": "Q", "q": "q"}
_CODES.update({"Q": "Q", "e": "e", "f": "f", "d": "d"})


def slot_format(types: Sequence[type]) -> str | None:
    """The ``struct`` format that puts each argument of these NumPy scalar types at the start of its own 8-byte slot
    (little-endian, the hosts CUDA runs on), or None where one does not fit a slot."""
    parts = ["<"]
    for t in types:
        if not (isinstance(t, type) and issubclass(t, np.generic)):
            return None
        dt = np.dtype(t)
        code = _CODES.get(dt.char)
        if code is None or dt.itemsize > 8:
            return None
        parts.append(code + (f"{8 - dt.itemsize}x" if dt.itemsize < 8 else ""))
    return "".join(parts)


class PreparedLaunch:
    """``call(stream_ptr, params, 0)``: ``cuLaunchKernel`` with the function, grid, block and shared bytes bound;
    ``params`` is the address of the kernelParams array, which points into the slots kept here."""

    __slots__ = ("call", "params", "_keep")

    def __init__(self, call: Any, params: int, keep: tuple[np.ndarray, np.ndarray]) -> None:
        self.call, self.params, self._keep = call, params, keep


def prepare(
    launch: Any, func_ptr: int, grid: tuple[int, ...], block: tuple[int, ...], values: Sequence[Any]
) -> PreparedLaunch | None:
    """Pack ``values`` for a launch of ``func_ptr`` through ``launch`` (``cuLaunchKernel``); None where an argument
    cannot be packed."""
    slots = packed(launch, func_ptr, grid, block, [type(v) for v in values])
    if slots is None:
        return None
    struct.pack_into(slots.fmt, slots.view, 0, *values)  # written once: never again, so threads may share it
    return PreparedLaunch(slots.call, slots.params, slots._keep)


class PackedLaunch:
    """A launch whose arguments change from call to call (a loop index): the function, grid and block bound, and
    slots for arguments of fixed types rewritten per call under a lock (``cuLaunchKernel`` copies them as it
    launches). Skips CuPy's ``Function.__call__``, which builds a pointer object per argument on every launch."""

    __slots__ = ("call", "params", "fmt", "view", "lock", "_keep")

    def __init__(self, call: Any, params: int, fmt: str, keep: tuple[np.ndarray, np.ndarray]) -> None:
        self.call, self.params, self.fmt, self._keep = call, params, fmt, keep
        self.view = memoryview(keep[0]).cast("B")
        self.lock = threading.Lock()

    def launch(self, stream_ptr: int, values: Sequence[Any]) -> None:
        with self.lock:
            struct.pack_into(self.fmt, self.view, 0, *values)
            self.call(stream_ptr, self.params, 0)


def packed(
    launch: Any, func_ptr: int, grid: tuple[int, ...], block: tuple[int, ...], types: Sequence[type]
) -> PackedLaunch | None:
    """Slots for arguments of these types, launched through ``launch`` (``cuLaunchKernel``); None where one does not
    fit a slot."""
    fmt = slot_format(types)
    if fmt is None:
        return None
    slots = np.zeros(max(len(types), 1), np.uint64)
    pointers = slots.ctypes.data + 8 * np.arange(len(slots), dtype=np.uint64)
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    call = partial(launch, func_ptr, gx, gy, gz, bx, by, bz, 0)
    return PackedLaunch(call, int(pointers.ctypes.data), fmt, (slots, pointers))
