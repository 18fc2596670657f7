"""Ops whose spans come from CUPTI: held as columns until their activity records arrive, then turned into span rows.

The front end appends each op's fields to a flat list (``pending``); each harvest joins the records of a flush to
the waiting ops by op id (the external id CUPTI reports) with sorted NumPy arrays, so the harvester costs no Python
work per op in the common case (one kernel, one record). An op done on the device is never queried unless its
records are late.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .spans import KIND_CODE

#: Fields of a pending op tuple, in order. ``many``: the op may produce several records (a staged copy, a graph).
OP_FIELDS: tuple[str, ...] = ("op", "device", "stream", "kind", "bytes", "name", "pinned", "enqueue_ns", "done", "many")
_DTYPES: dict[str, Any] = {
    "op": np.int64,
    "device": np.int64,
    "stream": np.int64,
    "kind": np.int64,
    "bytes": np.int64,
    "name": object,
    "pinned": np.int64,
    "enqueue_ns": np.int64,
    "done": object,  # the completion handle
    "many": bool,
    "since": np.int64,  # harvest cycle the op joined the waiting columns
    "done_at": np.int64,  # harvest cycle its completion was first seen done, -1 until then
}
_WIDTH = len(OP_FIELDS)
_MULTI_KINDS = np.array([KIND_CODE["h2d"], KIND_CODE["d2h"], KIND_CODE["d2d"]])
#: Cycles an op waits for a record before its completion is queried (records normally come the next flush).
QUERY_AFTER = 3
#: Cycles after an op was seen done with no record before it is counted lost.
LOST_AFTER = 50
#: Cycles a record is kept without a waiting op to claim it (its op not handed over yet, or a late record).
ORPHAN_AFTER = 100


class CuptiOps:
    """Waiting CUPTI ops and unclaimed records; ``harvest`` returns the span rows of the ops that are complete."""

    def __init__(self) -> None:
        # Launching threads ``extend`` this flat list by one op's OP_FIELDS at a time (atomic under the GIL); the
        # harvester cuts whole ops off its front: no per-op object outlives the enqueue.
        self.pending: list[Any] = []
        self._ops = {name: np.empty(0, dtype) for name, dtype in _DTYPES.items()}
        self._rec = {name: np.empty(0, np.int64) for name in ("op", "start", "end", "born")}
        self.lost = 0
        self.first_lost = ""

    def __len__(self) -> int:
        """Ops handed over and not yet turned into spans (or counted lost)."""
        return int(self._ops["op"].size) + len(self.pending) // _WIDTH

    def add_records(self, cols: dict[str, np.ndarray] | None, cycle: int) -> None:
        """Keep a flush's records that carry one of our op ids (external id > 0)."""
        if cols is None:
            return
        mine = cols["external_id"] > 0
        if not mine.any():
            return
        fresh = {
            "op": cols["external_id"][mine],
            "start": cols["start"][mine],
            "end": cols["end"][mine],
            "born": np.full(int(mine.sum()), cycle, np.int64),
        }
        self._rec = {k: np.concatenate([self._rec[k], fresh[k].astype(np.int64)]) for k in self._rec}

    def harvest(self, cycle: int, offsets: np.ndarray) -> dict[str, np.ndarray] | None:
        """Span columns (kind, device, stream, start_ns, end_ns, enqueue_ns, bytes, name, pinned) of the ops whose
        records are all in; ``offsets[device]`` maps the CUPTI clock onto the trace's (host = cupti - offset)."""
        self._take_pending(cycle)
        ops, rec = self._ops, self._rec
        n = ops["op"].size
        if not n:
            self._drop_records(rec["born"] < cycle - ORPHAN_AFTER)
            return None
        # Each op's first start and last end over its records: sort the records by op, reduce each run.
        by_op = np.argsort(rec["op"], kind="stable")
        rec_op = rec["op"][by_op]
        first = np.flatnonzero(np.r_[True, rec_op[1:] != rec_op[:-1]]) if rec_op.size else rec_op
        uniq = rec_op[first]
        starts = np.minimum.reduceat(rec["start"][by_op], first) if first.size else first
        ends = np.maximum.reduceat(rec["end"][by_op], first) if first.size else first
        if uniq.size:
            at = np.minimum(np.searchsorted(uniq, ops["op"]), uniq.size - 1)
            has = uniq[at] == ops["op"]
        else:
            at, has = np.zeros(n, np.int64), np.zeros(n, bool)
        many = ops["many"] | np.isin(ops["kind"], _MULTI_KINDS)
        done_at = ops["done_at"]
        # Query completions only where it decides something: an op of several records that has some (all are in
        # once it was done before this flush), or an op whose records are late.
        ask = np.flatnonzero((done_at < 0) & ((has & many) | (~has & (cycle - ops["since"] >= QUERY_AFTER))))
        if ask.size:
            handles = ops["done"][ask]
            seen = np.fromiter((h.done() for h in handles), bool, count=ask.size)
            done_at[ask[seen]] = cycle
        ready = has & (~many | ((done_at >= 0) & (done_at < cycle)))
        lost = ~has & (done_at >= 0) & (cycle - done_at >= LOST_AFTER)
        if lost.any():
            self.lost += int(lost.sum())
            self.first_lost = self.first_lost or str(ops["name"][np.flatnonzero(lost)[0]])
        rows = None
        if ready.any():
            idx, where = np.flatnonzero(ready), at[ready]
            dev = ops["device"][idx]
            off = offsets[dev]
            rows = {
                "kind": ops["kind"][idx],
                "device": dev,
                "stream": ops["stream"][idx],
                "start_ns": starts[where] - off,
                "end_ns": ends[where] - off,
                "enqueue_ns": ops["enqueue_ns"][idx],
                "bytes": ops["bytes"][idx],
                "name": ops["name"][idx],
                "pinned": ops["pinned"][idx],
            }
            self._drop_records(np.isin(rec["op"], ops["op"][idx]) | (rec["born"] < cycle - ORPHAN_AFTER))
        gone = ready | lost
        if gone.any():
            self._ops = {k: v[~gone] for k, v in ops.items()}
        return rows

    def _take_pending(self, cycle: int) -> None:
        pending = self.pending
        cut = len(pending) // _WIDTH * _WIDTH
        if not cut:
            return
        batch = pending[:cut]
        del pending[:cut]
        n = cut // _WIDTH
        fresh = {name: np.array(batch[i::_WIDTH], dtype=_DTYPES[name]) for i, name in enumerate(OP_FIELDS)}
        for name in ("name", "done"):  # object columns: never let NumPy look inside the values
            fresh[name] = np.fromiter(batch[OP_FIELDS.index(name) :: _WIDTH], object, count=n)
        fresh["since"] = np.full(n, cycle, np.int64)
        fresh["done_at"] = np.full(n, -1, np.int64)
        self._ops = {k: np.concatenate([self._ops[k], fresh[k]]) for k in self._ops}

    def _drop_records(self, drop: np.ndarray) -> None:
        if drop.any():
            self._rec = {k: v[~drop] for k, v in self._rec.items()}
