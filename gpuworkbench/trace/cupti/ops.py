"""Ops whose spans come from CUPTI: held as int64 rows until their activity records arrive, then turned into spans.

The launching thread packs each op into a bytearray (one ``+=``, atomic under the GIL) and keeps no Python object per
op alive: names become small codes, and a kernel's completion is not held at all (only the newest completion per
stream, as a marker). Each op carries the window of host time (``t0``..``t1``, on CUPTI's clock as read by
``time.time_ns``) in which its thread enqueued it: the API calls CUPTI records on that thread inside the window are the
op's (``resolve``), so no id is pushed to CUPTI per op. Each harvest cuts the packed rows off as one int64 array and
joins the flush's records to the waiting ops by op id with sorted NumPy arrays: no Python work per op in the common
case (one kernel, one record). An op done on the device is never queried unless its records are late.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import numpy as np

from ..spans import KIND_CODE

#: Columns of a packed op row, in order. ``name``: a code into ``CuptiOps.names`` (-1: see ``spilled``); ``many``: the
#: op may produce several records (a staged copy, a graph launch); ``t0``, ``t1``: the enqueue window on the window
#: clock (``t0`` is the op's enqueue time); ``thread``: ``threading.get_ident()`` of the enqueuing thread.
OP_FIELDS: tuple[str, ...] = (
    "op", "device", "stream", "kind", "bytes", "name", "pinned", "t0", "many", "t1", "thread", "loc"
)  # fmt: skip
ROW = struct.Struct(f"<{len(OP_FIELDS)}q")
# ... and two more per waiting op: the harvest cycle it was cut in, and the cycle it was first seen done (-1 until).
_SINCE, _DONE_AT = len(OP_FIELDS), len(OP_FIELDS) + 1
_C = {name: i for i, name in enumerate(OP_FIELDS)}
_MULTI_KINDS = (KIND_CODE["h2d"], KIND_CODE["d2h"], KIND_CODE["d2d"])
#: Cycles an op waits for a record before its completion is queried (records normally come the next flush).
QUERY_AFTER = 3
#: Cycles after an op was seen done with no record before it is counted lost.
LOST_AFTER = 50
#: Cycles a record is kept without a waiting op to claim it (its op not handed over yet, or a late record).
ORPHAN_AFTER = 100
#: A kernel record's launch shape (``decode.LAUNCH_FIELDS``), kept with the record for its op's span, and what a
#: record without it gives (the span table's defaults).
LAUNCH: dict[str, int] = {"grid": 0, "block": 0, "registers": -1, "shared_bytes": -1}
#: Distinct op names given codes; further new names are kept per op (``spilled``) so the table stays bounded.
NAMES_MAX = 1 << 16


class CuptiOps:
    """Waiting CUPTI ops and unclaimed records; ``harvest`` returns the span rows of the ops that are complete.

    Launching threads call ``add`` (or inline it, as ``Trace.record_op`` does). Whether an op is done is asked of its
    own completion for ops of several records (kept in ``completions`` until their span is made) and, for a kernel
    whose record is late, of its stream's marker: the newest completion enqueued on that stream when the op was cut,
    which is done only once the op is (two threads racing to launch on one stream can leave an older marker; the
    worst that does is count a kernel still running seconds later as lost)."""

    def __init__(self) -> None:
        self.rows = bytearray()  # packed ROWs; only ever extended in place (launchers) or cut from the front
        self.codes: dict[str, int] = {}
        self.names: list[str] = []
        self.spilled: dict[int, str] = {}  # op id -> name, once NAMES_MAX names have codes
        self.completions: dict[int, Any] = {}  # op id -> completion, for ops of several records
        self.markers: dict[tuple[int, int], Any] = {}  # (device, stream) -> newest completion enqueued there
        self._marks: dict[int, dict[tuple[int, int], Any]] = {}  # cycle -> the markers as that cycle cut its ops
        self._name_table = np.empty(0, object)
        self._ops = np.empty((len(OP_FIELDS) + 2, 0), np.int64)  # one row per field: each column's values contiguous
        self._rec = {name: np.empty(0, np.int64) for name in ("op", "start", "end", "born", *LAUNCH)}
        self._code_lock = threading.Lock()
        self.lost = 0
        self._cut = 0  # rows cut so far
        self.first_lost = ""

    @property
    def handed_over(self) -> int:
        """Ops handed over so far (cut or not)."""
        return self._cut + len(self.rows) // ROW.size

    def __len__(self) -> int:
        """Ops handed over and not yet turned into spans (or counted lost)."""
        return int(self._ops.shape[1]) + len(self.rows) // ROW.size

    def code_of(self, name: str, op_id: int) -> int:
        """The code of ``name`` (one is given on first sight); -1, keeping the name for ``op_id``, once full."""
        with self._code_lock:
            code = self.codes.get(name)
            if code is not None:
                return code
            if len(self.names) >= NAMES_MAX:
                self.spilled[op_id] = name
                return -1
            self.names.append(name)  # before the code is published: a harvester never meets a code it can't read
            self.codes[name] = code = len(self.names) - 1
            return code

    def add(
        self,
        op_id: int,
        device: int,
        stream: int,
        kind: int,
        nbytes: int,
        name: str,
        pinned: int,
        t0: int,
        completion: Any,
        many: bool = False,
        t1: int | None = None,
        thread: int = 0,
        loc: int = -1,
    ) -> None:
        """Hand over one enqueued op (``kind`` is a KIND_CODE) enqueued by ``thread`` between ``t0`` and ``t1``;
        what ``Trace.record_op`` does inline."""
        code = self.codes.get(name)
        if code is None:
            code = self.code_of(name, op_id)
        if many or kind != KIND_CODE["kernel"]:
            self.completions[op_id] = completion
        self.markers[device, stream] = completion  # before the row: a marker is never older than an op cut
        self.rows += ROW.pack(
            op_id, device, stream, kind, nbytes, code, pinned, t0, many, t0 if t1 is None else t1, thread, loc
        )

    def add_records(self, cols: dict[str, np.ndarray] | None, cycle: int) -> None:
        """Keep a flush's records that carry one of our op ids (external id > 0)."""
        if cols is None:
            return
        mine = cols["external_id"] > 0
        if not mine.any():
            return
        m = int(mine.sum())
        fresh = {
            "op": cols["external_id"][mine],
            "start": cols["start"][mine],
            "end": cols["end"][mine],
            "born": np.full(m, cycle, np.int64),
        }
        for name, default in LAUNCH.items():
            fresh[name] = cols[name][mine] if name in cols else np.full(m, default, np.int64)
        self._rec = {k: np.concatenate([self._rec[k], fresh[k].astype(np.int64)]) for k in self._rec}

    def resolve(self, thread: np.ndarray, start: np.ndarray) -> np.ndarray:
        """The op id of the waiting op in whose window each API call began on its thread (CUPTI's 32-bit thread id,
        start on the window clock); -1 where none. A thread's ops are sequential, so its windows never overlap."""
        ops = self._ops
        out = np.full(start.size, -1, np.int64)
        if not ops.shape[1] or not start.size:
            return out
        op_thread = ops[_C["thread"]] & 0xFFFFFFFF  # CUPTI keeps the low 32 bits of pthread_self()
        one = bool((thread == thread[0]).all())  # the usual case: one launching thread (np.unique would sort)
        for tid in [int(thread[0])] if one else np.unique(thread).tolist():
            mine = np.flatnonzero(op_thread == tid)
            if not mine.size:
                continue
            t0 = ops[_C["t0"], mine]
            if bool((t0[1:] < t0[:-1]).any()):  # a thread's rows are appended in its launch order; in case not
                order = np.argsort(t0, kind="stable")
                mine, t0 = mine[order], t0[order]
            calls = np.arange(thread.size) if one else np.flatnonzero(thread == tid)
            at = np.searchsorted(t0, start[calls], "right") - 1
            inside = at >= 0
            at = mine[np.maximum(at, 0)]
            inside &= start[calls] <= ops[_C["t1"], at]
            out[calls[inside]] = ops[_C["op"], at[inside]]
        return out

    def harvest(
        self, cycle: int, offsets: np.ndarray, window_offsets: np.ndarray | None = None
    ) -> dict[str, np.ndarray] | None:
        """Span columns (kind, device, stream, start_ns, end_ns, enqueue_ns, bytes, name, pinned, and a kernel's launch
        shape from its record) of the ops whose records are all in; ``offsets[device]`` maps the CUPTI clock onto the
        trace's (host = cupti - offset) and ``window_offsets[device]`` the window clock (none given: it is the
        trace's)."""
        self.take_rows(cycle)
        ops, rec = self._ops, self._rec
        n = ops.shape[1]
        if not n:
            self._drop_records(rec["born"] < cycle - ORPHAN_AFTER)
            return None
        op_ids = ops[_C["op"]]
        # Each op's first start and last end over its records: sort the records by op (they mostly come in order),
        # reduce each run.
        rec_op = rec["op"]
        by_op = None if bool((rec_op[1:] >= rec_op[:-1]).all()) else np.argsort(rec_op, kind="stable")
        if by_op is not None:
            rec_op = rec_op[by_op]
        is_first = np.concatenate([[True], rec_op[1:] != rec_op[:-1]]) if rec_op.size else np.zeros(0, bool)
        first = np.flatnonzero(is_first)
        uniq = rec_op[first]
        rec_start, rec_end = (rec["start"], rec["end"]) if by_op is None else (rec["start"][by_op], rec["end"][by_op])
        starts = np.minimum.reduceat(rec_start, first) if first.size else first
        ends = np.maximum.reduceat(rec_end, first) if first.size else first
        # an op's launch shape: its first record's (a graph launch's several kernels have none of their own here)
        firsts = first if by_op is None else by_op[first]
        if uniq.size:
            at = np.minimum(np.searchsorted(uniq, op_ids), uniq.size - 1)
            has = uniq[at] == op_ids
        else:
            at, has = np.zeros(n, np.int64), np.zeros(n, bool)
        kinds = ops[_C["kind"]]
        many = ops[_C["many"]] != 0
        for code in _MULTI_KINDS:
            many |= kinds == code
        done_at, since = ops[_DONE_AT], ops[_SINCE]
        # Query completions only where it decides something: an op of several records that has some (all are in
        # once it was done before this flush), or an op whose records are late.
        ask = np.flatnonzero((done_at < 0) & ((has & many) | (~has & (cycle - since >= QUERY_AFTER))))
        if ask.size:
            done_at[ask[self._query(ops[:, ask], many[ask])]] = cycle
        ready = has & (~many | ((done_at >= 0) & (done_at < cycle)))
        lost = ~has & (done_at >= 0) & (cycle - done_at >= LOST_AFTER)
        if lost.any():
            self.lost += int(lost.sum())
            self.first_lost = self.first_lost or self._names(ops[:, np.flatnonzero(lost)[:1]])[0]
        rows = None
        if ready.any():
            every = bool(ready.all())
            where = at if every else at[ready]
            done = ops if every else ops[:, ready]
            dev = done[_C["device"]]
            off = offsets[dev]
            rows = {
                "kind": done[_C["kind"]],
                "device": dev,
                "stream": done[_C["stream"]],
                "start_ns": starts[where] - off,
                "end_ns": ends[where] - off,
                "enqueue_ns": done[_C["t0"]] if window_offsets is None else done[_C["t0"]] - window_offsets[dev],
                "bytes": done[_C["bytes"]],
                "name": self._names(done),
                "pinned": done[_C["pinned"]],
                "corr": np.full(dev.size, -1, np.int64),
                "loc": done[_C["loc"]],
            }
            single = ~many if every else ~many[ready]
            for name, default in LAUNCH.items():
                rows[name] = np.where(single, rec[name][firsts[where]], default)
            # The records of the ops made spans go (all of them, when every op waiting had its records): mark their
            # runs of the op-sorted records, then put the marks back in the records' order.
            if every:
                used = np.ones(rec_op.size, bool)
            else:
                run_used = np.zeros(uniq.size, bool)
                run_used[where] = True
                used = run_used[np.cumsum(is_first) - 1]
                if by_op is not None:
                    used[by_op] = used.copy()
            self._drop_records(used | (rec["born"] < cycle - ORPHAN_AFTER))
        gone = ready | lost
        if gone.any():
            for op_id in op_ids[gone & many].tolist():
                self.completions.pop(op_id, None)
            for op_id in op_ids[lost & (ops[_C["name"]] < 0)].tolist():
                self.spilled.pop(op_id, None)
            self._ops = ops[:, ~gone]
            oldest = int(self._ops[_SINCE].min()) if self._ops.shape[1] else cycle + 1
            for c in [c for c in self._marks if c < oldest]:
                del self._marks[c]
        return rows

    def take_rows(self, cycle: int) -> None:
        """Move the packed rows handed over since the last harvest into the waiting ops, and note the markers."""
        packed = self.rows
        cut = len(packed) // ROW.size * ROW.size
        if not cut:
            return
        block = np.frombuffer(packed[:cut], np.int64).reshape(-1, len(OP_FIELDS))
        del packed[:cut]
        self._cut += block.shape[0]
        self._marks[cycle] = dict(self.markers)  # taken after the cut: as new as every op cut, or newer
        old = self._ops
        grown = np.empty((old.shape[0], old.shape[1] + block.shape[0]), np.int64)
        grown[:, : old.shape[1]] = old
        grown[: len(OP_FIELDS), old.shape[1] :] = block.T
        grown[_SINCE, old.shape[1] :] = cycle
        grown[_DONE_AT, old.shape[1] :] = -1
        self._ops = grown

    def _query(self, asked: np.ndarray, many: np.ndarray) -> np.ndarray:
        """Whether each asked op is done: by its own completion (ops of several records) or its stream's marker."""
        seen = np.zeros(asked.shape[1], bool)
        markers: dict[tuple[int, int, int], bool] = {}
        for i, (op_id, dev, stream, since, is_many) in enumerate(
            zip(
                asked[_C["op"]].tolist(),
                asked[_C["device"]].tolist(),
                asked[_C["stream"]].tolist(),
                asked[_SINCE].tolist(),
                many.tolist(),
            )
        ):
            if is_many:
                handle = self.completions.get(op_id)
                seen[i] = handle is None or handle.done()
                continue
            key = (since, dev, stream)
            if key not in markers:
                handle = self._marks.get(since, {}).get((dev, stream))
                markers[key] = handle is None or handle.done()
            seen[i] = markers[key]
        return seen

    def _names(self, rows: np.ndarray) -> np.ndarray:
        """The names of ``rows`` as an object column (codes looked up in one gather)."""
        if len(self._name_table) != len(self.names):
            names = self.names[:]
            self._name_table = np.fromiter(names, object, count=len(names))
        codes = rows[_C["name"]]
        out = self._name_table[np.maximum(codes, 0)] if self._name_table.size else np.full(codes.size, "", object)
        for i in np.flatnonzero(codes < 0).tolist():
            out[i] = self.spilled.pop(int(rows[_C["op"], i]), "")
        return out

    def _drop_records(self, drop: np.ndarray) -> None:
        if drop.any():
            self._rec = {k: v[~drop] for k, v in self._rec.items()}
