"""The span table: the columnar form every trace, analysis and picture shares.

A span is one operation on one device stream with start and end on the trace's host clock (ns). Columns are NumPy
arrays of equal length so that analyses are vectorised functions of plain tables (as in Holistic Trace Analysis).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..op_names import PEER_ROUTES, parse_peer_copy, peer_copy_name  # noqa: F401  (re-exported)

#: Span kinds, in the order of their integer codes in the ``kind`` column.
KINDS: tuple[str, ...] = ("h2d", "d2h", "d2d", "memset", "kernel", "alloc", "free", "marker", "api", "range")
KIND_CODE: dict[str, int] = {name: code for code, name in enumerate(KINDS)}
#: Kinds that happen on the host, not on a device: never busy device time. ``api`` is a host call that enqueued device
#: work (linked to it by ``corr``), ``range`` a named host region (NVTX, ``gw.range``, a profiler's ``cpu_op``).
HOST_KINDS: frozenset[str] = frozenset({"alloc", "free", "marker", "api", "range"})
#: Host rows of a device are negative streams: -1 the workbench's own (allocations, markers), -2 - i host thread i.
HOST_STREAM = -1


def thread_stream(index: int) -> int:
    """The stream number of the trace's ``index``-th host thread row."""
    return -2 - index


def pack_dim3(x: Any, y: Any = 1, z: Any = 1) -> Any:
    """A grid or block size as one int64 (x in the low 32 bits, y and z in 16 bits each); 0 means unknown."""
    return np.asarray(x, np.int64) | (np.asarray(y, np.int64) & 0xFFFF) << 32 | (np.asarray(z, np.int64) & 0xFFFF) << 48


@functools.lru_cache(maxsize=4096)
def pack_dims(dims: tuple[int, ...]) -> int:
    """``pack_dim3`` of a launch's 1 to 3 sizes (x first) as a Python int, for one row at a time (remembered: a
    harvest packs every kernel timed by events, and launches repeat their shapes)."""
    x, y, z = (*dims, 1, 1)[:3]
    return int(x) | (int(y) & 0xFFFF) << 32 | (int(z) & 0xFFFF) << 48


def launch_row(launch: tuple, loc: int) -> tuple[int, int, int, int, int]:
    """A kernel span row's columns from ``grid`` on (grid, block, loc, registers, shared_bytes), from the launch as
    the front end reports it: (grid sizes, block sizes, registers per thread, shared bytes per block)."""
    grid, block, registers, shared = launch
    return pack_dims(grid), pack_dims(block), loc, registers, shared


def unpack_dim3(value: int) -> tuple[int, int, int] | None:
    """``pack_dim3``'s (x, y, z), or None when unknown."""
    value = int(value)
    if value <= 0:
        return None
    return value & 0xFFFFFFFF, (value >> 32) & 0xFFFF, (value >> 48) & 0xFFFF


#: Column name -> dtype. ``name`` holds Python strings; ``pinned`` is -1 (unknown / not a copy), 0 or 1; ``corr``
#: links a host ``api`` span to the device span it enqueued (equal values; -1: none); ``grid``, ``block``: packed;
#: ``loc``: the source location that issued the op, an index into the trace's ``locations`` (-1: none; ``lines.py``);
#: ``registers`` (per thread) and ``shared_bytes`` (static + dynamic shared memory per block): a kernel's, -1 unknown.
COLUMNS: dict[str, Any] = {
    "kind": np.int8,
    "device": np.int16,
    "stream": np.int32,
    "start_ns": np.int64,
    "end_ns": np.int64,
    "enqueue_ns": np.int64,
    "bytes": np.int64,
    "name": object,
    "pinned": np.int8,
    "corr": np.int64,
    "grid": np.int64,
    "block": np.int64,
    "loc": np.int32,
    "registers": np.int16,
    "shared_bytes": np.int32,
}
#: What a column holds in rows that do not give it (a block made before the column existed, a hand-made table).
DEFAULTS: dict[str, Any] = {"enqueue_ns": -1, "pinned": -1, "corr": -1, "loc": -1, "registers": -1, "shared_bytes": -1}


