"""The span table: the columnar form every trace, analysis and picture shares.

A span is one operation on one device stream with start and end on the trace's host clock (ns). Columns are NumPy
arrays of equal length so that analyses are vectorised functions of plain tables (as in Holistic Trace Analysis).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Span kinds, in the order of their integer codes in the ``kind`` column.
KINDS: tuple[str, ...] = ("h2d", "d2h", "d2d", "memset", "kernel", "alloc", "free", "marker")
KIND_CODE: dict[str, int] = {name: code for code, name in enumerate(KINDS)}

#: Column name -> dtype. ``name`` holds Python strings; ``pinned`` is -1 (unknown / not a copy), 0 or 1.
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
}


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

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def empty_table(n: int = 0) -> dict[str, np.ndarray]:
    """A table of ``n`` rows with every column present (object column filled with empty strings)."""
    table = {col: np.zeros(n, dtype=dt) for col, dt in COLUMNS.items()}
    table["name"][:] = ""
    table["pinned"][:] = -1
    table["enqueue_ns"][:] = -1
    return table


def table_from_records(records: Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Build a table from dicts with ``kind``, ``stream``, ``start_ns``, ``end_ns`` and optional other columns."""
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
        )
        for i in range(n)
    ]


#: Memory samples: bytes the workbench holds on a device at a host time, beside the device's used total (-1: unknown).
MEMORY_COLUMNS: dict[str, Any] = {"device": np.int16, "t_ns": np.int64, "held_bytes": np.int64, "used_bytes": np.int64}


def empty_memory_table(n: int = 0) -> dict[str, np.ndarray]:
    """A memory-sample table of ``n`` rows."""
    table = {col: np.zeros(n, dtype=dt) for col, dt in MEMORY_COLUMNS.items()}
    table["used_bytes"][:] = -1
    return table
