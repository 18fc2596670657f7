"""A device's memory as the front end counts it: which dtypes can live there, and the ledger of what gpuworkbench
holds there (bytes, live buffers), through which every allocation and free reaches the recording traces.

``device.py`` (which owns one ledger per Device) and ``buffer.py`` (which allocates and frees) both import this
module; it imports neither (annotations only).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dispatch
from .errors import InvalidArgument

if TYPE_CHECKING:
    from .buffer import Buffer
    from .device import Device


def as_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype with fixed bytes; InvalidArgument for what is not a dtype, objects and empty types."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"{dtype!r} is not a NumPy dtype") from None
    if dt.hasobject or dt.itemsize == 0:
        raise InvalidArgument(f"dtype {dt} cannot live on a device (objects and empty types have no fixed bytes)")
    return dt


class Ledger:
    """What gpuworkbench holds on one device: ``held_bytes`` and the buffers not freed yet.

    ``Buffer.allocate`` and ``Buffer.free`` report here; each allocation and free also becomes a host span and a
    memory sample in every recording trace (``_dispatch.host_event``).
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.held_bytes = 0
        self._lock = threading.Lock()
        self._buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()

    def check_open(self) -> None:
        """InvalidArgument when the device is closed: nothing can be allocated on it (or asked of it)."""
        if self.device.closed:
            raise InvalidArgument(f"device {self.device.spec} is closed")

    def live(self) -> list[Buffer]:
        """Buffers allocated and not freed yet."""
        return [b for b in list(self._buffers) if not b.closed]

    def allocated(self, buf: Buffer, nbytes: int, start_ns: int, handle: Any) -> None:
        """``buf`` (``nbytes``, backend ``handle``) was allocated; the allocation began at ``start_ns``."""
        with self._lock:
            self.held_bytes += nbytes
        self._buffers.add(buf)
        address = handle if isinstance(handle, int) else 0  # a device pointer tells a CUPTI trace the bytes are ours
        _dispatch.host_event(self.device, "alloc", nbytes, f"alloc {nbytes} B", start_ns, address)

    def freed(self, nbytes: int, start_ns: int) -> None:
        """A buffer of ``nbytes`` was freed; the free began at ``start_ns``."""
        with self._lock:
            self.held_bytes -= nbytes
        _dispatch.host_event(self.device, "free", nbytes, f"free {nbytes} B", start_ns)
