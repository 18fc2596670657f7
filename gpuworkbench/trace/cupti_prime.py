"""Priming CUPTI after a source parks: a 4-byte copy and memset per device, on a stream of ours, through the driver.

Why: a parked source's forced flush hands every activity buffer back, and the next copy CUPTI records then costs its
caller ~300 µs more than one recorded before (measured on an H200, ``benchmarks/probes/cupti_prime.py``, with the
parked source not watching: a pipeline run's first 64 MiB H2D 0.2 s after a park took 392–474 µs, against 105–115 µs
with CUPTI let go). A 4-byte copy made on another thread right after the park brought it to 228–251 µs (made on the
user's own thread, to ~120 µs: part of the cost is per thread, which no thread of ours can pay for the user's); a
zero-byte memset (an API record and no device work) did not help. With the watch on (the default) the first op
took 422 against 547 µs.

Only devices whose primary context is active are primed (no context is ever created here); each gets, once per
process, a non-blocking stream and a 4-byte allocation in that context, kept for the process's life. Nothing waits
for the primer's work. ``cupti.py`` primes on a thread of its own after the park (~0.5 ms of priming would otherwise
hold up the next trace's start, which waits for the last trace's harvester) and drops the primer's records: its
streams' work and its thread's API calls. Nothing here imports cupti-python or a CUDA library: libcuda via ctypes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

_CU_STREAM_NON_BLOCKING = 1


class _Device:
    """What priming one device needs, made once: its primary context, a stream and 4 device bytes."""

    def __init__(self, lib: Any, ordinal: int, cupti_lib: Any) -> None:
        device = ctypes.c_int()
        context = ctypes.c_void_p()
        stream = ctypes.c_void_p()
        pointer = ctypes.c_uint64()
        _check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        self.context = context
        pushed = False
        try:  # a failure gives back what was made: the stream and the context's retain
            _check(lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
            pushed = True
            _check(lib.cuStreamCreate(ctypes.byref(stream), _CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            _check(lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(4)), "cuMemAlloc")
        except PrimeFailed:
            if stream.value:
                lib.cuStreamDestroy_v2(stream)
            if pushed:
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            lib.cuDevicePrimaryCtxRelease_v2(device)
            raise
        lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        self.stream, self.pointer = stream, pointer
        #: CUPTI's id of the stream (its records carry it), or -1 where CUPTI could not say.
        self.cupti_stream = -1
        fn = getattr(cupti_lib, "cuptiGetStreamIdEx", None) if cupti_lib is not None else None
        if fn is not None:
            sid = ctypes.c_uint32()
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint8, ctypes.POINTER(ctypes.c_uint32)]
            if not fn(context, stream, 0, ctypes.byref(sid)):
                self.cupti_stream = sid.value
        self.host = ctypes.c_uint32(0)  # pageable: the copy is staged, as most libraries' first copies are


class PrimeFailed(RuntimeError):
    """A driver call of the primer failed (its name and status)."""


def _check(status: int, what: str) -> None:
    if status:
        raise PrimeFailed(f"{what} returned CUDA error {status}")


class Primer:
    """``prime()``: one tiny copy and memset on every device whose primary context is active, with ``lock`` held."""

    def __init__(self) -> None:
        #: Held while priming: ``cuptiFinalize`` outside a CUDA call's exit (``cupti.let_go``) must not run meanwhile.
        self.lock = threading.Lock()
        self._lib: Any = None
        self._devices: dict[int, _Device | None] = {}  # ordinal -> its set-up (None: it failed, never tried again)
        #: (CUDA ordinal, CUPTI stream id) of the primer's streams: a source drops their records (work primed just
        #: before a trace took the source over can end after its cutoff).
        self.streams: frozenset[tuple[int, int]] = frozenset()
        #: Low 32 bits of the thread that primed last (as CUPTI names threads): its API calls are the primer's.
        #: ``cupti.py`` primes on one thread that lives as long as the process.
        self.threads: frozenset[int] = frozenset()
        #: Devices primed by the last call, and the last failure (empty: none).
        self.primed = 0
        self.error = ""

    def _load(self) -> Any:
        """libcuda with the argument types set; None where it cannot be opened (tried once)."""
        if self._lib is None:
            self._lib = False
            lib = ctypes.CDLL("libcuda.so.1")  # loaded already by whoever made CUDA calls: the same library
            lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p]
            lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
            self._lib = lib
        return self._lib or None

    def _active(self, lib: Any) -> list[int]:
        """Ordinals whose primary context is active (retained by a library, or by us)."""
        count = ctypes.c_int()
        if lib.cuDeviceGetCount(ctypes.byref(count)):
            return []  # the driver is not initialized: no CUDA work was ever done, nothing to prime
        active = []
        for ordinal in range(count.value):
            device, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            if lib.cuDeviceGet(ctypes.byref(device), ordinal):
                continue
            if not lib.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(on)) and on.value:
                active.append(ordinal)
        return active

    def prime(self, cupti_lib: Any = None) -> int:
        """Enqueue the copy and memset on each active device (the caller holds ``lock``); the number of devices
        primed. Never raises. ``cupti_lib`` (libcupti through ctypes, CUPTI attached) names each new stream's CUPTI
        id in ``streams``."""
        self.primed = 0
        self.threads = frozenset({threading.get_ident() & 0xFFFFFFFF})
        try:
            lib = self._load()
            for ordinal in self._active(lib) if lib is not None else ():
                dev = self._device(lib, ordinal, cupti_lib)
                if dev is None:
                    continue
                lib.cuCtxPushCurrent_v2(dev.context)
                try:
                    _check(
                        lib.cuMemcpyHtoDAsync_v2(dev.pointer.value, ctypes.addressof(dev.host), 4, dev.stream),
                        "cuMemcpyHtoDAsync",
                    )
                    _check(lib.cuMemsetD32Async(dev.pointer.value, 0, 1, dev.stream), "cuMemsetD32Async")
                    self.primed += 1
                except PrimeFailed as exc:
                    self.error = f"device {ordinal}: {exc}"
                finally:
                    lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        except (OSError, AttributeError) as exc:  # no libcuda, or one without these entry points
            self.error = f"{type(exc).__name__}: {exc}"
        return self.primed

    def _device(self, lib: Any, ordinal: int, cupti_lib: Any) -> _Device | None:
        """The set-up of ``ordinal``, made on first use (None: it failed once, and is never tried again)."""
        if ordinal not in self._devices:
            try:
                made = self._devices[ordinal] = _Device(lib, ordinal, cupti_lib)
                if made.cupti_stream >= 0:
                    self.streams = self.streams | {(ordinal, made.cupti_stream)}
            except PrimeFailed as exc:
                self._devices[ordinal] = None
                self.error = f"device {ordinal}: {exc}"
        return self._devices[ordinal]


PRIMER = Primer()
