"""Attach external ids (our op ids) to CUPTI activity records, as column operations.

A kernel / memcpy record carries only CUPTI's correlation id, the id of the API call that enqueued it. What op that
call belongs to comes either from an EXTERNAL_CORRELATION record (correlation id -> an id pushed around the call) or,
what a trace uses, from the API call's own record: the thread it ran on and when it started, placed in the window of
host time in which that thread enqueued one of our ops (``resolve``). Records of a call and of its work may arrive in
different flushes. Doing this join per record in Python cost about a microsecond a record on the harvester thread,
holding the GIL the launching thread needs, so it is done here on sorted NumPy arrays: no Python object per record.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_EMPTY = np.empty(0, np.int64)


class ExternalIdJoin:
    """Correlation id -> external id map, and the records still waiting for their entry.

    ``join`` is called once per flush. A record whose correlation id (or, for runtime-API copies, its runtime
    correlation id) is not in the map yet is held for up to ``hold_flushes`` flushes, then handed out with
    external id -1. A map entry stays ``keep_flushes`` flushes after a record last used it (a graph launch's
    kernels share one); entries never used are dropped, oldest first, once more than ``map_max`` are kept.
    """

    def __init__(self, hold_flushes: int = 2, keep_flushes: int = 16, map_max: int = 1 << 16) -> None:
        self.hold_flushes, self.keep_flushes, self.map_max = hold_flushes, keep_flushes, map_max
        self._corr = _EMPTY  # sorted correlation ids
        self._ext = _EMPTY  # their external ids
        self._last = _EMPTY  # flush that last used each entry, -1 if none yet
        self._held: dict[str, np.ndarray] | None = None  # records waiting for their entry, with a "born" column
        self._calls: dict[str, np.ndarray] | None = None  # API calls not placed in an op's window yet, same
        self.flushes = 0
        #: API calls placed in no op's window within the hold (another library's launches, on a traced thread or not).
        self.unplaced_calls = 0

    def __len__(self) -> int:
        """Map entries kept."""
        return int(self._corr.size)

    @property
    def held_calls(self) -> int:
        """API calls waiting to be placed in an op's window."""
        return 0 if self._calls is None else int(self._calls["born"].size)

    @property
    def held(self) -> int:
        """Records waiting for their external id."""
        return 0 if self._held is None else int(self._held["born"].size)

    def add(self, corr: np.ndarray, ext: np.ndarray) -> None:
        """Add map entries (a correlation id seen again keeps its newest external id)."""
        if not corr.size:
            return
        corr, ext = np.asarray(corr, np.int64), np.asarray(ext, np.int64)
        if (not self._corr.size or corr[0] > self._corr[-1]) and bool((corr[1:] > corr[:-1]).all()):
            # The usual case: ids only grow (CUPTI numbers API calls in order), so the map stays sorted as it is.
            self._corr = np.concatenate([self._corr, corr])
            self._ext = np.concatenate([self._ext, ext])
            self._last = np.concatenate([self._last, np.full(corr.size, -1, np.int64)])
            return
        corr = np.concatenate([self._corr, corr])
        ext = np.concatenate([self._ext, np.asarray(ext, np.int64)])
        last = np.concatenate([self._last, np.full(corr.size - self._last.size, -1, np.int64)])
        order = np.argsort(corr, kind="stable")
        corr, ext, last = corr[order], ext[order], last[order]
        newest = np.append(corr[1:] != corr[:-1], True)  # the last of each run of equal ids
        self._corr, self._ext, self._last = corr[newest], ext[newest], last[newest]

    def place_calls(
        self,
        calls: dict[str, np.ndarray] | None,
        resolve: Callable[[np.ndarray, np.ndarray], np.ndarray],
        wait: bool = True,
    ) -> None:
        """Map entries from API call records (columns thread, start, correlation_id): ``resolve(thread, start)`` gives
        the op id each call was made in (-1: none). A call not placed yet is tried again at the next flushes (its op
        may be handed over after CUPTI delivered the call), then dropped as not ours after ``hold_flushes``."""
        now = self.flushes + 1  # the flush ``join`` is about to count
        if calls is not None and not calls["start"].size:
            calls = None  # a flush with no call (all cut off, or the primer's): nothing to add to the held ones
        if calls is not None:
            calls = dict(calls)
            calls["born"] = np.full(calls["start"].size, now, np.int64)
        held, self._calls = self._calls, None
        if held is not None:
            calls = held if calls is None else {k: np.concatenate([held[k], calls[k]]) for k in held}
        if calls is None:
            return
        ext = resolve(calls["thread"], calls["start"])
        placed = ext >= 0
        if placed.any():
            self.add(calls["correlation_id"][placed], ext[placed])
        waiting = ~placed
        if waiting.any():
            expired = waiting & ((now - calls["born"] >= self.hold_flushes) | (not wait))
            self.unplaced_calls += int(expired.sum())
            waiting &= ~expired
            if waiting.any():
                self._calls = {k: v[waiting] for k, v in calls.items()}

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(external ids, -1 where absent; positions in the map of the hits)."""
        if not self._corr.size or not keys.size:
            return np.full(keys.size, -1, np.int64), _EMPTY
        pos = np.minimum(np.searchsorted(self._corr, keys), self._corr.size - 1)
        hit = self._corr[pos] == keys
        return np.where(hit, self._ext[pos], -1), pos[hit]

    def join(
        self,
        cols: dict[str, np.ndarray] | None,
        corr: np.ndarray = _EMPTY,
        ext: np.ndarray = _EMPTY,
        wait: bool = True,
        ordered: bool = True,
        calls: dict[str, np.ndarray] | None = None,
        resolve: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> dict[str, np.ndarray] | None:
        """One flush: add its map entries (``corr`` -> ``ext``, and ``calls`` placed by ``resolve``), join its
        records (``cols``, with ``correlation_id`` and ``runtime_correlation_id`` columns) and the held ones; return
        the released records with an ``external_id`` column, ordered by ``start`` if ``ordered``. ``wait=False``
        (the last flush) releases everything."""
        self.add(corr, ext)
        if resolve is not None:
            self.place_calls(calls, resolve, wait)
        self.flushes += 1
        now = self.flushes
        records = self._with_held(cols, now)
        if records is None:
            self._expire(now)
            return None
        ids, used = self.lookup(records["correlation_id"])
        runtime = records["runtime_correlation_id"]
        retry = np.flatnonzero((ids < 0) & (runtime != 0))  # copies the runtime API tagged (cudaMemcpy*)
        if retry.size:
            again, used_again = self.lookup(runtime[retry])
            ids[retry] = again
            used = np.concatenate([used, used_again])
        self._last[used] = now
        release = ids >= 0
        if wait:
            release |= now - records["born"] >= self.hold_flushes
        else:
            release[:] = True
        self._held = None if release.all() else {k: v[~release] for k, v in records.items()}
        self._expire(now)
        if not release.any():
            return None
        out = {k: v[release] for k, v in records.items() if k != "born"}
        out["external_id"] = ids[release]
        if not ordered:
            return out
        order = np.lexsort((np.arange(out["start"].size), out["start"]))
        return {k: v[order] for k, v in out.items()}

    def _with_held(self, cols: dict[str, np.ndarray] | None, now: int) -> dict[str, np.ndarray] | None:
        """This flush's records after the held ones (which are older), each with the flush it arrived in."""
        fresh = None
        if cols is not None and cols["start"].size:
            fresh = dict(cols)
            fresh["born"] = np.full(cols["start"].size, now, np.int64)
        held, self._held = self._held, None
        if held is None or fresh is None:
            return fresh if held is None else held
        return {k: np.concatenate([held[k], fresh[k]]) for k in held if k in fresh}

    def _expire(self, now: int) -> None:
        keep = (self._last < 0) | (now - self._last <= self.keep_flushes)
        if self._corr.size > self.map_max:  # entries of ops still queued (or never used): keep the newest half
            keep[: self._corr.size - self.map_max // 2] = False
        if not keep.all():
            self._corr, self._ext, self._last = self._corr[keep], self._ext[keep], self._last[keep]
