"""A flush's activity buffers as NumPy columns: span records (kernels, copies, memsets), external ids, API calls,
allocations and NVTX markers; records of work from before a take-over's cutoff, and the primer's, left out.

``flush()`` walks the records by their sizes (``walk.py``) and gathers each kind's fields with NumPy: no Python
object per record. Kernel names are ``const char*`` into CUPTI-owned memory, not into our buffers, so recycling a
buffer does not free them: they are read at a flush (as PyTorch's Kineto reads them, long after the callback),
through ``/proc/self/mem``; on the H200 the name of a kernel whose module was released before the flush still read
back intact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..spans import pack_dim3
from .binding import read_c_string
from .clock import TickClock
from .layout import RecordTables
from .prime import PRIMER

# Numeric span columns decoded per struct, in the order of the record dict's keys that come from them.
SPAN_FIELDS: tuple[str, ...] = (
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
    "registers",
    "shared_bytes",
)
#: A kernel's launch shape: every flush reads it (the harvester too, for our own kernels); 0 / -1 for other records.
LAUNCH_FIELDS: tuple[str, ...] = ("grid", "block", "registers", "shared_bytes")
TIME_FIELDS: tuple[str, ...] = ("start", "end", "correlation_id", *LAUNCH_FIELDS)
_DIM_FIELDS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
NONE = np.empty(0, np.int64)


def kernel_name(pointer: int) -> str:
    """The C string CUPTI keeps for a kernel's name ('' for NULL, a value no user-space pointer has, or memory no
    longer mapped). Read through ``/proc/self/mem``, which fails cleanly where the memory is gone: CUPTI frees a
    module's names when the module is unloaded, and reading them directly crashed the process (measured in the GPU
    test suite, which compiles and drops many modules)."""
    if not 4096 <= pointer < 1 << 56:
        return ""
    return read_c_string(pointer)


def launch_shape(rows: np.ndarray, column: Callable[[np.ndarray, str, str], np.ndarray]) -> dict[str, np.ndarray]:
    """Grid and block (packed), registers per thread and shared bytes per block (static + dynamic) of the kernel
    records at ``rows`` (``column(rows, struct, field)`` reads a field)."""
    dims = {f: column(rows, "kernel", f).astype(np.int64) for f in _DIM_FIELDS}
    shared = column(rows, "kernel", "static_shared_memory").astype(np.int64)
    shared += column(rows, "kernel", "dynamic_shared_memory").astype(np.int64)
    return {
        "grid": pack_dim3(dims["grid_x"], dims["grid_y"], dims["grid_z"]),
        "block": pack_dim3(dims["block_x"], dims["block_y"], dims["block_z"]),
        "registers": column(rows, "kernel", "registers_per_thread").astype(np.int64),
        "shared_bytes": shared,
    }


def span_dicts(cols: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """One dict per row of the joined columns."""
    names = ("kind", "start", "end", "external_id", "bytes", "name", "pinned", "stream_id", "device_id")
    keys = ("kind", "start_ns", "end_ns", "external_id", "bytes", "name", "pinned", "cupti_stream", "device")
    return [dict(zip(keys, row)) for row in zip(*(cols[n].tolist() for n in names))]


class RecordDecoder:
    """One source's decoding: the record tables, the take-over cutoff, what it dropped, and the extras (API calls,
    allocations, NVTX markers) decoded since ``take_extras`` last took them. ``on_error(message)``: a walk that
    stopped early."""

    def __init__(self, clock: TickClock, on_error: Callable[[str], None]) -> None:
        self.clock = clock
        self._on_error = on_error
        self.tables: RecordTables | None = None
        #: CUPTI's raw timestamp (ticks where another tool's callback changed them: never converted, so that a
        #: rate learned later cannot move records across it): records of work that ended before are dropped.
        self.cutoff = 0
        #: The smallest correlation id of an API call that began after the cutoff (0: none seen yet). Correlation ids
        #: grow with each call, so a record whose call came after it is the trace's even where its device timestamp
        #: (mapped from the GPU's clock by CUPTI) reads as before the cutoff.
        self.first_corr = 0
        #: Records and calls dropped as older than a take-over's cutoff (what a lost op asks about first).
        self.cut_off_records = self.cut_off_calls = 0
        #: Records dropped because CUPTI had no valid start/end for them (e.g. cut off by a forced flush).
        self.incomplete_records = 0
        #: Where the record layouts came from and what did not match (empty when cupti-python and cupti.h agree).
        self.layout_notes: list[str] = []
        self._read_names = True  # False once CUPTI's records turn out larger or smaller than the dtype says
        self._names: dict[int, str] = {0: ""}  # kernel name pointer -> name
        self._lock = threading.Lock()  # guards the swap of _extras
        self._extras: dict[str, list[dict[str, np.ndarray]]] = {"api": [], "memory": [], "marker": []}

    def use(self, tables: RecordTables) -> None:
        """Decode by ``tables`` from now on; their layout notes start this source's."""
        self.tables = tables
        self.layout_notes = list(tables.layout_notes)

    def reset(self) -> None:
        """Forget the last session's cutoff, counts and extras (the names read and the layout's trust stay)."""
        self.cutoff = self.first_corr = 0
        self.cut_off_records = self.cut_off_calls = 0
        self._extras = {"api": [], "memory": [], "marker": []}

    def decode(
        self, raw: Any, blob: bytearray, ends: list[int], full: bool = True, calls: bool = False
    ) -> tuple[dict[str, np.ndarray] | None, tuple[np.ndarray, np.ndarray], dict[str, np.ndarray] | None]:
        """Span columns (in buffer order), this flush's (correlation ids, external ids) and, if ``calls``, its API
        call records (thread, start, correlation_id); only times and ids unless ``full``. ``blob``: buffers back to
        back, each ending at its entry of ``ends`` (a multiple of 8); ``raw``: the walker that finds their records."""
        t = self.tables
        if not ends or raw is None or t is None:
            return None, (NONE, NONE), None
        to_ns = self.clock.to_ns
        offsets: list[np.ndarray] = []
        whole, begin = memoryview(blob), 0
        for end in ends:
            words = raw.walk(whole[begin:end])
            if raw.last_walk_status:
                self._on_error(f"record walk stopped early: CUPTI result {raw.last_walk_status}")
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
            offset, size = t.fields[struct][field]
            if size == 4 and offset % 4 == 0:
                return views[4][rows + offset // 4]
            if size == 8 and offset % 8 == 0 and aligned:
                return views[8][(rows >> 1) + offset // 8]
            pos = rows * 4 + offset
            if offset % size == 0 and size <= 4:
                return views[size][pos // size]
            raw_bytes = views[1][pos[:, None] + np.arange(size)]
            return np.ascontiguousarray(raw_bytes).view(f"<u{size}").ravel()

        ext_rows = at[kinds == t.k_ext]
        ext: tuple[np.ndarray, np.ndarray] = (NONE, NONE)
        if ext_rows.size:
            mine = column(ext_rows, "ext", "external_kind") == t.ext_kind
            ext = (
                column(ext_rows, "ext", "correlation_id")[mine].astype(np.int64),
                column(ext_rows, "ext", "external_id")[mine].astype(np.int64),
            )
        api = None
        if calls or full:
            api_rows = at[(kinds == t.k_api[0]) | (kinds == t.k_api[1])]
            if self.cutoff and api_rows.size:
                after = column(api_rows, "api", "start").astype(np.int64) >= self.cutoff
                self.cut_off_calls += api_rows.size - int(np.count_nonzero(after))
                if not self.first_corr and after.any():
                    self.first_corr = int(column(api_rows[after], "api", "correlation_id").min())
                api_rows = api_rows[after]
            if PRIMER.threads and api_rows.size:  # the primer's calls can come after a take-over's cutoff
                theirs = np.isin(column(api_rows, "api", "thread_id"), list(PRIMER.threads))
                api_rows = api_rows[~theirs] if theirs.any() else api_rows
            api = {
                "thread": column(api_rows, "api", "thread_id").astype(np.int64),
                "start": to_ns(column(api_rows, "api", "start").astype(np.int64)),
                "correlation_id": column(api_rows, "api", "correlation_id").astype(np.int64),
            }
            if full and api_rows.size:
                self._extras["api"].append(
                    api
                    | {
                        "end": to_ns(column(api_rows, "api", "end").astype(np.int64)),
                        "cbid": column(api_rows, "api", "cbid").astype(np.int64),
                        "runtime": (views[4][api_rows] == t.k_api[1]).astype(np.int64),
                    }
                )
            if not calls:
                api = None
        if t.k_memory >= 0:
            rows = self._after_cutoff(at[kinds == t.k_memory], "memory", "timestamp", column)
            if PRIMER.addresses and rows.size:  # the primer's own allocation, made as a trace may take over
                device = column(rows, "memory", "device_id").astype(np.int64)
                address = column(rows, "memory", "address").astype(np.uint64)
                primers = np.zeros(rows.size, bool)
                for d, a in PRIMER.addresses:
                    primers |= (device == d) & (address == np.uint64(a))
                rows = rows[~primers]
            if rows.size:
                memory = {f: column(rows, "memory", f).astype(np.int64) for f in t.fields["memory"]}
                memory["timestamp"] = to_ns(memory["timestamp"])
                self._extras["memory"].append(memory)
        if t.k_marker >= 0:
            rows = self._after_cutoff(at[kinds == t.k_marker], "marker", "timestamp", column)
            if rows.size:
                marks = {f: column(rows, "marker", f).astype(np.int64) for f in t.fields["marker"]}
                marks["timestamp"] = to_ns(marks["timestamp"])
                marks["name"] = self._strings(marks["name"])
                marks["domain"] = self._strings(marks["domain"])
                self._extras["marker"].append(marks)

        # Per struct: row, the wanted fields, runtime_correlation_id. ``full=False`` (the trace's harvester) reads
        # only times, ids and kernels' launch shapes: the op already knows its kind, name, bytes and stream.
        wanted = ("kind", *SPAN_FIELDS) if full else TIME_FIELDS
        groups: list[tuple[np.ndarray, ...]] = []

        def add_group(rows: np.ndarray, struct: str, runtime: np.ndarray | None = None, **given: Any) -> None:
            cols = [given[f] if f in given else column(rows, struct, f).astype(np.int64) for f in wanted]
            groups.append((rows, *cols, np.zeros(rows.size, np.int64) if runtime is None else runtime))

        def blank(n: int, kind: str) -> dict[str, np.ndarray]:
            zero, unknown = np.zeros(n, np.int64), np.full(n, -1, np.int64)
            launch = {"grid": zero, "block": zero, "registers": unknown, "shared_bytes": unknown}
            return (
                launch
                if not full
                else launch | {"kind": np.full(n, kind, dtype=object), "name": zero, "pinned": unknown}
            )

        is_kernel = kinds == t.k_kernels[0]
        for code in t.k_kernels[1:]:
            is_kernel |= kinds == code
        kernel_rows = at[is_kernel]
        if kernel_rows.size:
            n = kernel_rows.size
            given = launch_shape(kernel_rows, column)
            if full:
                given |= {
                    "kind": np.full(n, "kernel", dtype=object),
                    "pinned": np.full(n, -1, np.int64),
                    "bytes": np.zeros(n, np.int64),
                    "name": self._name_pointers(raw, kernel_rows, column),
                }
            add_group(kernel_rows, "kernel", **given)
        memcpy_rows = at[kinds == t.k_memcpy]
        if memcpy_rows.size:
            runtime = column(memcpy_rows, "memcpy", "runtime_correlation_id").astype(np.int64)
            given = blank(memcpy_rows.size, "")
            if full:
                copy_kind = column(memcpy_rows, "memcpy", "copy_kind").astype(np.int64) & 255
                given |= {
                    "kind": t.copy_names[copy_kind],
                    "pinned": self._pinned_column(memcpy_rows, copy_kind, column),
                }
            add_group(memcpy_rows, "memcpy", runtime, **given)
        memset_rows = at[kinds == t.k_memset]
        if memset_rows.size:
            add_group(memset_rows, "memset", **blank(memset_rows.size, "memset"))
        if not groups:
            return None, ext, api
        names = ("row", *wanted, "runtime_correlation_id")
        cols = dict(zip(names, groups[0] if len(groups) == 1 else map(np.concatenate, zip(*groups))))
        raw_end = cols["end"]
        start, end = cols["start"], cols["end"] = to_ns(cols["start"]), to_ns(raw_end)
        valid = (start > 0) & (end >= start)
        self.incomplete_records += start.size - int(np.count_nonzero(valid))
        if self.cutoff:
            after = raw_end >= self.cutoff
            if self.first_corr:
                after |= cols["correlation_id"] >= self.first_corr
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
        """The rows whose ``field`` (a CUPTI timestamp) is not before ``cutoff``."""
        if not self.cutoff or not rows.size:
            return rows
        return rows[column(rows, struct, field).astype(np.int64) >= self.cutoff]

    def _name_pointers(self, raw: Any, rows: np.ndarray, column: Any) -> np.ndarray:
        """The name pointers of the kernel records at ``rows`` (0 where the layout is not trusted): strings are read
        only for the records that need one (``names_of``), never for our own ops, whose names are known."""
        t = self.tables
        if self._read_names and any(k in raw.size_mismatch for k in t.k_kernels):
            self._read_names = False  # another struct version than the dtype: the name offset is not trusted
            self.layout_notes.append(f"kernel names not read: record sizes {raw.size_mismatch} differ")
        if not self._read_names:
            return np.zeros(rows.size, np.int64)
        return column(rows, "kernel", "name").astype(np.int64)

    def names_of(self, pointers: np.ndarray) -> np.ndarray:
        """Kernel names from the record's name pointers (CUPTI-owned C strings, kept by CUPTI while the module is
        loaded), each pointer read once per source and remembered."""
        unique, inverse = np.unique(pointers, return_inverse=True)
        cache = self._names
        for p in unique.tolist():
            if p not in cache:
                cache[p] = kernel_name(p)
        return np.array([cache[p] for p in unique.tolist()], dtype=object)[inverse.ravel()]

    def _pinned_column(self, rows: np.ndarray, copy_kind: np.ndarray, column: Any) -> np.ndarray:
        """1 / 0 where a host-side copy's host memory is pinned / pageable, -1 for device-side copies."""
        t = self.tables
        pinned = np.full(rows.size, -1, np.int64)
        from_host = np.isin(copy_kind, t.host_src)
        to_host = np.isin(copy_kind, t.host_dst)
        src_kind = column(rows, "memcpy", "src_kind").astype(np.int64) & 255
        dst_kind = column(rows, "memcpy", "dst_kind").astype(np.int64) & 255
        pinned[from_host] = t.pinned_of[src_kind[from_host]]
        pinned[to_host] = t.pinned_of[dst_kind[to_host]]
        return pinned

    @staticmethod
    def _strings(pointers: np.ndarray) -> np.ndarray:
        """The C strings at ``pointers`` (CUPTI-owned; NULL gives ''), read once per distinct pointer."""
        unique, inverse = np.unique(pointers, return_inverse=True)
        return np.array([kernel_name(p) for p in unique.tolist()], dtype=object)[inverse.ravel()]

    def take_extras(self) -> dict[str, dict[str, np.ndarray] | None]:
        """API calls (full flushes only), device-memory records and NVTX markers decoded since the last call."""
        out: dict[str, dict[str, np.ndarray] | None] = {}
        with self._lock:
            extras, self._extras = self._extras, {"api": [], "memory": [], "marker": []}
        for what, parts in extras.items():
            out[what] = None if not parts else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        return out
