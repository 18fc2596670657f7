"""Interval algebra on int64 arrays: union, intersection, difference, clip and total length.

Every DESIGN §6 figure is the length of a union, so that time covered by several streams counts once; these functions
are how the analysis measures it, vectorised (a sort and a running maximum, or one sweep over all boundaries).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Intervals as two int64 arrays ``(starts, ends)``; the functions below return them sorted, disjoint and non-touching.
Intervals = tuple[np.ndarray, np.ndarray]


def empty() -> Intervals:
    """No intervals."""
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def merge_sorted(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge intervals already sorted by start (empty ones dropped); touching intervals merge."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return empty()
    reach = np.maximum.accumulate(ends)
    new_run = np.empty(starts.size, dtype=bool)
    new_run[0] = True
    new_run[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new_run)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], reach[last]


def union(starts: Any, ends: Any) -> Intervals:
    """The sorted, merged intervals covering exactly the time the given ones cover (touching merge, empty drop).

    Every DESIGN §6 quantity is the length of a union, so that time covered by several streams counts once.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    return merge_sorted(starts[order], ends[order])


def union_of(*parts: Intervals) -> Intervals:
    """The union of several sets of intervals."""
    return union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def sweep(parts: list[Intervals], weights: list[int], points: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries ``b`` and values ``v``: on ``[b[i], b[i+1])`` the summed weights of the parts covering it.

    Each part must be a union (disjoint), so with weights 1, 2, 4 the value is a bit mask of which parts cover;
    ``points`` adds boundaries where nothing changes (a window's ends).
    """
    times = np.concatenate([p[0] for p in parts] + [p[1] for p in parts] + [np.asarray(points, dtype=np.int64)])
    deltas = np.concatenate(
        [np.full(p[0].size, w, dtype=np.int64) for p, w in zip(parts, weights, strict=True)]
        + [np.full(p[1].size, -w, dtype=np.int64) for p, w in zip(parts, weights, strict=True)]
        + [np.zeros(len(points), dtype=np.int64)]
    )
    order = np.argsort(times, kind="stable")
    times = times[order]
    values = np.cumsum(deltas[order])
    last_at_time = np.ones(times.size, dtype=bool)
    last_at_time[:-1] = times[1:] != times[:-1]
    return times[last_at_time], values[last_at_time]


def _select(bounds: np.ndarray, values: np.ndarray, wanted: int) -> Intervals:
    keep = values[:-1] == wanted
    return merge_sorted(bounds[:-1][keep], bounds[1:][keep])


def _normal(a: Intervals) -> Intervals:
    return union(a[0], a[1])


def intersection(a: Intervals, b: Intervals) -> Intervals:
    """The time covered by both ``a`` and ``b``, as a union.

    Overlap is |C ∩ K|: the copy time during which some kernel also ran.
    """
    bounds, values = sweep([_normal(a), _normal(b)], [1, 2])
    return _select(bounds, values, 3)


def difference(a: Intervals, b: Intervals) -> Intervals:
    """The time covered by ``a`` and not by ``b``, as a union.

    Exposed copy time is |C \\ K|: copy time that no kernel hides.
    """
    bounds, values = sweep([_normal(a), _normal(b)], [1, 2])
    return _select(bounds, values, 1)


def clip(a: Intervals, start: int, end: int) -> Intervals:
    """The part of ``a`` inside the window ``[start, end]``, as a union.

    Every figure is measured inside one window W, so spans reaching outside it count only in part.
    """
    starts, ends = _normal(a)
    return merge_sorted(np.maximum(starts, start), np.minimum(ends, end))


def total_length(a: Intervals) -> int:
    """Total time (ns) covered by ``a``, which must be a union (as every function here returns).

    The |X| of DESIGN §6.
    """
    return int(np.sum(a[1] - a[0]))


def share_pct(part: int, whole: int) -> float | None:
    """100·part / whole, the form of every % figure; None when the whole is empty (|W| = 0, no copies)."""
    return None if whole == 0 else 100.0 * part / whole
