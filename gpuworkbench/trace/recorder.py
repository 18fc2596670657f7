"""Trace: records every op of every device as spans on one host clock, harvested in the background, never syncing.

The front end reports each op as it is enqueued (``record_op``, or ``op_id`` / ``op_end``) with the backend's
completion handle. A harvester thread polls those handles (a non-blocking query) and, once an op is done, turns its
device-clock start and end into host-clock nanoseconds using one clock sample per device taken when the device first
appears in the trace. Where CUPTI is available on CUDA, spans come from its activity records instead
(``recorder_cupti.py``); the harvest itself is ``recorder_harvest.py``. A trace listens to the core through
``gpuworkbench.listeners``: it registers there while it records, and the core never imports it.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import listeners
from .columns import Columns, DeviceClock, TraceStats
from .counters import Counting, wanted
from .crossovers import CROSSOVERS, provide_crossovers  # noqa: F401 - the package root imports the second from here
from .cupti.clock import WindowClock
from .cupti.foreign import ForeignRecords
from .cupti.ops import ROW, CuptiOps
from .cupti.sites import CallSites
from .harvest_threads import THREADS as HARVEST_THREADS
from .harvest_threads import Run
from .lines import Location, SourceLines
from .recorder_cupti import CuptiTracing, cuda_in_process
from .recorder_harvest import WATCH_S, Harvesting
from .spans import (
    COLUMNS,
    DEFAULTS,
    KIND_CODE,
    KINDS,
    MEMORY_COLUMNS,
    Span,
    empty_memory_table,
    parse_peer_copy,
    spans_of,
    table_from_records,
)

_IDS = itertools.count(1)
_PACK = ROW.pack
_now = time.perf_counter_ns
#: The clock of CUPTI ops' enqueue windows: CUPTI's own on Linux (CLOCK_REALTIME, checked when CUPTI starts).
_wall = time.time_ns
_ident = threading.get_ident
_KERNEL = KIND_CODE["kernel"]


class Trace(CuptiTracing, Harvesting, Counting):
    """Spans of every op enqueued while active. Use as ``with gw.trace() as t:``; nothing here synchronizes a device.

    ``capacity`` bounds the rows kept (the newest win); ``interval_s`` is the harvester's polling period (20 Hz by
    default: live views refresh at 10–30 Hz, and each CUPTI flush briefly contends with launches);
    ``source`` is "auto" (CUPTI on CUDA where it starts, else events) or "events" to force the fallback; ``lines``:
    each span carries the source line that issued it (``trace/lines.py``; ``statistics().lines``); ``counters``: the
    host's CPU and memory, and devices' counters where offered, sampled while it records (``counters()``).
    """

    def __init__(
        self,
        capacity: int = 1_000_000,
        interval_s: float = 0.05,
        source: str = "auto",
        others: bool | None = None,
        lines: bool = False,
        counters: bool = False,
    ) -> None:
        if source not in ("auto", "events", "cupti"):
            raise ValueError(f"trace source must be 'auto', 'events' or 'cupti', not {source!r}")
        self.id = next(_IDS)
        self.capacity, self.interval_s, self.source = capacity, interval_s, source
        #: Whether other libraries' CUDA work (CuPy, PyTorch ...) is captured too (CUPTI from the trace's start):
        #: on unless ``others=False`` or ``GPUWB_TRACE_OTHERS=0``.
        self.others = _others(others)
        self.counting = wanted(counters)  # counter tracks (trace/counters.py)
        self._spans = Columns(COLUMNS, capacity, DEFAULTS)
        self._memory = Columns(MEMORY_COLUMNS, capacity)
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
        #: Where ops come from (``lines=True``): each op's location code, found as it is enqueued.
        self.lines: SourceLines | None = SourceLines() if lines else None
        self._sites: CallSites | None = None  # other libraries' call sites (Python's monitoring or CUPTI's callbacks)

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
        if self.lines is not None and not self.lines.focus:
            self.lines.focus_on_caller()  # the code that starts the trace (a cell) takes the work it calls
        if self.others and self.source != "events" and self._cupti is None and cuda_in_process():
            self._start_cupti()  # every library's CUDA work from the first op on
            self._report_sites()
        listeners.add(self)
        self._stop.clear()
        self._thread = HARVEST_THREADS.run(self._harvest_loop, f"gpuworkbench-trace-{self.id}")
        self._start_counters()
        return self

    def stop(self) -> None:
        """Stop recording new ops; spans of ops already enqueued keep arriving in the background."""
        listeners.remove(self)
        self._stop_sites()
        self.stopped_ns = time.perf_counter_ns()
        self._stop.set()
        self._stop_counters()

    def __enter__(self) -> Trace:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def recording(self) -> bool:
        return self in listeners.RECORDING

    @property
    def cupti_info(self) -> dict[str, Any]:
        """Where CUPTI stands for this trace: ``tried`` (a start was attempted), ``running`` (a CUPTI source serves
        it), ``reason`` (why it did not start) and ``taken`` (why it was handed to another client; "" if not)."""
        return {
            "tried": self._cupti_tried,
            "running": self._cupti is not None,
            "reason": self._cupti_reason,
            "taken": self._taken,
        }

    # ------------------------------------------------------------ called by the front end (gpuworkbench.listeners)
    def knows_device(self, device: Any) -> bool:
        """Whether ``device`` has a number in this trace already."""
        return id(device) in self._device_numbers

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
            for sid, label in device.stream_labels().items():
                self._stream_labels[(number, sid)] = label
        return number

    def _stream_info(self, stream: Any) -> tuple[int, bool, tuple[int, int]]:
        """(device number, spans from CUPTI, (device number, stream id)) of a stream, kept for the launch path."""
        number = self.device_number(stream.device)
        info = (number, self._cupti_flags[number], (number, stream.id))
        self._streams[stream] = info
        return info

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
        launch: Any = None,
    ) -> Any:
        """Enqueue one op through ``call(timed)`` and record it (the fast path when one trace records). ``many``: the
        op may show as several CUPTI records (a graph launch; copies are assumed to); ``launch``: a kernel's shape."""
        info = self._streams.get(stream)
        if info is None:
            info = self._stream_info(stream)
        number, cupti, key = info
        op_id = next(self._op_ids)
        lines = self.lines
        loc = -1 if lines is None else lines.here(2)
        # A zero-byte copy or memset does nothing on the device, so CUPTI sees nothing: time it with events instead;
        # so is a peer copy (see uses_cupti).
        if cupti and (nbytes > 0 or kind == "kernel") and not (kind == "d2d" and parse_peer_copy(name) is not None):
            t0 = _wall()  # the API calls CUPTI records on this thread from here to t1 are this op's
            completion = call(False)
            t1 = _wall()
            stream.track(completion, keep)
            ops = self._cupti_ops  # CuptiOps.add, inlined: this is the launch path
            code = ops.codes.get(name)
            if code is None:
                code = ops.code_of(name, op_id)
            kind_code = KIND_CODE[kind]
            if many or kind_code != _KERNEL:
                ops.completions[op_id] = completion
            ops.markers[key] = completion
            rows = ops.rows  # extended in place: the harvester cuts the same bytearray
            rows += _PACK(op_id, number, key[1], kind_code, nbytes, code, pinned, t0, many, t1, _ident(), loc)
            return completion
        enqueue_ns = _now()
        completion = call(True)
        stream.track(completion, keep)
        self._event_ops += 1
        self._pending.append(
            (op_id, number, stream.id, KIND_CODE[kind], nbytes, name, pinned, enqueue_ns, completion, loc, launch)
        )
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
        launch: Any = None,
    ) -> None:
        """Hand over an op enqueued at ``enqueue_ns`` (host clock) by this thread within ``window`` (the window clock,
        ``time.time_ns``); its span is filled in once the completion reports done."""
        kind_code = KIND_CODE[kind]
        loc = -1 if self.lines is None else self.lines.here(2)
        if self.uses_cupti(device_number, kind, nbytes, name):
            t0, t1 = window
            self._cupti_ops.add(
                op_id, device_number, stream, kind_code, nbytes, name, pinned, t0, completion, many, t1, _ident(), loc
            )
        else:
            self._pending.append(
                (op_id, device_number, stream, kind_code, nbytes, name, pinned, enqueue_ns, completion, loc, launch)
            )
            self._event_ops += 1

    def host_event(
        self, device_number: int, kind: str, nbytes: int, name: str, start_ns: int, end_ns: int, address: int = 0
    ) -> None:
        """Record a host-side event (alloc, free, marker) that took place between two host times; ``address``: the
        workbench's own device allocation, which CUPTI's memory records then do not count as another library's."""
        if address and self._foreign is not None:
            self._foreign.own_addresses.add(address)
        loc = -1 if self.lines is None else self.lines.here(2)
        with self._lock:
            self._append_span(device_number, -1, KIND_CODE[kind], start_ns, end_ns, start_ns, nbytes, name, -1, loc)

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
        """Name a stream's row."""
        self._stream_labels[(device_number, stream)] = label

    # ------------------------------------------------------------------ harvesting
    def _append_span(
        self, dev: int, stream: int, kind: int, start: int, end: int, enq: int, nbytes: int, name, pin, loc: int = -1
    ):
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
                "loc": loc,
            }
        )
        self._version += 1

    def warn_once(self, message: str) -> None:
        """Add ``message`` to the trace's warnings unless it is there already."""
        if message not in self.stats.warnings:
            self.stats.warnings.append(message)

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
    def host_threads(self) -> dict[int, int]:
        """Host thread id (the low 32 bits of its ``pthread_self``) → index of its host row (``thread_stream``)."""
        return dict(self._threads)

    @property
    def stream_labels(self) -> dict[tuple[int, int], str]:
        return dict(self._stream_labels)

    @property
    def locations(self) -> list[Location]:
        """The source locations spans point at (``loc`` column: an index here); empty without ``lines``."""
        return [] if self.lines is None else list(self.lines.locations)

    def location_of(self, span: Span) -> Location | None:
        """Where ``span``'s op was issued (None: not known)."""
        return self.lines.locations[span.loc] if self.lines is not None and span.loc >= 0 else None

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

    def summary(self, window: tuple[int, int] | None = None, crossover: Any = None):  # noqa: ANN201 - analysis.Summary
        """Overlap, idle, pipeline efficiency and advice (DESIGN §6); ``too-small-for-gpu`` too where crossover
        figures are given, or where the provider registered with ``provide_crossovers`` (the package root registers the
        kernel library's reader of the cache ``gw.crossover`` writes) has them for this trace's devices."""
        from .analysis import summarize
        from .device_limits import limits_of

        if crossover is None and CROSSOVERS.provider is not None:
            try:
                crossover = CROSSOVERS.provider(self)
            except Exception:  # noqa: BLE001 - an unreadable cache never stops a summary
                crossover = None
        kw = {"counters": self.counters()} if self.counting else {}  # how busy the SMs were, where sampled
        return summarize(self.table(), window=window, crossover=crossover, limits=limits_of(self._devices), **kw)

    def statistics(self):  # noqa: ANN201 - statistics.Statistics
        """Kernels by name, copies by direction and host memory, API calls and launch latency, as ``nsys stats``
        gives them (``trace/statistics.py``); waits for pending spans once the trace stopped."""
        from .statistics import trace_statistics

        return trace_statistics(self)

    def timeline(self, **kw: Any):  # noqa: ANN201 - a bokeh column
        """A Bokeh timeline: the detail view (a row per host thread and device stream) over an overview strip, in one
        column (options: ``viz.timeline_figure``; ``gw.compare(a, b).figure()`` puts two on one axis); waits for
        pending spans."""
        return pictures().trace_timeline(self, **kw)

    def memory_plot(self, **kw: Any):  # noqa: ANN201 - a bokeh figure
        """A Bokeh plot of bytes held per device over time beside the device's used total (``viz.memory_figure``)."""
        return pictures().trace_memory_plot(self, **kw)

    def counters_plot(self, **kw: Any):  # noqa: ANN201 - a bokeh figure
        """A Bokeh plot of the counter tracks (``counters()``), a line per counter (``viz.counters_figure``)."""
        return pictures().trace_counters_plot(self, **kw)

    def show(self, window: tuple[int, int] | None = None):  # noqa: ANN201 - None in a notebook, else a bokeh layout
        """Display timeline, memory plot and summary (over ``window``) in a notebook; elsewhere return the layout."""
        return pictures().show_trace(self, window=window)

    @classmethod
    def finished(
        cls,
        table: Mapping[str, np.ndarray],
        devices: Mapping[int, DeviceClock],
        stream_labels: Mapping[tuple[int, int], str],
        memory: Mapping[str, np.ndarray] | None = None,
        *,
        dropped: int = 0,
        lost: int = 0,
        started_ns: int = 0,
        stopped_ns: int = 0,
        locations: list[Location] | None = None,
    ) -> Trace:
        """A stopped Trace holding ``table`` (span columns) and ``memory`` (memory columns), each filled with one
        ``extend_columns`` (no row by row copy): a trace loaded from a file, or one part of a merged trace."""
        n = len(table["kind"])
        m = 0 if memory is None else len(memory["t_ns"])
        trace = cls(capacity=max(n, m, 1_000_000))  # a bound, not an allocation: room as a new trace has
        if n:
            trace._spans.extend_columns(table)
        if m:
            trace._memory.extend_columns(memory)
        trace._devices.update(devices)
        trace._stream_labels.update(stream_labels)
        trace._stats.dropped, trace._stats.lost = dropped, lost
        trace.started_ns, trace.stopped_ns = started_ns, stopped_ns
        trace.lines = SourceLines.holding(locations) if locations else None
        trace._version += 1
        return trace

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

    def _finished(self) -> None:
        """Called by the harvester as it ends: the next trace's object is made now, off that trace's start."""
        make_spares()

    def __repr__(self) -> str:
        state = "recording" if self.recording else "stopped"
        return f"<Trace {self.id}: {len(self)} spans, {self.stats.pending} pending, {state}>"


