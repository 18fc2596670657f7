"""Spans summed per (row, pixel column): how a timeline of 10^6 spans is drawn when zoomed out.

A cell is one row over one bin of the visible time range. It holds ``count`` (the spans whose visible part starts in
the bin: every span in view is counted once, so a row's counts sum to its spans in view), ``busy`` (the fraction of
the bin that the union of the row's spans covers: nested host ranges count once) and ``style`` (the style, a kind or
a state, that covers the most of the bin). The timeline's browser code (``timeline_js.AGGREGATE``) computes the same
cells from the same sorted arrays; this NumPy version draws the overview strip and the first view, and is the
reference the tests hold the browser's cells to.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Rows x bins x styles up to which the cells' pairs are counted densely (two arrays of this length, 8 bytes a value).
DENSE_PAIRS = 1 << 21


def aggregate(
    row: Any,
    style: Any,
    start: Any,
    end: Any,
    lo: float,
    hi: float,
    bins: int,
    n_rows: int,
    n_styles: int,
) -> dict[str, np.ndarray]:
    """Cells of the spans (``row`` and ``style`` codes, ``start`` / ``end`` times) over ``[lo, hi]`` in ``bins`` bins.

    Returns columns ``row``, ``bin``, ``left``, ``right`` (the bin's edges), ``count``, ``busy`` (0..1) and ``style``
    for every cell that holds a span or part of one, ordered by row then bin. ``n_rows``: the rows in all (the
    browser's version sizes its arrays by it; here only the cells and styles that occur are made).
    """
    row = np.asarray(row, dtype=np.int64)
    style = np.asarray(style, dtype=np.int64)
    start = np.asarray(start, dtype=np.float64)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    bins = max(int(bins), 1)
    width = (hi - lo) / bins if hi > lo else 1.0

    if start.size == 0:
        empty = np.zeros(0, np.int64)
        return {
            "row": empty,
            "bin": empty,
            "left": np.zeros(0),
            "right": np.zeros(0),
            "count": empty,
            "busy": np.zeros(0),
            "style": empty,
        }

    # The union of each row's spans, from start order: a span adds only what lies past the row's furthest end so far.
    # A trace's spans come in start order: then a stable sort by row keeps it (a radix sort where rows fit 16 bits).
    low, high = int(row.min()), int(row.max())
    if start.size > 1 and bool((start[1:] >= start[:-1]).all()):
        small = low >= 0 and high < 1 << 15
        order = np.argsort(row.astype(np.int16) if small else row, kind="stable")
    else:
        order = np.lexsort((start, row))
    row, style, start, end = row[order], style[order], start[order], end[order]
    origin = float(start.min())
    stride = 2.0 * (float(end.max()) - origin + 1.0)  # rows laid end to end, so one running maximum serves them all
    reach = np.maximum.accumulate(row * stride + (end - origin))
    previous = np.full(start.size, -np.inf)
    same = row[1:] == row[:-1]
    previous[1:][same] = (reach[:-1] - row[1:] * stride + origin)[same]
    a = np.clip(np.maximum(start, previous), lo, hi)
    b = np.clip(end, lo, hi)

    # Counts: each span in view once, in the bin where its visible part starts.
    seen = (end >= lo) & (start <= hi)
    first = np.clip(((np.maximum(start, lo) - lo) / width).astype(np.int64), 0, bins - 1)
    counted = (row[seen] * bins + first[seen]) * n_styles + style[seen]

    # Busy time: the covered piece [a, b) of each span, split over the bins it crosses.
    covered = b > a
    a, b, crow, cstyle = a[covered], b[covered], row[covered], style[covered]
    b0 = np.clip(((a - lo) / width).astype(np.int64), 0, bins - 1)
    b1 = np.maximum(np.clip(np.ceil((b - lo) / width).astype(np.int64) - 1, 0, bins - 1), b0)
    cell0, cell1 = crow * bins + b0, crow * bins + b1
    one = b0 == b1
    # The first bin's piece (all of it when the span ends in the same bin), the last bin's piece, the bins between.
    pieces = [(cell0, cstyle, np.where(one, b - a, lo + (b0 + 1) * width - a))]
    many = np.flatnonzero(~one)
    pieces.append((cell1[many], cstyle[many], b[many] - (lo + b1[many] * width)))
    inner = b1[many] - b0[many] - 1
    if inner.any():
        which = np.repeat(many, inner)
        offset = np.arange(which.size) - np.repeat(np.cumsum(inner) - inner, inner)
        pieces.append((cell0[which] + 1 + offset, cstyle[which], np.full(which.size, width)))
    index = np.concatenate([(cell * n_styles + s) for cell, s, _ in pieces])
    weight = np.concatenate([w for _, _, w in pieces])

    # Only the (cell, style) pairs that occur: a thousand spans touch a few thousand of rows x bins x styles. Where
    # those are few enough to count densely, by bincount over all of them; else by sorting the pairs that occur.
    space = max(n_rows, high + 1) * bins * n_styles
    if low >= 0 and space <= DENSE_PAIRS:
        count_dense = np.bincount(counted, minlength=space)
        busy_dense = np.bincount(index, weights=weight, minlength=space)
        pairs = np.flatnonzero((count_dense > 0) | (busy_dense != 0))
        count_by_pair, busy_by_pair = count_dense[pairs], busy_dense[pairs]
    else:
        pairs, at = np.unique(np.concatenate([counted, index]), return_inverse=True)
        at = at.ravel()
        count_by_pair = np.bincount(at[: counted.size], minlength=pairs.size)
        busy_by_pair = np.bincount(at[counted.size :], weights=weight, minlength=pairs.size)
    cell_of = pairs // n_styles
    cells_at = _firsts(cell_of)  # pairs are sorted: each cell's first pair
    count = np.add.reduceat(count_by_pair, cells_at) if pairs.size else count_by_pair
    busy = np.add.reduceat(busy_by_pair, cells_at) if pairs.size else busy_by_pair
    # The style that covers the most of a cell (its count breaks a tie, then the lowest style): each cell's first pair
    # (a cell's pairs are in style order) with the cell's highest score (NaN only where all are, as a sort has it).
    score = busy_by_pair + 1e-9 * width * count_by_pair
    if pairs.size:
        high = np.repeat(np.fmax.reduceat(score, cells_at), np.diff(np.append(cells_at, pairs.size)))
        best = np.flatnonzero((score == high) | np.isnan(high))
        top = best[_firsts(cell_of[best])]
    else:
        top = cells_at
    keep = (count > 0) | (busy > 0)
    cell = cell_of[cells_at][keep]
    bin_of = cell % bins
    return {
        "row": cell // bins,
        "bin": bin_of,
        "left": lo + bin_of * width,
        "right": lo + (bin_of + 1) * width,
        "count": count[keep],
        "busy": np.minimum(busy[keep] / width, 1.0),
        "style": (pairs[top] % n_styles)[keep],
    }


def _firsts(sorted_values: np.ndarray) -> np.ndarray:
    """The index of the first of each run of equal values."""
    new = np.ones(sorted_values.size, dtype=bool)
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=new[1:])
    return np.flatnonzero(new)


def levels(
    row: Any,
    style: Any,
    start: Any,
    end: Any,
    bins: int,
    n_rows: int,
    n_styles: int,
    factor: int = 4,
    depth: int = 4,
) -> list[dict[str, np.ndarray]]:
    """``aggregate`` over the whole extent at ``depth`` resolutions, ``bins`` × ``factor``**k bins at level k."""
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    lo = float(start.min()) if start.size else 0.0
    hi = float(end.max()) if end.size else 1.0
    return [aggregate(row, style, start, end, lo, hi, bins * factor**k, n_rows, n_styles) for k in range(depth)]
