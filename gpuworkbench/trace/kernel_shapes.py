"""How each kernel of ``statistics().kernels`` was launched: its most common launch shape (grid, block, registers
per thread, shared bytes per block) and the theoretical occupancy that shape allows on its device (``occupancy.py``).

A kernel name launched with several shapes (a library kernel over several sizes) shows the shape of most of its
launches (the first seen of equally common ones). Kernels of one shape each, the usual case, cost no sort; otherwise
one sort of a 64-bit mix of (kernel, shape) finds each kernel's most common shape (5·10^5 kernel spans of 50 names on
the 2-core development machine: 40 ms with one shape per kernel, 100 ms with seven).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .device_limits import DeviceLimits
from .occupancy import block_threads, occupancy
from .spans import unpack_dim3

#: The columns ``shape_columns`` adds to the kernels table, in order.
SHAPE_COLUMNS = ("grid", "block", "registers", "shared_bytes", "occupancy_pct")
#: Each launch column and what a table that lacks it holds.
_LAUNCH = {"grid": 0, "block": 0, "registers": -1, "shared_bytes": -1}


def dim_text(packed: int) -> str:
    """A packed grid or block as "x,y,z" ("" when unknown)."""
    xyz = unpack_dim3(packed)
    return "" if xyz is None else ",".join(map(str, xyz))


def shape_columns(
    table: Mapping[str, np.ndarray],
    rows: np.ndarray,
    group: np.ndarray,
    order: np.ndarray,
    first: np.ndarray,
    devices: np.ndarray,
    limits: Mapping[int, DeviceLimits | None] | None = None,
) -> dict[str, Any]:
    """``SHAPE_COLUMNS`` per kernel group. ``rows``: the table's kernel rows; ``group``: the group of each;
    ``order`` sorts them by group (stably), ``first`` is where each group starts in that order; ``devices``: each
    group's device. ``occupancy_pct`` is NaN where the device's ``limits`` or the shape's registers or shared bytes
    are not known."""
    n_groups = len(devices)
    if not rows.size:
        empty = {c: np.zeros(0, np.int64) for c in ("registers", "shared_bytes")}
        return {"grid": np.zeros(0, object), "block": np.zeros(0, object), **empty, "occupancy_pct": np.zeros(0)}
    values = {c: np.asarray(table[c], np.int64)[rows] if c in table else np.full(rows.size, d, np.int64)
              for c, d in _LAUNCH.items()}  # fmt: skip
    counts = np.diff(np.append(first, rows.size))
    ordered = [v[order] for v in values.values()]
    if all(np.array_equal(v, np.repeat(v[first], counts)) for v in ordered):
        best = order[first]  # the usual case: one shape per kernel, no sort needed
    else:
        best = _most_common(np.asarray(group, np.int64), list(values.values()), n_groups)
    shape = {c: v[best] for c, v in values.items()}
    pct = np.full(n_groups, np.nan)
    for device, device_limits in (limits or {}).items():
        mine = np.flatnonzero(np.asarray(devices) == device)
        if device_limits is not None and mine.size:
            threads = block_threads(shape["block"][mine])
            pct[mine] = occupancy(threads, shape["registers"][mine], shape["shared_bytes"][mine], device_limits).pct
    return {
        "grid": np.array([dim_text(g) for g in shape["grid"].tolist()], dtype=object),
        "block": np.array([dim_text(b) for b in shape["block"].tolist()], dtype=object),
        "registers": shape["registers"],
        "shared_bytes": shape["shared_bytes"],
        "occupancy_pct": pct,
    }


def _most_common(group: np.ndarray, columns: list[np.ndarray], n_groups: int) -> np.ndarray:
    """Per group, the first row of its most common combination of ``columns``' values (the earliest of equally
    common ones)."""
    first, inverse = distinct_rows([group, *columns])
    counts = np.bincount(inverse, minlength=first.size)
    owner = group[first]
    pick = np.lexsort((first, -counts, owner))  # by group, most common first, then the earliest
    head = pick[np.flatnonzero(np.append(True, owner[pick][1:] != owner[pick][:-1]))]
    best = np.zeros(n_groups, np.int64)
    best[owner[head]] = first[head]
    return best


def distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The first row of each distinct combination of the int64 ``columns``' values (rows in order of that first
    row's place in the sort) and each row's combination: one sort of a 64-bit mix of them, checked against each mix's
    first row; a sort of the rows themselves where two combinations mix alike."""
    mixed = np.zeros(columns[0].size, np.uint64)
    for column, factor in zip(columns, _FACTORS):
        mixed = (mixed ^ column.astype(np.uint64)) * factor  # wraps: a hash, checked below
    _, first, inverse = np.unique(mixed, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if all(np.array_equal(column, column[first][inverse]) for column in columns):
        return first, inverse
    _, first, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


#: Odd 64-bit multipliers of ``distinct_rows``' mix (splitmix64's and xxhash's), one per column (five at most).
_FACTORS = tuple(
    np.uint64(f)
    for f in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93, 0xC2B2AE3D27D4EB4F)
)
