"""Compare two traces, as HolisticTraceAnalysis's trace diff does: what changed from run ``a`` to run ``b``.

``compare(a, b)`` takes two ``Trace`` objects (recorded, built with ``Trace.from_records`` or read by
``gw.load_trace``) and gives a ``Comparison``: per device, the DESIGN §6 figures of each run (wall time of the window
W, overlap %, idle %, pipeline efficiency, from ``analysis.summarize``) and every kernel name's count and total time
on each side, marked added, removed, slower, faster or same, biggest change in total time first; where both traces
recorded source lines (``gw.trace(lines=True)``, ``%%gpu``), each line's device time on each side (``lines``, matched
by the line's text: ``compare_lines.py``). ``figure()`` lays the two timelines one above the other on one shared
time axis, each run's time counted from its own first span, so that two runs line up::

    diff = gw.compare(before, after, labels=("before", "after"))
    diff.table           # a pandas DataFrame (a dict of NumPy columns without pandas)
    diff.lines           # device time per source line in each run, the delta and ratio
    diff.figure()        # two timelines, one x range
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuworkbench._format import duration_ns
from gpuworkbench.errors import InvalidArgument

from .analysis import Summary, summarize
from .compare_lines import empty_line_changes, line_change_columns, line_changes_section
from .recorder import Trace, pictures
from .statistics import SHOWN_ROWS, Section, factorize, frame, kernel_columns

#: Columns of ``Comparison.table``, in order.
COLUMNS = ("section", "device", "item", "change", "count_a", "count_b", "a", "b", "delta", "ratio", "unit")
#: The trace-level rows: (item, DeviceSummary attribute, unit, word when b's value is higher, word when lower).
METRICS: tuple[tuple[str, str, str, str, str], ...] = (
    ("wall time", "window_ns", "ns", "slower", "faster"),
    ("overlap %", "overlap_pct", "%", "higher", "lower"),
    ("idle %", "idle_pct", "%", "higher", "lower"),
    ("pipeline efficiency", "pipeline_efficiency", "", "higher", "lower"),
)
#: What ``change`` says of a kernel row.
KERNEL_CHANGES = ("added", "removed", "slower", "faster", "same")


class Comparison:
    """What changed from trace ``a`` to trace ``b``: ``table`` (see ``compare``), ``lines``, ``summaries`` and
    ``figure()``.

    ``table`` has a row per (device, figure) in section "trace", then a row per (device, kernel name) in section
    "kernel", those sorted by |delta| of total time. ``a`` and ``b`` hold each side's value (ns, %, or a 0–1 ratio:
    ``unit`` says which; NaN where a side lacks it), ``delta`` = b − a, ``ratio`` = b / a (NaN when a is 0), and
    ``count_a`` / ``count_b`` the kernels' instances (−1 on trace rows).

    ``lines`` has a row per source line either trace ran device work from (``compare_lines.LINE_CHANGE_COLUMNS``):
    its line number in each (−1 where absent), text, ops and device time in each, ``delta_ns`` = b − a and ``ratio``
    = b / a, by |delta_ns| first; no rows unless both traces recorded lines.
    """

    def __init__(
        self,
        traces: tuple[Trace, Trace],
        tables: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]],
        labels: tuple[str, str],
        columns: Mapping[str, np.ndarray],
        summaries: tuple[Summary, Summary],
        lines: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.traces, self.labels, self.summaries = traces, labels, summaries
        self._tables = tables
        self._columns = dict(columns)
        self.table = frame(self._columns)
        self._lines = dict(lines) if lines is not None else empty_line_changes()
        self.lines = frame(self._lines)

    @property
    def unchanged(self) -> bool:
        """True when no figure and no kernel changed (comparing a trace with itself, say)."""
        change = self._columns["change"]
        return bool(np.all((change == "same") | (change == "n/a")))

    def changes(self, section: str = "kernel") -> dict[str, int]:
        """How many rows of ``section`` ("kernel" or "trace") say each change."""
        mine = self._columns["change"][self._columns["section"] == section]
        names, counts = np.unique(mine.astype(str), return_counts=True)
        return {str(n): int(c) for n, c in zip(names, counts)}

    def _sections(self) -> list[Section]:
        a, b = self.labels
        cols = self._columns
        trace_rows = np.flatnonzero(cols["section"] == "trace")
        several = len(set(cols["device"][trace_rows].tolist())) > 1
        rows = [
            [(f"device {cols['device'][i]} · " if several else "") + str(cols["item"][i])]
            + [_value(cols["a"][i], cols["unit"][i]), _value(cols["b"][i], cols["unit"][i])]
            + [_value(cols["delta"][i], cols["unit"][i], signed=True), _ratio(cols["ratio"][i]), str(cols["change"][i])]
            for i in trace_rows
        ]
        sections = [Section(f"{a} → {b}", ["figure", a, b, "delta", "ratio", "change"], rows, "no spans in either")]
        kernel_rows = np.flatnonzero(cols["section"] == "kernel")
        changed = kernel_rows[cols["change"][kernel_rows] != "same"]
        same = kernel_rows.size - changed.size
        rows = [
            [str(cols["item"][i]), str(cols["change"][i])]
            + [_count(cols["count_a"][i]), _count(cols["count_b"][i])]
            + [duration_ns(cols["a"][i]), duration_ns(cols["b"][i]), _value(cols["delta"][i], "ns", signed=True)]
            + [_ratio(cols["ratio"][i])]
            + ([f"device {cols['device'][i]}"] if several else [])
            for i in changed[:SHOWN_ROWS]
        ]
        headers = ["kernel", "change", f"count {a}", f"count {b}", f"total {a}", f"total {b}", "delta", "ratio"]
        title = f"kernels that changed ({changed.size} of {kernel_rows.size}; {same} the same)"
        note = "no kernel changed" if kernel_rows.size else "no kernels in either"
        more = changed.size - len(rows)
        sections.append(Section(title, headers + (["device"] if several else []), rows, note, more))
        if len(self._lines["delta_ns"]):
            sections.append(line_changes_section(self._lines, self.labels))
        return sections

    def __str__(self) -> str:
        return "\n\n".join(section.text() for section in self._sections())

    def _repr_html_(self) -> str:
        tables = "".join(section.html() for section in self._sections())
        return f"<div class='gpuworkbench-comparison'>{tables}</div>"

    def __repr__(self) -> str:
        kernels = self.changes("kernel")
        told = ", ".join(f"{kernels[c]} {c}" for c in KERNEL_CHANGES if kernels.get(c)) or "no kernels"
        return f"<Comparison {self.labels[0]!r} → {self.labels[1]!r}: {told}>"

    def figure(self, width: int = 1000, row_px: int = 26) -> Any:
        """The two timelines one above the other (Bokeh ``column``) on one shared x range, each in ms from its own
        first span; panning or zooming one moves both. Drawn by ``viz/compare.py``: the tracer itself draws nothing."""
        return pictures().comparison_figure(self.traces, self._tables, self.labels, width=width, row_px=row_px)


def _value(value: float, unit: str, signed: bool = False) -> str:
    if np.isnan(value):
        return "n/a"
    sign = "+" if signed and value > 0 else ""
    if unit == "ns":
        return sign + duration_ns(value)
    if unit == "%":
        return f"{sign}{value:.1f} %"
    return f"{sign}{value:.2f}"


def _ratio(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{value:.2f}×"


def _count(value: int) -> str:
    return "" if value < 0 else str(value)


def _check(what: str, value: Any) -> Trace:
    if not isinstance(value, Trace):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InvalidArgument(
            f"compare(a, b) takes two gpuworkbench Traces; {what} is a {type(value).__name__} ({shown}). "
            "Record one with `with gw.trace() as t:`, read a file with gw.load_trace(path), "
            "or build one with Trace.from_records(...)"
        )
    return value


def _labels(labels: Sequence[str]) -> tuple[str, str]:
    if isinstance(labels, str) or len(labels) != 2:
        raise InvalidArgument(f"labels must be two names, one per trace, such as ('before', 'after'); got {labels!r}")
    return str(labels[0]), str(labels[1])


def _ratio_of(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(b, a, out=np.full(a.size, np.nan), where=(a != 0) & ~np.isnan(a) & ~np.isnan(b))


def _metric_rows(summaries: tuple[Summary, Summary]) -> dict[str, np.ndarray]:
    """The trace-level rows: each METRICS figure of each device either trace has, NaN where a side lacks it."""
    devices = sorted(set(summaries[0].devices) | set(summaries[1].devices))
    device, item, unit, up, down, a, b = [], [], [], [], [], [], []
    for d in devices:
        for name, attribute, what, higher, lower in METRICS:
            sides = []
            for summary in summaries:
                ds = summary.devices.get(d)
                value = None if ds is None else getattr(ds, attribute)
                sides.append(np.nan if value is None else float(value))
            device.append(d)
            item.append(name)
            unit.append(what)
            up.append(higher)
            down.append(lower)
            a.append(sides[0])
            b.append(sides[1])
    a_values, b_values = np.array(a, np.float64), np.array(b, np.float64)
    delta = b_values - a_values
    missing = np.isnan(delta)
    change = np.where(missing, "n/a", np.where(delta > 0, up, np.where(delta < 0, down, "same")))
    n = len(device)
    return {
        "section": np.full(n, "trace", dtype=object),
        "device": np.array(device, np.int64),
        "item": np.array(item, dtype=object),
        "change": change.astype(object),
        "count_a": np.full(n, -1, np.int64),
        "count_b": np.full(n, -1, np.int64),
        "a": a_values,
        "b": b_values,
        "delta": delta,
        "ratio": _ratio_of(a_values, b_values),
        "unit": np.array(unit, dtype=object),
    }


def _kernel_rows(kernels: tuple[Mapping[str, Any], Mapping[str, Any]], tolerance: float) -> dict[str, np.ndarray]:
    """A row per (device, kernel name) either side ran: counts and totals of each, the change, by |delta| first."""
    codes, names = factorize(np.concatenate([kernels[0]["name"], kernels[1]["name"]]))
    width = max(names.size, 1)
    split = np.split(codes, [len(kernels[0]["name"])])
    keys = [side["device"].astype(np.int64) * width + code for side, code in zip(kernels, split)]
    every = np.union1d(keys[0], keys[1])
    count, total = [], []
    for side, key in zip(kernels, keys):
        at = np.searchsorted(every, key)  # each side's keys are unique: one row per (device, name)
        n = np.zeros(every.size, np.int64)
        t = np.zeros(every.size, np.float64)
        n[at], t[at] = side["count"], side["total_ns"]
        count.append(n)
        total.append(t)
    delta = total[1] - total[0]
    ratio = _ratio_of(total[0], total[1])
    added, removed = (count[0] == 0) & (count[1] > 0), (count[0] > 0) & (count[1] == 0)
    same = ~added & ~removed & (np.abs(delta) <= tolerance * np.abs(total[0]))
    change = np.select([added, removed, same, delta > 0], ["added", "removed", "same", "slower"], "faster")
    columns = {
        "section": np.full(every.size, "kernel", dtype=object),
        "device": every // width,
        "item": names[every % width],
        "change": change.astype(object),
        "count_a": count[0],
        "count_b": count[1],
        "a": total[0],
        "b": total[1],
        "delta": delta,
        "ratio": ratio,
        "unit": np.full(every.size, "ns", dtype=object),
    }
    order = np.lexsort((columns["item"].astype(str), columns["device"], -np.abs(delta)))
    return {name: values[order] for name, values in columns.items()}


def compare(a: Trace, b: Trace, labels: Sequence[str] = ("a", "b"), tolerance: float = 0.0) -> Comparison:
    """What changed from trace ``a`` to trace ``b``: wall time, overlap %, idle %, pipeline efficiency, and kernels
    added, removed, slower or faster by total time, and where both recorded source lines, each line's device time
    (see ``Comparison``). Waits for pending spans of stopped traces.

    ``tolerance``: a kernel whose total changed by at most this fraction of a's counts as "same" (0: any change).
    """
    traces = (_check("a", a), _check("b", b))
    labels = _labels(labels)
    if not tolerance >= 0:
        raise InvalidArgument(f"tolerance is a fraction of a's total time, 0 or more; got {tolerance!r}")
    tables = (a.table(), b.table())
    summaries = (summarize(tables[0]), summarize(tables[1]))
    metrics = _metric_rows(summaries)
    kernels = _kernel_rows((kernel_columns(tables[0]), kernel_columns(tables[1])), tolerance)
    columns = {name: np.concatenate([metrics[name], kernels[name]]) for name in COLUMNS}
    locations = [None if t.lines is None else t.locations for t in traces]
    lines = line_change_columns(tables, locations)
    return Comparison(traces, tables, labels, columns, summaries, lines)
