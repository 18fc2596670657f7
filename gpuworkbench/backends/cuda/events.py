"""The CUDA backend's events and completions: pooled CUDA events, the epoch a device's event times are measured from,
and the completion of an op bracketed by them; ``load_cupy`` imports CuPy where it is first needed."""

from __future__ import annotations

import gc
import time
from collections import deque
from typing import Any


def load_cupy() -> Any:
    """CuPy, imported on first use (so that the registry can list backends without it)."""
    import cupy

    return cupy


_COLLECTING = False  # True while Python's cyclic garbage collector runs (see CudaCompletion.__del__)


def _gc_phase(phase: str, info: dict) -> None:
    global _COLLECTING
    _COLLECTING = phase == "start"


gc.callbacks.append(_gc_phase)


class EventPool:
    """Reusable CUDA events: creating one costs microseconds, re-recording a pooled one much less."""

    def __init__(self, timing: bool) -> None:
        self._free: deque[Any] = deque(maxlen=4096)  # append/pop are atomic: no lock on the launch path
        self._timing = timing
        self.created = 0  # events made because the pool was empty (a diagnostic: each costs microseconds)

    def take(self) -> Any:
        try:
            return self._free.pop()
        except IndexError:
            self.created += 1
            return load_cupy().cuda.Event(block=False, disable_timing=not self._timing)

    def give(self, event: Any) -> None:
        self._free.append(event)


class Epoch:
    """An event recorded on an idle stream and waited for, paired with the host time it completed at."""

    def __init__(self, event: Any, host_ns: int, error_ns: int) -> None:
        self.event, self.host_ns, self.error_ns = event, host_ns, error_ns


def measure_epoch(stream: Any, tries: int = 3) -> Epoch:
    """An event recorded on the idle ``stream`` and waited for, its completion bracketed on the host: the best (the
    narrowest bracket) of ``tries``."""
    best: Epoch | None = None
    for _ in range(tries):
        event = load_cupy().cuda.Event()
        t0 = time.perf_counter_ns()
        event.record(stream)
        event.synchronize()
        t1 = time.perf_counter_ns()
        epoch = Epoch(event, (t0 + t1) // 2, (t1 - t0) // 2)
        if best is None or epoch.error_ns < best.error_ns:
            best = epoch
    assert best is not None
    return best


class CudaCompletion:
    """An op bracketed by events: ``end`` marks completion; ``start`` (timed ops only) marks when it began."""

    __slots__ = ("end", "start", "epoch", "_pools", "__weakref__")

    def __init__(self, end: Any, start: Any, epoch: Epoch | None, pools: tuple[EventPool, EventPool]) -> None:
        self.end, self.start, self.epoch, self._pools = end, start, epoch, pools

    def done(self) -> bool:
        return self.end.done

    def wait(self) -> None:
        self.end.synchronize()

    def times_ns(self) -> tuple[int, int] | None:
        if self.start is None or self.epoch is None or not self.end.done:
            return None
        cuda = load_cupy().cuda
        base = self.epoch.host_ns
        return (
            base + int(cuda.get_elapsed_time(self.epoch.event, self.start) * 1e6),
            base + int(cuda.get_elapsed_time(self.epoch.event, self.end) * 1e6),
        )

    def __del__(self) -> None:
        if _COLLECTING:
            # Finalized by the cyclic collector (a trace kept in a reference cycle): events pooled from here failed
            # their next record with 'context is destroyed' and then crashed the process (measured on an H100 with
            # CuPy 14.2). They are released with the completion instead; the pool makes new ones.
            return
        timed_pool, plain_pool = self._pools
        if self.start is not None:
            timed_pool.give(self.start)
            timed_pool.give(self.end)
        else:
            plain_pool.give(self.end)
