"""Trace: records every op of every device as spans on one host clock, harvested in the background, never syncing.

The front end reports each op as it is enqueued (``record_op``, or ``op_id`` / ``op_end``) with the backend's
completion handle. A harvester thread polls those handles (a non-blocking query) and, once an op is done, turns its
device-clock start and end into host-clock nanoseconds using one clock sample per device taken when the device first
appears in the trace. Where CUPTI is available on CUDA, spans come from its activity records instead (see
``trace/cupti.py`` and ``trace/cupti_ops.py``); while such a trace records and nobody reads it, the harvester leaves
CUPTI's records alone until the first read, stopping, or a bounded backlog (``DEFER_OPS``), so that tracing takes
as little as it can from the launches it measures; live views, which poll ``version``, get them at every harvest.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import cupti as cupti_source
from .cupti_foreign import ForeignRecords
from .cupti_ops import ROW, CuptiOps
from .cupti_window import WindowClock
from .harvest_threads import THREADS as HARVEST_THREADS
from .harvest_threads import Run
from .spans import (
    COLUMNS,
    KIND_CODE,
    KINDS,
    MEMORY_COLUMNS,
    Span,
    empty_memory_table,
    parse_peer_copy,
    spans_of,
    table_from_records,
    thread_stream,
)

#: Traces currently recording. The front end checks this list's truthiness before doing any tracing work.
ACTIVE: list[Trace] = []
_ACTIVE_LOCK = threading.Lock()
_IDS = itertools.count(1)
#: The trace whose CUPTI source is started (CUPTI serves one per process), and how long a new trace waits for a
#: stopped one to hand it over (its harvester releases CUPTI once its last ops have their spans).
_CUPTI_OWNER: Trace | None = None
CUPTI_HANDOFF_S = 2.0
#: Polling period of a stopped trace's harvester while its last ops finish (and of ``wait_pending``).
_DRAIN_S = 0.01
#: While a CUPTI trace records and nobody reads it, its harvester leaves CUPTI's records where they are (in CUPTI's
#: buffers, or undecoded in ours) for up to this many ops (~350 bytes each): flushing (which holds CUPTI's locks) and
#: decoding (which holds the GIL) would compete with the very launches being measured. A read, stopping, or this
#: many ops flushes and decodes them; a watched trace (below) is flushed and decoded at every harvest (>= 10 Hz).
DEFER_OPS = 200_000
#: ... and while fewer than this many ops of several records (copies, graph launches) hold their completions.
DEFER_COMPLETIONS = 1024
#: A trace counts as watched (decoded at every harvest, for live views) for this long after ``version`` is read.
WATCH_S = 1.0
_PACK = ROW.pack
_now = time.perf_counter_ns
#: The clock of CUPTI ops' enqueue windows: CUPTI's own on Linux (CLOCK_REALTIME, checked when CUPTI starts).
_wall = time.time_ns
_ident = threading.get_ident
_KERNEL = KIND_CODE["kernel"]
#: Modules whose presence means CUDA may be used by other code in this process: a trace then starts CUPTI when it
#: starts, not when the workbench's own first op meets a CUDA device, so that every library's work is in it.
CUDA_MODULES = ("cupy", "torch", "numba.cuda", "cuda.core", "cuda.bindings", "pycuda", "jax")


def _hook_torch_profiler() -> None:
    """Have torch.profiler take CUPTI cleanly from a recording trace: wraps ``torch.autograd.profiler.
    _prepare_profiler`` (once) so that the trace holding CUPTI flushes and stops it before Kineto takes the callbacks.
    Without it, records in a buffer of ours would go to Kineto, which drops buffers it did not hand out: lost to both.
    A seam with PyTorch (docs/architecture.md); a torch without that function keeps the harvester's detection."""
    module = sys.modules.get("torch.autograd.profiler")
    original = getattr(module, "_prepare_profiler", None)
    if original is None or getattr(original, "gpuworkbench_hook", False):
        return

    def prepare(*args: Any, **kwargs: Any) -> Any:
        owner = _CUPTI_OWNER
        if owner is not None:
            owner._yield_cupti("torch.profiler started and took CUPTI")
        cupti_source.hand_over()
        cupti_source.timestamps_may_change()
        return original(*args, **kwargs)

    prepare.gpuworkbench_hook = True  # type: ignore[attr-defined]
    module._prepare_profiler = prepare
    cupti_source.callbacks_unknown()  # a profiler session before the hook may have taken the callbacks


