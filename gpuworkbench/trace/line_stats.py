"""Device time per source line: the spans of a trace grouped by the line that issued them (``statistics().lines``).

A span's ``loc`` column points into the trace's locations (``lines.py``). Device work (kernels, copies, memsets) is
grouped by the location's line (file and line number): ``ops`` counts device work, ``kernels`` and ``copies`` split it,
``device_time_ns`` sums its durations (work on several streams at once counts once per op: this is what each line
asked of the device) and ``share_pct`` is that over the whole trace's sum. Spans without a location form one row
with ``line`` 0 and ``file`` "(unknown)", so the shares add up to 100 %.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .lines import Location
from .spans import HOST_KINDS, KIND_CODE, KINDS

LINE_COLUMNS = ("file", "line", "function", "source", "ops", "kernels", "copies", "device_time_ns", "share_pct")
UNKNOWN = "(unknown)"
_WORK = np.array([k not in HOST_KINDS for k in KINDS])
_KERNEL = KIND_CODE["kernel"]
_COPY = np.array([k in ("h2d", "d2h", "d2d") for k in KINDS])


def line_keys(locations: Sequence[Location]) -> tuple[np.ndarray, list[tuple[str, int, str, str]]]:
    """Each location's line (file, line, function, source) as a group number, and the groups (a loaded trace's
    locations of one line that differ by ``text``, the call each made, are groups of their own)."""
    groups: dict[tuple[str, int, str], int] = {}
    rows: list[tuple[str, int, str, str]] = []
    codes = np.empty(len(locations), np.int64)
    for i, loc in enumerate(locations):
        key = (loc.file, loc.line, loc.text)
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(rows)
            rows.append((loc.file, loc.line, loc.function, loc.source))
        codes[i] = g
    return codes, rows


def line_columns(table: Mapping[str, np.ndarray], locations: Sequence[Location]) -> dict[str, Any]:
    """The device work of ``table`` grouped by source line (``LINE_COLUMNS``), device time descending."""
    kind = np.asarray(table["kind"])
    work = _WORK[kind] if kind.size else np.zeros(0, bool)
    rows = np.flatnonzero(work)
    loc = np.asarray(table["loc"], np.int64)[rows] if "loc" in table else np.full(rows.size, -1, np.int64)
    codes, groups = line_keys(locations)
    group = np.where(loc >= 0, codes[np.clip(loc, 0, max(codes.size - 1, 0))] if codes.size else -1, -1)
    if (group < 0).any():
        groups = [*groups, (UNKNOWN, 0, "", "")]
        group = np.where(group < 0, len(groups) - 1, group)
    duration = (np.asarray(table["end_ns"], np.int64) - np.asarray(table["start_ns"], np.int64))[rows]
    n = len(groups)
    k = kind[rows]
    ops = np.bincount(group, minlength=n).astype(np.int64)
    kernels = np.bincount(group, weights=k == _KERNEL, minlength=n).astype(np.int64)
    copies = np.bincount(group, weights=_COPY[k], minlength=n).astype(np.int64)
    time = np.bincount(group, weights=duration, minlength=n).astype(np.int64)
    used = np.flatnonzero(ops > 0)
    total = int(time.sum())
    out = {
        "file": np.array([groups[g][0] for g in used], dtype=object),
        "line": np.array([groups[g][1] for g in used], np.int64),
        "function": np.array([groups[g][2] for g in used], dtype=object),
        "source": np.array([groups[g][3] for g in used], dtype=object),
        "ops": ops[used],
        "kernels": kernels[used],
        "copies": copies[used],
        "device_time_ns": time[used],
        "share_pct": 100.0 * time[used] / total if total else np.zeros(used.size),
    }
    order = np.lexsort((out["line"], -out["device_time_ns"]))
    return {c: v[order] for c, v in out.items()}


def empty_lines() -> dict[str, Any]:
    """The lines table with no rows (a trace without locations)."""
    text = ("file", "function", "source")
    return {c: np.zeros(0, object if c in text else np.float64 if c == "share_pct" else np.int64) for c in LINE_COLUMNS}
