"""Priming CUPTI after a source parks: a 4-byte copy and memset per device, on a stream of ours, through the driver.

Why: a parked source's forced flush hands every activity buffer back, and the next copy CUPTI records then costs its
caller ~300 µs more than one recorded before (measured on an H200, ``benchmarks/probes/cupti_prime.py``, with the
parked source not watching: a pipeline run's first 64 MiB H2D 0.2 s after a park took 392–474 µs, against 105–115 µs
with CUPTI let go). A 4-byte copy made on another thread right after the park brought it to 228–251 µs (made on the
user's own thread, to ~120 µs: part of the cost is per thread, which no thread of ours can pay for the user's); a
zero-byte memset (an API record and no device work) did not help. With the watch on (the default) the first op
took 422 against 547 µs.

Only devices whose primary context is active are primed; the context is retained for the prime and released after
it, so the primer never keeps one alive (a context released by everyone else between the check and the retain would
be made again for the prime: a window of microseconds). Each context gets a non-blocking stream and a 4-byte
allocation, made on its first prime and again whenever the device's primary context is a new one (``cuCtxGetId``);
they go with their context. A device is primed only where CUPTI names the stream's id (``cuptiGetStreamIdEx``, asked
at every prime: ids may change when CUPTI is let go and initialized again), so that its records can be dropped.
Nothing waits for the primer's work. The lifecycle (``lifecycle.py``) primes on a thread of its own after the park
(~0.5 ms of priming would otherwise hold up the next trace's start, which waits for the last trace's harvester), and
the decoder drops the primer's records: its streams' work, its allocations and its thread's API calls. Where the
user's own thread waits for no trace (``%load_ext``, a notebook cell's pre-run hook) it primes there too, since part
of the cost is per thread.
Nothing here imports cupti-python or a CUDA library: libcuda via ctypes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

_CU_STREAM_NON_BLOCKING = 1


class PrimeFailed(RuntimeError):
    """A driver call of the primer failed (its name and status)."""


def _check(status: int, what: str) -> None:
    if status:
        raise PrimeFailed(f"{what} returned CUDA error {status}")


class _Device:
    """One device's stream and 4 device bytes, in the primary context they were made in (``context_id``)."""

    def __init__(self) -> None:
        self.context_id: int | None = None
        self.stream = ctypes.c_void_p()
        self.pointer = ctypes.c_uint64()
        self.host = ctypes.c_uint32(0)  # pageable: the copy is staged, as most libraries' first copies are

    def make(self, lib: Any, context_id: int) -> None:
        """A stream and 4 bytes in the current context (pushed by the caller); on failure, nothing is left."""
        stream, pointer = ctypes.c_void_p(), ctypes.c_uint64()
        _check(lib.cuStreamCreate(ctypes.byref(stream), _CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        try:
            _check(lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(4)), "cuMemAlloc")
        except PrimeFailed:
            lib.cuStreamDestroy_v2(stream)
            raise
        self.stream, self.pointer, self.context_id = stream, pointer, context_id


class Primer:
    """``prime()``: one tiny copy and memset on every device whose primary context is active, with ``lock`` held."""

    def __init__(self) -> None:
        #: Held while priming: CUPTI is not let go, finalized or handed over meanwhile (``lifecycle.py``).
        self.lock = threading.Lock()
        self._lib: Any = None
        self._devices: dict[int, _Device | None] = {}  # ordinal -> its stream and bytes (None: failed, never again)
        #: (CUDA ordinal, CUPTI stream id) of the primer's streams as of the last prime: a source drops their records
        #: (work primed just before a trace took the source over can end after its cutoff).
        self.streams: frozenset[tuple[int, int]] = frozenset()
        #: (CUDA ordinal, device pointer) of the primer's allocations: a source drops their allocation records.
        self.addresses: frozenset[tuple[int, int]] = frozenset()
        #: Low 32 bits of the thread that primed last (as CUPTI names threads): its API calls are the primer's.
        #: The lifecycle primes on one thread that lives as long as the process.
        self.threads: frozenset[int] = frozenset()
        #: Devices primed by the last call, calls so far, and the last failure (empty: none).
        self.primed = 0
        self.rounds = 0
        self.error = ""

    def _load(self) -> Any:
        """libcuda with the argument types set; None where it cannot be opened (tried once)."""
        if self._lib is None:
            self._lib = False
            lib = ctypes.CDLL("libcuda.so.1")  # loaded already by whoever made CUDA calls: the same library
            lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p]
            lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
            lib.cuCtxGetId.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
            self._lib = lib
        return self._lib or None

    def _active(self, lib: Any) -> list[int]:
        """Ordinals whose primary context is active (retained by a library)."""
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

    def prime(self, cupti_lib: Any = None, drop_calls: bool = True) -> int:
        """Enqueue the copy and memset on each active device whose stream CUPTI names (the caller holds ``lock``);
        the number of devices primed. ``cupti_lib``: libcupti through ctypes, CUPTI attached (None: nothing is
        primed). ``drop_calls``: this thread's API calls are the primer's (``threads``); False where this is the
        user's thread, primed before a trace takes the source over (its calls then end before the cutoff). Never
        raises: a failure is kept in ``error``."""
        self.primed = 0
        self.rounds += 1
        if drop_calls:
            self.threads = frozenset({threading.get_ident() & 0xFFFFFFFF})
        streams = set()
        try:
            lib = self._load()
            get_id = getattr(cupti_lib, "cuptiGetStreamIdEx", None) if cupti_lib is not None else None
            if lib is None or get_id is None:
                return 0
            get_id.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint8, ctypes.POINTER(ctypes.c_uint32)]
            for ordinal in self._active(lib):
                if self._devices.get(ordinal, True) is None:
                    continue  # failed before
                try:
                    sid = self._prime_device(lib, ordinal, get_id)
                except PrimeFailed as exc:
                    self.error = f"device {ordinal}: {exc}"
                    if self._devices.get(ordinal) is None or self._devices[ordinal].context_id is None:
                        self._devices[ordinal] = None  # its set-up failed: never tried again
                    continue
                if sid is not None:
                    streams.add((ordinal, sid))
                    self.primed += 1
        except Exception as exc:  # noqa: BLE001  (no libcuda, an entry point missing, a ctypes error): never raise
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.streams = frozenset(streams)
        return self.primed

    def _prime_device(self, lib: Any, ordinal: int, get_id: Any) -> int | None:
        """Retain the primary context, (re)make the stream and bytes if it is a new one, ask CUPTI the stream's id,
        enqueue the copy and memset, release; the CUPTI stream id, or None where CUPTI could not say (not primed)."""
        device, context = ctypes.c_int(), ctypes.c_void_p()
        _check(lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        try:
            _check(lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
            try:
                context_id = ctypes.c_uint64()
                _check(lib.cuCtxGetId(context, ctypes.byref(context_id)), "cuCtxGetId")
                dev = self._devices.get(ordinal)
                if dev is None or dev.context_id != context_id.value:  # first use, or the context was made anew
                    gone = {(ordinal, dev.pointer.value)} if dev is not None else set()  # went with its context
                    dev = self._devices[ordinal] = dev or _Device()
                    dev.context_id = None
                    dev.make(lib, context_id.value)
                    # the old address is forgotten: another library's allocation may be given it in the new context
                    self.addresses = (self.addresses - gone) | {(ordinal, dev.pointer.value)}
                sid = ctypes.c_uint32()
                if get_id(context, dev.stream, 0, ctypes.byref(sid)):
                    return None
                _check(
                    lib.cuMemcpyHtoDAsync_v2(dev.pointer.value, ctypes.addressof(dev.host), 4, dev.stream),
                    "cuMemcpyHtoDAsync",
                )
                _check(lib.cuMemsetD32Async(dev.pointer.value, 0, 1, dev.stream), "cuMemsetD32Async")
                return sid.value
            finally:
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            lib.cuDevicePrimaryCtxRelease_v2(device)


PRIMER = Primer()
