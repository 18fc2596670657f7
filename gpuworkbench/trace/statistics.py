"""Statistics tables of a trace, as ``nsys stats`` and HolisticTraceAnalysis give them.

``statistics(table)`` (``Trace.statistics()`` on a trace) counts what ran: kernels grouped by name (count, total, mean,
min, max, and their share of device time), copies grouped by direction and host memory kind plus memsets (count,
bytes, time, bandwidth), host API calls grouped by name, launch latency (start − enqueue) of device work, and host
ranges by name with the device work enqueued inside them (``range_stats.py``). Device
time is the union of all device work on a device (DESIGN §6: never a sum across streams), so a kernel's share is the
time at least one instance of it ran over the time the device ran anything, and is at most 100 %. Host kinds
(alloc, free, marker, api, range) never count as device time. Every grouping is vectorised (a sort and
``np.add.reduceat``), so a 10^6-span trace takes a fraction of a second::

    stats = t.statistics()
    stats.kernels        # a pandas DataFrame (a dict of NumPy columns without pandas)
    stats                # in a notebook: the tables as HTML; print(stats) for text
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuworkbench._format import decimal_bytes, duration_ns, gbps, percent
from gpuworkbench.errors import InvalidArgument

from .analysis.intervals import total_length, union
from .codes import factorize
from .device_limits import DeviceLimits, limits_of
from .kernel_shapes import SHAPE_COLUMNS, shape_columns
from .line_stats import empty_lines, line_columns
from .lines import Location, short_file
from .range_stats import empty_ranges, range_columns
from .spans import HOST_KINDS, KIND_CODE, KINDS

#: Columns of each table, in order.
KERNEL_COLUMNS = ("device", "name", "count", "total_ns", "mean_ns", "min_ns", "max_ns", "busy_ns", "device_time_pct",
                  *SHAPE_COLUMNS)  # fmt: skip
COPY_COLUMNS = ("device", "kind", "memory", "count", "bytes", "total_ns", "mean_ns", "gbps")
API_COLUMNS = ("name", "count", "total_ns", "mean_ns", "min_ns", "max_ns")
LAUNCH_COLUMNS = ("device", "kind", "count", "median_ns", "p95_ns", "max_ns")

#: Host memory of a copy, by the ``pinned`` column (1, 0, -1); "n/a" for device-to-device copies and memsets.
MEMORY_KINDS: tuple[str, ...] = ("pinned", "pageable", "unknown", "n/a")
#: Rows shown per table in ``str()`` and HTML (the tables themselves hold every row).
SHOWN_ROWS = 40

_KERNEL = KIND_CODE["kernel"]
_API = KIND_CODE["api"]
_COPY_KINDS = ("h2d", "d2h", "d2d", "memset")
_COPY_CODES = np.array([KIND_CODE[k] for k in _COPY_KINDS])
_COPY_POSITION = np.full(len(KINDS), -1, np.int64)  # kind code -> its place in _COPY_KINDS
_COPY_POSITION[_COPY_CODES] = np.arange(len(_COPY_KINDS))
_IS_WORK = np.array([name not in HOST_KINDS for name in KINDS])
_REQUIRED = ("kind", "device", "start_ns", "end_ns", "enqueue_ns", "bytes", "name", "pinned")


# --- grouping -------------------------------------------------------------------------------------------------------


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``order`` sorting ``keys`` (stable), the first position in that order of each group, and each group's key."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first = np.flatnonzero(np.append(True, ordered[1:] != ordered[:-1])) if ordered.size else np.zeros(0, np.intp)
    return order, first, ordered[first]


def _aggregate(durations: np.ndarray, order: np.ndarray, first: np.ndarray) -> dict[str, np.ndarray]:
    """count, total, mean, min and max of ``durations`` per group (exact int64 sums)."""
    if first.size == 0:
        zeros = np.zeros(0, np.int64)
        return {"count": zeros, "total_ns": zeros, "mean_ns": np.zeros(0), "min_ns": zeros, "max_ns": zeros}
    ordered = durations[order]
    count = np.diff(np.append(first, ordered.size))
    total = np.add.reduceat(ordered, first)
    return {
        "count": count.astype(np.int64),
        "total_ns": total,
        "mean_ns": total / count,
        "min_ns": np.minimum.reduceat(ordered, first),
        "max_ns": np.maximum.reduceat(ordered, first),
    }


def _busy_per_group(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int) -> np.ndarray:
    """|union of each group's intervals| (ns), for groups numbered 0 .. n_groups − 1.

    Each group is lifted by ``group · span`` (span > the whole time range), so one sort orders by group then start
    and one running maximum merges the intervals without reaching from a group into the next. Where that would
    overflow int64 (traces of days with many groups), a sweep sorted by (group, time) does the same more slowly.
    """
    busy = np.zeros(n_groups, np.int64)
    if group.size == 0:
        return busy
    origin = int(start.min())
    span = int(end.max()) - origin + 1
    if span * n_groups >= 1 << 62:
        return _busy_by_sweep(group, start, end, n_groups)
    lift = group.astype(np.int64) * span - origin
    starts, ends = start + lift, end + lift
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.append(True, starts[1:] > reach[:-1]))
    last = np.append(first[1:] - 1, starts.size - 1)
    np.add.at(busy, group[order][first], reach[last] - starts[first])
    return busy


def _busy_by_sweep(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int) -> np.ndarray:
    """``_busy_per_group`` by a sweep of starts (+1) and ends (−1) sorted by group, then time.

    A group's count returns to 0 at its last end, so the running sum never carries from one group into the next.
    """
    times = np.concatenate([start, end])
    groups = np.concatenate([group, group])
    steps = np.concatenate([np.ones(start.size, np.int64), -np.ones(end.size, np.int64)])
    order = np.lexsort((times, groups))
    times, groups, depth = times[order], groups[order], np.cumsum(steps[order])
    covered = (depth[:-1] > 0) & (groups[1:] == groups[:-1])
    busy = np.zeros(n_groups, np.int64)
    np.add.at(busy, groups[:-1][covered], (times[1:] - times[:-1])[covered])
    return busy


def device_time_ns(table: Mapping[str, np.ndarray]) -> dict[int, int]:
    """|A| per device: the union of all device work (host kinds excluded), the denominator of a kernel's share."""
    kind = np.asarray(table["kind"])
    work = _IS_WORK[kind] if kind.size else np.zeros(0, bool)
    device = np.asarray(table["device"])[work]
    start = np.asarray(table["start_ns"], np.int64)[work]
    end = np.asarray(table["end_ns"], np.int64)[work]
    return {int(d): total_length(union(start[device == d], end[device == d])) for d in np.unique(device)}


