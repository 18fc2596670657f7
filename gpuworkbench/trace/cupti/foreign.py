"""Other libraries' CUDA work as spans: CUPTI records that no op of ours claimed, with the API calls that launched them.

CUPTI sees every kernel, copy and memset of the process, whichever library enqueued it (CuPy, PyTorch, Numba,
cuda.core, ctypes). A record our own ops did not claim becomes a span of its own: device and stream from the record
(a stream row per CUDA stream, named after the library whose kernels it runs where the names tell), the kernel's
demangled name, grid, block, registers per thread and shared memory per block, bytes, direction and pinned or
pageable host memory. The runtime or driver call that enqueued it (same correlation id) becomes an ``api`` span on
its host thread's row, linked by ``corr``, and gives the device span its enqueue time, so launch latency is
measured. Device allocations and frees (CUPTI's memory records) and NVTX ranges become host rows too. Everything is
columns: no Python object per record.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ...ranges import NVTX_DOMAIN
from ..spans import KIND_CODE

#: Stream numbers of other libraries' CUDA streams: this plus CUPTI's stream id (ours are small numbers).
FOREIGN_STREAM_BASE = 1 << 20
#: Harvests an API call waits for the device record it enqueued (a kernel still running) before it is dropped.
CALL_KEEP = 20
#: CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS / _START / _END.
_MARKER_INSTANT, _MARKER_START, _MARKER_END = 1, 2, 4
#: A record's kind -> its span's kind code; any other copy direction ("other_copy") counts as device to device.
_CODE_OF = collections.defaultdict(
    lambda: KIND_CODE["d2d"], {k: KIND_CODE[k] for k in ("kernel", "h2d", "d2h", "memset")}
)
_LIBRARIES = (("at::", "torch"), ("c10::", "torch"), ("pytorch", "torch"), ("cupy_", "cupy"), ("cupy::", "cupy"))
_DEMANGLE: Any = None
_DEMANGLE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8192)
def demangle(name: str) -> str:
    """A C++ symbol's readable name (``__cxa_demangle`` from libstdc++); the name itself when it is not mangled.
    Remembered: every trace of a notebook meets the same kernels."""
    global _DEMANGLE
    if not name.startswith("_Z"):
        return name
    with _DEMANGLE_LOCK:
        if _DEMANGLE is None:
            try:
                fn = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
                fn.restype = ctypes.c_void_p
                fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
                free = ctypes.CDLL(None).free
                free.argtypes = [ctypes.c_void_p]
                _DEMANGLE = (fn, free)
            except (OSError, AttributeError):
                _DEMANGLE = False
        if not _DEMANGLE:
            return name
        fn, free = _DEMANGLE
        status = ctypes.c_int()
        out = fn(name.encode(), None, None, ctypes.byref(status))
        if not out:
            return name
        try:
            return ctypes.string_at(out).decode("utf-8", "replace") if status.value == 0 else name
        finally:
            free(out)


def per_distinct(fn: Callable[..., Any], *columns: np.ndarray) -> np.ndarray:
    """``fn(a, b, ...)`` for each row of the columns, as an object array: called once per distinct row (a flush holds
    thousands of calls of a few kinds, on a few threads), each with the row's values as Python objects."""
    n = columns[0].size
    if n == 0:
        return np.empty(0, dtype=object)
    codes = np.zeros(n, np.int64)
    for column in columns:
        distinct, inverse = np.unique(column, return_inverse=True)
        codes = codes * distinct.size + inverse.ravel()
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    out = np.empty(first.size, dtype=object)
    out[:] = [fn(*row) for row in zip(*(column[first].tolist() for column in columns))]
    return out[inverse.ravel()]


def library_of(kernel_name: str) -> str:
    """The library a kernel's name says it belongs to ('' when it does not say)."""
    for marker, library in _LIBRARIES:
        if marker in kernel_name:
            return library
    return ""


