"""Where whoever records listens to what the core announces: ops, allocations, ranges and blocking points.

The core (devices, buffers, streams, dispatch, ranges, persistent kernels) imports this module and nothing above it;
a recording ``Trace`` adds itself to ``RECORDING`` when it starts and leaves when it stops, and the CUPTI lifecycle
adds itself to ``BLOCKERS`` (the model: CuPy's memory hooks register into its core, which never imports them).
Untraced, an announcement costs one list check: the core reads ``RECORDING`` directly.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol


class Listener(Protocol):
    """What the core calls on a recording listener (``trace.recorder.Trace`` is the one the package has). ``launch``:
    a kernel's (grid, block, registers per thread, shared bytes per block) as launched (-1: not known), or None."""

    def device_number(self, device: Any) -> int: ...
    def knows_device(self, device: Any) -> bool: ...
    def uses_cupti(self, number: int, kind: str, nbytes: int, name: str) -> bool: ...
    def op_id(self) -> int: ...
    def record_op(self, stream: Any, kind: str, nbytes: int, name: str, pinned: int, call: Any, keep: Any,
                  many: bool = False, launch: Any = None) -> Any: ...  # fmt: skip
    def op_end(self, op_id: int, number: int, stream_id: int, kind: str, nbytes: int, name: str, pinned: int,
               enqueue_ns: int, completion: Any, many: bool, claim: tuple[int, int],
               launch: Any = None) -> None: ...  # fmt: skip
    def host_event(
        self, number: int, kind: str, nbytes: int, name: str, start_ns: int, end_ns: int, address: int
    ) -> None: ...
    def memory_sample(self, number: int, held: int, used: int | None) -> None: ...
    def host_range(self, name: str, start_ns: int, end_ns: int, thread: int) -> None: ...
    def label_stream(self, number: int, stream_id: int, label: str) -> None: ...


class Blocker(Protocol):
    """Told when work starts that a whole-device synchronisation would wait for forever (a persistent kernel)."""

    def block(self, owner: object, reason: str) -> None: ...
    def unblock(self, owner: object) -> None: ...


RECORDING: list[Listener] = []  # the listeners recording now, in start order
BLOCKERS: list[Blocker] = []
_LOCK = threading.Lock()


def add(listener: Listener) -> None:
    """Start announcing to ``listener``."""
    with _LOCK:
        RECORDING.append(listener)


def remove(listener: Listener) -> bool:
    """Stop announcing to ``listener``; False when it was not recording."""
    with _LOCK:
        if listener in RECORDING:
            RECORDING.remove(listener)
            return True
        return False


def recording() -> list[Listener]:
    """A copy of the listeners recording now (safe to iterate while one stops)."""
    return list(RECORDING)


def block(owner: object, reason: str) -> None:
    """``owner`` (a persistent kernel) starts work that a device-wide sync would wait for forever."""
    for blocker in list(BLOCKERS):
        blocker.block(owner, reason)


def unblock(owner: object) -> None:
    """``owner``'s blocking work is over."""
    for blocker in list(BLOCKERS):
        blocker.unblock(owner)