def _weak(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (bound to a trace) called through a weak reference to its trace."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        if bound is None:
            raise ReferenceError("the trace is gone")
        return bound(*args)

    return call


def _cuda_in_process() -> bool:
    modules = sys.modules
    return any(name in modules for name in CUDA_MODULES)


def _cuda_name(ordinal: int) -> str:
    """A CUDA device's name, asked of whichever library is loaded (no new CUDA context is made for it)."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return cupy.cuda.runtime.getDeviceProperties(ordinal)["name"].decode()
        except Exception:  # noqa: BLE001
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return str(torch.cuda.get_device_name(ordinal))
        except Exception:  # noqa: BLE001
            pass
    return f"CUDA device {ordinal}"


@dataclass
class DeviceClock:
    """How one device's timestamps map onto the trace's host clock, and where they came from."""

    key: str  # "cuda:0"
    name: str
    source: str  # "cupti", "events", "profiling", "perf_counter"
    offset_ns: int = 0  # device_ns - host_ns
    error_ns: int = 0  # alignment uncertainty (half the bracket of the clock sample)
    note: str = ""  # e.g. why CUPTI was not used and what the fallback's bias is


# An op timed by events whose span is not known yet is a tuple (cheap to make on the enqueue path):
# (op_id, device, stream, kind code, bytes, name, pinned, enqueue_ns, completion). CUPTI ops: see cupti_ops.py.


class _Columns:
    """Columnar storage that grows to ``capacity`` rows and then keeps the newest (a ring), counting what it drops."""

    def __init__(self, schema: Mapping[str, Any], capacity: int) -> None:
        self.schema, self.capacity = schema, capacity
        self.size = 0  # allocated on the first rows: a trace's start makes no arrays
        self.cols: dict[str, np.ndarray] = {}
        self.count = 0  # rows ever appended
        self.dropped = 0

    def _grow(self, rows: int) -> None:
        """Double the arrays (up to ``capacity``) until ``rows`` more fit."""
        while self.count + rows > self.size and self.size < self.capacity:
            new = min(max(self.size * 2, 1024), self.capacity)
            for c, dt in self.schema.items():
                grown = np.zeros(new, dtype=dt)
                if self.size:
                    grown[: self.size] = self.cols[c]
                self.cols[c] = grown
            self.size = new

    def append(self, row: Mapping[str, Any]) -> None:
        self._grow(1)
        i = self.count % self.size
        if self.count >= self.size:
            self.dropped += 1
        for c, v in row.items():
            self.cols[c][i] = v
        self.count += 1

    def extend(self, rows: list[tuple]) -> None:
        """Append many rows (tuples in schema order) at once."""
        if rows:
            self.extend_columns(dict(zip(self.schema, zip(*rows))))

    def extend_columns(self, cols: Mapping[str, Any]) -> None:
        """Append columns of equal length (sequences or arrays, keyed by the schema): one assignment per column."""
        m = len(next(iter(cols.values())))
        self._grow(m)
        skip = 0
        if m > self.size:  # more rows than the ring holds: only the newest survive
            self.count += m - self.size
            skip, m = m - self.size, self.size
        at = self.count % self.size
        idx: Any = slice(at, at + m) if at + m <= self.size else (self.count + np.arange(m)) % self.size
        for c in self.schema:
            values = cols[c][skip:]
            column = self.cols[c]
            if column.dtype == object and not isinstance(values, np.ndarray):
                values = np.fromiter(values, object, count=m)
            column[idx] = values
        self.count += m
        self.dropped = max(0, self.count - self.size)

    def table(self, since: int = 0) -> dict[str, np.ndarray]:
        """Rows ``since`` (a count of appends) to now, in append order; older dropped rows are gone."""
        if not self.size:
            return {c: np.zeros(0, dtype=dt) for c, dt in self.schema.items()}
        first = max(since, self.count - self.size, 0)
        idx = np.arange(first, self.count) % self.size
        return {c: arr[idx].copy() for c, arr in self.cols.items()}


@dataclass
class TraceStats:
    """Counters that say how complete a trace is."""

    ops: int = 0
    pending: int = 0
    dropped: int = 0
    lost: int = 0  # ops whose span never arrived (e.g. no CUPTI record); listed in warnings
    unplaced_calls: int = 0  # CUDA calls CUPTI recorded outside every traced op (other code's launches)
    harvest_cycles: int = 0
    deferred_harvests: int = 0  # harvester wake-ups that left CUPTI's records alone (nobody was reading)
    harvest_cpu_s: float = 0.0  # CPU time the harvester thread spent (what tracing takes from the host)
    warnings: list[str] = field(default_factory=list)


class Trace:
    """Spans of every op enqueued while active. Use as ``with gw.trace() as t:``; nothing here synchronizes a device.

    ``capacity`` bounds the rows kept (the newest win); ``interval_s`` is the harvester's polling period (20 Hz by
    default: live views refresh at 10–30 Hz, and each CUPTI flush briefly contends with launches);
    ``source`` is "auto" (CUPTI on CUDA where it starts, else events) or "events" to force the fallback.
    """

    def __init__(
        self, capacity: int = 1_000_000, interval_s: float = 0.05, source: str = "auto", others: bool | None = None
    ) -> None:
        if source not in ("auto", "events", "cupti"):
            raise ValueError(f"trace source must be 'auto', 'events' or 'cupti', not {source!r}")
        self.id = next(_IDS)
        self.capacity, self.interval_s, self.source = capacity, interval_s, source
        #: Whether other libraries' CUDA work (CuPy, PyTorch ...) is captured too (CUPTI from the trace's start):
        #: on unless ``others=False`` or ``GPUWB_TRACE_OTHERS=0``.
        self.others = _others(others)
        self._spans = _Columns(COLUMNS, capacity)
        self._memory = _Columns(MEMORY_COLUMNS, capacity)
        self._pending: deque[tuple] = deque()  # ops timed by events, not yet looked at (layout above)
        self._waiting: list[tuple] = []  # ... and those looked at, not done yet
        self._cupti_ops = CuptiOps()
        #: CUPTI's clock against the window clock (the same clock unless another tool's callback made it ticks).
        self._window = WindowClock()
        self._lock = threading.Lock()
        self._devices: dict[int, DeviceClock] = {}  # trace device number -> clock
        self._device_numbers: dict[int, int] = {}  # id(Device state) -> trace device number
        self._streams: dict[Any, tuple[int, bool, tuple[int, int]]] = {}  # Stream -> _stream_info
        self._cupti_flags: list[bool] = []  # per trace device number: spans come from CUPTI
        self._stream_labels: dict[tuple[int, int], str] = {}
        self._cupti: Any = None
        self._cupti_tried = False
        self._cupti_reason = ""
        self._stats = TraceStats()
        self._event_ops = 0  # ops timed by events handed over (CUPTI ops are counted by CuptiOps)
        self.started_ns = self.stopped_ns = 0
        self._stop = threading.Event()
        self._hurry = threading.Event()  # set by the next trace that waits for CUPTI: drain without pausing
        self._thread: Run | None = None  # this trace's harvest loop, on a reused thread (harvest_threads)
        self._op_ids = itertools.count(1)
        self._version = 0  # bumped whenever spans or memory samples are added
        self._read_at = -WATCH_S  # monotonic time of the last ``version`` read
        self._deferred = False  # records left undecoded by the harvester since the last harvest
        self._harvest_lock = threading.RLock()
        self._other_bytes: dict[int, int] = {}  # device number -> other libraries' net device allocations
        self._foreign: ForeignRecords | None = None  # other libraries' records, while CUPTI serves this trace
        self._cuda_numbers: dict[int, int] = {}  # CUDA ordinal -> trace device number
        self._claimed: set[int] = set()  # trace device numbers a workbench Device has
        self._threads: dict[int, int] = {}  # CUPTI thread id (32 bits) -> host row index
        self._cupti_offset = self._cupti_error = 0
        self._clocks_sampled = False
        self._taken = ""  # why CUPTI was handed to another client while this trace recorded
        self._cupti_session = -1
        self._held = {}  # device number -> bytes the workbench held at its last memory sample

    @property
    def version(self) -> int:
        """Bumped whenever spans or memory samples are added. Live views poll it: reading it marks the trace as
        watched, so that a CUPTI trace decodes its records at every harvest rather than deferring them."""
        self._read_at = time.monotonic()
        return self._version

    @property
    def stats(self) -> TraceStats:
        """Counters that say how complete this trace is (``ops`` and ``pending`` counted as of now: a CUPTI trace
        that defers its records makes no spans, and updates no counter, until it is read)."""
        stats = self._stats
        stats.ops = self._event_ops + self._cupti_ops.handed_over
        stats.pending = self._unfinished()
        return stats

    # ------------------------------------------------------------------ lifetime
    def start(self) -> Trace:
        """Begin recording (the context manager calls this); starting a trace that records already does nothing."""
        if self.recording:
            return self
        self.started_ns = time.perf_counter_ns()
        if self.others and self.source != "events" and self._cupti is None and _cuda_in_process():
            self._start_cupti()  # every library's CUDA work from the first op on
        with _ACTIVE_LOCK:
            ACTIVE.append(self)
        self._stop.clear()
        self._thread = HARVEST_THREADS.run(self._harvest_loop, f"gpuworkbench-trace-{self.id}")
        return self

    def stop(self) -> None:
        """Stop recording new ops; spans of ops already enqueued keep arriving in the background."""
        with _ACTIVE_LOCK:
            if self in ACTIVE:
                ACTIVE.remove(self)
        self.stopped_ns = time.perf_counter_ns()
        self._stop.set()

    def __enter__(self) -> Trace:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def recording(self) -> bool:
        return self in ACTIVE

    # ------------------------------------------------------------------ called by the front end
    def device_number(self, device: Any) -> int:
        """The trace's number for ``device`` (a gpuworkbench Device), aligning its clock the first time."""
        key = id(device)
        number = self._device_numbers.get(key)
        if number is not None:
            return number
        ordinal = device.index if device.backend_kind.value == "cuda" else None
        with self._lock:
            if key in self._device_numbers:
                return self._device_numbers[key]
            number = self._cuda_numbers.get(ordinal) if ordinal is not None else None
            if number is not None and number not in self._claimed:  # seen first in another library's records
                clock = self._devices[number]
                clock.key, clock.name = device.spec, device.name
            else:
                number = len(self._devices)
                self._devices[number] = self._align(device)
                self._cupti_flags.append(self._devices[number].source == "cupti")
                if ordinal is not None and self._devices[number].source == "cupti":
                    self._cuda_numbers.setdefault(ordinal, number)
            self._claimed.add(number)
            self._device_numbers[key] = number
            for sid, label in device._stream_labels().items():
                self._stream_labels[(number, sid)] = label
        return number

    def _align(self, device: Any) -> DeviceClock:
        caps = device.caps
        clock = DeviceClock(key=device.spec, name=device.name, source=caps.timestamps)
        if caps.timestamps == "events" and self.source in ("auto", "cupti") and device.backend_kind.value == "cuda":
            # Measured on an H200: with a persistent kernel looping (persistent.py), a CUPTI trace waited for it to end.
            blocked = device._runs_persistent()
            reason = (
                "a persistent kernel runs on this device, and CUPTI would wait for it to end"
                if blocked
                else self._start_cupti()
            )
            if not blocked and self._cupti is not None and not self._taken:
                clock.source = "cupti"  # its offset: ``_sample_clocks`` (taken already, or fills it in then)
                clock.offset_ns, clock.error_ns = self._cupti_offset, self._cupti_error
                return clock
            reason = reason or self._taken
            clock.note = (
                f"CUPTI not used ({reason}); spans come from CUDA events, which mark when the stream reached each op, "
                "not when the copy engine or SMs ran it: kernels can look several µs longer and a copy queued behind "
                "another stream's copy can look hundreds of µs longer (and falsely overlapping)."
            )
            if self.source == "cupti":
                raise RuntimeError(f"trace source 'cupti' asked for but unavailable: {reason}")
        sample = device._backend.clock_sample()
        clock.offset_ns, clock.error_ns = sample.device_ns - sample.host_ns, sample.error_ns
        return clock

    def _start_cupti(self) -> str:
        if self._cupti_tried:
            return self._cupti_reason
        self._cupti_tried = True
        cupti_module = cupti_source
        ok, why = cupti_module.CuptiSource.available()
        if not ok:
            self._cupti_reason = why
            return why
        why = cupti_module.blocked()
        if why and not cupti_module.lingering():  # attaching or enabling could wait for the blocker; taking over not
            self._cupti_reason = why
            self._warn_once(f"CUPTI not used: {why}; this trace times its own ops by events and sees no other work")
            return why
        other = cupti_module.other_client()
        if other:
            self._cupti_reason = other
            self._warn_once(f"CUPTI not used: {other}; this trace times its own ops by events and sees no other work")
            return other
        global _CUPTI_OWNER
        owner = _CUPTI_OWNER
        if owner is not None and owner is not self and not owner.recording and owner._thread is not None:
            owner._hurry.set()  # its next pass now: a forced flush brings the records of ops already done
            owner._thread.join(CUPTI_HANDOFF_S)  # a stopped trace holds CUPTI until its last ops are in
        cupti_module.prepare()  # once per process: done at %load_ext, else here
        source = cupti_module.CuptiSource()  # one per trace (it takes over a parked one's kinds: cupti.LINGER_S)
        _hook_torch_profiler()
        try:
            source.start()
        except cupti_module.CuptiUnavailable as exc:
            self._cupti_reason = str(exc)
            return self._cupti_reason
        _CUPTI_OWNER = self
        window = WindowClock()  # set before the source, which a harvester may meet at once
        if cupti_source.timestamps_are_ticks():  # calls before the first harvest are placed between two samples
            window.sample(source)
        self._window = window
        self._clocks_sampled = False  # on first need (``_sample_clocks``), not on the path before the first op
        self._cupti = source
        self._cupti_session = source.session
        if self.others:
            # Weak callbacks: a trace in a reference cycle is freed by the cyclic collector, late and on any thread.
            self._foreign = ForeignRecords(
                _weak(self._foreign_devices),
                _weak(self._thread_row),
                _weak(self.label_stream),
                source.api_name,
                source.names_of,
            )
        return ""

    def _foreign_devices(self, ordinals: np.ndarray) -> np.ndarray:
        """Trace device numbers of CUDA ordinals seen in CUPTI records (new ones are added, on CUPTI's clock)."""
        numbers = self._cuda_numbers
        unique = np.unique(ordinals)
        if any(int(o) not in numbers for o in unique.tolist()):
            with self._lock:
                for ordinal in unique.tolist():
                    if ordinal not in numbers:
                        number = len(self._devices)
                        self._devices[number] = DeviceClock(
                            key=f"cuda:{ordinal}",
                            name=_cuda_name(ordinal),
                            source="cupti",
                            offset_ns=self._cupti_offset,
                            error_ns=self._cupti_error,
                        )
                        self._cupti_flags.append(True)
                        numbers[ordinal] = number
        lookup = np.array([numbers[int(o)] for o in unique.tolist()], np.int64)
        return lookup[np.searchsorted(unique, ordinals)] if unique.size else np.zeros(0, np.int64)

    def _thread_row(self, device: int, thread: int) -> int:
        """The host row (a negative stream) of a thread CUPTI names by the low 32 bits of its ``pthread_self``."""
        index = self._threads.get(thread)
        if index is None:
            index = self._threads[thread] = len(self._threads)
        stream = thread_stream(index)
        if (device, stream) not in self._stream_labels:
            name = next((t.name for t in threading.enumerate() if (t.ident or 0) & 0xFFFFFFFF == thread), "")
            self._stream_labels[(device, stream)] = f"host {name}" if name else f"host thread {thread:#x}"
        return stream

    def _yield_cupti(self, reason: str) -> None:
        """Hand CUPTI to another client that is about to take it (torch.profiler, through ``_hook_torch_profiler``):
        flush and stop it first, so that no buffer of ours is left for the other tool to receive, decode what came
        back, and time later ops by events. Ops whose records had not come (still running) are counted lost."""
        global _CUPTI_OWNER
        with self._harvest_lock:
            source = self._cupti
            if source is None or self._taken or source.session != self._cupti_session:
                return
            source.stop()
            self._give_up_cupti(reason)
            self._harvest(flush=False)
            left = len(self._cupti_ops)
            if left:
                self.stats.lost += left
                self._warn_once(f"{left} ops still running when CUPTI was handed over have no span")
            self._cupti_ops = CuptiOps()
            self._cupti, self._foreign = None, None
            if _CUPTI_OWNER is self:
                _CUPTI_OWNER = None

    def _give_up_cupti(self, reason: str) -> None:
        """Another client took CUPTI while this trace recorded: its later ops are timed by events."""
        self._taken = reason
        self._cupti.freeze()
        self._cupti_flags = [False] * len(self._cupti_flags)
        self._streams.clear()
        self._warn_once(
            f"CUPTI taken over mid-trace: {reason}. From then on this trace times its own ops by CUDA events and "
            "sees no other library's work; its ops enqueued just before may be missing."
        )

    def _sample_clocks(self) -> None:
        """CUPTI's clock against the host's and the window clock, once per CUPTI source, when first needed: at the
        first harvest or a read of ``devices`` (a CUDA device's clock made before then gets the offset here). On the
        trace's start, on a CPU that idled between notebook cells, they took ~12 µs before the first op (H200 host)."""
        source = self._cupti
        if self._clocks_sampled or source is None:
            return
        cupti_ns, host_ns, err = source.clock_sample()
        with self._lock:  # against ``_align``: every CUPTI clock made before gets the offset, every one after too
            if self._clocks_sampled:
                return
            self._window.sample(source)
            self._cupti_offset, self._cupti_error = cupti_ns - host_ns, err
            for clock in self._devices.values():
                if clock.source == "cupti":
                    clock.offset_ns, clock.error_ns = self._cupti_offset, self._cupti_error
            self._clocks_sampled = True

    def _resolve(self, thread: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Place CUPTI API calls (thread id, start on CUPTI's clock) in the enqueue windows of the waiting ops."""
        return self._cupti_ops.resolve(thread, start - self._window.offsets(self._cupti, start))

    def _stream_info(self, stream: Any) -> tuple[int, bool, tuple[int, int]]:
        """(device number, spans from CUPTI, (device number, stream id)) of a stream, kept for the launch path."""
        number = self.device_number(stream.device)
        info = (number, self._cupti_flags[number], (number, stream.id))
        self._streams[stream] = info
        return info

    def uses_cupti(self, device_number: int, kind: str = "kernel", nbytes: int = 1, name: str = "") -> bool:
        """Whether this op's span comes from CUPTI: not for zero-byte copies and memsets (they do nothing CUPTI could
        see), nor for peer copies between devices (CUPTI reports them as MEMCPY2 records, a kind not enabled here:
        measured on two H200s, a peer copy's op then got no span)."""
        return (
            self._cupti_flags[device_number]
            and (nbytes > 0 or kind == "kernel")
            and not (kind == "d2d" and parse_peer_copy(name) is not None)
        )

    def record_op(
        self,
        stream: Any,
        kind: str,
        nbytes: int,
        name: str,
        pinned: int,
        call: Any,
        keep: Any = None,
        many: bool = False,
    ) -> Any:
        """Enqueue one op through ``call(timed)`` and record it: the fast path when one trace records.

        ``many``: the op may show as several CUPTI records (a graph launch); copies are assumed to."""
        info = self._streams.get(stream)
        if info is None:
            info = self._stream_info(stream)
        number, cupti, key = info
        op_id = next(self._op_ids)
        # A zero-byte copy or memset does nothing on the device, so CUPTI sees nothing: time it with events instead;
        # so is a peer copy (see uses_cupti).
        if cupti and (nbytes > 0 or kind == "kernel") and not (kind == "d2d" and parse_peer_copy(name) is not None):
            t0 = _wall()  # the API calls CUPTI records on this thread from here to t1 are this op's
            completion = call(False)
            t1 = _wall()
            stream._track(completion, keep)
            ops = self._cupti_ops  # CuptiOps.add, inlined: this is the launch path
            code = ops.codes.get(name)
            if code is None:
                code = ops.code_of(name, op_id)
            kind_code = KIND_CODE[kind]
            if many or kind_code != _KERNEL:
                ops.completions[op_id] = completion
            ops.markers[key] = completion
            rows = ops.rows  # extended in place: the harvester cuts the same bytearray
            rows += _PACK(op_id, number, key[1], kind_code, nbytes, code, pinned, t0, many, t1, _ident())
            return completion
        enqueue_ns = _now()
        completion = call(True)
        stream._track(completion, keep)
        self._event_ops += 1
        self._pending.append((op_id, number, stream.id, KIND_CODE[kind], nbytes, name, pinned, enqueue_ns, completion))
        return completion

    def op_id(self) -> int:
        """Reserve an op id (for ``op_end``)."""
        return next(self._op_ids)

    def op_end(
        self,
        op_id: int,
        device_number: int,
        stream: int,
        kind: str,
        nbytes: int,
        name: str,
        pinned: int,
        enqueue_ns: int,
        completion: Any,
        many: bool = False,
        window: tuple[int, int] = (0, 0),
    ) -> None:
        """Hand over an op enqueued at ``enqueue_ns`` (host clock) by this thread within ``window`` (the window clock,
        ``time.time_ns``); its span is filled in once the completion reports done."""
        kind_code = KIND_CODE[kind]
        if self.uses_cupti(device_number, kind, nbytes, name):
            t0, t1 = window
            self._cupti_ops.add(
                op_id, device_number, stream, kind_code, nbytes, name, pinned, t0, completion, many, t1, _ident()
            )
        else:
            self._pending.append(
                (op_id, device_number, stream, kind_code, nbytes, name, pinned, enqueue_ns, completion)
            )
            self._event_ops += 1

    def host_event(
        self, device_number: int, kind: str, nbytes: int, name: str, start_ns: int, end_ns: int, address: int = 0
    ) -> None:
        """Record a host-side event (alloc, free, marker) that took place between two host times; ``address``: the
        workbench's own device allocation, which CUPTI's memory records then do not count as another library's."""
        if address and self._foreign is not None:
            self._foreign.own_addresses.add(address)
        with self._lock:
            self._append_span(device_number, -1, KIND_CODE[kind], start_ns, end_ns, start_ns, nbytes, name, -1)

    def host_range(self, name: str, start_ns: int, end_ns: int, thread: int) -> None:
        """A named region of host time on ``thread``'s host row (``gw.range``), on the trace's first device."""
        device = min(self._devices, default=0)
        with self._lock:
            stream = self._thread_row(device, thread & 0xFFFFFFFF)
            self._append_span(device, stream, KIND_CODE["range"], start_ns, end_ns, start_ns, 0, name, -1)

    def memory_sample(self, device_number: int, held: int, used: int) -> None:
        """Record the bytes the workbench holds on a device (and the device's used total, -1 if unknown) now."""
        with self._lock:
            row = {
                "device": device_number,
                "t_ns": time.perf_counter_ns(),
                "held_bytes": held,
                "used_bytes": used,
                "other_bytes": self._other_bytes.get(device_number, -1),
            }
            self._held[device_number] = held
            self._memory.append(row)
            self._version += 1

    def label_stream(self, device_number: int, stream: int, label: str) -> None:
        self._stream_labels[(device_number, stream)] = label

    # ------------------------------------------------------------------ harvesting
    def _append_span(self, dev: int, stream: int, kind: int, start: int, end: int, enq: int, nbytes: int, name, pin):
        self._spans.append(
            {
                "kind": kind,
                "device": dev,
                "stream": stream,
                "start_ns": start,
                "end_ns": end,
                "enqueue_ns": enq,
                "bytes": nbytes,
                "name": name,
                "pinned": pin,
                "corr": -1,
                "grid": 0,
                "block": 0,
            }
        )
        self._version += 1

    def _harvest_loop(self) -> None:
        stopping = False
        while True:
            if self._cupti is not None:  # a take-over's watch callbacks (QUIET_BY "trace"): off as the loop begins,
                cupti_source.quiet_taken_over()  # or at its next wake where CUPTI started later (a first CUDA op)
            if stopping:  # stopped, ops still running: drain at a gentle pace, never in a busy loop
                self._hurry.wait(min(self.interval_s, _DRAIN_S))
                self._hurry.clear()
            else:
                stopping = self._stop.wait(self.interval_s)
            cpu = time.thread_time()
            try:
                if self._cupti is not None and not self._taken and self.recording:
                    other = cupti_source.other_client()
                    if other:
                        self._give_up_cupti(other)
                if self._defers():
                    self._deferred = True
                    self._stats.deferred_harvests += 1
                else:
                    self.harvest()
            except Exception as exc:  # noqa: BLE001 - a harvester crash must be visible, not silent
                self.stats.warnings.append(f"harvester error: {exc!r}")
                warnings.warn(f"gpuworkbench trace harvester error: {exc!r}", RuntimeWarning, stacklevel=1)
            self.stats.harvest_cpu_s += time.thread_time() - cpu
            if stopping and not self._unfinished():
                self._finish_cupti()
                make_spares()  # the next trace's object, off its start
                return

    def _defers(self) -> bool:
        """Whether this wake-up may leave CUPTI's records alone: recording, unwatched, a bounded backlog, and no ops
        timed by events waiting (their pooled events are held until harvested)."""
        return (
            self._cupti is not None
            and not self._taken
            and self.recording
            and time.monotonic() - self._read_at > WATCH_S
            and not self._pending
            and not self._waiting
            and len(self._cupti_ops.completions) < DEFER_COMPLETIONS
            and len(self._cupti_ops.rows) < DEFER_OPS * ROW.size
        )

    def _catch_up(self) -> None:
        """Flush and decode what the harvester deferred, for a reader while the trace records."""
        if self._deferred and self.recording:
            self.harvest(flush=True)

    def _unfinished(self) -> int:
        """Ops recorded whose spans have not been made yet."""
        return len(self._pending) + len(self._waiting) + len(self._cupti_ops)

    def harvest(self, flush: bool = False) -> int:
        """Turn finished ops into spans (non-blocking); returns how many spans were added. ``flush``: have CUPTI hand
        back every record now (else only when a flush is due: see ``trace/cupti.py``)."""
        with self._harvest_lock:
            self._deferred = False
            return self._harvest(flush)

    def _harvest(self, flush: bool) -> int:
        self.stats.harvest_cycles += 1
        cycle = self.stats.harvest_cycles
        self._sample_clocks()  # before the offsets are read
        offsets = {n: c.offset_ns for n, c in self._devices.items()}
        cupti_rows = None
        ops = self._cupti_ops
        if self._cupti is not None:
            ops.take_rows(cycle)  # before the flush: the windows of the ops handed over so far place its API calls
            if self._window.drifts:
                self._window.sample(self._cupti)
            eager = flush or not self.recording
            records = self._cupti.flush_columns(eager=eager, full=self.others, resolve=self._resolve)
            ops.add_records(records, cycle)
            self.stats.unplaced_calls = self._cupti.unplaced_calls
            if self._foreign is not None:
                self._add_foreign(records)
            if len(ops):
                lost = ops.lost
                off = np.array([offsets[n] for n in range(len(offsets))], np.int64)
                cupti_rows = ops.harvest(cycle, off, off - self._window.offsets(self._cupti))
                if ops.lost > lost:
                    self.stats.lost += ops.lost - lost
                    self._warn_once(f"no CUPTI record arrived for some ops (first: {ops.first_lost!r}): missing")
        waiting = self._waiting
        while self._pending:
            waiting.append(self._pending.popleft())
        rows: list[tuple] = []
        keep: list[tuple] = []
        blocked: set[tuple[int, int]] = set()  # streams with an unfinished op: later ops there are unfinished too
        for p in waiting:
            op_id, dev, stream, kind, nbytes, name, pinned, enq, completion = p
            key = (dev, stream)
            if key in blocked or not completion.done():
                blocked.add(key)
                keep.append(p)
                continue
            times = completion.times_ns()
            if times is None:
                self.stats.lost += 1
                self._warn_once(f"an op finished without timestamps ({name!r}); it is missing")
                continue
            off = offsets[dev]
            rows.append((kind, dev, stream, times[0] - off, times[1] - off, enq, nbytes, name, pinned, -1, 0, 0))
        added = len(rows) + (0 if cupti_rows is None else len(cupti_rows["kind"]))
        if added:
            with self._lock:
                self._spans.extend(rows)
                if cupti_rows is not None:
                    self._spans.extend_columns(cupti_rows)
                self._version += 1
        self._waiting = keep
        self.stats.dropped = self._spans.dropped
        return added

    def _add_foreign(self, records: dict[str, np.ndarray] | None) -> None:
        """Other libraries' work, launches, allocations and NVTX ranges from this flush, as spans."""
        foreign = None
        if records is not None:
            theirs = records["external_id"] <= 0
            if theirs.any():
                foreign = {k: v[theirs] for k, v in records.items()}
        blocks = [
            b
            for b in map(self._in_window, self._foreign.spans(foreign, self._cupti.take_extras(), self._cupti_offset))
            if b["kind"].size
        ]
        if not blocks:
            return
        with self._lock:
            for block in blocks:
                self._spans.extend_columns(block)
                if (block["kind"] == KIND_CODE["alloc"]).any() or (block["kind"] == KIND_CODE["free"]).any():
                    now = int(block["end_ns"].max())
                    for dev, total in self._foreign.other_bytes.items():
                        self._other_bytes[dev] = total
                        row = {"device": dev, "t_ns": now, "held_bytes": self._held.get(dev, 0), "used_bytes": -1}
                        self._memory.append(row | {"other_bytes": total})
            self._version += 1

    def _in_window(self, block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The rows of a block of other libraries' work whose call (or start, where no call is known) came before this
        trace stopped: CUPTI runs on after a stop until the trace's own ops are in, and sees work enqueued then. The
        start needs no bound: CUPTI records nothing before the trace starts it but work already running."""
        if not self.stopped_ns:
            return block
        keep = np.where(block["enqueue_ns"] >= 0, block["enqueue_ns"], block["start_ns"]) <= self.stopped_ns
        return block if keep.all() else {k: v[keep] for k, v in block.items()}

    def _warn_once(self, message: str) -> None:
        if message not in self.stats.warnings:
            self.stats.warnings.append(message)

    def _finish_cupti(self) -> None:
        global _CUPTI_OWNER
        if self._cupti is not None and self._cupti.session == self._cupti_session:
            if self._taken:
                self._cupti.abandon()  # the other client holds CUPTI now: leave its kinds and callbacks alone
            else:
                self._cupti.stop()
            self.harvest()  # what the stop's forced flush handed back, and records held for ids: all released now
            self.stats.unplaced_calls = self._cupti.unplaced_calls
            if _CUPTI_OWNER is self:
                _CUPTI_OWNER = None

    def wait_pending(self, timeout_s: float = 30.0) -> bool:
        """Block until every recorded op has its span (the ops themselves must finish); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._unfinished():
            self._read_at = time.monotonic()  # a recording trace's harvester decodes while someone waits
            if self._thread is None or not self._thread.is_alive():
                self.harvest()
            if time.monotonic() > deadline:
                return False
            time.sleep(min(self.interval_s / 2, _DRAIN_S / 2))
        if not self.recording and self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))  # it releases CUPTI as it ends
        return True

    # ------------------------------------------------------------------ reading
    def table(self, since: int = 0, wait: bool = True) -> dict[str, np.ndarray]:
        """The spans as columns (see ``trace/spans.py``); waits for pending ops when ``wait`` and not recording."""
        if wait and not self.recording:
            self.wait_pending()
        self._catch_up()
        with self._lock:
            return self._spans.table(since)

    def delta(self, since: int) -> tuple[dict[str, np.ndarray], int]:
        """Spans added after the first ``since`` ever appended, and the new cursor (for live views; never waits)."""
        self._catch_up()
        with self._lock:
            return self._spans.table(since), self._spans.count

    def memory_table(self) -> dict[str, np.ndarray]:
        with self._lock:
            return self._memory.table() if self._memory.count else empty_memory_table()

    @property
    def spans(self) -> list[Span]:
        """Every span, as Span objects in order of start time (``table()`` keeps the order spans arrived in)."""
        table = self.table()
        order = np.argsort(table["start_ns"], kind="stable")
        return spans_of({column: values[order] for column, values in table.items()})

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    def __len__(self) -> int:
        return min(self._spans.count, self._spans.size)

    @property
    def devices(self) -> dict[int, DeviceClock]:
        self._sample_clocks()
        return dict(self._devices)

    @property
    def stream_labels(self) -> dict[tuple[int, int], str]:
        return dict(self._stream_labels)

    def to_dataframe(self):  # noqa: ANN201 - pandas is optional
        """The spans as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        t = self.table()
        frame = pd.DataFrame({c: t[c] for c in COLUMNS})
        frame["kind"] = [KINDS[k] for k in t["kind"]]
        frame["duration_ns"] = t["end_ns"] - t["start_ns"]
        return frame

    def to_chrome_trace(self, path: str | None = None) -> dict:
        """Write (and return) the trace as Chrome-trace JSON in the Kineto layout; Perfetto opens it."""
        from .export import chrome_trace

        return chrome_trace(self, path)

    def summary(self, window: tuple[int, int] | None = None):  # noqa: ANN201 - analysis.Summary
        """Overlap, idle, pipeline efficiency and advice (DESIGN §6); ``too-small-for-gpu`` too where this machine's
        crossovers are cached (``gw.crossover``)."""
        from ..crossovers import cached_crossovers  # a seam: crossovers imports device, which imports this module
        from .analysis import summarize

        try:
            crossover = cached_crossovers(self)
        except Exception:  # noqa: BLE001 - an unreadable cache never stops a summary
            crossover = None
        return summarize(self.table(), window=window, crossover=crossover)

    def statistics(self):  # noqa: ANN201 - statistics.Statistics
        """Kernels by name, copies by direction and host memory, API calls and launch latency, as ``nsys stats``
        gives them (``trace/statistics.py``); waits for pending spans once the trace stopped."""
        from .statistics import trace_statistics

        return trace_statistics(self)

    def timeline(self, **kw: Any):  # noqa: ANN201 - a bokeh column
        """A Bokeh timeline: the detail view (a row per host thread and device stream) over an overview strip, in one
        column (options: ``viz.timeline_figure``; ``gw.compare(a, b).figure()`` puts two on one axis); waits for
        pending spans."""
        from ..viz.timeline import trace_timeline

        return trace_timeline(self, **kw)

    def memory_plot(self, **kw: Any):  # noqa: ANN201 - a bokeh figure
        """A Bokeh plot of bytes held per device over time beside the device's used total (``viz.memory_figure``)."""
        from ..viz.memory import trace_memory_plot

        return trace_memory_plot(self, **kw)

    def show(self, window: tuple[int, int] | None = None):  # noqa: ANN201 - None in a notebook, else a bokeh layout
        """Display timeline, memory plot and summary (over ``window``) in a notebook; elsewhere return the layout."""
        from ..viz import show_trace

        return show_trace(self, window=window)

    @classmethod
    def from_records(cls, records: Any, device_names: Mapping[int, str] | None = None) -> Trace:
        """A finished trace built from dicts (kind, stream, start_ns, end_ns, ...), e.g. to analyse by hand.

        ``stream`` is a number or a name: names get numbers (in order of first appearance, per device) and stay the
        rows' labels."""
        t = cls()
        records = list(records)
        named: dict[tuple[int, str], int] = {}
        for i, rec in enumerate(records):
            stream = rec.get("stream")
            if isinstance(stream, str):
                dev = int(rec.get("device", 0))
                number = named.get((dev, stream))
                if number is None:
                    number = named[dev, stream] = sum(1 for d, _ in named if d == dev)
                    t._stream_labels[(dev, number)] = stream
                records[i] = {**rec, "stream": number}
        table = table_from_records(records)
        for i in range(len(table["kind"])):
            t._spans.append({c: table[c][i] for c in COLUMNS})
        for dev in sorted(set(int(d) for d in table["device"])) or [0]:
            name = (device_names or {}).get(dev, f"device {dev}")
            t._devices[dev] = DeviceClock(key=f"device:{dev}", name=name, source="records")
        return t

    def __repr__(self) -> str:
        state = "recording" if self.recording else "stopped"
        return f"<Trace {self.id}: {len(self)} spans, {self.stats.pending} pending, {state}>"


def active() -> list[Trace]:
    """The traces recording now."""
    return list(ACTIVE)


def _others(others: bool | None) -> bool:
    """Whether a trace records other libraries' CUDA work: ``others``, or unless ``GPUWB_TRACE_OTHERS=0``."""
    return others if others is not None else os.environ.get("GPUWB_TRACE_OTHERS", "1") != "0"


#: A trace made ahead with the default arguments (``new_trace``), off the path a cell times: by the harvester of the
#: trace before as it ends, and at ``%load_ext``. Making one on a CPU that has idled between notebook cells took
#: ~0.1 ms of a trace's start (H200 host, ``benchmarks/probes/trace_start_steps.py``); 8 µs back to back.
_SPARES: list[Trace] = []


def new_trace(
    capacity: int = 1_000_000, interval_s: float = 0.05, source: str = "auto", others: bool | None = None
) -> Trace:
    """A new, unstarted Trace: the one made ahead (``make_spares``) where it was made with these arguments."""
    try:
        spare = _SPARES.pop()
    except IndexError:
        spare = None
    if spare is not None and (spare.capacity, spare.interval_s, spare.source, spare.others) == (
        capacity,
        interval_s,
        source,
        _others(others),
    ):
        spare.id = next(_IDS)
        return spare
    if spare is not None and spare.others == _others(None) and not _SPARES:
        _SPARES.append(spare)  # still what a call with the defaults gets: kept for the next one
    return Trace(capacity=capacity, interval_s=interval_s, source=source, others=others)


def make_spares() -> None:
    """Make the next trace ahead (``new_trace``)."""
    if not _SPARES:
        _SPARES.append(Trace())
