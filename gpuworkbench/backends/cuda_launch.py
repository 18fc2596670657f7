"""Kernel launches straight through ``cuLaunchKernel``: the arguments packed by ``struct`` into a per-thread block
of 8-byte slots whose addresses never change, so a launch is one ``pack_into`` and one driver call.

CuPy's ``Function.__call__`` builds a pointer object per argument on every launch; this path costs about 1.3 µs
less per launch on an H200 host (benchmarks/probes/launch_layers.py). Arguments it cannot pack (wider than 8 bytes,
or not NumPy scalars) go through CuPy as before. The driver copies the parameters during the call, so the slots
may be reused at once; they are per thread because the call releases the GIL. ``cuLaunchKernel`` needs the
device's context current on the calling thread, which ``cudaGetDevice`` alone does not ensure in a thread that
never called ``cudaSetDevice``: the first launch of each thread sets the device.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

SLOTS = 64  # the most arguments a packed launch takes (more go through CuPy)
_CODES = {"?": "?", "b": "b", "B": "B", "h": "h", "H": "H", "i": "i", "I": "I", "l": "q", "L": "Q", "q": "q"}
_CODES.update({"Q": "Q", "e": "e", "f": "f", "d": "d"})


def _slot_format(types: tuple[type, ...]) -> str | None:
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


class DirectLauncher:
    """Packs and launches; ``launch`` returns False (having done nothing) where CuPy must launch instead."""

    def __init__(self, driver: Any, set_device: Any) -> None:
        self._launch = driver.launchKernel
        self._set_device = set_device  # makes the device's primary context current on this thread
        self._formats: dict[tuple[type, ...], struct.Struct | None] = {}
        self._local = threading.local()

    def _slots(self) -> tuple[memoryview, int]:
        self._set_device()
        slots = np.zeros(SLOTS, np.uint64)
        addresses = slots.ctypes.data + 8 * np.arange(SLOTS, dtype=np.uint64)  # the kernelParams array
        self._local.params = params = (memoryview(slots).cast("B"), int(addresses.ctypes.data), slots, addresses)
        return params[0], params[1]

    def launch(
        self, func_ptr: int, grid: tuple[int, ...], block: tuple[int, ...], values: Sequence[Any], stream_ptr: int
    ) -> bool:
        types = tuple(map(type, values))
        packer = self._formats.get(types, False)
        if packer is False:
            fmt = _slot_format(types) if len(types) <= SLOTS else None
            packer = self._formats[types] = None if fmt is None else struct.Struct(fmt)
        if packer is None:
            return False
        try:
            view, pointers = self._local.params[:2]
        except AttributeError:
            view, pointers = self._slots()
        packer.pack_into(view, 0, *values)
        gx, gy, gz = grid if len(grid) == 3 else (grid + (1, 1))[:3]
        bx, by, bz = block if len(block) == 3 else (block + (1, 1))[:3]
        self._launch(func_ptr, gx, gy, gz, bx, by, bz, 0, stream_ptr, pointers, 0)
        return True
