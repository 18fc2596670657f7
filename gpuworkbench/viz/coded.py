"""A column of strings made from codes into a few distinct strings, keeping both, so that a document's encoder sends
the codes it was made from (``doc_text``) instead of finding them again item by item."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class Coded(np.ndarray):
    """An object array of strings that keeps the ``codes`` (non-negative ints) and ``strings`` it was made from. An
    array derived from it (a slice, a copy, a selection) keeps neither; it must not be changed in place."""

    codes: np.ndarray | None
    strings: list[str] | None

    def __array_finalize__(self, obj: Any) -> None:
        self.codes = None
        self.strings = None


def coded(strings: Sequence[str] | np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``strings[codes]`` as a ``Coded`` column (``codes``: non-negative indices into ``strings``)."""
    table = np.empty(len(strings), dtype=object)
    table[:] = list(strings)
    codes = np.asarray(codes, dtype=np.int64)
    out = table[codes].view(Coded)
    out.codes = codes
    out.strings = table.tolist()
    return out


def take(column: Any, index: np.ndarray) -> np.ndarray:
    """``column[index]`` as an array, a ``Coded`` one (its codes taken too) where ``column`` is one."""
    codes = getattr(column, "codes", None)
    if codes is not None and len(codes) == len(column):
        return coded(column.strings, codes[index])
    return np.asarray(column)[index]


def lookup(column: Any, of: Callable[[Any], Any], dtype: Any) -> np.ndarray:
    """``of(item)`` for every item of ``column`` as an array of ``dtype``: once per distinct string of a ``Coded``
    column (its codes index the results), else once per item."""
    codes = getattr(column, "codes", None)
    if codes is not None and len(codes) == len(column):
        return np.array([of(s) for s in column.strings], dtype=dtype)[codes]
    return np.array([of(x) for x in np.asarray(column, dtype=object).tolist()], dtype=dtype).reshape(-1)
