"""CUPTI activity records (kernels, memcpys, memsets) as a span source, through NVIDIA's ``cupti-python``.

CUPTI's activity callbacks are process-global, so at most one :class:`CuptiSource` is active per process: a second
``start()`` while another source is active raises :class:`CuptiUnavailable` (it is not reference-counted).
Nothing here synchronizes the device; ``cupti`` is imported lazily so that this module imports without it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any

#: Activity kinds enabled by :meth:`CuptiSource.start`, by their ``cupti.ActivityKind`` names.
ACTIVITY_KINDS: tuple[str, ...] = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "EXTERNAL_CORRELATION")
#: API record kinds enabled as carriers: CUPTI emits EXTERNAL_CORRELATION records only for API calls it records.
#: Their records are discarded in the buffer callback.
API_CARRIER_KINDS: tuple[str, ...] = ("DRIVER", "RUNTIME")
#: Restrict the carriers to the API calls that enqueue device work (names by prefix), to keep buffers small.
API_FILTER = True
_API_PREFIXES: dict[str, tuple[str, ...]] = {
    "driver": ("cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"),
    "runtime": ("cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch"),
}
#: Size of each activity buffer handed to CUPTI (a kernel record is a few hundred bytes).
BUFFER_BYTES = 4 << 20
#: Flushes an activity record waits for its external id before it is handed out with ``external_id`` -1.
HOLD_FLUSHES = 2
#: Flushes an external-correlation entry is kept once an activity record has used it (graph launches share one).
EXT_KEEP_FLUSHES = 16
#: Most external-correlation entries kept while waiting for their activity records (deep queues), oldest dropped.
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

_STATE_LOCK = threading.Lock()
_ACTIVE: CuptiSource | None = None


class CuptiUnavailable(Exception):
    """CUPTI cannot be used in this process; the message says why."""


def _on_buffer_requested() -> tuple[int, int]:
    """CUPTI asks for an empty buffer: its size in bytes, no limit on the number of records."""
    return BUFFER_BYTES, 0


def _on_buffer_completed(activities: Any) -> None:
    """CUPTI hands back a buffer of records (on its own thread, or in a flush): pass them to the active source."""
    source = _ACTIVE
    if source is not None:
        source._ingest(activities)


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


class CuptiSource:
    """Collects CUPTI activity records (kernels, memcpy, memset) with device start/end; never synchronizes."""

    def __init__(self) -> None:
        self._cupti: Any = None
        self._running = False
        self._enabled: list[Any] = []
        self._lock = threading.Lock()  # guards _incoming and _incoming_ext (written on CUPTI's thread)
        self._flush_lock = threading.Lock()  # serializes flush() and guards the join state below
        self._incoming: list[tuple[dict[str, Any], int, int]] = []
        self._incoming_ext: list[tuple[int, int]] = []
        self._held: list[tuple[dict[str, Any], int, int, int]] = []
        self._ext_map: dict[int, tuple[int, int]] = {}  # corr id -> (ext id, arrival flush, or -flush of last use)
        self._flush_index = 0
        self._pushed = False
        self._push: Any = None
        self._pop: Any = None
        self._ext_kind = 0
        #: Whether the API carrier records are limited to the calls that enqueue device work.
        self.api_filtered = False
        #: Records dropped because CUPTI had no valid start/end for them (e.g. cut off by a forced flush).
        self.incomplete_records = 0
        #: Records that failed to convert in the buffer callback, and the last such error.
        self.callback_errors = 0
        self.last_callback_error = ""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @staticmethod
    def available() -> tuple[bool, str]:
        """Whether ``cupti-python`` imports here (cheap: no CUDA call), with a reason."""
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
        """Register the buffer callbacks and enable the activity kinds; CuptiUnavailable (nothing left on) if not."""
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
            self._reset()
            self._cupti = cupti
            try:
                self._k_kernels = {int(cupti.ActivityKind.CONCURRENT_KERNEL), int(cupti.ActivityKind.KERNEL)}
                self._k_memcpy = int(cupti.ActivityKind.MEMCPY)
                self._k_memset = int(cupti.ActivityKind.MEMSET)
                self._k_ext = int(cupti.ActivityKind.EXTERNAL_CORRELATION)
                self._ext_kind = int(cupti.ExternalCorrelationKind.CUSTOM0)
                self._copy_kinds = {
                    int(member): _COPY_KIND_NAMES.get(member.name, "other_copy") for member in cupti.ActivityMemcpyKind
                }
                self._pinned_of = {int(cupti.ActivityMemoryKind.PINNED): 1, int(cupti.ActivityMemoryKind.PAGEABLE): 0}
                self._host_src = {int(cupti.ActivityMemcpyKind.HTOD), int(cupti.ActivityMemcpyKind.HTOA)}
                self._host_dst = {int(cupti.ActivityMemcpyKind.DTOH), int(cupti.ActivityMemcpyKind.ATOH)}
                _ACTIVE = self  # before enabling, so that no buffer completes without a receiver
                cupti.activity_register_callbacks(_on_buffer_requested, _on_buffer_completed)
                for name in ACTIVITY_KINDS + API_CARRIER_KINDS:
                    kind = cupti.ActivityKind[name]
                    cupti.activity_enable(kind)
                    self._enabled.append(kind)
                self.api_filtered = API_FILTER and bool(API_CARRIER_KINDS) and self._filter_api(True)
            except Exception as exc:  # cuptiError, or libcupti failing to load
                self._disable_all()
                _ACTIVE = None
                raise CuptiUnavailable(f"CUPTI activity tracing could not start: {_describe(exc, cupti)}") from exc
            self._push = cupti.activity_push_external_correlation_id
            self._pop = cupti.activity_pop_external_correlation_id
            self._running = True

    def stop(self) -> None:
        """Forced flush, disable the kinds, detach from the callbacks; idempotent. ``flush()`` then returns the rest."""
        global _ACTIVE
        if not self._running:
            return
        cupti = self._cupti
        with contextlib.suppress(Exception):
            cupti.activity_flush_all(1)
        self._disable_all()
        with contextlib.suppress(Exception):
            cupti.activity_flush_all(1)
        with _STATE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None  # CUPTI has no "unregister": the global callbacks now drop what comes
            self._running = False

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

    # -- records -----------------------------------------------------------------------------------------------

    def flush(self) -> list[dict[str, Any]]:
        """Non-forced CUPTI flush, then every record completed since the last call, sorted by ``start_ns``."""
        with self._flush_lock:
            if self._running:
                try:
                    self._cupti.activity_flush_all(0)
                except Exception as exc:  # noqa: BLE001
                    self.callback_errors += 1
                    self.last_callback_error = f"flush: {_describe(exc, self._cupti)}"
            with self._lock:
                incoming, self._incoming = self._incoming, []
                ext, self._incoming_ext = self._incoming_ext, []
            return self._join(incoming, ext, final=not self._running)

    def clock_sample(self) -> tuple[int, int, int]:
        """(cupti_ns, host perf_counter_ns, error_ns): a CUPTI timestamp bracketed by two host reads (best of 3)."""
        if self._cupti is None:
            try:
                from cupti import cupti
            except Exception as exc:
                raise CuptiUnavailable(f"cupti-python is not importable: {type(exc).__name__}: {exc}") from exc
            self._cupti = cupti
        get_timestamp, perf = self._cupti.get_timestamp, time.perf_counter_ns
        best: tuple[int, int, int] | None = None
        for _ in range(3):
            t0 = perf()
            c = get_timestamp()
            t1 = perf()
            if best is None or t1 - t0 < 2 * best[2]:
                best = (int(c), (t0 + t1) // 2, (t1 - t0 + 1) // 2)
        assert best is not None
        return best

    # -- internals ---------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._enabled = []
        with self._lock:
            self._incoming, self._incoming_ext = [], []
        self._held, self._ext_map, self._flush_index, self._pushed = [], {}, 0, False

    def _disable_all(self) -> None:
        for kind in reversed(self._enabled):
            with contextlib.suppress(Exception):
                self._cupti.activity_disable(kind)
        self._enabled = []
        if self.api_filtered:
            self._filter_api(False)
            self.api_filtered = False

    def _filter_api(self, on: bool) -> bool:
        """Record only the device-work API calls (``on``) or every call again; False if this CUPTI cannot."""
        cupti = self._cupti
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
        return True

    def _ingest(self, activities: Any) -> None:
        """Buffer-completed callback body: convert records to dicts at once (the buffer is reused afterwards)."""
        recs: list[tuple[dict[str, Any], int, int]] = []
        ext: list[tuple[int, int]] = []
        for act in activities:
            try:
                kind = act.kind
                runtime_corr = 0
                if kind == self._k_ext:
                    if act.external_kind == self._ext_kind:
                        ext.append((int(act.correlation_id), int(act.external_id)))
                    continue
                if kind in self._k_kernels:
                    name, nbytes, pinned, span_kind = str(act.name), 0, -1, "kernel"
                elif kind == self._k_memcpy:
                    copy_kind = int(act.copy_kind)
                    span_kind = self._copy_kinds.get(copy_kind, "other_copy")
                    if copy_kind in self._host_src:
                        pinned = self._pinned_of.get(int(act.src_kind), -1)
                    elif copy_kind in self._host_dst:
                        pinned = self._pinned_of.get(int(act.dst_kind), -1)
                    else:
                        pinned = -1
                    name, nbytes = "", int(act.bytes)
                    runtime_corr = int(act.runtime_correlation_id)
                elif kind == self._k_memset:
                    name, nbytes, pinned, span_kind = "", int(act.bytes), -1, "memset"
                else:
                    continue  # API carrier records
                start, end = int(act.start), int(act.end)
                if start <= 0 or end < start:
                    self.incomplete_records += 1
                    continue
                rec = {
                    "kind": span_kind,
                    "start_ns": start,
                    "end_ns": end,
                    "external_id": -1,
                    "bytes": nbytes,
                    "name": name,
                    "pinned": pinned,
                    "cupti_stream": int(act.stream_id),
                    "device": int(act.device_id),
                }
                recs.append((rec, int(act.correlation_id), runtime_corr))
            except Exception as exc:  # noqa: BLE001  never let an exception escape into CUPTI's thread
                self.callback_errors += 1
                self.last_callback_error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._incoming.extend(recs)
            self._incoming_ext.extend(ext)

    def _join(
        self, incoming: list[tuple[dict[str, Any], int, int]], ext: list[tuple[int, int]], final: bool
    ) -> list[dict[str, Any]]:
        """Attach external ids by correlation id; hold unmatched records for up to HOLD_FLUSHES flushes."""
        self._flush_index += 1
        now = self._flush_index
        ext_map = self._ext_map
        for corr, ext_id in ext:
            ext_map[corr] = (ext_id, now)
        wait = self._pushed and not final
        out: list[dict[str, Any]] = []
        held: list[tuple[dict[str, Any], int, int, int]] = []
        for rec, corr, runtime_corr, born in self._held + [(r, c, rc, now) for r, c, rc in incoming]:
            key = corr if corr in ext_map else runtime_corr
            hit = ext_map.get(key) if key else None
            if hit is not None:
                rec["external_id"] = hit[0]
                del ext_map[key]  # re-inserted last: the cap below drops the least recently used first
                ext_map[key] = (hit[0], -now)  # negative: used at flush ``now``, may go after EXT_KEEP_FLUSHES
                out.append(rec)
            elif wait and now - born < HOLD_FLUSHES:
                held.append((rec, corr, runtime_corr, born))
            else:
                out.append(rec)
        self._held = held
        if now % 4 == 0 and ext_map:
            self._ext_map = ext_map = {c: v for c, v in ext_map.items() if v[1] >= 0 or now + v[1] <= EXT_KEEP_FLUSHES}
        if len(ext_map) > EXT_MAP_MAX:  # entries of ops still queued (or never used): keep the newest half
            for c in list(itertools.islice(ext_map, len(ext_map) - EXT_MAP_MAX // 2)):
                del ext_map[c]
        out.sort(key=lambda r: r["start_ns"])
        return out