class ForeignRecords:
    """Pending API calls and NVTX range starts of other libraries, and what each harvest turns into span rows.

    The owner (a ``Trace``) supplies ``device_of(cuda_ids) -> trace device numbers``, ``thread_row(device, tid)``
    (the stream number of a host thread's row), ``label(device, stream, text)``, ``api_name(runtime, cbid)`` and
    ``names_of(name_pointers)`` (the records carry pointers to CUPTI's strings: only other libraries' are read)."""

    def __init__(
        self,
        device_of: Callable[[np.ndarray], np.ndarray],
        thread_row: Callable[[int, int], int],
        label: Callable[[int, int, str], None],
        api_name: Callable[[int, int], str],
        names_of: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        self._device_of, self._thread_row, self._label, self._api_name = device_of, thread_row, label, api_name
        self._names_of = names_of
        self._calls: dict[str, np.ndarray] | None = None
        self._open: dict[int, tuple[int, int, str, str]] = {}  # NVTX id -> (start, thread, name, domain)
        self._labelled: set[tuple[int, int]] = set()
        self._cycle = 0
        self.own_addresses: set[int] = set()  # device pointers of the workbench's own buffers
        self.other_bytes: dict[int, int] = {}  # trace device -> other libraries' net device allocations
        #: ``locate(thread, start, end)`` -> the source location of each API call (CUPTI's clock), where the trace
        #: attributes lines (``sites.CallSites``); None: spans carry no location.
        self.locate: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None

    def spans(
        self,
        records: dict[str, np.ndarray] | None,
        extras: dict[str, dict[str, np.ndarray] | None],
        offset: int,
    ) -> list[dict[str, np.ndarray]]:
        """Span column blocks for this harvest: other libraries' device work (``records``: decoded CUPTI records
        with ``external_id`` < 0), their API calls, allocations and NVTX ranges. ``offset``: CUPTI clock − host."""
        self._cycle += 1
        blocks: list[dict[str, np.ndarray]] = []
        calls = self._take_calls(extras.get("api"))
        if records is not None and records["start"].size:
            blocks.extend(self._device_spans(records, calls, offset))
        if extras.get("memory") is not None:
            blocks.append(self._memory_spans(extras["memory"], offset))
        if extras.get("marker") is not None:
            block = self._marker_spans(extras["marker"], offset)
            if block is not None:
                blocks.append(block)
        return [b for b in blocks if b["kind"].size]

    # -- device work and its launches ------------------------------------------------------------------------

    def _take_calls(self, fresh: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        held = self._calls
        if fresh is not None and fresh["start"].size:
            fresh = dict(fresh)
            fresh["born"] = np.full(fresh["start"].size, self._cycle, np.int64)
            held = fresh if held is None else {k: np.concatenate([held[k], fresh[k]]) for k in held}
        if held is not None:
            keep = self._cycle - held["born"] < CALL_KEEP
            order = np.argsort(held["correlation_id"][keep], kind="stable")
            held = {k: v[keep][order] for k, v in held.items()}
        self._calls = held
        return held

    def _device_spans(
        self, rec: dict[str, np.ndarray], calls: dict[str, np.ndarray] | None, offset: int
    ) -> list[dict[str, np.ndarray]]:
        n = rec["start"].size
        kinds = np.fromiter(map(_CODE_OF.__getitem__, rec["kind"].tolist()), np.int8, n)
        device = self._device_of(rec["device_id"].astype(np.int64))
        stream = FOREIGN_STREAM_BASE + rec["stream_id"].astype(np.int64)
        pointers, inverse = np.unique(rec["name"], return_inverse=True)  # a name read and demangled once
        names = np.array([demangle(x) for x in self._names_of(pointers).tolist()], dtype=object)
        names = names[inverse.ravel()]
        corr = rec["correlation_id"].astype(np.int64)
        enqueue = np.full(n, -1, np.int64)
        link = np.full(n, -1, np.int64)
        loc = np.full(n, -1, np.int64)
        blocks = []
        if calls is not None and calls["start"].size:
            keys = calls["correlation_id"]
            at = np.full(n, -1, np.int64)
            for key in (corr, rec["runtime_correlation_id"].astype(np.int64)):
                pos = np.minimum(np.searchsorted(keys, key), keys.size - 1)
                hit = (at < 0) & (keys[pos] == key) & (key != 0)
                at[hit] = pos[hit]
            found = at >= 0
            if found.any():
                used = at[found]
                enqueue[found] = calls["start"][used] - offset
                link[found] = keys[used]
                if self.locate is not None:
                    loc[found] = self.locate(calls["thread"][used], calls["start"][used], calls["end"][used])
                blocks.append(self._api_spans(calls, used, device[found], offset, loc[found]))
                keep = np.ones(keys.size, bool)
                keep[used] = False
                self._calls = {k: v[keep] for k, v in calls.items()}
        self._label_streams(device, stream, names, kinds)
        blocks.insert(
            0,
            {
                "kind": kinds,
                "device": device,
                "stream": stream,
                "start_ns": rec["start"].astype(np.int64) - offset,
                "end_ns": rec["end"].astype(np.int64) - offset,
                "enqueue_ns": enqueue,
                "bytes": rec["bytes"].astype(np.int64),
                "name": names,
                "pinned": rec["pinned"].astype(np.int64),
                "corr": link,
                "grid": rec["grid"].astype(np.int64),
                "block": rec["block"].astype(np.int64),
                "loc": loc,
                "registers": rec["registers"].astype(np.int64),
                "shared_bytes": rec["shared_bytes"].astype(np.int64),
            },
        )
        return blocks

    def _api_spans(
        self, calls: dict[str, np.ndarray], rows: np.ndarray, device: np.ndarray, offset: int, loc: np.ndarray
    ) -> dict[str, np.ndarray]:
        stream = per_distinct(self._thread_row, device, calls["thread"][rows]).astype(np.int64)
        names = per_distinct(self._api_name, calls["runtime"][rows], calls["cbid"][rows])
        m = rows.size
        return {
            "kind": np.full(m, KIND_CODE["api"], np.int8),
            "device": device,
            "stream": stream,
            "start_ns": calls["start"][rows] - offset,
            "end_ns": np.maximum(calls["end"][rows], calls["start"][rows]) - offset,
            "enqueue_ns": calls["start"][rows] - offset,
            "bytes": np.zeros(m, np.int64),
            "name": names,
            "pinned": np.full(m, -1, np.int64),
            "corr": calls["correlation_id"][rows],
            "grid": np.zeros(m, np.int64),
            "block": np.zeros(m, np.int64),
            "loc": loc,
        }

    def _label_streams(self, device: np.ndarray, stream: np.ndarray, names: np.ndarray, kinds: np.ndarray) -> None:
        keys = set(zip(device.tolist(), stream.tolist())) - self._labelled
        for dev, sid in keys:
            mine = (device == dev) & (stream == sid) & (kinds == KIND_CODE["kernel"])
            library = ""
            for name in names[mine][:32].tolist():
                library = library_of(name)
                if library:
                    break
            cuda_id = sid - FOREIGN_STREAM_BASE
            self._label(dev, sid, f"{library} stream {cuda_id}" if library else f"CUDA stream {cuda_id}")
            if library or not mine.any():
                self._labelled.add((dev, sid))

    # -- allocations -------------------------------------------------------------------------------------------

    def _memory_spans(self, mem: dict[str, np.ndarray], offset: int) -> dict[str, np.ndarray]:
        """Other libraries' device allocations and frees as host rows; ``other_bytes`` follows their net total."""
        device_kind = 3  # CUPTI_ACTIVITY_MEMORY_KIND_DEVICE
        ours = np.isin(mem["address"], np.fromiter(self.own_addresses, np.int64, len(self.own_addresses)))
        keep = np.flatnonzero(~ours & (mem["memory_kind"] == device_kind) & (mem["memory_operation_type"] > 0))
        keep = keep[np.argsort(mem["timestamp"][keep], kind="stable")]
        alloc = mem["memory_operation_type"][keep] == 1
        device = self._device_of(mem["device_id"][keep])
        nbytes = mem["bytes"][keep]
        for dev, signed in zip(device.tolist(), np.where(alloc, nbytes, -nbytes).tolist()):
            self.other_bytes[dev] = self.other_bytes.get(dev, 0) + signed
        t = mem["timestamp"][keep] - offset
        m = keep.size
        names = np.array(
            [
                f"{'cudaMalloc' if a else 'cudaFree'} {b / 2**20:.1f} MiB"
                for a, b in zip(alloc.tolist(), nbytes.tolist())
            ],
            dtype=object,
        )
        return {
            "kind": np.where(alloc, KIND_CODE["alloc"], KIND_CODE["free"]).astype(np.int8),
            "device": device,
            "stream": np.full(m, -1, np.int64),
            "start_ns": t,
            "end_ns": t,
            "enqueue_ns": t,
            "bytes": nbytes,
            "name": names,
            "pinned": np.full(m, -1, np.int64),
            "corr": mem["correlation_id"][keep],
            "grid": np.zeros(m, np.int64),
            "block": np.zeros(m, np.int64),
        }

    # -- NVTX --------------------------------------------------------------------------------------------------

    def _marker_spans(self, marks: dict[str, np.ndarray], offset: int) -> dict[str, np.ndarray] | None:
        """NVTX push/pop and start/end ranges (paired by id across harvests) and instant marks, on thread rows."""
        rows: list[tuple[int, int, int, int, str]] = []  # kind, thread, start, end, name
        order = np.argsort(marks["timestamp"], kind="stable")
        for i in order.tolist():
            flags, stamp, mark_id = int(marks["flags"][i]), int(marks["timestamp"][i]), int(marks["id"][i])
            thread, name, domain = int(marks["thread_id"][i]), str(marks["name"][i]), str(marks["domain"][i])
            if domain == NVTX_DOMAIN:  # ``gw.range``: the trace records those itself
                continue
            if flags & _MARKER_START:
                self._open[mark_id] = (stamp, thread, name, domain)
            elif flags & _MARKER_END:
                begun = self._open.pop(mark_id, None)
                if begun is not None:
                    rows.append((KIND_CODE["range"], begun[1], begun[0], stamp, begun[2]))
            elif flags & _MARKER_INSTANT:
                rows.append((KIND_CODE["marker"], thread, stamp, stamp, name))
        if not rows:
            return None
        device = int(self._device_of(np.zeros(1, np.int64))[0])
        kind, thread, start, end, name = zip(*rows)
        m = len(rows)
        return {
            "kind": np.array(kind, np.int8),
            "device": np.full(m, device, np.int64),
            "stream": np.array([self._thread_row(device, t) for t in thread], np.int64),
            "start_ns": np.array(start, np.int64) - offset,
            "end_ns": np.array(end, np.int64) - offset,
            "enqueue_ns": np.array(start, np.int64) - offset,
            "bytes": np.zeros(m, np.int64),
            "name": np.array(name, dtype=object),
            "pinned": np.full(m, -1, np.int64),
            "corr": np.full(m, -1, np.int64),
            "grid": np.zeros(m, np.int64),
            "block": np.zeros(m, np.int64),
        }