# --- the tables -----------------------------------------------------------------------------------------------------


def kernel_columns(
    table: Mapping[str, np.ndarray],
    device_ns: Mapping[int, int] | None = None,
    limits: Mapping[int, DeviceLimits | None] | None = None,
) -> dict[str, Any]:
    """Kernels grouped by (device, name) as NumPy columns (``KERNEL_COLUMNS``), by device, then total descending;
    each with its most common launch shape and the theoretical occupancy it allows on a device of known ``limits``
    (``kernel_shapes.py``)."""
    kind = np.asarray(table["kind"])
    rows = np.flatnonzero(kind == _KERNEL)
    device = np.asarray(table["device"], np.int64)[rows]
    start = np.asarray(table["start_ns"], np.int64)[rows]
    end = np.asarray(table["end_ns"], np.int64)[rows]
    codes, names = factorize(np.asarray(table["name"], dtype=object)[rows])
    order, first, keys = _groups(device * max(names.size, 1) + codes)
    out: dict[str, Any] = {"device": keys // max(names.size, 1), "name": names[keys % max(names.size, 1)]}
    out |= _aggregate(end - start, order, first)
    group = np.empty(rows.size, np.intp)
    group[order] = np.repeat(np.arange(first.size), out["count"])
    out["busy_ns"] = _busy_per_group(group, start, end, first.size)
    if device_ns is None:
        device_ns = device_time_ns(table)
    whole = np.array([device_ns.get(int(d), 0) for d in out["device"]], np.float64)
    out["device_time_pct"] = np.divide(100.0 * out["busy_ns"], whole, out=np.full(first.size, np.nan), where=whole > 0)
    out |= shape_columns(table, rows, group, order, first, out["device"], limits)
    return _sorted(out, out["device"], -out["total_ns"], out["name"])


def copy_columns(table: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Copies grouped by (device, direction, host memory) and memsets by device, as NumPy columns (``COPY_COLUMNS``).

    ``gbps`` is bytes over the summed durations (bytes per ns = GB/s); NaN when they took no time.
    """
    kind = np.asarray(table["kind"])
    rows = np.flatnonzero(np.isin(kind, _COPY_CODES))
    kind = kind[rows].astype(np.int64)
    device = np.asarray(table["device"], np.int64)[rows]
    pinned = np.asarray(table["pinned"], np.int64)[rows]
    host_side = (kind == KIND_CODE["h2d"]) | (kind == KIND_CODE["d2h"])
    memory = np.where(host_side, np.select([pinned == 1, pinned == 0], [0, 1], 2), 3)
    order, first, keys = _groups((device * len(_COPY_KINDS) + _COPY_POSITION[kind]) * len(MEMORY_KINDS) + memory)
    durations = np.asarray(table["end_ns"], np.int64)[rows] - np.asarray(table["start_ns"], np.int64)[rows]
    stats = _aggregate(durations, order, first)
    nbytes = np.asarray(table["bytes"], np.int64)[rows][order]
    nbytes = np.add.reduceat(nbytes, first) if first.size else np.zeros(0, np.int64)
    total = stats["total_ns"]
    return {
        "device": keys // (len(_COPY_KINDS) * len(MEMORY_KINDS)),
        "kind": np.array(_COPY_KINDS, dtype=object)[(keys // len(MEMORY_KINDS)) % len(_COPY_KINDS)],
        "memory": np.array(MEMORY_KINDS, dtype=object)[keys % len(MEMORY_KINDS)],
        "count": stats["count"],
        "bytes": nbytes.astype(np.int64),
        "total_ns": total,
        "mean_ns": stats["mean_ns"],
        "gbps": np.divide(nbytes, total, out=np.full(total.size, np.nan), where=total > 0),
    }


def api_columns(table: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Host API calls (kind ``api``) grouped by name as NumPy columns (``API_COLUMNS``), total descending."""
    rows = np.flatnonzero(np.asarray(table["kind"]) == _API)
    codes, names = factorize(np.asarray(table["name"], dtype=object)[rows])
    order, first, keys = _groups(codes)
    durations = np.asarray(table["end_ns"], np.int64)[rows] - np.asarray(table["start_ns"], np.int64)[rows]
    out: dict[str, Any] = {"name": names[keys]} | _aggregate(durations, order, first)
    return _sorted(out, -out["total_ns"], out["name"])


def launch_columns(table: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Launch latency (start − enqueue, ns) of device work whose enqueue time is known, per (device, kind)."""
    kind = np.asarray(table["kind"])
    enqueue = np.asarray(table["enqueue_ns"], np.int64)
    rows = np.flatnonzero(_IS_WORK[kind] & (enqueue >= 0)) if kind.size else np.zeros(0, np.intp)
    latency = np.asarray(table["start_ns"], np.int64)[rows] - enqueue[rows]
    order, first, keys = _groups(np.asarray(table["device"], np.int64)[rows] * len(KINDS) + kind[rows])
    ordered = latency[order]
    bounds = np.append(first, ordered.size)
    median, p95 = np.zeros(first.size), np.zeros(first.size)
    for i in range(first.size):  # one step per (device, kind): a handful, never one per span
        median[i], p95[i] = np.percentile(ordered[bounds[i] : bounds[i + 1]], [50, 95])
    return {
        "device": keys // len(KINDS),
        "kind": np.array(KINDS, dtype=object)[keys % len(KINDS)],
        "count": np.diff(bounds).astype(np.int64),
        "median_ns": median,
        "p95_ns": p95,
        "max_ns": np.maximum.reduceat(ordered, first) if first.size else np.zeros(0, np.int64),
    }


def _sorted(columns: dict[str, Any], *keys: np.ndarray) -> dict[str, Any]:
    """The columns reordered by ``keys`` (the first key most significant)."""
    if not columns or len(keys[0]) == 0:
        return columns
    order = np.lexsort(tuple(np.asarray(k) if k.dtype != object else _rank(k) for k in reversed(keys)))
    return {name: values[order] for name, values in columns.items()}


def _rank(values: np.ndarray) -> np.ndarray:
    """Sort ranks of an object array of strings (few distinct values: these are group names)."""
    ranks = np.empty(values.size, np.intp)
    ranks[np.argsort(values.astype(str), kind="stable")] = np.arange(values.size)
    return ranks


def frame(columns: Mapping[str, Any]) -> Any:
    """A pandas DataFrame of ``columns`` when pandas is installed, else the dict of NumPy columns itself."""
    try:
        import pandas as pd
    except ImportError:
        return dict(columns)
    return pd.DataFrame(dict(columns))


# --- the result -----------------------------------------------------------------------------------------------------


class Statistics:
    """A trace's statistics tables: ``kernels``, ``copies``, ``api``, ``launch_latency``, ``lines`` (device time
    per source line, where the trace recorded where ops came from: ``gw.trace(lines=True)``, ``%%gpu``) and
    ``ranges`` (host ranges by name, with the device work enqueued inside them: ``range_stats.py``).

    Each is a pandas DataFrame (a dict of NumPy columns without pandas); ``device_time_ns`` holds |A| per device,
    the denominator of ``kernels.device_time_pct``. A notebook shows the tables as HTML; ``str()`` as text.
    """

    def __init__(
        self,
        columns: Mapping[str, Mapping[str, Any]],
        device_time_ns: Mapping[int, int],
        spans: int,
        device_names: Mapping[int, str] | None = None,
    ) -> None:
        self._columns = {name: dict(cols) for name, cols in columns.items()}
        self.device_time_ns = dict(device_time_ns)
        self.spans = spans
        self.device_names = dict(device_names or {})
        self.kernels = frame(self._columns["kernels"])
        self.copies = frame(self._columns["copies"])
        self.api = frame(self._columns["api"])
        self.launch_latency = frame(self._columns["launch_latency"])
        self._columns.setdefault("lines", empty_lines())
        self.lines = frame(self._columns["lines"])
        self._columns.setdefault("ranges", empty_ranges())
        self.ranges = frame(self._columns["ranges"])

    @property
    def empty(self) -> bool:
        """True when the trace held no spans at all."""
        return self.spans == 0

    def _device(self, device: int) -> str:
        label, name = f"device {device}", self.device_names.get(device, "")
        return f"{label} ({name})" if name and name != label else label

    def _sections(self) -> list[Section]:
        """Every table formatted for reading: its first ``SHOWN_ROWS`` rows, and how many more it holds."""
        sections = []
        several = len(self.device_time_ns) > 1
        kernels = self._columns["kernels"]
        for device in sorted(self.device_time_ns):
            mine = np.flatnonzero(kernels["device"] == device)
            title = f"kernels on {self._device(device)}: device busy {duration_ns(self.device_time_ns[device])}"
            shown = mine[:SHOWN_ROWS]
            shapes = "block" in kernels and any(str(kernels["block"][i]) for i in shown)  # launch shapes known
            rows = [
                [str(kernels["name"][i]), str(kernels["count"][i])]
                + [duration_ns(kernels[c][i]) for c in ("total_ns", "mean_ns", "min_ns", "max_ns", "busy_ns")]
                + [percent(kernels["device_time_pct"][i])]
                + ([str(kernels["block"][i]), percent(float(kernels["occupancy_pct"][i]))] if shapes else [])
                for i in shown
            ]
            headers = ["name", "count", "total", "mean", "min", "max", "busy", "% of device time"]
            headers += ["block", "occupancy"] if shapes else []
            sections.append(Section(title, headers, rows, "no kernels", mine.size - len(rows)))
        if not self.device_time_ns:
            sections.append(Section("kernels", [], [], "no device work: no kernels"))
        copies = self._columns["copies"]
        rows = [
            ([self._device(int(copies["device"][i]))] if several else [])
            + [str(copies["kind"][i]), str(copies["memory"][i]), str(copies["count"][i])]
            + [decimal_bytes(int(copies["bytes"][i])), duration_ns(copies["total_ns"][i])]
            + [duration_ns(copies["mean_ns"][i]), gbps(copies["gbps"][i])]
            for i in range(min(len(copies["count"]), SHOWN_ROWS))
        ]
        headers = (["device"] if several else []) + ["kind", "memory", "count", "bytes", "total", "mean", "GB/s"]
        more = len(copies["count"]) - len(rows)
        sections.append(Section("copies and memsets", headers, rows, "no copies or memsets", more))
        api = self._columns["api"]
        rows = [
            [str(api["name"][i]), str(api["count"][i])]
            + [duration_ns(api[c][i]) for c in ("total_ns", "mean_ns", "min_ns", "max_ns")]
            for i in range(min(len(api["count"]), SHOWN_ROWS))
        ]
        headers = ["name", "count", "total", "mean", "min", "max"]
        sections.append(Section("host API calls", headers, rows, "no API calls", len(api["count"]) - len(rows)))
        launch = self._columns["launch_latency"]
        rows = [
            ([self._device(int(launch["device"][i]))] if several else [])
            + [str(launch["kind"][i]), str(launch["count"][i])]
            + [duration_ns(launch[c][i]) for c in ("median_ns", "p95_ns", "max_ns")]
            for i in range(len(launch["count"]))
        ]
        headers = (["device"] if several else []) + ["kind", "count", "median", "p95", "max"]
        sections.append(Section("launch latency (start − enqueue)", headers, rows, "no enqueue times recorded"))
        ranges = self._columns["ranges"]
        if len(ranges["name"]):
            rows = [
                [str(ranges["name"][i]), str(ranges["count"][i])]
                + [duration_ns(ranges[c][i]) for c in ("host_total_ns", "host_median_ns", "device_ns")]
                + [str(ranges[c][i]) for c in ("ops", "kernels", "copies")]
                for i in range(min(len(ranges["name"]), SHOWN_ROWS))
            ]
            headers = ["name", "count", "host total", "host median", "device time", "ops", "kernels", "copies"]
            title = "host ranges (device time: the work enqueued inside them)"
            sections.append(Section(title, headers, rows, "", len(ranges["name"]) - len(rows)))
        lines = self._columns["lines"]
        if len(lines["line"]):
            rows = [
                [f"{short_file(str(lines['file'][i]))}:{lines['line'][i]}", _clip(str(lines["source"][i]), 48)]
                + [str(lines[c][i]) for c in ("ops", "kernels", "copies")]
                + [duration_ns(lines["device_time_ns"][i]), percent(lines["share_pct"][i])]
                for i in range(min(len(lines["line"]), SHOWN_ROWS))
            ]
            headers = ["line", "source", "ops", "kernels", "copies", "device time", "share"]
            sections.append(Section("device time by source line", headers, rows, "", len(lines["line"]) - len(rows)))
        return sections

    def __str__(self) -> str:
        if self.empty:
            return "no spans traced: no kernels, copies or API calls to count"
        return "\n\n".join(section.text() for section in self._sections())

    def _repr_html_(self) -> str:
        if self.empty:
            return "<p>no spans traced: no kernels, copies or API calls to count</p>"
        tables = "".join(section.html() for section in self._sections())
        return f"<div class='gpuworkbench-statistics'>{tables}</div>"

    def __repr__(self) -> str:
        kernels = len(factorize(self._columns["kernels"]["name"])[1])
        return f"<Statistics: {self.spans} spans, {kernels} kernel names, {len(self.device_time_ns)} device(s)>"


def statistics(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    locations: Sequence[Location] | None = None,
    processes: Mapping[int, int] | None = None,
    limits: Mapping[int, DeviceLimits | None] | None = None,
) -> Statistics:
    """The statistics tables of a span table (``trace/spans.py`` columns); ``device_names`` label the devices;
    ``locations`` (the trace's, which the ``loc`` column points into): the lines table too; ``processes``: device ->
    the process driving it, where several did (the ranges table places ops of unknown thread by it); ``limits``:
    device -> its ``DeviceLimits``, for the kernels' theoretical occupancy."""
    missing = [col for col in _REQUIRED if col not in table]
    if missing:
        raise InvalidArgument(f"span table lacks column(s) {', '.join(missing)}; build it with trace.spans.empty_table")
    device_ns = device_time_ns(table)
    columns = {
        "kernels": kernel_columns(table, device_ns, limits),
        "copies": copy_columns(table),
        "api": api_columns(table),
        "launch_latency": launch_columns(table),
        "lines": empty_lines() if locations is None else line_columns(table, locations),
        "ranges": range_columns(table, processes),
    }
    return Statistics(columns, device_ns, len(table["kind"]), device_names)


def trace_statistics(trace: Any, processes: Mapping[int, int] | None = None) -> Statistics:
    """``Trace.statistics``: the tables of a whole trace (waits for pending spans once it stopped); ``processes``:
    device -> process, for a trace merged from several (``statistics``)."""
    names = {n: (c.name if c.source == "records" else c.key) for n, c in trace.devices.items()}
    locations = None if trace.lines is None else trace.locations
    return statistics(trace.table(), names, locations, processes, limits_of(trace.devices))


# --- rendering (shared with trace/compare.py) ------------------------------------------------------------------------


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class Section:
    """One titled table ready to print: formatted cells (the first column a name), ``note`` when it has no rows,
    and ``more``, the rows left out (tables show ``SHOWN_ROWS``; the DataFrames hold them all)."""

    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    note: str = "none"
    more: int = 0

    def text(self) -> str:
        """Plain text: the first column left-aligned and cut at 60 characters, the others right-aligned."""
        if not self.rows:
            return f"{self.title}\n  {self.note}"
        rows = [[_clip(row[0], 60), *row[1:]] for row in self.rows]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(self.headers)]

        def line(cells: Sequence[str]) -> str:
            cells = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
            return ("  " + "  ".join(cells)).rstrip()

        lines = [self.title, line(self.headers)] + [line(r) for r in rows]
        if self.more:
            lines.append(f"  … and {self.more} more rows (the table holds them all)")
        return "\n".join(lines)

    def html(self) -> str:
        """An HTML table with inline styles only (no external CSS); long names are cut, in full on hover."""
        caption = f"<h4 style='margin:0.8em 0 0.2em'>{html.escape(self.title)}</h4>"
        if not self.rows:
            return f"{caption}<p style='margin:0'>{html.escape(self.note)}</p>"
        right = "style='text-align:right;padding:1px 8px'"
        left = "style='text-align:left;padding:1px 8px'"
        head = f"<th {left}>{html.escape(self.headers[0])}</th>"
        head += "".join(f"<th {right}>{html.escape(h)}</th>" for h in self.headers[1:])
        body = "".join(
            f"<tr><td {left} title='{html.escape(row[0], quote=True)}'>{html.escape(_clip(row[0], 80))}</td>"
            + "".join(f"<td {right}>{html.escape(c)}</td>" for c in row[1:])
            + "</tr>"
            for row in self.rows
        )
        table = f"<table style='border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        if self.more:
            table += f"<p style='margin:0'>… and {self.more} more rows (the table holds them all)</p>"
        return caption + table
