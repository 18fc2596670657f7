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

        Records start 8-byte aligned, so each aligned slot whose word is a kind of verified size is a candidate
        start, and points to the candidate its record's size leads to (or to the end, or to nowhere). The records
        are the candidates on the chain from the first one, found by pointer doubling in NumPy: log2(records)
        steps, no Python per record (a PyTorch step's records, which repeat only in short runs, had taken ~1 µs
        each walked one by one). A chain that leads nowhere, or past the end, is left to CUPTI's walk."""
        self.last_walk_status = 0
        if len(data) % 8 == 0:
            array = np.frombuffer(data, np.uint32)
            n = array.size
            if n == 0:
                return np.empty(0, np.int64)
            table = np.asarray(self.size_words + [UNVERIFIED], np.int64)
            table[table & 1 == 1] = UNVERIFIED  # records start 8-byte aligned: an odd size is no size
            size = table[np.minimum(array[::2], MAX_KIND)]
            starts = np.flatnonzero(size < UNVERIFIED)  # candidate slots
            chain = _chain(starts, starts * 2 + size[starts], n) if starts.size and starts[0] == 0 else None
            if chain is not None:
                return chain
        return np.asarray(self.walk_cupti(data), np.int64)

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
