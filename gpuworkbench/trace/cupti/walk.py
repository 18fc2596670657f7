"""Where each activity record starts in a buffer CUPTI handed back: walked by record sizes that CUPTI's own walk taught.

Verified on an H200 (CUPTI 13.0, benchmarks/probes/cupti_probe.py): the walk by learned sizes gives exactly the
offsets of ``cuptiActivityGetNextRecord`` on every buffer; cupti-python's dtypes match both CUPTI's record sizes and
cupti.h.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

#: A record size for kinds not (yet) verified: any walk that meets one overshoots and falls back to CUPTI's walk.
UNVERIFIED = 1 << 40
#: Activity kinds the size table covers.
MAX_KIND = 256
#: Records walked one by one, no run found among them, after which the walk turns to pointer doubling.
ALONE = 48


class RecordWalker:
    """Record offsets in a buffer: by verified sizes (NumPy where records repeat), else by CUPTI's walk, which
    teaches the sizes. ``get_next``: libcupti's ``cuptiActivityGetNextRecord`` (None: never asked)."""

    def __init__(self, get_next: Any = None) -> None:
        self._get_next = get_next
        #: Record size per activity kind, in 4-byte words, once CUPTI's own walk has shown it; else UNVERIFIED.
        self.size_words: list[int] = [UNVERIFIED] * MAX_KIND
        #: Sizes the dtypes predict per kind (bytes): a kind seen only as a buffer's last record is verified by them.
        self.expected_bytes: dict[int, int] = {}
        #: Learned sizes that differ from the dtypes' (kind -> (learned, expected) bytes).
        self.size_mismatch: dict[int, tuple[int, int]] = {}
        self.end_status = -1  # CUPTI_ERROR_MAX_LIMIT_REACHED, set by the record tables from cupti-python's enum
        self.buffers_walked_by_cupti = 0
        self.last_walk_status = 0

    def walk(self, data: Any) -> np.ndarray:
        """Offsets (in 4-byte words) of the records in ``data``: by the verified sizes, else by CUPTI's walk.

        Record by record while the records repeat (a launch loop writes API and kernel records, and external-id
        ones where ids are pushed, over and over): every 16 records, the repetitions of the last few that follow are
        checked in one NumPy step, each predicted record's kind word being the one whose size predicted the next.
        Once ``ALONE`` records in a row came one by one (a PyTorch step's records repeat only in short runs, and had
        taken ~1 µs each so), the rest is found by pointer doubling (``_doubled``). Either way, the same walk."""
        self.last_walk_status = 0
        if len(data) % 8 == 0:
            array = np.frombuffer(data, np.uint32)
            words = memoryview(data).cast("I")
            sizes = self.size_words
            parts: list[np.ndarray] = []
            offsets: list[int] = []
            kinds: list[int] = []
            i, n = 0, len(words)
            try:
                while i < n:
                    kind = words[i]
                    offsets.append(i)
                    kinds.append(kind)
                    i += sizes[kind]
                    if not len(kinds) & 15 and i < n:  # every 16 records walked one by one: a run ahead?
                        skipped = self._repeat(array, offsets, kinds, i)
                        if skipped is not None:
                            parts.append(np.asarray(offsets, np.int64))
                            parts.append(skipped)
                            i = int(skipped[-1]) + sizes[kinds[-1]]
                            offsets, kinds = [], []
                        elif len(kinds) >= ALONE:
                            rest = self._doubled(array, i)
                            if rest is None:
                                break
                            parts.append(np.asarray(offsets, np.int64))
                            parts.append(rest)
                            offsets, i = [], n
            except IndexError:  # a kind beyond the table
                i = -1
            if i == n:
                parts.append(np.asarray(offsets, np.int64))
                return np.concatenate(parts) if len(parts) > 1 else parts[0]
        return np.asarray(self.walk_cupti(data), np.int64)

    def _doubled(self, array: np.ndarray, i: int) -> np.ndarray | None:
        """The record offsets from word ``i`` on, by pointer doubling: records start 8-byte aligned, so each aligned
        slot whose word is a kind of verified size is a candidate, pointing to the candidate its size leads to (or
        to the end, or to nowhere); the records are the candidates on the chain from the one at ``i``, found in
        log2(records) NumPy steps. None where the chain leads nowhere or past the end."""
        if i & 1:
            return None
        table = np.asarray(self.size_words + [UNVERIFIED], np.int64)
        table[table & 1 == 1] = UNVERIFIED  # records start 8-byte aligned: an odd size is no size
        size = table[np.minimum(array[i::2], MAX_KIND)]
        starts = np.flatnonzero(size < UNVERIFIED)  # candidate slots, from word i
        if not starts.size or starts[0] != 0:
            return None
        chain = _chain(starts, starts * 2 + size[starts], array.size - i)
        return None if chain is None else chain + i

    def _repeat(self, array: np.ndarray, offsets: list[int], kinds: list[int], i: int) -> np.ndarray | None:
        """If the last L records (L = 1 to 4) repeat the L before them: the offsets of the repetitions of that pattern
        that follow from word ``i`` on, checked all at once; None when there are none."""
        for length in (1, 2, 3, 4):
            if len(kinds) < 2 * length or kinds[-length:] != kinds[-2 * length : -length]:
                continue
            start = offsets[-length]
            period = i - start
            if period <= 0 or start - offsets[-2 * length] != period:
                continue
            reps = (array.size - i) // period
            if reps < 8:
                return None
            pattern = kinds[-length:]
            if any(int(array[i + period * r + offsets[j - length] - start]) != pattern[j]
                   for r in range(2) for j in range(length)):  # fmt: skip
                return None  # the next two repetitions already break it: no NumPy step for nothing (a PyTorch
                # step's records repeat in short runs, and each vain check cost ~25 µs)
            rel = np.asarray(offsets[-length:], np.int64) - start
            base = i + period * np.arange(reps, dtype=np.int64)
            pos = base[:, None] + rel[None, :]
            good = (array[pos] == np.asarray(kinds[-length:], np.uint32)[None, :]).all(axis=1)
            count = reps if good.all() else int(np.argmin(good))
            return pos[:count].ravel() if count else None
        return None

    def walk_cupti(self, data: Any) -> list[int]:
        """Offsets (in 4-byte words) from ``cuptiActivityGetNextRecord`` on a copy; learns the record sizes it shows."""
        data = bytes(data)
        n = len(data)
        copy = (ctypes.c_uint64 * ((n + 7) // 8))()
        ctypes.memmove(copy, data, n)
        base = ctypes.addressof(copy)
        record = ctypes.c_void_p()
        offsets: list[int] = []
        while True:
            status = self._get_next(base, n, ctypes.byref(record))
            if status:
                break
            offset = (record.value or 0) - base
            if offset < 0 or offset >= n or offset % 8:
                status = -1
                break
            offsets.append(offset >> 2)
        self.last_walk_status = 0 if status == self.end_status else status
        self.buffers_walked_by_cupti += 1
        self._learn(data, offsets)
        return offsets

    def _learn(self, data: bytes, offsets: list[int]) -> None:
        """Record each kind's size from the gaps between CUPTI's record offsets (all equal, or nothing learned)."""
        if not offsets:
            return
        words = np.frombuffer(data, np.uint32, count=len(data) // 4)
        pos = np.asarray(offsets, dtype=np.int64)
        kinds = words[pos]
        gaps = np.diff(np.append(pos, len(data) // 4))
        for kind in np.unique(kinds).tolist():
            if kind >= MAX_KIND:
                continue
            mine = kinds == kind
            interior = np.unique(gaps[:-1][mine[:-1]])
            if interior.size == 1:
                learned = int(interior[0])
            elif interior.size == 0 and gaps[-1] * 4 == self.expected_bytes.get(kind):
                learned = int(gaps[-1])  # only ever last in its buffers: the gap to the end must match the dtype
            else:
                continue
            self.size_words[kind] = learned
            expected = self.expected_bytes.get(kind)
            if expected is not None and expected != learned * 4:
                self.size_mismatch[kind] = (learned * 4, expected)


def _chain(starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray | None:
    """Word offsets of the candidates (``starts``, slots; ``ends``: the word each one's record ends at) on the chain
    from the first that ends exactly at word ``n``; None where it leads nowhere or past ``n``."""
    c = starts.size
    at = np.minimum(np.searchsorted(starts, ends >> 1), c - 1)
    follow = np.where(starts[at] * 2 == ends, at, np.where(ends == n, c, c + 1))  # c: the end; c + 1: nowhere
    follow = np.append(follow, [c, c + 1])
    reached = np.zeros(c + 2, bool)
    reached[0] = True
    while True:  # after each step, ``reached`` holds every candidate within twice as many records of the first
        reached[follow[np.flatnonzero(reached)]] = True
        if follow[0] >= c:
            break
        follow = follow[follow]
    if reached[c + 1] or not reached[c]:
        return None
    return starts[reached[:c]] * 2
