"""Device time per source line in two traces, matched line to line: ``Comparison.lines`` (see ``compare.py``).

Two runs of a cell have different cell file names, and a line may move when one is added above it, so lines are
matched by their text: key = (stripped source text, the line's place among the lines of its file with that text).
Where the text is unknown (empty), by (file, line) instead; the device work without a location ("(unknown)", line 0)
matches the other side's. A line only one trace has gets 0 ops and 0 ns (and line −1) on the other side.
"""

from __future__ import annotations

import linecache
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuworkbench._format import duration_ns

from .line_stats import UNKNOWN, line_columns
from .lines import Location
from .statistics import Section

#: Columns of ``Comparison.lines``, in order.
LINE_CHANGE_COLUMNS = ("line_a", "line_b", "source", "ops_a", "ops_b", "time_a_ns", "time_b_ns", "delta_ns", "ratio")
#: Rows of the lines table shown in the comparison's text and HTML (the table holds them all).
SHOWN_LINES = 10

Key = tuple[Any, ...]


def line_change_columns(
    tables: Sequence[Mapping[str, np.ndarray]], locations: Sequence[Sequence[Location] | None]
) -> dict[str, np.ndarray]:
    """Each source line either trace ran device work from (``LINE_CHANGE_COLUMNS``), by |delta_ns| descending.

    ``locations[i]`` is trace i's (what its ``loc`` column points into), None where it recorded no lines: then the
    table is empty, as there is nothing to match."""
    if any(locs is None for locs in locations):
        return empty_line_changes()
    sides = []
    for table, locs in zip(tables, locations):
        lines = line_columns(table, locs)
        sides.append((lines, {key: i for i, key in enumerate(_keys(lines, locs))}))
    keys = list(dict.fromkeys(key for _, index in sides for key in index))
    n = len(keys)
    out: dict[str, Any] = {c: np.zeros(n, np.int64) for c in LINE_CHANGE_COLUMNS if c not in ("source", "ratio")}
    out["source"] = np.full(n, "", dtype=object)
    for suffix, (lines, index) in reversed(list(zip("ab", sides))):  # a's text last: it wins where both have it
        out[f"line_{suffix}"][:] = -1
        for row, key in enumerate(keys):
            i = index.get(key)
            if i is None:
                continue
            out[f"line_{suffix}"][row] = lines["line"][i]
            out[f"ops_{suffix}"][row] = lines["ops"][i]
            out[f"time_{suffix}_ns"][row] = lines["device_time_ns"][i]
            out["source"][row] = UNKNOWN if lines["file"][i] == UNKNOWN else str(lines["source"][i]).strip()
    out["delta_ns"] = out["time_b_ns"] - out["time_a_ns"]
    a, b = out["time_a_ns"].astype(np.float64), out["time_b_ns"].astype(np.float64)
    out["ratio"] = np.divide(b, a, out=np.full(n, np.nan), where=a != 0)
    order = np.lexsort((out["line_a"], out["line_b"], -np.maximum(a, b), -np.abs(out["delta_ns"])))
    return {c: out[c][order] for c in LINE_CHANGE_COLUMNS}


def empty_line_changes() -> dict[str, np.ndarray]:
    """The lines table with no rows (a trace that recorded no lines)."""
    kinds = {"source": object, "ratio": np.float64}
    return {c: np.zeros(0, kinds.get(c, np.int64)) for c in LINE_CHANGE_COLUMNS}


def _keys(lines: Mapping[str, np.ndarray], locations: Sequence[Location]) -> list[Key]:
    """The matching key of each row of a ``line_columns`` table (see the module's docstring).

    The place among equal lines is counted in the file's text where ``linecache`` has it (so that a line that issued
    no work does not shift the next), else among the table's rows. Two files with an equal line at the same place
    (a cell and a helper module) stay apart: the later file, in the order the trace met them, counts one more."""
    files = {f: i for i, f in enumerate(dict.fromkeys(loc.file for loc in locations))}
    order = sorted(range(len(lines["line"])), key=lambda i: (files.get(lines["file"][i], len(files)), lines["line"][i]))
    texts: dict[str, list[str]] = {}
    seen: dict[tuple[str, str], int] = {}  # (file, text) -> rows met, for files linecache cannot read
    taken: dict[Key, int] = {}
    keys: list[Key] = [()] * len(order)
    for i in order:
        file, line, text = str(lines["file"][i]), int(lines["line"][i]), str(lines["source"][i]).strip()
        if not text:
            keys[i] = ("at", file, line)
            continue
        if file not in texts:
            texts[file] = [t.strip() for t in linecache.getlines(file)]
        mine = texts[file]
        if 0 < line <= len(mine) and mine[line - 1] == text:
            place = mine[: line - 1].count(text)
        else:
            place = seen.get((file, text), 0)
        seen[(file, text)] = seen.get((file, text), 0) + 1
        key = ("text", text, place)
        repeat = taken.get(key, 0)
        taken[key] = repeat + 1
        keys[i] = (*key, repeat)
    return keys


def line_changes_section(columns: Mapping[str, np.ndarray], labels: tuple[str, str]) -> Section:
    """The "lines that changed" section of a comparison's text and HTML: the first ``SHOWN_LINES`` rows that
    changed, biggest change first."""
    a, b = labels
    changed = np.flatnonzero(columns["delta_ns"] != 0)
    total = len(columns["delta_ns"])
    rows = [
        [_source(columns["source"][i], columns["line_a"][i], columns["line_b"][i])]
        + [_line(columns["line_a"][i]), _line(columns["line_b"][i])]
        + [str(columns["ops_a"][i]), str(columns["ops_b"][i])]
        + [duration_ns(columns["time_a_ns"][i]), duration_ns(columns["time_b_ns"][i])]
        + [("+" if columns["delta_ns"][i] > 0 else "") + duration_ns(columns["delta_ns"][i])]
        + ["n/a" if np.isnan(columns["ratio"][i]) else f"{columns['ratio'][i]:.2f}×"]
        for i in changed[:SHOWN_LINES]
    ]
    headers = ["source", f"line {a}", f"line {b}", f"ops {a}", f"ops {b}", f"time {a}", f"time {b}", "delta", "ratio"]
    title = f"lines that changed ({changed.size} of {total}; {total - changed.size} the same)"
    return Section(title, headers, rows, "no line changed", changed.size - len(rows))


def _line(value: int) -> str:
    return "" if value < 0 else str(value)


def _source(text: str, line_a: int, line_b: int) -> str:
    return text or f"(line {max(line_a, line_b)}: text unknown)"
