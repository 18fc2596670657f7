"""Strings as small integer codes: ``factorize``, the one way the statistics, the range table and the timeline group
a column of names."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def factorize(values: np.ndarray, leading: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Codes (intp, one per value) and the distinct values they index: ``leading`` first (coded whether present or
    not), then the others in order of first appearance.

    A dict finds the distinct values and a C-level lookup codes each value (no sort of Python strings, no hash
    column); a column holding something unhashable is grouped by its values' text, which the distinct values are.
    """
    items = np.asarray(values, dtype=object).tolist()
    distinct = dict.fromkeys(leading)
    try:
        distinct.update(dict.fromkeys(items))
    except TypeError:  # something unhashable in the column: its values' text, grouped
        items = [str(v) for v in items]
        distinct.update(dict.fromkeys(items))
    index = {v: i for i, v in enumerate(distinct)}
    codes = np.fromiter(map(index.__getitem__, items), np.intp, count=len(items))
    return codes, np.fromiter(index, object, count=len(index))
