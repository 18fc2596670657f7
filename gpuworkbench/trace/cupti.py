"""CUPTI activity records (kernels, memcpys, memsets) as a span source: NVIDIA's ``cupti-python`` plus raw buffers.

CUPTI's activity callbacks are process-global, so at most one :class:`CuptiSource` is active per process: a second
``start()`` while another source is active raises :class:`CuptiUnavailable` (it is not reference-counted).
Nothing here synchronizes the device; ``cupti`` is imported lazily so that this module imports without it.

Why raw buffers: cupti-python builds a Python object per record inside CUPTI's buffer callback (10–40 µs a record, on
CUPTI's thread, holding the GIL), which slowed kernel launches on other threads ~10× while a flush ran. So cupti-python
only enables kinds, names enums, describes record layouts (its NumPy dtypes) and pushes/pops external ids; the buffer
callbacks are our own, registered on the same libcupti through ctypes. The completed-buffer callback only copies the
valid bytes. ``flush()`` walks the records by their sizes (learned from CUPTI's own ``cuptiActivityGetNextRecord`` on
the first buffers that hold each kind) and gathers each kind's fields with NumPy.

Verified on an H200 (CUPTI 13.0, benchmarks/probes/cupti_probe.py): the walk by learned sizes gives exactly the
offsets of ``cuptiActivityGetNextRecord`` on every buffer; cupti-python's dtypes match both CUPTI's record sizes and
cupti.h.

Kernel names are ``const char*`` into CUPTI-owned memory, not into our buffers, so recycling a buffer does not free
them: they are read in ``flush()`` (as PyTorch's Kineto reads them, long after the callback); on the H200 the name of a
kernel whose module was released before the flush still read back intact. They are read once per distinct pointer per
flush and not cached across flushes, so a pointer reused after a module unload cannot yield a stale name.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .cupti_detach import Deadline, ExitDetach
from .cupti_join import ExternalIdJoin
from .cupti_prime import PRIMER
from .spans import pack_dim3

#: Activity kinds enabled by :meth:`CuptiSource.start`, by their ``cupti.ActivityKind`` names.
ACTIVITY_KINDS: tuple[str, ...] = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "EXTERNAL_CORRELATION")
#: ... and where this CUPTI has them: device allocations and frees of every library (CUPTI_ACTIVITY_KIND_MEMORY2),
#: and NVTX ranges (MARKER; NVTX reaches CUPTI only where ``NVTX_INJECTION64_PATH`` named libcupti before the
#: process's first NVTX call: set by the user, never by us). ``GPUWB_CUPTI_OPTIONAL=`` (empty) turns both off.
OPTIONAL_KINDS: tuple[str, ...] = tuple(
    k for k in os.environ.get("GPUWB_CUPTI_OPTIONAL", "MEMORY2,MARKER").split(",") if k
)
#: API record kinds enabled as carriers: CUPTI emits EXTERNAL_CORRELATION records only for API calls it records, and
#: a trace places each call (its thread and start) in the window in which it enqueued one of its ops.
API_CARRIER_KINDS: tuple[str, ...] = ("DRIVER", "RUNTIME")
#: Restrict the carriers to the API calls that enqueue device work (names by prefix), to keep buffers small.
API_FILTER = True
_API_PREFIXES: dict[str, tuple[str, ...]] = {
    "driver": ("cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"),
    "runtime": ("cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch"),
}
#: Size of each activity buffer handed to CUPTI (a traced launch costs 256 bytes of records: kernel, API call).
#: Small enough that CUPTI hands full buffers back by itself every few ms of busy launching.
BUFFER_BYTES = 512 << 10
#: ``flush_columns`` asks CUPTI to flush only when no buffer has come back for this long (a flush holds CUPTI's
#: locks for a millisecond or more, stalling launches on other threads: measured on an H200, flushing every 10 ms
#: made each traced launch several µs slower). None: flush on every call.
FLUSH_IDLE_S: float | None = 0.05
#: ... and at least this often (10 Hz, what a live view needs), for records left in a buffer that is not full.
FLUSH_MAX_S = 0.1
#: Empty buffers kept for reuse once CUPTI hands them back; more are freed.
POOL_MAX = 8
#: Seconds at most that CUPTI stays attached with its kinds on after the last trace that used it stops (``stop`` parks
#: the source): a trace started meanwhile takes it over without enabling anything. Then, or at the first untraced
#: launch, copy or memset (``WATCH_UNTRACED``), it is let go (``cuptiFinalize``), because an attached CUPTI slows every
#: launch of the process, traced or not (see ``cupti_detach.py``). 0: let go as each trace ends.
LINGER_S = float(os.environ.get("GPUWB_CUPTI_LINGER_S", "30"))
#: Seconds after CUPTI was let go at a CUDA call's exit (the linger ran out, or untraced work met a lingering source)
#: until it is initialized again on a thread of ours, with no kind on (``reattach_soon``): the next trace then only
#: enables its kinds (~0.3 ms on an H200) rather than attaching (~12–16 ms), while an empty launch pays 1.03–1.04 ×
#: what it pays with CUPTI let go (in one process; see docs/benchmarks.md). Not in a notebook (``NOTEBOOK``).
#: None: never (the next trace attaches).
REATTACH_S: float | None = float(os.environ.get("GPUWB_CUPTI_REATTACH_S", "0.1") or "nan")
if REATTACH_S != REATTACH_S:  # GPUWB_CUPTI_REATTACH_S= (empty): off
    REATTACH_S = None
#: Whether a lingering source is let go at the first untraced call that enqueues device work (a launch, copy or
#: memset of any library on any thread), rather than lingering on for ``LINGER_S``: that work would pay the kinds.
WATCH_UNTRACED = os.environ.get("GPUWB_CUPTI_WATCH", "1") != "0"
#: Prime CUPTI as a source parks (``cupti_prime.py``): a 4-byte copy and memset per active device, so that the next
#: op CUPTI records does not pay for the park's forced flush. ``GPUWB_CUPTI_PRIME=0`` turns it off.
PRIME_AT_PARK = os.environ.get("GPUWB_CUPTI_PRIME", "1") != "0"
#: Who turns a taken-over watch's callbacks off: "trace" (the taking trace's harvest thread, as it begins and at each
#: wake, ``quiet_taken_over``: no other thread woken beside the first op; ``CuptiSource.start`` took 36–45 µs against
#: 51–60 µs with "linger", H200 host, ``probes/trace_start_steps.py``) or "linger" (the linger thread, woken by the
#: take-over: for sources started without a trace's harvest thread). ``GPUWB_CUPTI_QUIET_BY`` sets it.
QUIET_BY = os.environ.get("GPUWB_CUPTI_QUIET_BY", "trace")
_QUIET_DUE = False
#: Set by ``%load_ext gpuworkbench``: its IPython hooks attach CUPTI before each cell that traces
#: (``warm_for_cell``) and let it go before the others, so a let-go is not followed by a re-initialization
#: ``REATTACH_S`` later, which could fall inside a running cell and stall its CUDA calls (4–9 ms once on an H200,
#: ``probes/cupti_attach.py``) and would leave untraced cells paying *ready*'s cost.
NOTEBOOK = False
#: Flushes an activity record waits for its external id before it is handed out with ``external_id`` -1.
HOLD_FLUSHES = 2
#: Flushes an external-correlation entry is kept once an activity record has used it (graph launches share one).
EXT_KEEP_FLUSHES = 16
#: Most external-correlation entries kept while waiting for their activity records (deep queues); the oldest to
#: arrive are dropped first.
EXT_MAP_MAX = 1 << 16

# CUpti_ActivityMemcpyKind names -> our span kinds; anything else is "other_copy".
_COPY_KIND_NAMES: dict[str, str] = {
    "HTOD": "h2d",
    "HTOA": "h2d",
    "DTOH": "d2h",
    "ATOH": "d2h",
    "DTOD": "d2d",
    "ATOA": "d2d",
    "ATOD": "d2d",
    "DTOA": "d2d",
    "PTOP": "d2d",
}
# Hints for CUPTI results that mean "CUPTI cannot be used here".
_RESULT_HINTS: dict[str, str] = {
    "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED": "another CUPTI client (Nsight Systems, a framework profiler ...) is "
    "attached to this process",
    "ERROR_NOT_COMPATIBLE": "this CUPTI does not match the driver (a cupti-python / nvidia-cuda-cupti newer than the "
    "driver's CUDA version?)",
    "ERROR_CUDA_COMPILER_NOT_COMPATIBLE": "this CUPTI does not match the driver",
    "ERROR_NOT_INITIALIZED": "CUPTI could not initialize (no CUDA driver, or a driver too old for this CUPTI?)",
    "ERROR_INSUFFICIENT_PRIVILEGES": "the driver refuses profiling to this user",
    "ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED": "tracing is not supported on this virtualized GPU",
    "ERROR_LEGACY_PROFILER_NOT_SUPPORTED": "the driver refuses the activity API here",
}

# Record layouts: the fields we read, as (byte offset, size) in the C structs of cupti.h (CUpti_ActivityKernel4..10,
# CUpti_ActivityMemcpy6, CUpti_ActivityMemset4, CUpti_ActivityExternalCorrelation). cupti-python's dtypes, where
# present, override them; these are the fallback and a cross-check.
_BUILTIN_FIELDS: dict[str, dict[str, tuple[int, int]]] = {
    "kernel": {
        "start": (16, 8),
        "end": (24, 8),
        "device_id": (40, 4),
        "stream_id": (48, 4),
        "correlation_id": (92, 4),
        "name": (104, 8),
        "grid_x": (52, 4),
        "grid_y": (56, 4),
        "grid_z": (60, 4),
        "block_x": (64, 4),
        "block_y": (68, 4),
        "block_z": (72, 4),
    },
    "memcpy": {
        "copy_kind": (4, 1),
        "src_kind": (5, 1),
        "dst_kind": (6, 1),
        "bytes": (8, 8),
        "start": (16, 8),
        "end": (24, 8),
        "device_id": (32, 4),
        "stream_id": (40, 4),
        "correlation_id": (44, 4),
        "runtime_correlation_id": (48, 4),
    },
    "memset": {
        "bytes": (8, 8),
        "start": (16, 8),
        "end": (24, 8),
        "device_id": (32, 4),
        "stream_id": (40, 4),
        "correlation_id": (44, 4),
    },
    "ext": {"external_kind": (4, 4), "external_id": (8, 8), "correlation_id": (16, 4)},
    "api": {"cbid": (4, 4), "start": (8, 8), "end": (16, 8), "thread_id": (28, 4), "correlation_id": (32, 4)},
    "memory": {
        "memory_operation_type": (4, 4),
        "memory_kind": (8, 4),
        "correlation_id": (12, 4),
        "address": (16, 8),
        "bytes": (24, 8),
        "timestamp": (32, 8),
        "device_id": (52, 4),
        "stream_id": (60, 4),
    },
    "marker": {
        "flags": (4, 4),
        "timestamp": (8, 8),
        "id": (16, 4),
        "thread_id": (28, 4),
        "name": (40, 8),
        "domain": (48, 8),
    },
}
# cupti-python dtype names per struct (newest first).
_DTYPE_NAMES: dict[str, tuple[str, ...]] = {
    "kernel": ("activity_kernel10_dtype", "activity_kernel9_dtype"),
    "memcpy": ("activity_memcpy6_dtype", "activity_memcpy5_dtype"),
    "memset": ("activity_memset4_dtype",),
    "ext": ("activity_external_correlation_dtype",),
    "api": ("activity_api_dtype",),
    "memory": ("activity_memory4_dtype",),
    "marker": ("activity_marker2_dtype",),
}
_BUILTIN_SIZES: dict[str, int] = {"ext": 24, "api": 40, "memory": 128, "marker": 56}

# A record size for kinds not (yet) verified: any walk that meets one overshoots and falls back to CUPTI's walk.
_UNVERIFIED = 1 << 40
_MAX_KIND = 256

_REQUEST_FN = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
_COMPLETE_FN = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)

# Numeric span columns decoded per struct, in the order of the record dict's keys that come from them.
_SPAN_FIELDS: tuple[str, ...] = (
    "start",
    "end",
    "bytes",
    "name",
    "pinned",
    "stream_id",
    "device_id",
    "correlation_id",
    "grid",
    "block",
)
_TIME_FIELDS: tuple[str, ...] = ("start", "end", "correlation_id")

_NONE = np.empty(0, np.int64)
_DIM_FIELDS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
_STATE_LOCK = threading.Lock()

_ACTIVE: CuptiSource | None = None
#: The source left running after its trace stopped (see ``LINGER_S``), and the number of its parking.
_PARKED: CuptiSource | None = None
_PARK_TOKEN = 0
#: CUPTI's callback subscriber while we have it attached: armed once the linger is over, it finalizes CUPTI at the
#: next CUDA call's exit.
_DETACH: ExitDetach | None = None
#: Whether CUPTI is attached by us (callbacks registered or kinds enabled since the last ``cuptiFinalize``).
_ATTACHED = False
#: Whether CUPTI is attached with no kind enabled since it was initialized (``reattach_soon``): an empty launch then
#: pays 1.03–1.04 × (H200, one process), where one whose kinds were on pays 1.2 × until ``cuptiFinalize``.
_FRESH = False
#: Callback ids of the driver calls that enqueue device work, as a lookup table (``ExitDetach.watch``).
_WORK_CBIDS = b""
#: The CUPTI result that refused the last detach's subscriber or arming (0: not refused); CUPTI then stays attached.
detach_refused = 0
_RAW: _RawCupti | None = None
_AVAILABLE: tuple[bool, str] | None = None


class CuptiUnavailable(Exception):
    """CUPTI cannot be used in this process; the message says why."""


class _CuptiCallFailed(Exception):
    """A libcupti call made through ctypes returned an error (``status`` is its ``CUptiResult``)."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what} returned {status}")
        self.status = status