def active() -> list[Trace]:
    """The traces recording now."""
    return [t for t in listeners.recording() if isinstance(t, Trace)]


def pictures() -> Any:
    """``gpuworkbench.viz``, imported on first use: the one accessor seam between the tracer and its pictures (as
    pandas' ``DataFrame.plot``). The tracer draws nothing; ``Trace.timeline``, ``show``, ``memory_plot`` and
    ``Comparison.figure`` hand their data to ``viz`` through here."""
    from .. import viz

    return viz


def _others(others: bool | None) -> bool:
    """Whether a trace records other libraries' CUDA work: ``others``, or unless ``GPUWB_TRACE_OTHERS=0``."""
    return others if others is not None else os.environ.get("GPUWB_TRACE_OTHERS", "1") != "0"


#: A trace made ahead with the default arguments (``new_trace``), off the path a cell times: by the harvester of the
#: trace before as it ends, and at ``%load_ext``. Making one on a CPU that has idled between notebook cells took
#: ~0.1 ms of a trace's start (H200 host, ``benchmarks/probes/trace_start_steps.py``); 8 µs back to back.
_SPARES: list[Trace] = []


def new_trace(
    capacity: int = 1_000_000,
    interval_s: float = 0.05,
    source: str = "auto",
    others: bool | None = None,
    lines: bool = False,
    counters: bool = False,
) -> Trace:
    """A new, unstarted Trace: the one made ahead (``make_spares``) where it was made with these arguments."""
    counting = wanted(counters)  # checked before a spare is taken
    spare = _SPARES.pop() if _SPARES else None
    args = (capacity, interval_s, source, _others(others))
    if spare is not None and (spare.capacity, spare.interval_s, spare.source, spare.others) == args:
        spare.id = next(_IDS)
        trace = spare
    else:
        if spare is not None and spare.others == _others(None) and not _SPARES:
            _SPARES.append(spare)  # still what a call with the defaults gets: kept for the next one
        trace = Trace(capacity=capacity, interval_s=interval_s, source=source, others=others)
    if lines:
        trace.lines = SourceLines()
    trace.counting = counting
    return trace


def make_spares() -> None:
    """Make the next trace ahead (``new_trace``)."""
    if not _SPARES:
        _SPARES.append(Trace())
