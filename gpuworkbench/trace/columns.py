"""A trace's storage: bounded columns (a ring that keeps the newest rows), its counters, and its devices' clocks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .device_limits import DeviceLimits


@dataclass
class DeviceClock:
    """How one device's timestamps map onto the trace's host clock, and where they came from."""

    key: str  # "cuda:0"
    name: str
    source: str  # "cupti", "events", "profiling", "perf_counter"
    offset_ns: int = 0  # device_ns - host_ns
    error_ns: int = 0  # alignment uncertainty (half the bracket of the clock sample)
    note: str = ""  # e.g. why CUPTI was not used and what the fallback's bias is
    limits: DeviceLimits | None = None  # what occupancy is computed from (CUDA devices; None where not known)


class Handover(dict):
    """Columns handed to a store for good (a loaded trace's table, made for it): an empty store's
    ``extend_columns`` keeps their arrays as they are, no copy, where they are what its first allocation would be."""


class Columns:
    """Columnar storage that grows to ``capacity`` rows and then keeps the newest (a ring), counting what it drops."""

    def __init__(self, schema: Mapping[str, Any], capacity: int, defaults: Mapping[str, Any] | None = None) -> None:
        self.schema, self.capacity = schema, capacity
        #: What a column gets in rows that do not give it (0 for columns not named here).
        self.defaults = {c: (defaults or {}).get(c, 0) for c in schema}
        self.size = 0  # allocated on the first rows: a trace's start makes no arrays
        self.cols: dict[str, np.ndarray] = {}
        self.count = 0  # rows ever appended
        self.dropped = 0

    def _grow(self, rows: int) -> None:
        """Double the arrays (up to ``capacity``) until ``rows`` more fit: at once to the size needed where doubling
        would take several steps (a loaded trace's one extend of 10^6 rows had doubled ten times)."""
        while self.count + rows > self.size and self.size < self.capacity:
            new = min(max(self.size * 2, 1024, self.count + rows), self.capacity)
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
        for c, column in self.cols.items():
            column[i] = row.get(c, self.defaults[c])
        self.count += 1

    def extend(self, rows: list[tuple]) -> None:
        """Append many rows (tuples in schema order) at once."""
        if rows:
            self.extend_columns(dict(zip(self.schema, zip(*rows))))

    def extend_columns(self, cols: Mapping[str, Any]) -> None:
        """Append columns of equal length (sequences or arrays, keyed by the schema): one assignment per column."""
        m = len(next(iter(cols.values())))
        if isinstance(cols, Handover) and self._adopt(cols, m):
            return
        self._grow(m)
        skip = 0
        if m > self.size:  # more rows than the ring holds: only the newest survive
            self.count += m - self.size
            skip, m = m - self.size, self.size
        at = self.count % self.size
        idx: Any = slice(at, at + m) if at + m <= self.size else (self.count + np.arange(m)) % self.size
        for c in self.schema:
            given = cols.get(c)
            column = self.cols[c]
            if given is None:
                column[idx] = self.defaults[c]
                continue
            values = given[skip:]
            if column.dtype == object and not isinstance(values, np.ndarray):
                values = np.fromiter(values, object, count=m)
            column[idx] = values
        self.count += m
        self.dropped = max(0, self.count - self.size)

    def _adopt(self, cols: Handover, m: int) -> bool:
        """Keep handed-over columns as the arrays of an empty store: ``m`` rows, as many as its first ``_grow`` would
        make room for, each column given with its dtype and its own memory."""
        if self.count or self.size or not 1024 <= m <= self.capacity:
            return False
        arrays = [cols.get(c) for c in self.schema]
        if not all(
            isinstance(array, np.ndarray) and array.dtype == dtype and array.shape == (m,) and array.base is None
            for array, dtype in zip(arrays, self.schema.values())
        ):
            return False
        self.cols = dict(zip(self.schema, arrays))
        self.size = self.count = m
        self.dropped = 0
        return True

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
