"""The timeline's data: rows in their order, span styles, launch links, and the column data of spans, state segments,
compact arrays and aggregated cells, all NumPy from the span table (the figures are ``timeline.py``'s)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuworkbench.trace.analysis import STATE_OF_MASK, STATES, state_segments
from gpuworkbench.trace.codes import factorize
from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.lines import Location, short_file
from gpuworkbench.trace.spans import HOST_KINDS, HOST_STREAM, KIND_CODE, KINDS

from .coded import coded, lookup
from .palette import HOST_WAIT, STATE_COLORS, STYLE_COLORS, STYLES
from .timeline_launch import launch_text

#: Above this many spans the figure draws with WebGL (canvas becomes slow to pan around 10^4 bars).
WEBGL_THRESHOLD = 5_000
#: Above this many spans (or state segments) the document carries them compactly and the browser draws those in view:
#: the spans themselves when at most this many are visible, otherwise cells per (row, pixel column).
DETAIL_LIMIT = 20_000
#: API calls that block the calling thread until the device catches up: synchronizes, blocking copies, frees.
HOST_WAIT_PATTERN = re.compile(
    r"synchroni[sz]e|^(?:cu|cuda|hip)memcpy(?!.*async)|^(?:cu|cuda|hip)(?:mem)?free(?:_v\d)?$", re.I
)
#: What a device span launched from the workbench's own row (no API call of the trace) is said to be launched by.
ENQUEUE = "enqueue (workbench)"
#: All colour keys of the drawn sources: span styles, then states (state segments ride along in the compact arrays).
ALL_STYLES: tuple[str, ...] = (*STYLES, *STATES)
LINK_COLOR = "#e7298a"
#: Width of a cell of a zoomed-out large timeline in pixels (1: one per pixel column; 2 halves what the browser draws).
CELL_PX = 2
#: Busy fractions are drawn in this many steps of opacity; neighbouring cells in the same step merge into one bar.
BUSY_STEPS = 8
#: The colour of every key in ``ALL_STYLES``.
ALL_COLORS: dict[str, str] = {**STYLE_COLORS, **STATE_COLORS}
#: The columns of the span, state and cell sources (``span_columns``, ``state_columns``, ``cell_columns``).
SPAN_COLUMNS = (
    "left",
    "right",
    "row",
    "kind",
    "style",
    "name",
    "bytes",
    "gbps",
    "duration_us",
    "call",
    "call_left",
    "call_row",
    "launch_us",
    "queue_us",
    "height",
    "alpha",
    "depth",
    "line",
    "loc",
    "launch",
)
STATE_COLUMNS = ("left", "right", "row", "state", "duration_us")
CELL_COLUMNS = ("left", "right", "row", "style", "count", "busy", "alpha")

_COPY_KINDS = np.array([k in ("h2d", "d2h", "d2d") for k in KINDS])
_HOST_KIND = np.array([k in HOST_KINDS for k in KINDS])
#: The style code of host waits (hatched).
WAIT_STYLE = STYLES.index(HOST_WAIT)


#: A bar's height in its row (rows are 1 apart).
BAR_HEIGHT = 0.8
# Host ranges enclose the calls made inside them: drawn first, taller and translucent, calls on top and thinner.
RANGE_KIND = KIND_CODE["range"]
#: Per kind code: a bar's height and opacity.
KIND_HEIGHTS = np.array([0.9 if k == "range" else 0.55 if k == "api" else BAR_HEIGHT for k in KINDS])
KIND_ALPHAS = np.array([0.45 if k == "range" else 1.0 for k in KINDS])
#: A range nested d deep in others on its row is drawn this much shorter per level (centred, never below the minimum),
#: so that nesting reads as bars inside bars (a PyTorch profile nests cpu_ops 5-10 deep).
NEST_SHRINK, NEST_MIN = 0.8, 0.25
AXIS_PX = 90  # room for the title, the x axis and the toolbar
CHAR_PX = 6.2  # mean width of an 8pt character, to decide whether a name fits on its bar
TIME_AXIS = "time since trace start (ms)"  # the x axis's label


def _row_key(devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """One int64 per (device, stream) pair."""
    return np.asarray(devices, dtype=np.int64) * (1 << 32) + (np.asarray(streams, dtype=np.int64) + (1 << 31))


def _row_order(stream: int) -> tuple[int, int]:
    """Within a device: host threads (thread 0 first), then the workbench's own row, then device streams by id."""
    if stream <= -2:
        return (0, -2 - stream)
    return (1, 0) if stream == HOST_STREAM else (2, stream)