def _describe(exc: BaseException, cupti: Any = None) -> str:
    """A readable reason from a cupti-python exception (a ``cuptiError`` carries a ``CUptiResult``)."""
    status = getattr(exc, "status", None)
    if status is None or cupti is None:
        return f"{type(exc).__name__}: {exc}"
    try:
        name = cupti.Result(status).name
    except ValueError:
        name = f"result {status}"
    hint = _RESULT_HINTS.get(name)
    return f"CUPTI_{name}" + (f": {hint}" if hint else "")


def _libcupti_path(cupti: Any) -> str:
    """Path of the libcupti that cupti-python loaded: ours must register on that very instance."""
    cupti.get_timestamp()  # makes cupti-python load the library if it has not yet
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.rsplit("/", 1)[-1].startswith("libcupti.so"):
                    return path
    except OSError:
        pass
    try:  # cupti-python finds libcupti through cuda-pathfinder; ask it the same question
        from cuda import pathfinder

        return str(pathfinder.load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception as exc:  # noqa: BLE001
        raise CuptiUnavailable(f"cannot locate the libcupti that cupti-python loaded: {exc!r}") from exc


class _RawCupti:
    """libcupti through ctypes: our buffer callbacks, flush, and the record walk; one per process."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)  # already loaded by cupti-python: dlopen returns that same instance
        lib.cuptiActivityRegisterCallbacks.argtypes = [_REQUEST_FN, _COMPLETE_FN]
        lib.cuptiActivityRegisterCallbacks.restype = ctypes.c_int
        lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        lib.cuptiActivityFlushAll.restype = ctypes.c_int
        lib.cuptiActivityGetNextRecord.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.cuptiActivityGetNextRecord.restype = ctypes.c_int
        self.path = path
        self.lib = lib
        self._lock = threading.Lock()  # guards the pool and the buffers CUPTI holds (CUPTI calls from any thread)
        self._pool: list[Any] = []
        self._live: dict[int, Any] = {}
        # ctypes releases the GIL around foreign calls: flushes never block other Python threads.
        self.flush_all = lib.cuptiActivityFlushAll
        self._get_next = lib.cuptiActivityGetNextRecord
        self._request_fn = _REQUEST_FN(self._on_request)  # kept alive for good: CUPTI has no "unregister"
        self._complete_fn = _COMPLETE_FN(self._on_complete)
        #: Record size per activity kind, in 4-byte words, once CUPTI's own walk has shown it; else _UNVERIFIED.
        self.size_words: list[int] = [_UNVERIFIED] * _MAX_KIND
        #: Sizes the dtypes predict per kind (bytes): a kind seen only as a buffer's last record is verified by them.
        self.expected_bytes: dict[int, int] = {}
        #: Learned sizes that differ from the dtypes' (kind -> (learned, expected) bytes).
        self.size_mismatch: dict[int, tuple[int, int]] = {}
        self.end_status = -1  # CUPTI_ERROR_MAX_LIMIT_REACHED, set by the source from cupti-python's enum
        self.buffers_walked_by_cupti = 0
        self.last_walk_status = 0
        #: Whether CUPTI's buffer callbacks are ours as far as we know (registering costs ~1 ms: done when not).
        self.ours = False

    def hand_back(self) -> bool:
        """Give CUPTI's buffer callbacks back to PyTorch's profiler (Kineto) where it is loaded: Kineto may register
        its callbacks only once per process, so after a trace of ours its next session would otherwise send its
        records to us (measured: torch.profiler then saw 0 kernels). True when handed back."""
        self.ours = False  # the other tool registers its own anyway
        callbacks = _kineto_callbacks()
        if callbacks is None:
            return False
        return not self.lib.cuptiActivityRegisterCallbacks(*callbacks)

    def register(self) -> None:
        """Make CUPTI hand its activity buffers to us (replaces any callbacks registered before)."""
        status = self.lib.cuptiActivityRegisterCallbacks(self._request_fn, self._complete_fn)
        if status:
            raise _CuptiCallFailed("cuptiActivityRegisterCallbacks", status)
        self.ours = True

    def _on_request(self, buf_out: Any, size_out: Any, max_records_out: Any) -> None:
        """CUPTI asks for an empty buffer (on whichever thread records an activity): one from the pool."""
        try:
            with self._lock:
                buf = self._pool.pop() if self._pool else None
            if buf is None:
                buf = (ctypes.c_uint64 * (BUFFER_BYTES // 8))()  # 8-byte aligned, as CUPTI requires
            addr = ctypes.addressof(buf)
            with self._lock:
                self._live[addr] = buf
            buf_out[0] = addr
            size_out[0] = ctypes.sizeof(buf)
            max_records_out[0] = 0
        except BaseException:  # noqa: BLE001  nothing may escape into CUPTI; a NULL buffer drops the records
            with contextlib.suppress(BaseException):
                buf_out[0] = None
                size_out[0] = 0

    def _on_complete(self, context: Any, stream_id: int, buf: int | None, size: int, valid: int) -> None:
        """CUPTI hands back a buffer (its thread, or inside a flush): copy the valid bytes, pool the buffer, return."""
        try:
            source = _ACTIVE
            if buf and valid and source is not None:
                source._ingest((ctypes.c_char * valid).from_address(buf))  # copied there, before the buffer is reused
            with self._lock:
                kept = self._live.pop(buf, None) if buf else None
                if kept is not None and len(self._pool) < POOL_MAX:
                    self._pool.append(kept)
        except BaseException:  # noqa: BLE001  nothing may escape into CUPTI's thread
            pass

    def walk(self, data: Any) -> np.ndarray:
        """Offsets (in 4-byte words) of the records in ``data``: by the verified sizes, else by CUPTI's walk.

        Record by record in Python, except where the last few records repeat (a launch loop writes API and kernel
        records, and external-id ones where ids are pushed, over and over): then the repetitions that follow are
        checked in one NumPy step, each predicted record's kind word being the one whose size predicted the next, so
        the result is the same walk."""
        self.last_walk_status = 0
        if len(data) % 8 == 0:
            words = memoryview(data).cast("I")
            array = np.frombuffer(data, np.uint32)
            sizes = self.size_words
            parts: list[np.ndarray] = []
            offsets: list[int] = []
            kinds: list[int] = []
            i, n = 0, len(words)
            try:
                while i < n:
                    kind = words[i]
                    offsets.append(i)
                    kinds.append(kind)
                    i += sizes[kind]
                    if not len(kinds) & 15 and i < n:  # every 16 records walked one by one: a run ahead?
                        skipped = self._repeat(array, offsets, kinds, i)
                        if skipped is not None:
                            parts.append(np.asarray(offsets, np.int64))
                            parts.append(skipped)
                            i = int(skipped[-1]) + sizes[kinds[-1]]
                            offsets, kinds = [], []
            except IndexError:  # a kind beyond the table
                i = -1
            if i == n:
                parts.append(np.asarray(offsets, np.int64))
                return np.concatenate(parts) if len(parts) > 1 else parts[0]
        return np.asarray(self.walk_cupti(data), np.int64)

    def _repeat(self, array: np.ndarray, offsets: list[int], kinds: list[int], i: int) -> np.ndarray | None:
        """If the last L records (L = 1 to 4) repeat the L before them: the offsets of the repetitions of that pattern
        that follow from word ``i`` on, checked all at once; None when there are none."""
        for length in (1, 2, 3, 4):
            if len(kinds) < 2 * length or kinds[-length:] != kinds[-2 * length : -length]:
                continue
            start = offsets[-length]
            period = i - start
            if period <= 0 or start - offsets[-2 * length] != period:
                continue
            reps = (array.size - i) // period
            if reps < 8:
                return None
            rel = np.asarray(offsets[-length:], np.int64) - start
            base = i + period * np.arange(reps, dtype=np.int64)
            pos = base[:, None] + rel[None, :]
            good = (array[pos] == np.asarray(kinds[-length:], np.uint32)[None, :]).all(axis=1)
            count = reps if good.all() else int(np.argmin(good))
            return pos[:count].ravel() if count else None
        return None

    def walk_cupti(self, data: Any) -> list[int]:
        """Offsets (in 4-byte words) from ``cuptiActivityGetNextRecord`` on a copy; learns the record sizes it shows."""
        data = bytes(data)
        n = len(data)
        copy = (ctypes.c_uint64 * ((n + 7) // 8))()
        ctypes.memmove(copy, data, n)
        base = ctypes.addressof(copy)
        record = ctypes.c_void_p()
        offsets: list[int] = []
        while True:
            status = self._get_next(base, n, ctypes.byref(record))
            if status:
                break
            offset = (record.value or 0) - base
            if offset < 0 or offset >= n or offset % 8:
                status = -1
                break
            offsets.append(offset >> 2)
        self.last_walk_status = 0 if status == self.end_status else status
        self.buffers_walked_by_cupti += 1
        self._learn(data, offsets)
        return offsets

    def _learn(self, data: bytes, offsets: list[int]) -> None:
        """Record each kind's size from the gaps between CUPTI's record offsets (all equal, or nothing learned)."""
        if not offsets:
            return
        words = np.frombuffer(data, np.uint32, count=len(data) // 4)
        pos = np.asarray(offsets, dtype=np.int64)
        kinds = words[pos]
        gaps = np.diff(np.append(pos, len(data) // 4))
        for kind in np.unique(kinds).tolist():
            if kind >= _MAX_KIND:
                continue
            mine = kinds == kind
            interior = np.unique(gaps[:-1][mine[:-1]])
            if interior.size == 1:
                learned = int(interior[0])
            elif interior.size == 0 and gaps[-1] * 4 == self.expected_bytes.get(kind):
                learned = int(gaps[-1])  # only ever last in its buffers: the gap to the end must match the dtype
            else:
                continue
            self.size_words[kind] = learned
            expected = self.expected_bytes.get(kind)
            if expected is not None and expected != learned * 4:
                self.size_mismatch[kind] = (learned * 4, expected)


#: Kineto's buffer callbacks (exported C++ symbols of libtorch), to hand CUPTI back to PyTorch's profiler.
_KINETO_SYMBOLS = (
    "_ZN9libkineto16CuptiActivityApi25bufferRequestedTrampolineEPPhPmS3_",
    "_ZN9libkineto16CuptiActivityApi25bufferCompletedTrampolineEP8CUctx_stjPhmm",
)
_KINETO: Any = None


_MEM_FD: int | None = None


def _read_c_string(pointer: int, limit: int = 1 << 16) -> str:
    """A NUL-terminated string at ``pointer`` in this process, read without touching memory that may be unmapped."""
    global _MEM_FD
    if _MEM_FD is None:
        try:
            _MEM_FD = os.open("/proc/self/mem", os.O_RDONLY)
        except OSError:
            _MEM_FD = -1
    if _MEM_FD < 0:
        return ctypes.string_at(pointer).decode("utf-8", "replace")  # no /proc (not Linux): read it directly
    out = b""
    while len(out) < limit:
        try:
            chunk = os.pread(_MEM_FD, 1024, pointer + len(out))
        except OSError:
            return out.decode("utf-8", "replace") if out else ""
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode("utf-8", "replace")
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")


def _kineto_callbacks() -> tuple[Any, Any] | None:
    """PyTorch's profiler's CUPTI buffer callbacks where torch is loaded (None: not loaded, or not found)."""
    global _KINETO
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if _KINETO is None:
        _KINETO = False
        folder = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or ""), "lib")
        for name in ("libtorch_cpu.so", "libkineto.so", "libtorch_cuda.so"):
            try:
                lib = ctypes.CDLL(os.path.join(folder, name))  # loaded already: the same instance
                request, complete = (ctypes.cast(getattr(lib, s), ctypes.c_void_p).value for s in _KINETO_SYMBOLS)
            except (OSError, AttributeError):
                continue
            _KINETO = (ctypes.cast(request, _REQUEST_FN), ctypes.cast(complete, _COMPLETE_FN))
            break
    return _KINETO or None


def _raw_cupti(cupti: Any) -> _RawCupti:
    """The process's :class:`_RawCupti`, created on first use."""
    global _RAW
    if _RAW is None:
        path = _libcupti_path(cupti)
        try:
            _RAW = _RawCupti(path)
        except (OSError, AttributeError) as exc:
            raise CuptiUnavailable(f"cannot open {path} through ctypes: {exc}") from exc
    return _RAW


def _layout(cupti: Any) -> tuple[dict[str, dict[str, tuple[int, int]]], dict[str, int], list[str]]:
    """Field (offset, size) per struct and struct sizes, from cupti-python's dtypes where it has them; plus notes."""
    fields: dict[str, dict[str, tuple[int, int]]] = {}
    sizes: dict[str, int] = dict(_BUILTIN_SIZES)
    notes: list[str] = []
    for struct, names in _DTYPE_NAMES.items():
        dtype = next((getattr(cupti, n) for n in names if getattr(cupti, n, None) is not None), None)
        if dtype is not None:
            sizes[struct] = (int(dtype.itemsize) + 7) // 8 * 8
        builtin = _BUILTIN_FIELDS.get(struct, {})
        chosen: dict[str, tuple[int, int]] = {}
        for field, default in builtin.items():
            camel = field.split("_")[0] + "".join(p.title() for p in field.split("_")[1:])
            entry = None
            for name in (field, camel):
                if dtype is not None and dtype.fields and name in dtype.fields:
                    entry = dtype.fields[name]
                    break
            if entry is not None and entry[0].itemsize in (1, 2, 4, 8) and entry[0].kind in "iub":
                chosen[field] = (int(entry[1]), int(entry[0].itemsize))
                if chosen[field] != default:
                    notes.append(f"{struct}.{field} at {chosen[field]} per cupti-python, {default} per cupti.h")
            else:
                chosen[field] = default
                notes.append(f"{struct}.{field}: built-in offset {default}")
        if builtin:
            fields[struct] = chosen
    return fields, sizes, notes


#: Once PyTorch's profiler has started in this process, Kineto's CUPTI timestamp callback stays registered after its
#: session: CUPTI's timestamps are then the CPU's time-stamp counter, not nanoseconds (measured on the H100 host: 2.0999
#: ticks per ns, and a trace's records fell outside its ops' enqueue windows). From then on every timestamp read is
#: mapped back to nanoseconds by a line through a reference sample and the latest one (``_calibrate``).
_TICKS = False
#: The tables a source makes from cupti-python's enums and dtypes, per cupti module (kept with it: ids are reused).
_TABLES: dict[int, tuple[Any, dict[str, Any]]] = {}
_TABLE_ATTRS = (
    "_k_kernels",
    "_k_memcpy",
    "_k_memset",
    "_k_ext",
    "_k_api",
    "_k_memory",
    "_k_marker",
    "_api_names",
    "_ext_kind",
    "_copy_names",
    "_pinned_of",
    "_host_src",
    "_host_dst",
    "_fields",
    "layout_notes",
)
#: Whether CUPTI records only the API calls that enqueue device work (``CuptiSource._filter_api``).
_API_FILTER_SET = False
_TICK_REF: tuple[int, int] | None = None  # (CUPTI timestamp, perf_counter_ns) of the first sample since
_TICKS_PER_NS = 1.0


def timestamps_are_ticks() -> bool:
    """Whether CUPTI's timestamps may be another tool's ticks (``timestamps_may_change`` was called)."""
    return _TICKS


def timestamps_may_change() -> None:
    """Called before another tool (torch.profiler) takes CUPTI: its timestamp callback may outlive its session."""
    global _TICKS, _TICK_REF, _TICKS_PER_NS
    with _STATE_LOCK:
        _TICKS, _TICK_REF, _TICKS_PER_NS = True, None, 1.0


def _calibrate(raw: int, host_ns: int) -> None:
    """Learn CUPTI's ticks per nanosecond from a sample (CUPTI timestamp, perf_counter_ns) and the reference one."""
    global _TICK_REF, _TICKS_PER_NS
    if _TICK_REF is None:
        _TICK_REF = (raw, host_ns)
        return
    elapsed = host_ns - _TICK_REF[1]
    if elapsed > 1_000_000:  # 1 ms: the samples' error (~1 us) is then below 0.2 % of the span they measure
        rate = (raw - _TICK_REF[0]) / elapsed
        _TICKS_PER_NS = 1.0 if abs(rate - 1.0) < 1e-4 else rate


def _await_rate() -> None:
    """A rate needs a sample over 1 ms after the reference one: a flush sooner waits out the rest (its records would
    otherwise be read as nanoseconds; seen on an H200 as a trace right after torch.profiler missing its kernels)."""
    ref = _TICK_REF
    if ref is not None and _TICKS_PER_NS == 1.0:
        left = 1_100_000 - (time.perf_counter_ns() - ref[1])
        if left > 0:
            time.sleep(left / 1e9)


def _to_ns(ticks: Any) -> Any:
    """CUPTI timestamps (an int or an int64 array) in nanoseconds, on the line through the reference sample."""
    if not _TICKS or _TICK_REF is None or _TICKS_PER_NS == 1.0:
        return ticks
    ref = _TICK_REF[0]
    if isinstance(ticks, np.ndarray):
        zero = ticks == 0  # "no timestamp" stays so
        out = ref + np.round((ticks.astype(np.float64) - ref) / _TICKS_PER_NS).astype(np.int64)
        out[zero] = 0
        return out
    return ref + round((ticks - ref) / _TICKS_PER_NS) if ticks else ticks


class CuptiSource:
    """Collects CUPTI activity records (kernels, memcpy, memset) with device start/end; never synchronizes."""

    def __init__(self) -> None:
        self._cupti: Any = None
        self._raw: _RawCupti | None = None
        self._running = False
        self._enabled: list[Any] = []
        self._lock = threading.Lock()  # guards _incoming and _ends (appended on CUPTI's thread)
        self._flush_lock = threading.Lock()  # serializes flush() and guards the join state below
        self._incoming = bytearray()  # the bytes of every buffer handed back since the last flush, each padded to 8
        self._ends: list[int] = []  # where each of those buffers ends in it
        self._delivered = self._flushed = 0.0  # monotonic times of the last buffer handed back, the last flush
        self._joiner = ExternalIdJoin(HOLD_FLUSHES, EXT_KEEP_FLUSHES, EXT_MAP_MAX)
        self._pushed = False
        self._push: Any = None
        self._pop: Any = None
        self._ext_kind = 0
        self._fields: dict[str, dict[str, tuple[int, int]]] = {}
        self._read_names = True  # False once CUPTI's records turn out larger or smaller than the dtype says
        self._extras: dict[str, list[dict[str, np.ndarray]]] = {"api": [], "memory": [], "marker": []}
        self._k_memory = self._k_marker = -1
        #: CUPTI's raw timestamp (ticks where another tool's callback changed them: never converted, so that a
        #: rate learned later cannot move records across it): records of work that ended before are dropped.
        self._cutoff = 0
        #: The smallest correlation id of an API call that began after the cutoff (0: none seen yet). Correlation ids
        #: grow with each call, so a record whose call came after it is the trace's even where its device timestamp
        #: (mapped from the GPU's clock by CUPTI) reads as before the cutoff.
        self._first_corr = 0
        #: Records and calls dropped as older than a take-over's cutoff (what a lost op asks about first).
        self.cut_off_records = self.cut_off_calls = 0
        self._api_names: dict[int, dict[int, str]] = {0: {}, 1: {}}
        self._tables_ready = False
        self._started = False  # a started source is reset before it starts again; a new one needs no reset
        self._names: dict[int, str] = {0: ""}  # kernel name pointer -> name
        self._frozen = False
        #: Bumped by every ``start``: a trace stops or abandons only the session it started.
        self.session = 0
        #: Whether the API carrier records are limited to the calls that enqueue device work.
        self.api_filtered = False
        #: Records dropped because CUPTI had no valid start/end for them (e.g. cut off by a forced flush).
        self.incomplete_records = 0
        #: Failures while flushing or decoding buffers, and the last such error.
        self.callback_errors = 0
        self.last_callback_error = ""
        #: Where the record layouts came from and what did not match (empty when cupti-python and cupti.h agree).
        self.layout_notes: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether ``cupti-python`` imports here (cheap: no CUDA call; the answer is kept), with a reason."""
        global _AVAILABLE
        if _AVAILABLE is None:
            _AVAILABLE = CuptiSource._available()
        return _AVAILABLE

    @staticmethod
    def _available() -> tuple[bool, str]:
        try:
            from cupti import cupti  # noqa: F401
        except Exception as exc:  # noqa: BLE001  (ImportError, or a missing libcupti / cuda-bindings)
            return False, f"cupti-python is not importable: {type(exc).__name__}: {exc}"
        try:
            from importlib.metadata import version

            return True, f"cupti-python {version('cupti-python')}"
        except ImportError:  # PackageNotFoundError
            return True, "cupti-python (version unknown)"

    def start(self) -> None:
        """Take a lingering source over (nothing to enable), or register the buffer callbacks where CUPTI is not ready
        and enable the activity kinds; CuptiUnavailable (nothing left on) if not."""
        global _ACTIVE
        if self._running:
            return
        try:
            from cupti import cupti
        except Exception as exc:
            raise CuptiUnavailable(f"cupti-python is not importable: {type(exc).__name__}: {exc}") from exc
        with _STATE_LOCK:
            if _ACTIVE is not None:
                raise CuptiUnavailable(
                    "another CuptiSource is already active in this process (CUPTI activity callbacks are global); "
                    "stop it first"
                )
            if self._started:
                self._reset()
            self._started = True
            self._cupti = cupti
            try:
                self._raw = _raw_cupti(cupti)
                if not self._tables_ready:  # once per source
                    self._setup_tables(cupti)
                    self._tables_ready = True
                if not self._take_parked(cupti):
                    _cancel_detach()
                    _ACTIVE = self  # before enabling, so that no buffer completes without a receiver
                    self._enable(cupti)
            except CuptiUnavailable:
                self._disable_all()
                _ACTIVE = None
                raise
            except Exception as exc:  # cuptiError, a failed ctypes call, or libcupti failing to load
                self._disable_all()
                _ACTIVE = None
                raise CuptiUnavailable(f"CUPTI activity tracing could not start: {_describe(exc, cupti)}") from exc
            self._push = cupti.activity_push_external_correlation_id
            self._pop = cupti.activity_pop_external_correlation_id
            self._frozen = False
            self.session += 1
            self._running = True

    def _enable(self, cupti: Any) -> None:
        global _ATTACHED, _FRESH
        if not self._raw.ours:
            self._raw.register()
        _ATTACHED, _FRESH = True, False
        _subscribe_detach(cupti)  # here, on the thread starting the trace: not from a thread beside CUDA calls
        for name in ACTIVITY_KINDS + API_CARRIER_KINDS:
            kind = cupti.ActivityKind[name]
            cupti.activity_enable(kind)
            self._enabled.append(kind)
        self.api_filtered = API_FILTER and bool(API_CARRIER_KINDS) and self._filter_api(True)
        for name in OPTIONAL_KINDS:
            kind = getattr(cupti.ActivityKind, name, None)
            if kind is not None:
                with contextlib.suppress(Exception):  # an older CUPTI: allocations and NVTX not seen
                    cupti.activity_enable(kind)
                    self._enabled.append(kind)

    def _take_parked(self, cupti: Any) -> bool:
        """Take over the kinds a stopped source left on (under ``_STATE_LOCK``): nothing to enable; records of work
        that ended before now (still in CUPTI's buffers) are dropped by ``_cutoff``."""
        global _ACTIVE
        parked = _claim_parked(taking_over=True)
        if parked is None:
            return False
        self._enabled, parked._enabled = parked._enabled, []
        self.api_filtered = parked.api_filtered
        self._cutoff, self._first_corr = int(cupti.get_timestamp()), 0
        _ACTIVE = self
        return True

    def stop(self) -> None:
        """Forced flush (this source's last records), then park: the kinds stay on for the next source to take over,
        for ``LINGER_S`` or until untraced work launches (``WATCH_UNTRACED``); a frozen source (another tool took
        CUPTI) or one with no kinds turns them off instead. Idempotent. ``flush()`` then returns the rest."""
        global _ACTIVE
        if not self._running:
            return
        raw = self._raw
        if raw is not None:
            raw.flush_all(1)
        with _STATE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None  # CUPTI has no "unregister": our callbacks now drop what comes
            self._running = False
            if self._enabled and not self._frozen:
                _park(self)
                return
        self._disable_all()
        if raw is not None:
            raw.flush_all(1)

    def freeze(self) -> None:
        """Another CUPTI client took CUPTI over: never flush it again (that would hand the other tool's buffers
        back); what was already handed to us is still decoded."""
        self._frozen = True

    def abandon(self) -> None:
        """Let go without touching CUPTI (another client holds it now): no flush, no disabling its kinds."""
        global _ACTIVE
        with _STATE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None
            self._running = False
            self._frozen = False
            self._enabled = []

    @property
    def running(self) -> bool:
        """Whether this source is started."""
        return self._running

    # -- external correlation ------------------------------------------------------------------------------------

    def push_external_id(self, ext_id: int) -> None:
        """Tag the CUDA calls this thread makes from now on with ``ext_id`` (until the matching pop)."""
        if self._push is not None:
            self._pushed = True
            self._push(self._ext_kind, int(ext_id))

    def pop_external_id(self) -> None:
        """Undo the last ``push_external_id`` of this thread."""
        if self._pop is not None:
            self._pop(self._ext_kind)

    def external_id_calls(self) -> tuple[Any, Any, int]:
        """(push, pop, kind) to call as ``push(kind, id)`` / ``pop(kind)`` on a hot path, skipping two Python frames."""
        if self._push is None:
            raise CuptiUnavailable("the CUPTI source is not started")
        self._pushed = True
        return self._push, self._pop, self._ext_kind

    # -- records -----------------------------------------------------------------------------------------------

    def flush_columns(
        self,
        eager: bool = False,
        full: bool = True,
        resolve: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> dict[str, np.ndarray] | None:
        """Every record handed back since the last call, as columns (ordered by ``start`` if ``full``), after a CUPTI
        flush if one is due (see ``FLUSH_IDLE_S``; ``eager``: always, e.g. once no more launches are traced).

        Columns: kind (str), start, end (CUPTI ns), external_id (-1: none), bytes, name, pinned (-1/0/1),
        stream_id, device_id, correlation_id, runtime_correlation_id; None when nothing completed. ``full=False``:
        only start, end, external_id and the two correlation ids (cheaper; what a trace needs). ``resolve(thread,
        start)``: the external id of the op each API call (CUPTI thread id, start on CUPTI's clock) was made in, -1
        if none: how a trace tags its ops' records without pushing ids (see ``ExternalIdJoin.place_calls``)."""
        with self._flush_lock:
            self._flush_if_due(eager)
            blob, ends = self._take_incoming()
            if _TICKS and ends:
                with contextlib.suppress(Exception):  # calibrates with a sample later than every record here
                    _await_rate()
                    self.clock_sample()
            try:
                cols, ext, calls = self._decode(blob, ends, full, calls=resolve is not None)
            except Exception as exc:  # noqa: BLE001  a bad buffer must not stop the harvester
                self.callback_errors += 1
                self.last_callback_error = f"decode: {type(exc).__name__}: {exc}"
                cols, ext, calls = None, (_NONE, _NONE), None
            wait = (self._pushed or resolve is not None) and self._running
            return self._joiner.join(cols, *ext, wait=wait, ordered=full, calls=calls, resolve=resolve)

    @property
    def backlog_bytes(self) -> int:
        """Bytes of records handed back by CUPTI and not decoded yet (about 256 per traced launch)."""
        return len(self._incoming)

    def _flush_if_due(self, eager: bool) -> None:
        now = time.monotonic()
        due = (
            eager
            or FLUSH_IDLE_S is None
            or now - max(self._delivered, self._flushed) >= FLUSH_IDLE_S
            or now - self._flushed >= FLUSH_MAX_S
        )
        if due and self._running and self._raw is not None and not self._frozen:
            self._flushed = now
            status = self._raw.flush_all(0)
            if status:
                self.callback_errors += 1
                self.last_callback_error = f"flush: {_describe(_CuptiCallFailed('flush', status), self._cupti)}"

    @property
    def unplaced_calls(self) -> int:
        """API calls a ``resolve`` placed in no op (another library's launches, say); once stopped, with those still
        waiting for one."""
        return self._joiner.unplaced_calls + (0 if self._running else self._joiner.held_calls)

    def flush(self) -> list[dict[str, Any]]:
        """``flush_columns()`` as one dict per record (kind, start_ns, end_ns, external_id, bytes, name, pinned,
        cupti_stream, device): for diagnostics; the trace uses the columns."""
        cols = self.flush_columns(eager=True)
        if cols is None:
            return []
        return _span_dicts(cols | {"name": self.names_of(cols["name"])})

    @staticmethod
    def to_ns(ticks: Any) -> Any:
        """CUPTI timestamps (an int or an int64 array) in ns, on the line the latest flush's records went through."""
        return _to_ns(ticks)

    def clock_sample(self, host: Callable[[], int] = time.perf_counter_ns, raw: bool = False) -> tuple[int, int, int]:
        """(cupti_ns, host_ns, error_ns): a CUPTI timestamp bracketed by two reads of ``host`` (best of 3); ``raw``:
        CUPTI's own timestamp, not mapped to ns (``to_ns`` maps it later, on a line learned by then)."""
        if self._cupti is None:
            try:
                from cupti import cupti
            except Exception as exc:
                raise CuptiUnavailable(f"cupti-python is not importable: {type(exc).__name__}: {exc}") from exc
            self._cupti = cupti
        get_timestamp, perf = self._cupti.get_timestamp, host
        best: tuple[int, int, int] | None = None
        for _ in range(3):
            t0 = perf()
            c = get_timestamp()
            t1 = perf()
            if best is None or t1 - t0 < 2 * best[2]:
                best = (int(c), (t0 + t1) // 2, (t1 - t0 + 1) // 2)
        assert best is not None
        if _TICKS:
            if host is time.perf_counter_ns:
                _calibrate(best[0], best[1])
            if not raw:
                best = (int(_to_ns(best[0])), best[1], best[2])
        return best

    # -- internals ---------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._enabled = []
        self._cutoff = self._first_corr = 0
        self.cut_off_records = self.cut_off_calls = 0
        self._extras = {"api": [], "memory": [], "marker": []}
        self._take_incoming()
        self._pushed = False
        self._joiner = ExternalIdJoin(HOLD_FLUSHES, EXT_KEEP_FLUSHES, EXT_MAP_MAX)

    def _setup_tables(self, cupti: Any) -> None:
        """Kind codes, enum lookup tables and record layouts from cupti-python; the expected sizes to the walker.
        Made once per process (~0.3 ms of a trace's start otherwise) and shared by every source."""
        cached = _TABLES.get(id(cupti))
        if cached is not None and cached[0] is cupti:
            self.__dict__.update(cached[1])
            self.layout_notes = list(self.layout_notes)  # notes added later are this source's
            return
        self._make_tables(cupti)
        _TABLES[id(cupti)] = (cupti, {name: getattr(self, name) for name in _TABLE_ATTRS})

    def _make_tables(self, cupti: Any) -> None:
        kind = cupti.ActivityKind
        self._k_kernels = (int(kind.CONCURRENT_KERNEL), int(kind.KERNEL))
        self._k_memcpy = int(kind.MEMCPY)
        self._k_memset = int(kind.MEMSET)
        self._k_ext = int(kind.EXTERNAL_CORRELATION)
        self._k_api = (int(kind.DRIVER), int(kind.RUNTIME))
        self._k_memory = int(kind.MEMORY2) if hasattr(kind, "MEMORY2") else -1
        self._k_marker = int(kind.MARKER) if hasattr(kind, "MARKER") else -1
        self._api_names = {
            domain: {int(m): m.name for m in enum_cls}
            for domain, enum_cls in ((0, cupti.driver_api_trace_cbid), (1, cupti.runtime_api_trace_cbid))
        }
        self._ext_kind = int(cupti.ExternalCorrelationKind.CUSTOM0)
        self._copy_names = np.full(256, "other_copy", dtype=object)
        for member in cupti.ActivityMemcpyKind:
            if 0 <= int(member) < 256:
                self._copy_names[int(member)] = _COPY_KIND_NAMES.get(member.name, "other_copy")
        self._pinned_of = np.full(256, -1, dtype=np.int64)
        self._pinned_of[int(cupti.ActivityMemoryKind.PINNED)] = 1
        self._pinned_of[int(cupti.ActivityMemoryKind.PAGEABLE)] = 0
        self._host_src = np.array([int(cupti.ActivityMemcpyKind.HTOD), int(cupti.ActivityMemcpyKind.HTOA)])
        self._host_dst = np.array([int(cupti.ActivityMemcpyKind.DTOH), int(cupti.ActivityMemcpyKind.ATOH)])
        self._fields, sizes, self.layout_notes = _layout(cupti)
        raw = self._raw
        if raw is not None:
            raw.end_status = int(cupti.Result.ERROR_MAX_LIMIT_REACHED)
            for struct, codes in (
                ("kernel", self._k_kernels),
                ("memcpy", (self._k_memcpy,)),
                ("memset", (self._k_memset,)),
                ("ext", (self._k_ext,)),
                ("api", (int(kind.DRIVER), int(kind.RUNTIME))),
                ("memory", (self._k_memory,)),
                ("marker", (self._k_marker,)),
            ):
                if struct in sizes:
                    for code in codes:
                        raw.expected_bytes[code] = sizes[struct]

    def _disable_all(self) -> None:
        for kind in reversed(self._enabled):
            with contextlib.suppress(Exception):
                self._cupti.activity_disable(kind)
        self._enabled = []
        self.api_filtered = False  # the filter itself stays set (see _filter_api)

    def _filter_api(self, on: bool) -> bool:
        """``_filter_api`` on this source's cupti module."""
        return _filter_api(self._cupti, on)

    def api_name(self, runtime: int, cbid: int) -> str:
        """The name of a driver (``runtime`` 0) or runtime API call from its callback id, e.g. 'cuLaunchKernel'."""
        name = self._api_names[1 if runtime else 0].get(int(cbid), "")
        return name.rsplit("_v", 1)[0] if "_v" in name and name.rsplit("_v", 1)[1].isdigit() else name

    def _ingest(self, data: Any) -> None:
        """Buffer-completed callback body: append the valid bytes for the next flush (one copy, nothing decoded)."""
        with self._lock:
            incoming = self._incoming
            incoming += data
            if len(incoming) % 8:
                incoming += bytes(8 - len(incoming) % 8)  # keeps the next buffer's records 8-byte aligned
            self._ends.append(len(incoming))
        self._delivered = time.monotonic()

    def _take_incoming(self) -> tuple[bytearray, list[int]]:
        """The bytes handed back since the last call, and where each buffer ends in them."""
        with self._lock:
            blob, ends = self._incoming, self._ends
            self._incoming, self._ends = bytearray(), []
        return blob, ends

    def _decode(
        self, blob: bytearray, ends: list[int], full: bool = True, calls: bool = False
    ) -> tuple[dict[str, np.ndarray] | None, tuple[np.ndarray, np.ndarray], dict[str, np.ndarray] | None]:
        """Span columns (in buffer order), this flush's (correlation ids, external ids) and, if ``calls``, its API
        call records (thread, start, correlation_id); only times and ids unless ``full``. ``blob``: buffers back to
        back, each ending at its entry of ``ends`` (a multiple of 8)."""
        raw = self._raw
        if not ends or raw is None:
            return None, (_NONE, _NONE), None
        offsets: list[np.ndarray] = []
        whole, begin = memoryview(blob), 0
        for end in ends:
            words = raw.walk(whole[begin:end])
            if raw.last_walk_status:
                self.callback_errors += 1
                self.last_callback_error = f"record walk stopped early: CUPTI result {raw.last_walk_status}"
            offsets.append(words + begin // 4 if begin else words)
            begin = end
        at = offsets[0] if len(offsets) == 1 else np.concatenate(offsets)
        views = {
            1: np.frombuffer(blob, np.uint8),
            2: np.frombuffer(blob, np.uint16),
            4: np.frombuffer(blob, np.uint32),
            8: np.frombuffer(blob, np.uint64),
        }
        kinds = views[4][at]
        aligned = not bool((at & 1).any())

        def column(rows: np.ndarray, struct: str, field: str) -> np.ndarray:
            offset, size = self._fields[struct][field]
            if size == 4 and offset % 4 == 0:
                return views[4][rows + offset // 4]
            if size == 8 and offset % 8 == 0 and aligned:
                return views[8][(rows >> 1) + offset // 8]
            pos = rows * 4 + offset
            if offset % size == 0 and size <= 4:
                return views[size][pos // size]
            raw_bytes = views[1][pos[:, None] + np.arange(size)]
            return np.ascontiguousarray(raw_bytes).view(f"<u{size}").ravel()

        ext_rows = at[kinds == self._k_ext]
        ext: tuple[np.ndarray, np.ndarray] = (_NONE, _NONE)
        if ext_rows.size:
            mine = column(ext_rows, "ext", "external_kind") == self._ext_kind
            ext = (
                column(ext_rows, "ext", "correlation_id")[mine].astype(np.int64),
                column(ext_rows, "ext", "external_id")[mine].astype(np.int64),
            )
        api = None
        if calls or full:
            api_rows = at[(kinds == self._k_api[0]) | (kinds == self._k_api[1])]
            if self._cutoff and api_rows.size:
                after = column(api_rows, "api", "start").astype(np.int64) >= self._cutoff
                self.cut_off_calls += api_rows.size - int(np.count_nonzero(after))
                if not self._first_corr and after.any():
                    self._first_corr = int(column(api_rows[after], "api", "correlation_id").min())
                api_rows = api_rows[after]
            if PRIMER.threads and api_rows.size:  # the primer's calls can come after a take-over's cutoff
                theirs = np.isin(column(api_rows, "api", "thread_id"), list(PRIMER.threads))
                api_rows = api_rows[~theirs] if theirs.any() else api_rows
            api = {
                "thread": column(api_rows, "api", "thread_id").astype(np.int64),
                "start": _to_ns(column(api_rows, "api", "start").astype(np.int64)),
                "correlation_id": column(api_rows, "api", "correlation_id").astype(np.int64),
            }
            if full and api_rows.size:
                self._extras["api"].append(
                    api
                    | {
                        "end": _to_ns(column(api_rows, "api", "end").astype(np.int64)),
                        "cbid": column(api_rows, "api", "cbid").astype(np.int64),
                        "runtime": (views[4][api_rows] == self._k_api[1]).astype(np.int64),
                    }
                )
            if not calls:
                api = None
        if self._k_memory >= 0:
            rows = self._after_cutoff(at[kinds == self._k_memory], "memory", "timestamp", column)
            if PRIMER.addresses and rows.size:  # the primer's own allocation, made as a trace may take over
                device = column(rows, "memory", "device_id").astype(np.int64)
                address = column(rows, "memory", "address").astype(np.uint64)
                primers = np.zeros(rows.size, bool)
                for d, a in PRIMER.addresses:
                    primers |= (device == d) & (address == np.uint64(a))
                rows = rows[~primers]
            if rows.size:
                memory = {f: column(rows, "memory", f).astype(np.int64) for f in self._fields["memory"]}
                memory["timestamp"] = _to_ns(memory["timestamp"])
                self._extras["memory"].append(memory)
        if self._k_marker >= 0:
            rows = self._after_cutoff(at[kinds == self._k_marker], "marker", "timestamp", column)
            if rows.size:
                marks = {f: column(rows, "marker", f).astype(np.int64) for f in self._fields["marker"]}
                marks["timestamp"] = _to_ns(marks["timestamp"])
                marks["name"] = self._strings(marks["name"])
                marks["domain"] = self._strings(marks["domain"])
                self._extras["marker"].append(marks)

        # Per struct: row, the wanted fields, runtime_correlation_id. ``full=False`` (the trace's harvester) reads
        # only times and ids: the op already knows its kind, name, bytes and stream.
        wanted = ("kind", *_SPAN_FIELDS) if full else _TIME_FIELDS
        groups: list[tuple[np.ndarray, ...]] = []

        def add_group(rows: np.ndarray, struct: str, runtime: np.ndarray | None = None, **given: Any) -> None:
            cols = [given[f] if f in given else column(rows, struct, f).astype(np.int64) for f in wanted]
            groups.append((rows, *cols, np.zeros(rows.size, np.int64) if runtime is None else runtime))

        def blank(n: int, kind: str) -> dict[str, np.ndarray]:
            kind_col = np.full(n, kind, dtype=object)
            zero = np.zeros(n, np.int64)
            return {"kind": kind_col, "name": zero, "pinned": np.full(n, -1), "grid": zero, "block": zero}

        is_kernel = kinds == self._k_kernels[0]
        for code in self._k_kernels[1:]:
            is_kernel |= kinds == code
        kernel_rows = at[is_kernel]
        if kernel_rows.size:
            n = kernel_rows.size
            given = {}
            if full:
                dims = {f: column(kernel_rows, "kernel", f).astype(np.int64) for f in _DIM_FIELDS}
                given = blank(n, "kernel") | {
                    "bytes": np.zeros(n, np.int64),
                    "name": self._name_pointers(kernel_rows, column),
                    "grid": pack_dim3(dims["grid_x"], dims["grid_y"], dims["grid_z"]),
                    "block": pack_dim3(dims["block_x"], dims["block_y"], dims["block_z"]),
                }
            add_group(kernel_rows, "kernel", **given)
        memcpy_rows = at[kinds == self._k_memcpy]
        if memcpy_rows.size:
            runtime = column(memcpy_rows, "memcpy", "runtime_correlation_id").astype(np.int64)
            given = {}
            if full:
                copy_kind = column(memcpy_rows, "memcpy", "copy_kind").astype(np.int64) & 255
                given = blank(memcpy_rows.size, "") | {
                    "kind": self._copy_names[copy_kind],
                    "pinned": self._pinned_column(memcpy_rows, copy_kind, column),
                }
            add_group(memcpy_rows, "memcpy", runtime, **given)
        memset_rows = at[kinds == self._k_memset]
        if memset_rows.size:
            add_group(memset_rows, "memset", **(blank(memset_rows.size, "memset") if full else {}))
        if not groups:
            return None, ext, api
        names = ("row", *wanted, "runtime_correlation_id")
        cols = dict(zip(names, groups[0] if len(groups) == 1 else map(np.concatenate, zip(*groups))))
        raw_end = cols["end"]
        start, end = cols["start"], cols["end"] = _to_ns(cols["start"]), _to_ns(raw_end)
        valid = (start > 0) & (end >= start)
        self.incomplete_records += start.size - int(np.count_nonzero(valid))
        if self._cutoff:
            after = raw_end >= self._cutoff
            if self._first_corr:
                after |= cols["correlation_id"] >= self._first_corr
            self.cut_off_records += int(np.count_nonzero(valid & ~after))
            valid &= after
        primed = PRIMER.streams
        if primed and full:  # the primer's copy and memset can end after a cutoff: never the user's work
            ids = cols["device_id"] << 32 | cols["stream_id"]
            valid &= ~np.isin(ids, [device << 32 | stream for device, stream in primed])
        keep = np.flatnonzero(valid)
        if len(groups) > 1:
            keep = keep[np.argsort(cols["row"][keep], kind="stable")]
        return {name: col[keep] for name, col in cols.items() if name != "row"}, ext, api

    def _after_cutoff(self, rows: np.ndarray, struct: str, field: str, column: Any) -> np.ndarray:
        """The rows whose ``field`` (a CUPTI timestamp) is not before ``_cutoff``."""
        if not self._cutoff or not rows.size:
            return rows
        return rows[column(rows, struct, field).astype(np.int64) >= self._cutoff]

    def _name_pointers(self, rows: np.ndarray, column: Any) -> np.ndarray:
        """The name pointers of the kernel records at ``rows`` (0 where the layout is not trusted): strings are read
        only for the records that need one (``names_of``), never for our own ops, whose names are known."""
        raw = self._raw
        if self._read_names and raw is not None and any(k in raw.size_mismatch for k in self._k_kernels):
            self._read_names = False  # another struct version than the dtype: the name offset is not trusted
            self.layout_notes.append(f"kernel names not read: record sizes {raw.size_mismatch} differ")
        if not self._read_names:
            return np.zeros(rows.size, np.int64)
        return column(rows, "kernel", "name").astype(np.int64)

    def names_of(self, pointers: np.ndarray) -> np.ndarray:
        """Kernel names from the record's name pointers (CUPTI-owned C strings, kept by CUPTI while the module is
        loaded), each pointer read once per process and remembered."""
        unique, inverse = np.unique(pointers, return_inverse=True)
        cache = self._names
        for p in unique.tolist():
            if p not in cache:
                cache[p] = self._kernel_name(p)
        return np.array([cache[p] for p in unique.tolist()], dtype=object)[inverse.ravel()]

    def _pinned_column(self, rows: np.ndarray, copy_kind: np.ndarray, column: Any) -> np.ndarray:
        """1 / 0 where a host-side copy's host memory is pinned / pageable, -1 for device-side copies."""
        pinned = np.full(rows.size, -1, np.int64)
        from_host = np.isin(copy_kind, self._host_src)
        to_host = np.isin(copy_kind, self._host_dst)
        src_kind = column(rows, "memcpy", "src_kind").astype(np.int64) & 255
        dst_kind = column(rows, "memcpy", "dst_kind").astype(np.int64) & 255
        pinned[from_host] = self._pinned_of[src_kind[from_host]]
        pinned[to_host] = self._pinned_of[dst_kind[to_host]]
        return pinned

    def _strings(self, pointers: np.ndarray) -> np.ndarray:
        """The C strings at ``pointers`` (CUPTI-owned; NULL gives ''), read once per distinct pointer."""
        unique, inverse = np.unique(pointers, return_inverse=True)
        return np.array([self._kernel_name(p) for p in unique.tolist()], dtype=object)[inverse.ravel()]

    def take_extras(self) -> dict[str, dict[str, np.ndarray] | None]:
        """API calls (full flushes only), device-memory records and NVTX markers decoded since the last call."""
        out: dict[str, dict[str, np.ndarray] | None] = {}
        with self._lock:
            extras, self._extras = self._extras, {"api": [], "memory": [], "marker": []}
        for what, parts in extras.items():
            out[what] = None if not parts else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return out

    @staticmethod
    def _kernel_name(pointer: int) -> str:
        """The C string CUPTI keeps for a kernel's name ('' for NULL, a value no user-space pointer has, or memory
        no longer mapped). Read through ``/proc/self/mem``, which fails cleanly where the memory is gone: CUPTI frees
        a module's names when the module is unloaded, and reading them directly crashed the process (measured in the
        GPU test suite, which compiles and drops many modules)."""
        if not 4096 <= pointer < 1 << 56:
            return ""
        return _read_c_string(pointer)


def _filter_api(cupti: Any, on: bool) -> bool:
    """Record only the device-work API calls (``on``) or every call again; False if this CUPTI cannot. Setting it
    is one CUPTI call per API (~1.5 ms of a trace's start and as much of its stop, measured on an H200), so it is
    set once and stays set while no kind of ours is on (it filters only the API records, which nobody else takes
    then); ``hand_over`` clears it before torch.profiler takes CUPTI."""
    global _API_FILTER_SET
    if on == _API_FILTER_SET:
        return True
    try:
        for domain, enum_cls, set_api in (
            ("driver", cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api),
            ("runtime", cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
        ):
            prefixes = _API_PREFIXES[domain]
            for member in enum_cls:
                name = member.name
                if name in ("INVALID", "SIZE", "FORCE_INT"):
                    continue
                keep = not on or (name.startswith(prefixes) and "HostFunc" not in name)
                set_api(int(member), int(keep))
    except Exception:  # noqa: BLE001  (an older CUPTI without per-API switches: records every call)
        return False
    _API_FILTER_SET = on
    return True


def _work_table(cupti: Any) -> bytes:
    """``_WORK_CBIDS`` from this CUPTI's driver callback ids: 1 where a call enqueues device work."""
    members = [m for m in cupti.driver_api_trace_cbid if m.name not in ("INVALID", "SIZE", "FORCE_INT")]
    table = bytearray(max((int(m) for m in members), default=0) + 1)
    for m in members:
        if m.name.startswith(_API_PREFIXES["driver"]) and "HostFunc" not in m.name:
            table[int(m)] = 1
    return bytes(table)


def _span_dicts(cols: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """One dict per row of the joined columns."""
    names = ("kind", "start", "end", "external_id", "bytes", "name", "pinned", "stream_id", "device_id")
    keys = ("kind", "start_ns", "end_ns", "external_id", "bytes", "name", "pinned", "cupti_stream", "device")
    return [dict(zip(keys, row)) for row in zip(*(cols[n].tolist() for n in names))]


_PREPARED = False
#: Whether ``prepare`` also attaches CUPTI to the process (its first callback registration: ~20 ms on an H100),
#: so that the first trace does not pay it.
ATTACH_EARLY = True


def _park(source: CuptiSource) -> None:
    """Leave ``source``'s kinds on for ``LINGER_S`` (under ``_STATE_LOCK``); then ``_linger_over`` lets CUPTI go. With
    ``WATCH_UNTRACED``, sooner: at the first untraced call that enqueues device work. With ``PRIME_AT_PARK`` the
    prime thread primes CUPTI first (``_prime_parked``), then watches."""
    global _PARKED, _PARK_TOKEN
    _PARKED, _PARK_TOKEN = source, _PARK_TOKEN + 1
    token = _PARK_TOKEN
    _LINGER.arm(LINGER_S, token)
    if PRIME_AT_PARK and _RAW is not None:
        _PRIME.arm(0.0, token)  # primes on its own thread, then watches: the next trace does not wait for it
    else:
        _watch(token)


def _watch(token: int) -> None:
    """Watch for untraced work while the source parked as ``token`` lingers (under ``_STATE_LOCK``); not for a source
    parked for a notebook cell that traces (``_unwatch_parked``)."""
    if token != _UNWATCHED_TOKEN and WATCH_UNTRACED and _DETACH is not None and _WORK_CBIDS:
        _DETACH.watch(lambda: _PARK_TOKEN == token and _LINGER.arm(0.0, token), _WORK_CBIDS)


def _prime_parked(token: int) -> None:
    """Prime CUPTI for the source parked as ``token`` (``cupti_prime.py``), then watch; nothing if a trace took it
    over or it was let go first. The primer's lock is taken before the state lock goes, so that letting the source
    go (``_unpark``: then a finalize, or another tool's subscriber) waits for a prime under way; a take-over does
    not."""
    with _STATE_LOCK:
        if token != _PARK_TOKEN or _PARKED is None or _RAW is None:
            return
        if _BLOCKERS:  # a persistent kernel holds the device: no work of ours queued behind it
            _watch(token)
            return
        lib = _RAW.lib
        PRIMER.lock.acquire()
    try:
        PRIMER.prime(lib)
    finally:
        PRIMER.lock.release()
        with _STATE_LOCK:
            if token == _PARK_TOKEN and _PARKED is not None:
                _watch(token)


def prime_here() -> int:
    """Prime the parked source on the calling thread (``cupti_prime.py``): the first op CUPTI records on a thread
    after a park costs that thread ~300 µs more, part of it per thread, which the prime thread cannot pay for the
    user's. For a thread that waits for no trace (``%load_ext``, a notebook cell's pre-run hook). Its records end
    before a take-over's cutoff (its streams' are dropped anyway); the watch does not count its work. The number of
    devices primed (0: none parked, a block holds, or ``PRIME_AT_PARK`` is off)."""
    with _STATE_LOCK:
        if not PRIME_AT_PARK or _PARKED is None or _RAW is None or _BLOCKERS:
            return 0
        lib, detach = _RAW.lib, _DETACH
        PRIMER.lock.acquire()
    try:
        if detach is not None:
            detach.ignored_thread = threading.get_ident()
        return PRIMER.prime(lib, drop_calls=False)
    finally:
        if detach is not None:
            detach.ignored_thread = 0
        PRIMER.lock.release()


def warm_for_cell() -> bool:
    """Before a notebook cell that traces (its pre-run hook, on the kernel's thread): where no source lingers, attach
    CUPTI if it was let go (~12–16 ms) and start a source and park it, so that the cell's trace takes it over instead
    of doing that in the cell (enabling the kinds alone took ~0.45 ms on an H100); call off its watch
    (``_unwatch_parked``), prime it on this thread (``prime_here``) and wait for the prime thread, so that nothing of
    ours runs beside the cell's start. True if a source is parked for the cell. Nothing where a trace records, a block
    holds, another tool holds CUPTI, CUPTI was never set up (``prepare``) or is attached with its kinds off after
    another tool."""
    if _ACTIVE is not None or _RAW is None or blocked() or other_client():
        return False
    if not _ATTACHED:
        _reattach(_REATTACH_TOKEN)  # here, on the user's thread, between cells
    if _PARKED is None and _FRESH:
        _park_new_source()
    if _PARKED is None:
        return False
    _unwatch_parked()
    prime_here()
    _PRIME.wait_idle(PRIME_WAIT_S)  # the cell's trace then starts with no prime or watch of ours under way
    return _PARKED is not None


def _park_new_source() -> None:
    """Start a source and stop it, so that its kinds stay on, parked for the next trace to take over (CUPTI's first
    enabling of each kind paid here); nothing where it cannot start: a trace that cannot start CUPTI says why."""
    with contextlib.suppress(Exception):
        source = CuptiSource()
        source.start()
        source.stop()


#: How long the pre-run hook waits for the prime thread (``warm_for_cell``); priming took ~1–3 ms on an H100.
PRIME_WAIT_S = 0.1
#: The park token of a source parked for a notebook cell that traces: no watch for untraced work on it.
_UNWATCHED_TOKEN = -1


def _unwatch_parked() -> None:
    """Call off the watch on the parked source, for a cell whose trace takes it over: a watch would let it go at the
    cell's first untraced CUDA call before the trace starts (``a = cp.ones(3)`` above ``with gw.trace():``), and its
    callbacks would cost every call until the take-over's quiet. The linger deadline is set again (a watch that fired
    had brought it forward)."""
    global _UNWATCHED_TOKEN
    with _STATE_LOCK:
        if _PARKED is None:
            return
        _UNWATCHED_TOKEN = _PARK_TOKEN
        _LINGER.arm(LINGER_S, _PARK_TOKEN)
        if _DETACH is not None and not _DETACH.armed:
            _DETACH.disarm()


def _claim_parked(taking_over: bool = False) -> CuptiSource | None:
    """Take the parked source off the shelf (under ``_STATE_LOCK``): its linger deadline and its watch called off
    (a trace taking it over traces its own calls; once unparked, every call would go on paying for the callback).
    ``taking_over`` (a trace's start): the watch's callbacks are turned off just after, by the trace's harvest thread
    (``quiet_taken_over``) or the linger thread (``_QUIET``) as ``QUIET_BY`` says, not on the starting thread; until
    then each returns at once."""
    global _PARKED, _PARK_TOKEN, _QUIET_DUE
    source = _PARKED
    if source is None:
        return None
    _PARKED, _PARK_TOKEN = None, _PARK_TOKEN + 1
    if _DETACH is not None and taking_over:
        _DETACH.disarm(keep_domain=True)
        if QUIET_BY == "trace":
            _QUIET_DUE = True
            _LINGER.disarm()
        else:
            _LINGER.arm(0.0, _QUIET)
    else:
        _LINGER.disarm()
        if _DETACH is not None:
            _DETACH.disarm()
    return source


def quiet_taken_over() -> None:
    """Turn the callbacks of a watch that a trace's take-over stopped off (``QUIET_BY == "trace"``: the trace's
    harvest thread calls this at each wake), unless a watch or a finalize needs them again by then."""
    global _QUIET_DUE
    if not _QUIET_DUE:
        return
    with _STATE_LOCK:
        _QUIET_DUE = False
        if _DETACH is not None:
            _DETACH.quiet()


def _unpark() -> bool:
    """Turn the parked source's kinds off and drop what CUPTI still holds (under ``_STATE_LOCK``); False if none.
    A prime under way is waited for (``PRIMER.lock``): none starts after (its token is stale), so whatever follows
    (a finalize, another tool's subscriber) never meets a CUDA call of the primer's."""
    with PRIMER.lock:
        source = _claim_parked()
    if source is None:
        return False
    source._disable_all()
    if _RAW is not None:
        _RAW.flush_all(1)  # no source is active: the callbacks drop these records
    return True


def _linger_over(token: int) -> None:
    """No trace took the parked source over in time: kinds off, then CUPTI finalized at the next CUDA call's exit.
    ``_QUIET``: a trace took it over; turn the watch's callbacks off (unless a watch or a finalize needs them again)."""
    global detach_refused
    if token == _QUIET:
        with _STATE_LOCK:
            if _DETACH is not None:
                _DETACH.quiet()
        return
    with _STATE_LOCK:
        if token != _PARK_TOKEN:  # a stale call (a watch that fired as a trace took over): keep the live deadline
            if _PARKED is not None and not _LINGER.armed:
                _LINGER.arm(LINGER_S, _PARK_TOKEN)
            elif _PARKED is None and _DETACH is not None:
                _DETACH.quiet()  # it may have replaced a take-over's _QUIET: the callbacks must not stay on
            return
        if _BLOCKERS:  # letting go could wait for the blocker (a persistent kernel): linger on, unwatched
            if _DETACH is not None:
                _DETACH.disarm()
            _LINGER.arm(max(LINGER_S, 1.0), token)
            return
        if not _unpark() or _DETACH is None:
            return
        detach = _DETACH
        status = detach.arm()
        if status:
            if status > 0:
                detach_refused = status  # CUPTI stays attached (kinds off): the next trace enables them again
            return
    detach.host_exit()  # a CUDA call of this thread's own: its exit lets CUPTI go here, not in the user's next call


def _subscribe_detach(cupti: Any) -> None:
    """Hold CUPTI's callback subscriber for the detach (under ``_STATE_LOCK``), unless held already."""
    global _DETACH, _WORK_CBIDS, detach_refused
    if _RAW is None or (_DETACH is not None and _DETACH.subscribed):
        return
    if not _WORK_CBIDS:
        with contextlib.suppress(Exception):  # a cupti without the enum: no watch, the linger runs its course
            _WORK_CBIDS = _work_table(cupti)
    detach = ExitDetach(_RAW.lib, _detached_at_exit)
    detach_refused = detach.subscribe()  # non-zero: another subscriber (Kineto's): CUPTI stays attached after it
    if not detach_refused:
        _DETACH = detach


def _detached() -> None:
    """Right after ``cuptiFinalize`` (inside a CUDA call, on its thread): what CUPTI forgot must be set again."""
    global _API_FILTER_SET, _TICK_REF, _TICKS_PER_NS, _ATTACHED, _FRESH
    _ATTACHED = _FRESH = False
    if _RAW is not None:
        _RAW.ours = False
    _API_FILTER_SET = False
    _TICK_REF, _TICKS_PER_NS = None, 1.0  # another tool's timestamp callback may be gone with it: learn the rate again
    PRIMER.streams = frozenset()  # CUPTI's stream ids may differ once it is initialized again: asked at each prime


def block(owner: object, reason: str) -> None:
    """While ``owner`` holds a block (a persistent kernel loops: attaching CUPTI waited for it to end, measured on an
    H200), CUPTI is not attached, initialized again, enabled or let go: a trace takes over a lingering source, or else
    times the workbench's own ops by events, saying ``reason``. Waits out a re-initialization or let-go under way,
    and calls off an armed detach (it would finalize in the blocker's own launch)."""
    with _STATE_LOCK:
        _BLOCKERS[id(owner)] = reason
        if _DETACH is not None and _DETACH.armed:
            _DETACH.disarm()


def unblock(owner: object) -> None:
    """``owner``'s block ends; CUPTI attached with its kinds off (a detach the block called off) is let go."""
    with _STATE_LOCK, PRIMER.lock:  # no prime under way when the detach is armed
        _BLOCKERS.pop(id(owner), None)
        detach = _DETACH
        go = (
            not _BLOCKERS
            and _ATTACHED
            and not _FRESH
            and _PARKED is None
            and _ACTIVE is None
            and detach is not None
            and detach.subscribed
            and not detach.armed
            and detach.arm() == 0
        )
    if go:
        detach.host_exit()


def blocked() -> str:
    """Why CUPTI must not be attached or let go now ('' if nothing blocks it)."""
    reasons = tuple(_BLOCKERS.values())
    return reasons[0] if reasons else ""


def _detached_at_exit() -> None:
    """``cuptiFinalize`` ran at a CUDA call's exit: CUPTI is initialized again ``REATTACH_S`` later, off that thread
    (not in a notebook: the next cell that traces attaches it before it runs)."""
    timed = REATTACH_S is not None and not NOTEBOOK
    if timed:
        _REATTACHED.clear()  # before ``detached()`` turns true: a ``settle`` then waits for the re-initialization
    _detached()
    if timed:
        reattach_soon(REATTACH_S)


def reattach_soon(delay_s: float = 0.0) -> None:
    """Initialize CUPTI again ``delay_s`` from now on a thread of ours, with no kind on (buffer callbacks and the API
    filter set: ~10–13 ms on an H200), so that the next trace only enables its kinds. Nothing happens if CUPTI is
    attached by then, a source records, or another tool holds CUPTI; a block puts it off (tried again every second).
    ``settle`` waits for it."""
    _REATTACHED.clear()
    _REATTACH.arm(delay_s, _REATTACH_TOKEN)


def settle(timeout_s: float = 1.0) -> bool:
    """Wait up to ``timeout_s`` for a re-initialization that is due or under way (one put off by a block does not
    count); True once none is."""
    return _REATTACHED.wait(timeout_s)


def _reattach(token: int) -> None:
    """The re-initialization ``reattach_soon`` arms, on the re-attach thread (``token``: called off if it changed)."""
    global _ATTACHED, _FRESH
    try:
        with _STATE_LOCK:
            raw = _RAW
            if token != _REATTACH_TOKEN or _ATTACHED or _ACTIVE is not None or raw is None or other_client():
                return
            if blocked():
                _REATTACH.arm(max(REATTACH_S or 0.0, 1.0), token)  # again once nothing blocks it
                _REATTACHED.set()
                return
            from cupti import cupti

            raw.register()
            _ATTACHED = _FRESH = True
            if API_FILTER and API_CARRIER_KINDS:
                _filter_api(cupti, True)
    except Exception:  # noqa: BLE001  the next trace attaches, and says why if it cannot
        pass
    finally:
        _REATTACHED.set()


def _cancel_reattach() -> None:
    """Call off a re-initialization that is due or waits for ``_STATE_LOCK`` (held by the caller)."""
    global _REATTACH_TOKEN
    _REATTACH_TOKEN += 1
    _REATTACH.disarm()
    _REATTACHED.set()


def _cancel_detach(unsubscribe: bool = False) -> None:
    """A source starts (under ``_STATE_LOCK``): an armed detach is called off, one under way waited for;
    ``unsubscribe``: the subscriber is given up too (another tool subscribes next, or the process ends)."""
    global _DETACH
    detach = _DETACH
    if detach is None:
        return
    if unsubscribe:
        detach.unsubscribe()
    elif detach.disarm():
        return
    _DETACH = None


def detached() -> bool:
    """Whether CUPTI is let go (or was never attached by us): no source records or lingers, and CUPTI is not
    initialized."""
    return not _ATTACHED


def let_go() -> bool:
    """Let CUPTI go now: a parked source's kinds off, then ``cuptiFinalize`` on this thread; nothing initializes it
    again until a trace does. Call it only where no other thread makes CUDA calls (CUPTI asks for a call's exit
    otherwise); for benchmarks that need a process as if it never traced. False if a source records, CUPTI is not
    attached, a block holds (a persistent kernel runs), another tool holds CUPTI, or ``cuptiFinalize`` failed."""
    if _ACTIVE is not None or _RAW is None or not _ATTACHED or other_client():
        return False
    with _STATE_LOCK:
        if _BLOCKERS:
            return False
        _unpark()
        _cancel_detach(unsubscribe=True)
        _cancel_reattach()
        if _ACTIVE is not None:
            return False
        lib = _RAW.lib
        lib.cuptiFinalize.restype = ctypes.c_int
        with PRIMER.lock:  # no CUDA call of the primer's in flight
            if lib.cuptiFinalize():
                return False
        _detached()
    return True


def lingering() -> bool:
    """Whether a source lingers (attached, kinds on) for the next trace to take over."""
    return _PARKED is not None


def state() -> str:
    """Where CUPTI stands in this process, in words (``%gpu cupti``): what a launch pays for it now, and until when."""
    if _ACTIVE is not None:
        return "recording: a trace's source holds CUPTI"
    why = blocked()
    if why:
        return f"blocked: {why}; CUPTI is left as it is ({'attached' if _ATTACHED else 'not attached'}) meanwhile"
    if _PARKED is not None:
        left = _LINGER.left_s()
        when = f"in {left:.0f} s" if left is not None else "soon"
        watching = _DETACH is not None and _DETACH.watching
        return (
            f"lingering: attached with its kinds on, so that the next trace starts without attaching it; let go "
            f"{'at the first untraced launch, copy or memset, or ' if watching else ''}{when} unless a trace takes "
            f"it over (cupti.LINGER_S = {LINGER_S:g}). Every CUDA call pays for it meanwhile"
        )
    if _DETACH is not None and _DETACH.armed:
        return "kinds off; CUPTI is let go at the exit of the next CUDA call"
    if _REATTACH.armed:
        return "not attached: CUDA calls pay nothing for it; initialized again (no kind on) shortly"
    if NOTEBOOK and not _ATTACHED:
        return "not attached: CUDA calls pay nothing for it; the next cell that traces attaches it before it runs"
    if _ATTACHED and _FRESH:
        return (
            "ready: initialized again with no kind on, so that the next trace only enables its kinds; an empty launch "
            "pays a few % more than with CUPTI let go (%gpu cupti release)"
        )
    if _ATTACHED:
        if detach_refused:
            return (
                f"attached with its kinds off, not let go: CUPTI refused the detach (result {detach_refused}; another "
                "tool such as torch.profiler holds its one callback subscriber). Every CUDA call pays for it"
            )
        return "attached with its kinds off"
    return "not attached: CUDA calls pay nothing for it"


_LINGER = Deadline(_linger_over, "gpuworkbench-cupti-linger")
_QUIET = -1  # the linger deadline's token for turning a taken-over watch's callbacks off (park tokens are >= 1)
_PRIME = Deadline(_prime_parked, "gpuworkbench-cupti-prime", idle_s=None)  # one thread: PRIMER.threads names it
_REATTACH = Deadline(_reattach, "gpuworkbench-cupti-reattach")
_REATTACHED = threading.Event()
_REATTACHED.set()
_REATTACH_TOKEN = 0
_BLOCKERS: dict[int, str] = {}


def hand_over() -> None:
    """Before another tool (torch.profiler) takes CUPTI: a parked source's kinds turned off and a pending detach
    called off (one subscriber per process: Kineto subscribes too); CUPTI's buffer callbacks given back to Kineto
    where it is loaded (it may register them only once per process: after a trace of ours its next session would
    otherwise send its records to us; measured: torch.profiler then saw 0 kernels)."""
    global _FRESH
    with _STATE_LOCK:
        _unpark()
        _cancel_detach(unsubscribe=True)
        _cancel_reattach()
        _FRESH = False  # the other tool's kinds go on
    raw = _RAW
    if raw is not None and _ACTIVE is None:
        raw.hand_back()
        if _API_FILTER_SET:
            with contextlib.suppress(Exception):
                from cupti import cupti

                _filter_api(cupti, False)  # the other tool records every API call again


def callbacks_unknown() -> None:
    """Another client may have registered CUPTI's buffer callbacks (torch was loaded before we watched its profiler):
    the next start registers ours again."""
    if _RAW is not None:
        _RAW.ours = False


def other_client() -> str:
    """Why another CUPTI client holds CUPTI now ('' if none is known): PyTorch's profiler, or a tool injected through
    ``CUDA_INJECTION64_PATH`` (Nsight Systems, Nsight Compute). CUPTI's activity callbacks are one per process: taking
    them would break that tool, so a trace then times its own ops by events."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch._C._autograd._profiler_enabled():
                return "torch.profiler is recording (it holds CUPTI)"
        except Exception:  # noqa: BLE001  (a torch without the C profiler switch)
            pass
    injected = os.environ.get("CUDA_INJECTION64_PATH", "")
    if injected and "cupti" not in os.path.basename(injected).lower():
        return f"a CUDA tool is injected into this process (CUDA_INJECTION64_PATH={injected}: Nsight Systems?)"
    return ""


def prepare() -> None:
    """Do once what makes the first CUPTI trace slow: import cupti-python (~60 ms on the H100 machine) and what the
    harvest imports (numpy.ma), open libcupti and, with ``ATTACH_EARLY``, attach CUPTI (~20 ms; nothing is recorded
    until a trace starts) and start a source and park it (``stop``): the first trace takes it over without attaching,
    unless untraced work or ``LINGER_S`` let it go first. On the calling thread: the process's first CUPTI set-up from a
    thread beside the user's CUDA calls made later CUDA calls fail ('context is destroyed', seen on the H100 machine);
    initializing it again after a let-go (``reattach_soon``, from a thread of ours) did not, in 15 of 15 processes on an
    H200. ``%load_ext gpuworkbench`` calls it; so does the first trace that meets CUDA. Never raises."""
    global _PREPARED, _ATTACHED
    if _PREPARED:  # every trace's start asks: not behind the state lock, which a prime or a watch may hold
        return
    attached = False
    with _STATE_LOCK:
        if _PREPARED:
            return
        _PREPARED = True
        try:
            ok, _ = CuptiSource.available()
            if not ok:
                return
            from cupti import cupti

            # numpy imports numpy.ma on the first np.unique: in the first trace's harvest, 77 ms holding the GIL on the
            # H100 host (61 ms of it compiling, where numpy's .pyc files were missing)
            np.unique(np.zeros(2, np.int64))
            raw = _raw_cupti(cupti)
            if ATTACH_EARLY and _ACTIVE is None and not other_client():
                raw.register()  # attaches CUPTI; our callbacks drop what comes while no source is active
                _ATTACHED = True
                attached = True
        except Exception:  # noqa: BLE001  a trace reports why CUPTI cannot start when it tries
            pass
    if attached:  # outside the lock, which start and stop take: CUPTI's first enabling of each kind, paid here;
        # the source stays parked for a first trace to take over
        _park_new_source()  # primed on the prime thread, which then watches
        prime_here()  # and on the user's thread: part of what the first recorded op pays after a park is per thread


def _stop_active_at_exit() -> None:
    """Stop the active or parked source and call off a detach before the interpreter goes: CUPTI must not call into
    a finalizing Python. Nothing is primed (no new thread, no CUDA work, as the interpreter ends)."""
    global PRIME_AT_PARK
    PRIME_AT_PARK = False
    source = _ACTIVE
    if source is not None:
        with contextlib.suppress(Exception):
            source.stop()  # parks it: turned off just below
    with contextlib.suppress(Exception), _STATE_LOCK:
        _PRIME.disarm()
        _cancel_reattach()
        _unpark()
        _cancel_detach(unsubscribe=True)


atexit.register(_stop_active_at_exit)
