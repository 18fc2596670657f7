"""A trace's session with CUPTI (``CuptiSource``): kinds on or taken over, buffers in, rationed flushes, and the
records as columns joined to external ids.

CUPTI's activity callbacks are process-global, so at most one source records per process: a second ``start()``
while another source records raises :class:`CuptiUnavailable` (it is not reference-counted). Where a source starts,
stops and parks, and what happens to CUPTI between traces, is the lifecycle's (``lifecycle.py``), which every source
is given. Nothing here synchronizes the device.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import kinds
from .binding import CuptiCallFailed, CuptiUnavailable, available, describe, import_cupti
from .decode import NONE, RecordDecoder, span_dicts
from .join import ExternalIdJoin
from .layout import RecordTables

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

#: ``flush_columns`` asks CUPTI to flush only when no buffer has come back for this long (a flush holds CUPTI's
#: locks for a millisecond or more, stalling launches on other threads: measured on an H200, flushing every 10 ms
#: made each traced launch several µs slower). None: flush on every call.
FLUSH_IDLE_S: float | None = 0.05
#: ... and at least this often (10 Hz, what a live view needs), for records left in a buffer that is not full.
FLUSH_MAX_S = 0.1
#: Flushes an activity record waits for its external id before it is handed out with ``external_id`` -1.
HOLD_FLUSHES = 2
#: Flushes an external-correlation entry is kept once an activity record has used it (graph launches share one).
EXT_KEEP_FLUSHES = 16
#: Most external-correlation entries kept while waiting for their activity records (deep queues); the oldest to
#: arrive are dropped first.
EXT_MAP_MAX = 1 << 16


class CuptiSource:
    """Collects CUPTI activity records (kernels, memcpy, memset) with device start/end; never synchronizes.
    ``lifecycle``: the process's CUPTI lifecycle (``cupti.LIFECYCLE``; ``cupti.new_source()`` makes one on it)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.clock = lifecycle.clock
        self._cupti: Any = None
        self._raw: Any = None
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
        #: Decodes this source's buffers; holds the take-over cutoff and what it dropped.
        self.decoder = RecordDecoder(self.clock, self._note_error)
        self._tables_ready = False
        self._started = False  # a started source is reset before it starts again; a new one needs no reset
        self._frozen = False
        #: Bumped by every ``start``: a trace stops or abandons only the session it started.
        self.session = 0
        #: Whether the API carrier records are limited to the calls that enqueue device work.
        self.api_filtered = False
        #: Failures while flushing or decoding buffers, and the last such error.
        self.callback_errors = 0
        self.last_callback_error = ""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether ``cupti-python`` imports here (cheap: no CUDA call; the answer is kept), with a reason."""
        return available()

    def start(self) -> None:
        """Take a lingering source over (nothing to enable), or register the buffer callbacks where CUPTI is not ready
        and enable the activity kinds; CuptiUnavailable (nothing left on) if not."""
        if self._running:
            return
        cupti = import_cupti()
        life = self.lifecycle
        with life.lock:
            if life.active is not None:
                raise CuptiUnavailable(
                    "another CuptiSource is already active in this process (CUPTI activity callbacks are global); "
                    "stop it first"
                )
            if self._started:
                self._reset()
            self._started = True
            self._cupti = cupti
            try:
                self._raw = life.raw_for(cupti)
                if not self._tables_ready:  # once per source
                    self._setup_tables(cupti)
                    self._tables_ready = True
                if not life.take_over(self, cupti):
                    life.cancel_detach()
                    life.start_recording(self)  # before enabling, so that no buffer completes without a receiver
                    self._enable(cupti)
            except CuptiUnavailable:
                self.disable_all()
                life.stop_recording(self)
                raise
            except Exception as exc:  # cuptiError, a failed ctypes call, or libcupti failing to load
                self.disable_all()
                life.stop_recording(self)
                raise CuptiUnavailable(f"CUPTI activity tracing could not start: {describe(exc, cupti)}") from exc
            self._push = cupti.activity_push_external_correlation_id
            self._pop = cupti.activity_pop_external_correlation_id
            self._frozen = False
            self.session += 1
            self._running = True

    def _enable(self, cupti: Any) -> None:
        if not self._raw.ours:
            self._raw.register()
        self.lifecycle.mark_attached(cupti)
        for name in kinds.ACTIVITY_KINDS + kinds.API_CARRIER_KINDS:
            kind = cupti.ActivityKind[name]
            cupti.activity_enable(kind)
            self._enabled.append(kind)
        self.api_filtered = kinds.API_FILTER and bool(kinds.API_CARRIER_KINDS) and self._filter_api(True)
        for name in kinds.OPTIONAL_KINDS:
            kind = getattr(cupti.ActivityKind, name, None)
            if kind is not None:
                with contextlib.suppress(Exception):  # an older CUPTI: allocations and NVTX not seen
                    cupti.activity_enable(kind)
                    self._enabled.append(kind)

    def adopt(self, parked: CuptiSource, cupti: Any) -> None:
        """Take over the kinds ``parked`` left on (the lifecycle's ``take_over``, under its lock): nothing to enable;
        records of work that ended before now (still in CUPTI's buffers) are dropped by the decoder's cutoff."""
        self._enabled, parked._enabled = parked._enabled, []
        self.api_filtered = parked.api_filtered
        self.decoder.cutoff, self.decoder.first_corr = int(cupti.get_timestamp()), 0

    def stop(self) -> None:
        """Forced flush (this source's last records), then park: the kinds stay on for the next source to take over,
        for ``linger_s`` or until untraced work launches (``watch_untraced``); a frozen source (another tool took
        CUPTI) or one with no kinds turns them off instead. Idempotent. ``flush()`` then returns the rest."""
        if not self._running:
            return
        raw = self._raw
        if raw is not None:
            raw.flush_all(1)
        life = self.lifecycle
        with life.lock:
            life.stop_recording(self)  # CUPTI has no "unregister": our callbacks now drop what comes
            self._running = False
            if self._enabled and not self._frozen:
                life.park(self)
                return
        self.disable_all()
        if raw is not None:
            raw.flush_all(1)

    def freeze(self) -> None:
        """Another CUPTI client took CUPTI over: never flush it again (that would hand the other tool's buffers
        back); what was already handed to us is still decoded."""
        self._frozen = True

    def abandon(self) -> None:
        """Let go without touching CUPTI (another client holds it now): no flush, no disabling its kinds."""
        with self.lifecycle.lock:
            self.lifecycle.stop_recording(self)
            self._running = False
            self._frozen = False
            self._enabled = []

    @property
    def running(self) -> bool:
        """Whether this source is started."""
        return self._running

    def disable_all(self) -> None:
        """Turn this source's kinds off (the API filter itself stays set: see ``kinds.ApiFilter``)."""
        for kind in reversed(self._enabled):
            with contextlib.suppress(Exception):
                self._cupti.activity_disable(kind)
        self._enabled = []
        self.api_filtered = False

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
        stream_id, device_id, correlation_id, runtime_correlation_id, and the launch shape (grid, block, registers,
        shared_bytes: ``decode.LAUNCH_FIELDS``); None when nothing completed. ``full=False``: only start, end,
        external_id, the two correlation ids and the launch shape (cheaper; what a trace needs). ``resolve(thread,
        start)``: the external id of the op each API call (CUPTI thread id, start on CUPTI's clock) was made in, -1
        if none: how a trace tags its ops' records without pushing ids (see ``ExternalIdJoin.place_calls``)."""
        with self._flush_lock:
            self._flush_if_due(eager)
            blob, ends = self._take_incoming()
            if self.clock.ticks and ends:
                with contextlib.suppress(Exception):  # calibrates with a sample later than every record here
                    self.clock.await_rate()
                    self.clock_sample()
            try:
                cols, ext, calls = self.decoder.decode(self._raw, blob, ends, full, calls=resolve is not None)
            except Exception as exc:  # noqa: BLE001  a bad buffer must not stop the harvester
                self._note_error(f"decode: {type(exc).__name__}: {exc}")
                cols, ext, calls = None, (NONE, NONE), None
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
                self._note_error(f"flush: {describe(CuptiCallFailed('flush', status), self._cupti)}")

    def _note_error(self, message: str) -> None:
        self.callback_errors += 1
        self.last_callback_error = message

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
        return span_dicts(cols | {"name": self.names_of(cols["name"])})

    def to_ns(self, ticks: Any) -> Any:
        """CUPTI timestamps (an int or an int64 array) in ns, on the line the latest flush's records went through."""
        return self.clock.to_ns(ticks)

    def clock_sample(self, host: Callable[[], int] = time.perf_counter_ns, raw: bool = False) -> tuple[int, int, int]:
        """(cupti_ns, host_ns, error_ns): a CUPTI timestamp bracketed by two reads of ``host`` (best of 3); ``raw``:
        CUPTI's own timestamp, not mapped to ns (``to_ns`` maps it later, on a line learned by then)."""
        if self._cupti is None:
            self._cupti = import_cupti()
        get_timestamp, perf = self._cupti.get_timestamp, host
        best: tuple[int, int, int] | None = None
        for _ in range(3):
            t0 = perf()
            c = get_timestamp()
            t1 = perf()
            if best is None or t1 - t0 < 2 * best[2]:
                best = (int(c), (t0 + t1) // 2, (t1 - t0 + 1) // 2)
        assert best is not None
        clock = self.clock
        if clock.ticks:
            if host is time.perf_counter_ns:
                clock.calibrate(best[0], best[1])
            if not raw:
                best = (int(clock.to_ns(best[0])), best[1], best[2])
        return best

    # -- decoded records -------------------------------------------------------------------------------------------

    @property
    def layout_notes(self) -> list[str]:
        """Where the record layouts came from and what did not match (empty when cupti-python and cupti.h agree)."""
        return self.decoder.layout_notes

    @property
    def incomplete_records(self) -> int:
        """Records dropped because CUPTI had no valid start/end for them (e.g. cut off by a forced flush)."""
        return self.decoder.incomplete_records

    @property
    def cut_off_records(self) -> int:
        """Records dropped as older than a take-over's cutoff (what a lost op asks about first)."""
        return self.decoder.cut_off_records

    @property
    def cut_off_calls(self) -> int:
        """API calls dropped as older than a take-over's cutoff."""
        return self.decoder.cut_off_calls

    def names_of(self, pointers: np.ndarray) -> np.ndarray:
        """Kernel names from the records' name pointers (``RecordDecoder.names_of``)."""
        return self.decoder.names_of(pointers)

    def take_extras(self) -> dict[str, dict[str, np.ndarray] | None]:
        """API calls (full flushes only), device-memory records and NVTX markers decoded since the last call."""
        return self.decoder.take_extras()

    def api_name(self, runtime: int, cbid: int) -> str:
        """The name of a driver (``runtime`` 0) or runtime API call from its callback id, e.g. 'cuLaunchKernel'."""
        tables = self.decoder.tables
        name = tables.api_names[1 if runtime else 0].get(int(cbid), "") if tables is not None else ""
        return name.rsplit("_v", 1)[0] if "_v" in name and name.rsplit("_v", 1)[1].isdigit() else name

    # -- internals ---------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._enabled = []
        self.decoder.reset()
        self._take_incoming()
        self._pushed = False
        self._joiner = ExternalIdJoin(HOLD_FLUSHES, EXT_KEEP_FLUSHES, EXT_MAP_MAX)

    def _setup_tables(self, cupti: Any) -> None:
        """Kind codes, enum lookup tables and record layouts from cupti-python, made once per process and shared by
        every source (~0.3 ms of a trace's start otherwise); the expected sizes to the walker."""
        tables = RecordTables.of(cupti, self._raw)
        self.decoder.use(tables)
        self._ext_kind = tables.ext_kind

    def _filter_api(self, on: bool) -> bool:
        """The process's API filter (``kinds.ApiFilter``) set on this source's cupti module."""
        return self.lifecycle.api_filter.apply(self._cupti, on)

    def ingest(self, data: Any) -> None:
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