class RowLayout:
    """The timeline's rows: each (device, stream) seen so far with a unique label, and a state strip per device that
    has device work (a device row; a CPU-only profile's host rows get none).

    Rows are ordered device by device (host thread rows, the workbench's row, streams by id, then the device's state
    strip), so that rows can be added as a live trace reveals new streams without relabelling the old ones.
    """

    def __init__(
        self,
        device_names: Mapping[int, str] | None = None,
        stream_labels: Mapping[tuple[int, int], str] | None = None,
        states: bool = True,
        limits: Mapping[int, DeviceLimits | None] | None = None,
    ) -> None:
        self.device_names = dict(device_names or {})
        self.stream_labels = dict(stream_labels or {})
        self.states = states
        self.limits = dict(limits or {})  # each device's limits: the kernels' occupancy in the tooltip
        self._label_of: dict[int, str] = {}  # row key -> label
        self._state_label_of: dict[int, str] = {}  # device -> label of its state strip
        self._used: set[str] = set()

    def _unique(self, label: str, suffix: str) -> str:
        if label in self._used:
            label = f"{label} ({suffix})"
        while label in self._used:
            label += "'"
        self._used.add(label)
        return label

    def device_label(self, device: int) -> str:
        """The name rows of ``device`` start with."""
        return self.device_names.get(device, f"device {device}")

    def add(self, devices: np.ndarray, streams: np.ndarray) -> bool:
        """Add the rows of these spans' (device, stream) pairs; True when a row is new."""
        keys = np.unique(_row_key(devices, streams))
        new = [int(k) for k in keys if int(k) not in self._label_of]
        for key in new:
            device, stream = key >> 32, (key & 0xFFFFFFFF) - (1 << 31)
            if self.states and stream >= 0 and device not in self._state_label_of:  # a strip once it has device work
                self._state_label_of[device] = self._unique(f"{self.device_label(device)} · states", str(device))
            if stream == HOST_STREAM:
                label = "workbench"
            else:
                default = f"host thread {-2 - stream}" if stream < -1 else f"stream {stream}"
                label = self.stream_labels.get((device, stream), default)
            self._label_of[key] = self._unique(f"{self.device_label(device)} · {label}", str(stream))
        return bool(new)

    def add_table(self, table: Mapping[str, np.ndarray], links: Mapping[str, np.ndarray] | None = None) -> bool:
        """Add the rows of a table's spans and the workbench rows its enqueued device spans link from (``links``:
        ``launch_links(table)`` where already computed)."""
        new = self.add(table["device"], table["stream"])
        links = launch_links(table) if links is None else links
        enqueued = links["call"] == -2
        if enqueued.any():
            devices = np.asarray(table["device"])[enqueued]
            new = self.add(devices, np.full(devices.size, HOST_STREAM)) or new
        return new

    def labels(self, devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
        """The row label of every span (an object array), for rows already added."""
        keys, inverse = np.unique(_row_key(devices, streams), return_inverse=True)
        if not keys.size:
            return np.zeros(0, dtype=object)
        return coded([self._label_of[int(k)] for k in keys], inverse.reshape(-1))

    def codes(self, devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
        """The position of every span's row in ``top_to_bottom`` (int64), for rows already added."""
        position = {label: i for i, label in enumerate(self.top_to_bottom)}
        keys, inverse = np.unique(_row_key(devices, streams), return_inverse=True)
        codes = np.array([position[self._label_of[int(k)]] for k in keys], dtype=np.int64)
        return codes[inverse.reshape(-1)] if keys.size else np.zeros(0, dtype=np.int64)

    def has_state_strip(self, device: int) -> bool:
        """Whether ``device`` has a state strip (it has a device row)."""
        return device in self._state_label_of

    def state_label(self, device: int) -> str:
        """The label of ``device``'s state strip (its row is made when the device's first span is added)."""
        return self._state_label_of[device]

    @property
    def devices(self) -> list[int]:
        """The devices with at least one row, in order."""
        return sorted({key >> 32 for key in self._label_of})

    @property
    def top_to_bottom(self) -> list[str]:
        """Row labels as they appear from the top of the figure."""
        rows: list[str] = []
        for device in self.devices:
            keys = sorted(
                (k for k in self._label_of if k >> 32 == device),
                key=lambda k: _row_order((k & 0xFFFFFFFF) - (1 << 31)),
            )
            rows += [self._label_of[k] for k in keys]
            if device in self._state_label_of:
                rows.append(self._state_label_of[device])
        return rows

    @property
    def factors(self) -> list[str]:
        """The y range's factors: Bokeh lists categorical factors from the bottom up."""
        return self.top_to_bottom[::-1]

    def height(self, row_px: int) -> int:
        """Figure height in pixels for ``row_px`` per row."""
        # The rows, the axis and the two legends under it (a few lines each), so that narrow views keep their plot.
        return AXIS_PX + LEGENDS_PX + row_px * max(len(self._label_of) + len(self._state_label_of), 1)


def host_waits(table: Mapping[str, np.ndarray]) -> np.ndarray:
    """True for every ``api`` span whose call blocks its thread (``HOST_WAIT_PATTERN``: synchronizes, blocking
    copies, frees)."""
    kind = np.asarray(table["kind"])
    api = np.flatnonzero(kind == KIND_CODE["api"])
    waits = np.zeros(kind.size, dtype=bool)
    if api.size:
        codes, names = factorize(np.asarray(table["name"], dtype=object)[api])
        verdict = np.fromiter((bool(HOST_WAIT_PATTERN.search(str(n))) for n in names), dtype=bool, count=names.size)
        waits[api] = verdict[codes]
    return waits


def span_styles(table: Mapping[str, np.ndarray]) -> np.ndarray:
    """The style code (index in ``palette.STYLES``) of every span: its kind, or host wait for a blocking call."""
    style = np.asarray(table["kind"], dtype=np.int64).copy()
    style[host_waits(table)] = WAIT_STYLE
    return style


def launch_links(table: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Where each device span was launched from, and how long it took to start.

    ``call``: the index of the ``api`` span with the span's ``corr`` (correlation ids are unique in a process, so the
    join is on ``corr`` alone, as in the Chrome-trace export; the first such call wins), -2 where the span has no call
    but an enqueue time (launched from the workbench's row), -1 where neither (host spans too). ``origin_ns``: that
    call's start or the enqueue time. ``latency_ns``: start minus origin. ``queue_ns``: the part of the latency during
    which earlier work on the span's own stream was still running (from the origin until that work's last end).
    """
    kind = np.asarray(table["kind"], dtype=np.int64)
    n = kind.size
    corr = np.asarray(table["corr"], dtype=np.int64)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    enqueue = np.asarray(table["enqueue_ns"], dtype=np.int64)
    device_work = ~_HOST_KIND[kind] if n else np.zeros(0, dtype=bool)
    call = np.full(n, -1, dtype=np.int64)
    calls = np.flatnonzero((kind == KIND_CODE["api"]) & (corr >= 0))
    wanted = np.flatnonzero(device_work & (corr >= 0))
    if calls.size and wanted.size:
        order = np.argsort(corr[calls], kind="stable")
        sorted_corr = corr[calls][order]
        at = np.minimum(np.searchsorted(sorted_corr, corr[wanted]), sorted_corr.size - 1)
        found = sorted_corr[at] == corr[wanted]
        call[wanted[found]] = calls[order[at[found]]]
    call[device_work & (call < 0) & (enqueue >= 0)] = -2
    origin = np.full(n, -1, dtype=np.int64)
    by_call = call >= 0
    origin[by_call] = start[call[by_call]]
    origin[call == -2] = enqueue[call == -2]
    linked = call != -1
    latency = np.where(linked, start - origin, 0)

    # Earlier work on the same stream: the running maximum of ends before each device span, row by row.
    queue = np.zeros(n, dtype=np.int64)
    work = np.flatnonzero(device_work)
    if work.size:
        _, row = np.unique(_row_key(table["device"], table["stream"])[work], return_inverse=True)
        row = row.reshape(-1)
        order = np.lexsort((start[work], row))
        w, r = work[order], row[order]
        low = int(start[w].min())
        stride = 2 * (int(end[w].max()) - low + 1)
        reach = np.maximum.accumulate(r * stride + (end[w] - low))
        previous = np.full(w.size, np.iinfo(np.int64).min)
        same = r[1:] == r[:-1]
        previous[1:][same] = (reach[:-1] - r[1:] * stride + low)[same]
        busy_until = np.maximum(previous, origin[w])
        queue[w] = np.where(linked[w], np.clip(busy_until - origin[w], 0, np.maximum(latency[w], 0)), 0)
    return {"call": call, "origin_ns": origin, "latency_ns": latency, "queue_ns": queue}


def _origin_rows(table: Mapping[str, np.ndarray], call: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (device, stream) row each linked span's arrow starts on (only meaningful where ``call`` != -1)."""
    devices = np.asarray(table["device"], dtype=np.int64).copy()
    streams = np.full(devices.size, HOST_STREAM, dtype=np.int64)
    by_call = call >= 0
    devices[by_call] = np.asarray(table["device"], dtype=np.int64)[call[by_call]]
    streams[by_call] = np.asarray(table["stream"], dtype=np.int64)[call[by_call]]
    return devices, streams


def line_label(location: Location, width: int = 80) -> str:
    """A location as the timeline's tooltip shows it: ``<cell 1>:12  y = model(x)``, and the site where the op was
    issued inside a function the line called."""
    text = location.source
    if len(text) > width:
        text = text[: width - 1] + "\u2026"
    label = f"{short_file(location.file)}:{location.line}  {text}".rstrip()
    if location.nested:
        label += f"  (via {location.site_function} at {short_file(location.site_file)}:{location.site_line})"
    return label


def span_lines(table: Mapping[str, np.ndarray], locations: Sequence[Location] | None) -> tuple[np.ndarray, np.ndarray]:
    """Every span's location code (-1: none) and its line's label (``line_label``; "" where none)."""
    n = len(table["kind"])
    loc = np.asarray(table["loc"], np.int64) if "loc" in table else np.full(n, -1, np.int64)
    if not locations:
        return np.full(n, -1, np.int64), np.full(n, "", dtype=object)
    labels = [*(line_label(location) for location in locations), ""]
    known = (loc >= 0) & (loc < len(locations))
    loc = np.where(known, loc, -1)
    return loc, coded(labels, np.where(known, loc, len(locations)))  # the trailing "" where none


def span_columns(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    links: Mapping[str, np.ndarray] | None = None,
    locations: Sequence[Location] | None = None,
    names: tuple[np.ndarray, list[str]] | None = None,
) -> dict[str, np.ndarray]:
    """The timeline's ColumnDataSource columns for these spans (``rows.add_table(table)`` must have run).

    Times are ms from ``t0_ns``; ``gbps`` (bytes per ns) is NaN for spans that are not copies or last 0 ns. A device
    span's launch: ``call`` (the API call's name, or ``ENQUEUE``), ``call_left`` / ``call_row`` (where the arrow
    starts), ``launch_us`` and ``queue_us``; NaN and "" where it has none. ``loc`` and ``line``: the source line that
    issued the span (an index into ``locations`` and its ``line_label``; -1 and "" where none). ``launch``: a
    kernel's grid, block, registers, shared memory and occupancy on a device of ``rows.limits`` ("" where none).
    ``names``: ``name_codes(table)`` where computed already.
    """
    kind = np.asarray(table["kind"], dtype=np.intp)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    duration = (end - start).astype(np.float64)
    nbytes = np.asarray(table["bytes"], dtype=np.float64)
    copy = _COPY_KINDS[kind] & (duration > 0)
    gbps = np.full(kind.size, np.nan)
    np.divide(nbytes, duration, out=gbps, where=copy)
    links = launch_links(table) if links is None else links
    call = links["call"]
    linked = call != -1
    name, strings = name_codes(table) if names is None else names
    call_row = np.full(kind.size, "", dtype=object)
    if linked.any():
        devices, streams = _origin_rows(table, call)
        labels = rows.labels(devices[linked], streams[linked])
        codes = np.zeros(kind.size, np.int64)
        codes[linked] = labels.codes + 1
        call_row = coded(["", *labels.strings], codes)
    nan = np.full(kind.size, np.nan)
    depth = range_depths(table)
    loc, line = span_lines(table, locations)
    return {
        "left": (start - t0_ns) / 1e6,
        "right": (end - t0_ns) / 1e6,
        "row": rows.labels(table["device"], table["stream"]),
        "kind": coded(KINDS, kind),
        "style": coded(STYLES, span_styles(table)),
        "name": coded(strings, name),
        "bytes": nbytes,
        "gbps": gbps,
        "duration_us": duration / 1e3,
        "call": coded(strings, call_names(name, call)),
        "call_left": np.where(linked, (links["origin_ns"] - t0_ns) / 1e6, nan),
        "call_row": call_row,
        "launch_us": np.where(linked, links["latency_ns"] / 1e3, nan),
        "queue_us": np.where(linked, links["queue_ns"] / 1e3, nan),
        "height": nested_heights(KIND_HEIGHTS[kind], depth),
        "alpha": KIND_ALPHAS[kind],
        "depth": depth,
        "line": line,
        "loc": loc,
        "launch": launch_text(table, rows.limits),
    }


def nested_heights(heights: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Bar heights of spans ``depth`` ranges deep (``timeline_js.VIEW`` computes the same for a large trace)."""
    return np.where(depth > 0, np.maximum(heights * NEST_SHRINK ** np.minimum(depth, 64), NEST_MIN), heights)


def range_depths(table: Mapping[str, np.ndarray]) -> np.ndarray:
    """How many ranges on the same row enclose each range (0 for the outermost and for every other kind).

    A range encloses another when it starts no later and ends no earlier; of two that start together the longer is
    outside. A range that only overlaps another (neither holds the other) is not counted inside it."""
    kind = np.asarray(table["kind"])
    depth = np.zeros(kind.size, np.int64)
    ranges = np.flatnonzero(kind == RANGE_KIND)
    if ranges.size < 2:
        return depth
    device = np.asarray(table["device"], np.int64)[ranges]
    stream = np.asarray(table["stream"], np.int64)[ranges]
    start = np.asarray(table["start_ns"], np.int64)[ranges]
    end = np.asarray(table["end_ns"], np.int64)[ranges]
    order = np.lexsort((-end, start, stream, device))
    rows = (device[order] << 32) ^ (stream[order] & 0xFFFFFFFF)
    ends = end[order]
    # A row whose ends rise strictly in this order nests nothing (each range ends after every one before it): only
    # the rows where an end does not rise are walked.
    flat = np.ones(ends.size, dtype=bool)
    flat[1:] = (rows[1:] != rows[:-1]) | (ends[1:] > ends[:-1])
    if flat.all():
        return depth
    walk = np.isin(rows, rows[~flat])
    order, rows, ends = order[walk], rows[walk], ends[walk]
    open_ends: list[int] = []  # ends of the ranges enclosing the current one, innermost last
    depths: list[int] = []  # in sorted order, written into ``depth`` at once
    last_row = None
    for stop, row in zip(ends.tolist(), rows.tolist()):
        if row != last_row:
            open_ends, last_row = [], row
        while open_ends and open_ends[-1] < stop:  # ended before this one does: it does not enclose it
            open_ends.pop()
        depths.append(len(open_ends))
        open_ends.append(stop)
    depth[ranges[order]] = depths
    return depth


def state_columns(table: Mapping[str, np.ndarray], rows: RowLayout, t0_ns: int) -> dict[str, np.ndarray]:
    """The state strips' columns: the 8-state segments of every device, neighbours in the same state merged."""
    parts = []
    for device in rows.devices:
        if not rows.has_state_strip(device):
            continue
        seg = state_segments(table, device)
        mask = seg["mask"]
        if mask.size == 0:
            continue
        first = np.ones(mask.size, dtype=bool)
        first[1:] = mask[1:] != mask[:-1]
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], mask.size) - 1
        parts.append((device, seg["start_ns"][starts], seg["end_ns"][ends], mask[starts]))
    if not parts:
        times, labels = np.zeros(0), np.zeros(0, dtype=object)
        return {"left": times, "right": times, "row": labels, "state": labels, "duration_us": times}
    lefts = np.concatenate([p[1] for p in parts])
    rights = np.concatenate([p[2] for p in parts])
    strip = np.repeat(np.arange(len(parts)), [p[1].size for p in parts])
    return {
        "left": (lefts - t0_ns) / 1e6,
        "right": (rights - t0_ns) / 1e6,
        "row": coded([rows.state_label(p[0]) for p in parts], strip),
        "state": coded(STATE_OF_MASK, np.concatenate([p[3] for p in parts])),
        "duration_us": (rights - lefts) / 1e3,
    }


def name_codes(table: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
    """Every span's name as a code into the names (first "" and ``ENQUEUE``, then the others in order of first use)."""
    codes, strings = factorize(table["name"], leading=("", ENQUEUE))
    return codes.astype(np.int64, copy=False), strings.tolist()


def call_names(name: np.ndarray, call: np.ndarray) -> np.ndarray:
    """The code of the name of each span's launching call (``name_codes``; ``call``: ``launch_links``'s): 1
    (``ENQUEUE``) for an enqueue, 0 ("") for none."""
    return np.where(call >= 0, name[np.maximum(call, 0)], np.where(call == -2, 1, 0))


def compact_columns(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    states: Mapping[str, np.ndarray] | None = None,
    links: Mapping[str, np.ndarray] | None = None,
    names: tuple[np.ndarray, list[str]] | None = None,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every span (and non-idle state segment) as typed arrays sorted by start, with the table of their names.

    Columns: ``start`` (ms, float64), ``dur`` (ms, float32), ``row`` (position in ``rows.top_to_bottom``), ``style``
    (index in ``ALL_STYLES``: a state segment's is past the span styles), ``name`` (index in the names), ``bytes``,
    ``depth`` (``range_depths``), and the launch: ``lat`` (ms, NaN where none), ``queue`` (ms), ``orow`` (the arrow's
    start row), ``oname`` (the call's name). What the large timeline's document carries, a few bytes per span, and what
    the browser draws from. ``names``: ``name_codes(table)`` where computed already."""
    kind = np.asarray(table["kind"], dtype=np.int64)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    name, strings = name_codes(table) if names is None else names
    links = launch_links(table) if links is None else links
    call = links["call"]
    linked = call != -1
    orow = np.zeros(kind.size, dtype=np.int64)
    if linked.any():
        devices, streams = _origin_rows(table, call)
        orow[linked] = rows.codes(devices[linked], streams[linked])
    oname = call_names(name, call)
    parts = {
        "start": (start - t0_ns) / 1e6,
        "dur": (end - start) / 1e6,
        "row": rows.codes(table["device"], table["stream"]),
        "style": span_styles(table),
        "name": name,
        "bytes": np.asarray(table["bytes"], dtype=np.float64),
        "lat": np.where(linked, links["latency_ns"] / 1e6, np.nan),
        "queue": links["queue_ns"] / 1e6,
        "orow": orow,
        "oname": oname,
        "depth": np.minimum(range_depths(table), 255),  # uint8 below
    }
    if states is not None and len(states["left"]):
        position = {label: i for i, label in enumerate(rows.top_to_bottom)}
        state_code = {s: len(STYLES) + i for i, s in enumerate(STATES)}
        style = lookup(states["state"], state_code.__getitem__, np.int64)
        busy = style != state_code["idle"]
        m = int(busy.sum())
        extra = {
            "start": np.asarray(states["left"], dtype=np.float64)[busy],
            "dur": np.asarray(states["duration_us"], dtype=np.float64)[busy] / 1e3,
            "row": lookup(states["row"], position.__getitem__, np.int64)[busy],
            "style": style[busy],
            "name": np.zeros(m, np.int64),
            "bytes": np.zeros(m),
            "lat": np.full(m, np.nan),
            "queue": np.zeros(m),
            "orow": np.zeros(m, np.int64),
            "oname": np.zeros(m, np.int64),
            "depth": np.zeros(m, np.int64),
        }
        parts = {col: np.concatenate([parts[col], extra[col]]) for col in parts}
    order = np.argsort(parts["start"], kind="stable")
    small = np.uint16 if len(rows.top_to_bottom) < 1 << 16 else np.uint32
    dtypes = {
        "start": np.float64,
        "dur": np.float32,
        "row": small,
        "style": np.uint8,
        "name": np.uint32,
        "bytes": np.float64,
        "lat": np.float32,
        "queue": np.float32,
        "orow": small,
        "oname": np.uint32,
        "depth": np.uint8,
    }
    columns = {col: parts[col][order].astype(dtypes[col]) for col in parts}
    return columns, list(strings)


LEGENDS_PX = 150  # two legends under the plot: kinds in up to 2 lines of 6, states in 4 lines of 2, with titles


def cell_columns(cells: Mapping[str, np.ndarray], row_names: list[str]) -> dict[str, Any]:
    """``aggregate``'s cells as the drawn source's columns: neighbouring cells of a row with the same style and busy
    step (``BUSY_STEPS``) merged into one bar (counts summed, busy averaged), opacity from the step."""
    row = np.asarray(cells["row"], dtype=np.int64)
    bin_ = np.asarray(cells["bin"], dtype=np.int64)
    style = np.asarray(cells["style"], dtype=np.int64)
    busy = np.asarray(cells["busy"], dtype=np.float64)
    step = np.rint(busy * BUSY_STEPS).astype(np.int64)
    if row.size == 0:
        return {col: [] for col in CELL_COLUMNS}
    new = np.ones(row.size, dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (style[1:] != style[:-1]) | (step[1:] != step[:-1]) | (bin_[1:] != bin_[:-1] + 1)
    first = np.flatnonzero(new)
    last = np.append(first[1:], row.size) - 1
    length = last - first + 1
    return {
        "left": np.asarray(cells["left"], dtype=np.float64)[first],
        "right": np.asarray(cells["right"], dtype=np.float64)[last],
        "row": coded(row_names, row[first]),
        "style": coded(ALL_STYLES, style[first]),
        "count": np.add.reduceat(np.asarray(cells["count"], dtype=np.int64), first),
        "busy": np.add.reduceat(busy, first) / length,
        "alpha": 0.25 + 0.75 * step[first] / BUSY_STEPS,
    }