@dataclass(frozen=True)
class Span:
    """One recorded operation, times in ns on the trace's host clock (``enqueue_ns`` is -1 when unknown)."""

    kind: str
    device: int
    stream: int
    start_ns: int
    end_ns: int
    enqueue_ns: int = -1
    bytes: int = 0
    name: str = ""
    pinned: int = -1
    corr: int = -1
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    loc: int = -1
    registers: int = -1
    shared_bytes: int = -1

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def empty_table(n: int = 0) -> dict[str, np.ndarray]:
    """A table of ``n`` rows with every column present (object column filled with empty strings)."""
    table = {col: np.zeros(n, dtype=dt) for col, dt in COLUMNS.items()}
    table["name"][:] = ""
    for column, value in DEFAULTS.items():
        table[column][:] = value
    return table


def table_from_records(records: Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Build a table from dicts with ``kind``, ``stream`` (a number), ``start_ns``, ``end_ns`` and optional other
    columns (``grid`` / ``block`` as (x, y, z) tuples or packed; ``registers``, ``shared_bytes``)."""
    rows = list(records)
    table = empty_table(len(rows))
    for i, rec in enumerate(rows):
        kind = rec["kind"]
        if kind not in KIND_CODE:
            raise ValueError(f"record {i}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        start, end = int(rec["start_ns"]), int(rec["end_ns"])
        if end < start:
            raise ValueError(f"record {i}: end_ns {end} is before start_ns {start}")
        table["kind"][i] = KIND_CODE[kind]
        table["stream"][i] = int(rec["stream"])
        table["start_ns"][i] = start
        table["end_ns"][i] = end
        table["device"][i] = int(rec.get("device", 0))
        table["enqueue_ns"][i] = int(rec.get("enqueue_ns", -1))
        table["bytes"][i] = int(rec.get("bytes", 0))
        table["name"][i] = str(rec.get("name", ""))
        pinned = rec.get("pinned")
        table["pinned"][i] = -1 if pinned is None else int(bool(pinned))
        table["corr"][i] = int(rec.get("corr", -1))
        table["loc"][i] = int(rec.get("loc", -1))
        table["registers"][i] = int(rec.get("registers", -1))
        table["shared_bytes"][i] = int(rec.get("shared_bytes", -1))
        for dim in ("grid", "block"):
            value = rec.get(dim)
            if value is not None:
                table[dim][i] = int(pack_dim3(*value)) if isinstance(value, (tuple, list)) else int(value)
    return table


def spans_of(table: Mapping[str, np.ndarray]) -> list[Span]:
    """The table's rows as ``Span`` objects (convenient for small traces and tests)."""
    n = len(table["kind"])
    return [
        Span(
            kind=KINDS[int(table["kind"][i])],
            device=int(table["device"][i]),
            stream=int(table["stream"][i]),
            start_ns=int(table["start_ns"][i]),
            end_ns=int(table["end_ns"][i]),
            enqueue_ns=int(table["enqueue_ns"][i]),
            bytes=int(table["bytes"][i]),
            name=str(table["name"][i]),
            pinned=int(table["pinned"][i]),
            corr=int(table["corr"][i]),
            grid=unpack_dim3(table["grid"][i]),
            block=unpack_dim3(table["block"][i]),
            loc=int(table["loc"][i]) if "loc" in table else -1,
            registers=int(table["registers"][i]) if "registers" in table else -1,
            shared_bytes=int(table["shared_bytes"][i]) if "shared_bytes" in table else -1,
        )
        for i in range(n)
    ]


#: Memory samples: bytes the workbench holds on a device at a host time, beside the device's used total (-1: unknown).
#: ``other_bytes``: device memory that other libraries (CuPy's pool, PyTorch's caching allocator ...) allocated, net of
#: their frees, since the trace started (from CUPTI's memory records; -1: not known).
MEMORY_COLUMNS: dict[str, Any] = {
    "device": np.int16,
    "t_ns": np.int64,
    "held_bytes": np.int64,
    "used_bytes": np.int64,
    "other_bytes": np.int64,
}


def empty_memory_table(n: int = 0) -> dict[str, np.ndarray]:
    """A memory-sample table of ``n`` rows."""
    table = {col: np.zeros(n, dtype=dt) for col, dt in MEMORY_COLUMNS.items()}
    table["used_bytes"][:] = -1
    table["other_bytes"][:] = -1
    return table
