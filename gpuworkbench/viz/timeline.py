"""The timeline: a row per device stream and per host thread, the 8 overlap states under each device, launch links.

Host rows come first in each device's group: one per host thread (its API calls and ``gw.range`` / NVTX ranges; calls
that block the thread, a synchronize or a blocking copy, drawn hatched in the "host wait" style), then the workbench's
own row (allocations, markers, and where ops were enqueued from). Hovering or selecting a device span draws an arrow
from the call that launched it (the ``api`` span with the same ``corr``), or from its enqueue on the workbench's row,
to where it ran; the tooltip gives the launch latency (start minus the call's start) and how much of it the span
queued behind earlier work on its stream. Names are written on bars wide enough to hold them.

Up to ``DETAIL_LIMIT`` spans the figure's source holds every span. Above it the document carries every span in compact
typed arrays and the browser (``timeline_js.VIEW``) draws the spans in view when few enough are, otherwise cells per
(row, pixel column) with their counts and busy fraction (``aggregate``); an overview strip below the detail view
(``timeline_view``) moves and sizes the visible range. Columns are built with NumPy from the span table, never a
loop over spans; the live dashboard reuses ``RowLayout`` and ``span_columns`` to stream new spans into the figure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import (
    Arrow,
    BoxZoomTool,
    ColumnDataSource,
    CustomJS,
    CustomJSHover,
    DataRange1d,
    FactorRange,
    HoverTool,
    Legend,
    LegendItem,
    PanTool,
    Range1d,
    RangeTool,
    ResetTool,
    SaveTool,
    TapTool,
    VeeHead,
    WheelZoomTool,
)
from bokeh.plotting import figure
from bokeh.transform import factor_cmap, factor_hatch

from gpuworkbench.trace.analysis import STATES, state_segments
from gpuworkbench.trace.spans import HOST_KINDS, HOST_STREAM, KIND_CODE, KINDS

from . import timeline_js
from .aggregate import aggregate
from .palette import (
    HOST_WAIT,
    HOST_WAIT_HATCH,
    KIND_COLORS,
    STATE_COLORS,
    STATE_LABELS,
    STYLE_COLORS,
    STYLE_INK,
    STYLES,
)

__all__ = ["KIND_COLORS", "STATE_COLORS"]  # re-exported from .palette for older imports

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
_ALL_COLORS: dict[str, str] = {**STYLE_COLORS, **STATE_COLORS}
_SPAN_COLUMNS = (
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
)
_STATE_COLUMNS = ("left", "right", "row", "state", "duration_us")
_CELL_COLUMNS = ("left", "right", "row", "style", "count", "busy", "alpha")

_KIND_NAMES = np.array(KINDS, dtype=object)
_STYLE_NAMES = np.array(STYLES, dtype=object)
_COPY_KINDS = np.array([k in ("h2d", "d2h", "d2d") for k in KINDS])
_HOST_KIND = np.array([k in HOST_KINDS for k in KINDS])
_WAIT_STYLE = STYLES.index(HOST_WAIT)


def _wait_hatch() -> Any:
    """Hatching for host waits, none for every other style (a new mapper per figure: models live in one document)."""
    return factor_hatch("style", [HOST_WAIT_HATCH if s == HOST_WAIT else " " for s in STYLES], list(STYLES))


_BAR_HEIGHT = 0.8
# Host ranges enclose the calls made inside them: drawn first, taller and translucent, calls on top and thinner.
_RANGE = KIND_CODE["range"]
_HEIGHT = np.array([0.9 if k == "range" else 0.55 if k == "api" else _BAR_HEIGHT for k in KINDS])
_ALPHA = np.array([0.45 if k == "range" else 1.0 for k in KINDS])
_AXIS_PX = 90  # room for the title, the x axis and the toolbar
_CHAR_PX = 6.2  # mean width of an 8pt character, to decide whether a name fits on its bar
_TIME_AXIS = "time since trace start (ms)"


def _row_key(devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """One int64 per (device, stream) pair."""
    return np.asarray(devices, dtype=np.int64) * (1 << 32) + (np.asarray(streams, dtype=np.int64) + (1 << 31))


def _row_order(stream: int) -> tuple[int, int]:
    """Within a device: host threads (thread 0 first), then the workbench's own row, then device streams by id."""
    if stream <= -2:
        return (0, -2 - stream)
    return (1, 0) if stream == HOST_STREAM else (2, stream)


class RowLayout:
    """The timeline's rows: each (device, stream) seen so far with a unique label, and a state strip per device.

    Rows are ordered device by device (host thread rows, the workbench's row, streams by id, then the device's state
    strip), so that rows can be added as a live trace reveals new streams without relabelling the old ones.
    """

    def __init__(
        self,
        device_names: Mapping[int, str] | None = None,
        stream_labels: Mapping[tuple[int, int], str] | None = None,
        states: bool = True,
    ) -> None:
        self.device_names = dict(device_names or {})
        self.stream_labels = dict(stream_labels or {})
        self.states = states
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
            if self.states and device not in self._state_label_of:
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
        names = np.array([self._label_of[int(k)] for k in keys], dtype=object)
        return names[inverse.reshape(-1)] if keys.size else np.zeros(0, dtype=object)

    def codes(self, devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
        """The position of every span's row in ``top_to_bottom`` (int64), for rows already added."""
        position = {label: i for i, label in enumerate(self.top_to_bottom)}
        keys, inverse = np.unique(_row_key(devices, streams), return_inverse=True)
        codes = np.array([position[self._label_of[int(k)]] for k in keys], dtype=np.int64)
        return codes[inverse.reshape(-1)] if keys.size else np.zeros(0, dtype=np.int64)

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
            if self.states:
                rows.append(self._state_label_of[device])
        return rows

    @property
    def factors(self) -> list[str]:
        """The y range's factors: Bokeh lists categorical factors from the bottom up."""
        return self.top_to_bottom[::-1]

    def height(self, row_px: int) -> int:
        """Figure height in pixels for ``row_px`` per row."""
        # The rows, the axis and the two legends under it (a few lines each), so that narrow views keep their plot.
        return _AXIS_PX + _LEGENDS_PX + row_px * max(len(self._label_of) + len(self._state_label_of), 1)


def host_waits(table: Mapping[str, np.ndarray]) -> np.ndarray:
    """True for every ``api`` span whose call blocks its thread (``HOST_WAIT_PATTERN``: synchronizes, blocking
    copies, frees)."""
    kind = np.asarray(table["kind"])
    api = np.flatnonzero(kind == KIND_CODE["api"])
    waits = np.zeros(kind.size, dtype=bool)
    if api.size:
        names = np.asarray(table["name"], dtype=object)[api]
        verdict = {name: bool(HOST_WAIT_PATTERN.search(str(name))) for name in set(names.tolist())}
        waits[api] = np.fromiter((verdict[name] for name in names.tolist()), dtype=bool, count=api.size)
    return waits


def span_styles(table: Mapping[str, np.ndarray]) -> np.ndarray:
    """The style code (index in ``palette.STYLES``) of every span: its kind, or host wait for a blocking call."""
    style = np.asarray(table["kind"], dtype=np.int64).copy()
    style[host_waits(table)] = _WAIT_STYLE
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


def span_columns(
    table: Mapping[str, np.ndarray], rows: RowLayout, t0_ns: int, links: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """The timeline's ColumnDataSource columns for these spans (``rows.add_table(table)`` must have run).

    Times are ms from ``t0_ns``; ``gbps`` (bytes per ns) is NaN for spans that are not copies or last 0 ns. A device
    span's launch: ``call`` (the API call's name, or ``ENQUEUE``), ``call_left`` / ``call_row`` (where the arrow
    starts), ``launch_us`` and ``queue_us``; NaN and "" where it has none.
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
    names = np.asarray(table["name"], dtype=object)
    call_name = np.full(kind.size, "", dtype=object)
    call_name[call >= 0] = names[call[call >= 0]]
    call_name[call == -2] = ENQUEUE
    call_row = np.full(kind.size, "", dtype=object)
    if linked.any():
        devices, streams = _origin_rows(table, call)
        call_row[linked] = rows.labels(devices[linked], streams[linked])
    nan = np.full(kind.size, np.nan)
    return {
        "left": (start - t0_ns) / 1e6,
        "right": (end - t0_ns) / 1e6,
        "row": rows.labels(table["device"], table["stream"]),
        "kind": _KIND_NAMES[kind],
        "style": _STYLE_NAMES[span_styles(table)],
        "name": names,
        "bytes": nbytes,
        "gbps": gbps,
        "duration_us": duration / 1e3,
        "call": call_name,
        "call_left": np.where(linked, (links["origin_ns"] - t0_ns) / 1e6, nan),
        "call_row": call_row,
        "launch_us": np.where(linked, links["latency_ns"] / 1e3, nan),
        "queue_us": np.where(linked, links["queue_ns"] / 1e3, nan),
        "height": _HEIGHT[kind],
        "alpha": _ALPHA[kind],
    }


def state_columns(table: Mapping[str, np.ndarray], rows: RowLayout, t0_ns: int) -> dict[str, np.ndarray]:
    """The state strips' columns: the 8-state segments of every device, neighbours in the same state merged."""
    parts = []
    for device in rows.devices:
        seg = state_segments(table, device)
        state = seg["state"]
        if state.size == 0:
            continue
        first = np.ones(state.size, dtype=bool)
        first[1:] = state[1:] != state[:-1]
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], state.size) - 1
        parts.append((device, seg["start_ns"][starts], seg["end_ns"][ends], state[starts]))
    if not parts:
        times, labels = np.zeros(0), np.zeros(0, dtype=object)
        return {"left": times, "right": times, "row": labels, "state": labels, "duration_us": times}
    lefts = np.concatenate([p[1] for p in parts])
    rights = np.concatenate([p[2] for p in parts])
    states = np.concatenate([p[3] for p in parts])
    row = np.concatenate([np.full(p[1].size, rows.state_label(p[0]), dtype=object) for p in parts])
    return {
        "left": (lefts - t0_ns) / 1e6,
        "right": (rights - t0_ns) / 1e6,
        "row": row,
        "state": states,
        "duration_us": (rights - lefts) / 1e3,
    }


def _codes(values: np.ndarray, table: dict[str, int]) -> np.ndarray:
    """Small integer codes of strings, growing ``table`` (string -> code) with the new ones."""
    return np.fromiter((table.setdefault(v, len(table)) for v in values.tolist()), dtype=np.int64, count=len(values))


def compact_columns(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    states: Mapping[str, np.ndarray] | None = None,
    links: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every span (and non-idle state segment) as typed arrays sorted by start, with the table of their names.

    Columns: ``start`` (ms, float64), ``dur`` (ms, float32), ``row`` (position in ``rows.top_to_bottom``), ``style``
    (index in ``ALL_STYLES``: a state segment's is past the span styles), ``name`` (index in the names), ``bytes``,
    and the launch: ``lat`` (ms, NaN where none), ``queue`` (ms), ``orow`` (the arrow's start row), ``oname`` (the
    call's name). What the large timeline's document carries, a few bytes per span, and what the browser draws from.
    """
    kind = np.asarray(table["kind"], dtype=np.int64)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    names: dict[str, int] = {"": 0, ENQUEUE: 1}
    name = _codes(np.asarray(table["name"], dtype=object), names)
    links = launch_links(table) if links is None else links
    call = links["call"]
    linked = call != -1
    orow = np.zeros(kind.size, dtype=np.int64)
    if linked.any():
        devices, streams = _origin_rows(table, call)
        orow[linked] = rows.codes(devices[linked], streams[linked])
    oname = np.where(call >= 0, name[np.maximum(call, 0)], np.where(call == -2, 1, 0))
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
    }
    if states is not None and len(states["left"]):
        busy = np.asarray(states["state"], dtype=object) != "idle"
        position = {label: i for i, label in enumerate(rows.top_to_bottom)}
        state_code = {s: len(STYLES) + i for i, s in enumerate(STATES)}
        m = int(busy.sum())
        extra = {
            "start": np.asarray(states["left"], dtype=np.float64)[busy],
            "dur": np.asarray(states["duration_us"], dtype=np.float64)[busy] / 1e3,
            "row": np.array([position[r] for r in np.asarray(states["row"], dtype=object)[busy]], dtype=np.int64),
            "style": np.array([state_code[s] for s in np.asarray(states["state"], dtype=object)[busy]], np.int64),
            "name": np.zeros(m, np.int64),
            "bytes": np.zeros(m),
            "lat": np.full(m, np.nan),
            "queue": np.zeros(m),
            "orow": np.zeros(m, np.int64),
            "oname": np.zeros(m, np.int64),
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
    }
    columns = {col: parts[col][order].astype(dtypes[col]) for col in parts}
    return columns, list(names)


def _tooltips() -> list[tuple[str, str]]:
    return [
        ("name", "@name"),
        ("kind", "@kind"),
        ("row", "@row"),
        ("start", "@left{0,0.000} ms"),
        ("duration", "@duration_us{0,0.0} µs"),
        ("bytes", "@bytes{custom}"),
        ("GB/s", "@gbps{custom}"),
        ("launched by", "@call"),
        ("launch latency", "@launch_us{custom} (start − call start)"),
        ("queued behind stream", "@queue_us{custom}"),
    ]


def _number_or_dash(decimals: int, unit: str = "") -> Any:
    """A hover formatter: the number with thousands separators and ``decimals`` decimals (and ``unit``), or "—" where
    the span has none (NaN: no bytes, no launching call), which Bokeh's own formats print as "NaN"."""
    return CustomJSHover(
        code=f"""
        if (value == null || Number.isNaN(value)) {{ return "—" }}
        return value.toLocaleString("en-US", {{minimumFractionDigits: {decimals}, maximumFractionDigits: {decimals}}})
            + "{unit}"
        """
    )


def _formatters() -> dict[str, Any]:
    return {
        "@bytes": _number_or_dash(0),
        "@gbps": _number_or_dash(2),
        "@launch_us": _number_or_dash(1, " µs"),
        "@queue_us": _number_or_dash(1, " µs"),
    }


def _empty(columns: Mapping[str, Any]) -> dict[str, list]:
    return {col: [] for col in columns}


_LEGENDS_PX = 150  # two legends under the plot: kinds in up to 2 lines of 6, states in 4 lines of 2, with titles


def _legends(fig: Any, styles_present: list[str], states: bool) -> None:
    """Two legends under the rows, across (they leave the plot its width in a narrow notebook or panel tab): the span
    kinds (and host waits) present, and the overlap states.

    They are drawn from a legend-only source whose glyphs sit at NaN (never visible), so they stay put while a large
    trace's drawn sources change with the view.
    """
    kinds = ColumnDataSource(
        {"y": [np.nan] * len(styles_present), "x": [np.nan] * len(styles_present), "style": styles_present},
        name="kind legend",
    )
    swatch = fig.hbar(
        y="y",
        left="x",
        right="x",
        height=_BAR_HEIGHT,
        source=kinds,
        fill_color=factor_cmap("style", [STYLE_COLORS[s] for s in STYLES], list(STYLES)),
        hatch_pattern=_wait_hatch(),
        hatch_color="#ffffff",
        line_color=None,
        name="kind legend",
    )
    common = {
        "label_text_font_size": "8pt",
        "glyph_height": 12,
        "glyph_width": 12,
        "spacing": 0,
        "title_text_font_size": "8pt",
        "title_text_font_style": "bold",
        "location": "top_left",
    }
    fig.add_layout(
        Legend(
            items=[LegendItem(label={"field": "style"}, renderers=[swatch])],
            title="kinds",
            name="kinds legend",
            orientation="horizontal",
            ncols=min(6, max(len(styles_present), 1)),
            **common,
        ),
        "below",
    )
    if states:
        labels = [STATE_LABELS[s] for s in STATES]
        source = ColumnDataSource(
            {"y": [np.nan] * len(STATES), "x": [np.nan] * len(STATES), "state": list(STATES), "label": labels},
            name="state legend",
        )
        strip = fig.hbar(
            y="y",
            left="x",
            right="x",
            height=_BAR_HEIGHT,
            source=source,
            fill_color=factor_cmap("state", [STATE_COLORS[s] for s in STATES], list(STATES)),
            line_color="#bbbbbb",
            name="state legend",
        )
        fig.add_layout(
            Legend(
                items=[LegendItem(label={"field": "label"}, renderers=[strip])],
                title="overlap states (device strips)",
                name="states legend",
                orientation="horizontal",
                ncols=2,
                **common,
            ),
            "below",
        )


def build_timeline(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    *,
    title: str = "timeline",
    width: int = 1000,
    row_px: int = 26,
    webgl: bool | None = None,
    webgl_threshold: int = WEBGL_THRESHOLD,
    x_range: Any = None,
    detail_limit: int = DETAIL_LIMIT,
) -> tuple[Any, ColumnDataSource, ColumnDataSource | None]:
    """The timeline figure with its span source and state source (None when ``rows.states`` is off).

    Split from ``timeline_figure`` so that the live dashboard can keep the sources and stream into them (it passes no
    ``x_range``: a ``DataRange1d`` follows the data). Above ``detail_limit`` spans or state segments the sources start
    empty and the browser fills them from the compact arrays (the ``timeline raw`` source); cells per pixel column
    (``cell source``) draw the zoomed-out view.
    """
    fig, span_source, state_source, _ = _timeline(
        table,
        rows,
        t0_ns,
        title=title,
        width=width,
        row_px=row_px,
        webgl=webgl,
        webgl_threshold=webgl_threshold,
        x_range=x_range,
        detail_limit=detail_limit,
    )
    return fig, span_source, state_source


def _timeline(
    table: Mapping[str, np.ndarray],
    rows: RowLayout,
    t0_ns: int,
    *,
    title: str,
    width: int,
    row_px: int,
    webgl: bool | None,
    webgl_threshold: int,
    x_range: Any,
    detail_limit: int,
    compact: bool = False,
) -> tuple[Any, ColumnDataSource, ColumnDataSource | None, dict[str, np.ndarray] | None]:
    """``build_timeline``, and the compact columns of every span when the figure carries them or ``compact`` asks."""
    n = len(table["kind"])
    links = launch_links(table)
    rows.add_table(table, links)
    state_data = state_columns(table, rows, t0_ns) if rows.states else None
    large = max(n, len(state_data["left"]) if state_data else 0) > detail_limit
    if webgl is None:
        # A large timeline draws at most ``detail_limit`` bars or a few per pixel column: the canvas does that faster
        # than WebGL where WebGL is software-rendered (headless Chromium: 120 against 340 ms a zoomed-out redraw).
        webgl = n > webgl_threshold and not large
    if x_range is None:
        x_range = DataRange1d(range_padding=0.02)
    hover = HoverTool(tooltips=_tooltips(), formatters=_formatters(), name="span hover")
    wheel = WheelZoomTool(dimensions="width")
    pan = PanTool(dimensions="width")
    tap = TapTool()
    fig = figure(
        title=title,
        width=width,
        height=rows.height(row_px),
        x_range=x_range,
        y_range=FactorRange(factors=rows.factors),
        x_axis_label=_TIME_AXIS,
        tools=[pan, wheel, BoxZoomTool(dimensions="width"), tap, ResetTool(), SaveTool(), hover],
        active_drag=pan,
        active_scroll=wheel,
        output_backend="webgl" if webgl else "canvas",
        sizing_mode="stretch_width",
        name="timeline",
    )
    fig.ygrid.grid_line_color = None
    fig.yaxis.major_label_text_font_size = "8pt"
    fig.toolbar.logo = None

    state_source = None
    if state_data is not None:
        state_source = ColumnDataSource(_empty(_STATE_COLUMNS) if large else state_data, name="state source")
        strip = fig.hbar(
            y="row",
            left="left",
            right="right",
            height=_BAR_HEIGHT,
            fill_color=factor_cmap("state", [STATE_COLORS[s] for s in STATES], list(STATES)),
            line_color=None,
            source=state_source,
            name="states",
        )
        fig.add_tools(
            HoverTool(
                renderers=[strip],
                tooltips=[("state", "@state"), ("start", "@left{0,0.000} ms"), ("duration", "@duration_us{0,0.0} µs")],
                name="state hover",
            )
        )

    if large:
        span_data: dict[str, Any] = _empty(_SPAN_COLUMNS)
    else:
        span_data = span_columns(table, rows, t0_ns, links)
        behind = np.argsort(np.asarray(table["kind"]) != _RANGE, kind="stable")  # ranges first: drawn underneath
        span_data = {col: np.asarray(values)[behind] for col, values in span_data.items()}
    span_source = ColumnDataSource(span_data, name="span source")
    style_colors = factor_cmap("style", [STYLE_COLORS[s] for s in STYLES], list(STYLES))
    bars = fig.hbar(
        y="row",
        left="left",
        right="right",
        height="height",
        fill_color=style_colors,
        fill_alpha="alpha",
        line_color=style_colors,  # an outline keeps zero-length spans (markers) visible
        line_width=1,
        source=span_source,
        name="spans",
    )
    hover.renderers = [bars]
    tap.renderers = [bars]
    # Host waits hatched, drawn over their bars from a source of their own: a hatch pattern per bar (a vector hatch
    # on the span renderer) makes BokehJS create a canvas layer per bar at every redraw, seconds for 10^4 bars.
    waits = np.asarray(span_data["style"], dtype=object) == HOST_WAIT
    wait_source = ColumnDataSource(
        {col: np.asarray(span_data[col])[waits] for col in ("left", "right", "row", "height")}, name="wait source"
    )
    fig.hbar(
        y="row",
        left="left",
        right="right",
        height="height",
        fill_color=None,
        line_color=None,
        hatch_pattern=HOST_WAIT_HATCH,
        hatch_color="#ffffff",
        hatch_weight=1.5,
        source=wait_source,
        name="host waits",
    )

    # Names on the bars wide enough to hold them (the view callback fills this source).
    labels = ColumnDataSource({"x": [], "row": [], "text": [], "color": []}, name="name source")
    fig.text(
        x="x",
        y="row",
        text="text",
        text_color="color",
        source=labels,
        text_font_size="8pt",
        text_baseline="middle",
        name="names",
    )

    # The arrow from a hovered or selected device span's launching call to the span.
    arrows = ColumnDataSource({"x0": [], "y0": [], "x1": [], "y1": [], "call": [], "launch_us": []}, name="link source")
    fig.add_layout(
        Arrow(
            end=VeeHead(size=8, fill_color=LINK_COLOR, line_color=LINK_COLOR),
            x_start="x0",
            y_start="y0",
            x_end="x1",
            y_end="y1",
            source=arrows,
            line_color=LINK_COLOR,
            line_width=2,
            name="launch links",
        )
    )
    show_links = CustomJS(args={"spans": span_source, "links": arrows}, code=timeline_js.LINKS)
    hover.callback = show_links
    span_source.selected.js_on_change("indices", show_links)

    columns: dict[str, np.ndarray] | None = None
    names: list[str] = []
    if large or compact:
        columns, names = compact_columns(table, rows, t0_ns, state_data, links)
    raw = None
    cell_data: Mapping[str, Any] = _empty(_CELL_COLUMNS)
    if large and columns is not None:
        raw = ColumnDataSource(columns, name="timeline raw")
        lo, hi = _extent(table, t0_ns)
        pad = 0.02 * (hi - lo)
        first = _aggregate_columns(columns, lo - pad, hi + pad, width // CELL_PX, len(rows.top_to_bottom))
        cell_data = cell_columns(first, rows.top_to_bottom)
    cells = ColumnDataSource(cell_data, name="cell source")
    cell_bars = fig.hbar(
        y="row",
        left="left",
        right="right",
        height=_BAR_HEIGHT,
        fill_color=factor_cmap("style", [_ALL_COLORS[s] for s in ALL_STYLES], list(ALL_STYLES)),
        fill_alpha="alpha",
        line_color=None,
        source=cells,
        name="cells",
    )
    fig.add_tools(
        HoverTool(
            renderers=[cell_bars],
            tooltips=[
                ("row", "@row"),
                ("from", "@left{0,0.000} ms"),
                ("to", "@right{0,0.000} ms"),
                ("spans starting here", "@count{0,0}"),
                ("busy", "@busy{0.0%}"),
                ("mostly", "@style"),
            ],
            name="cell hover",
        )
    )
    view = CustomJS(
        args={
            "fig": fig,
            "spans": span_source,
            "states": state_source or ColumnDataSource(_empty(_STATE_COLUMNS)),
            "agg": cells,
            "waits": wait_source,
            "labels": labels,
            "raw": raw,
            "row_names": rows.top_to_bottom,
            "names": names,
            "styles": list(ALL_STYLES),
            "copies": ["h2d", "d2h", "d2d"],
            "inks": dict(STYLE_INK),
            "n_styles": len(STYLES),
            "wait_style": _WAIT_STYLE,
            "kind_of_wait": KIND_CODE["api"],
            "limit": detail_limit,
            "max_dur": float(columns["dur"].max()) if raw is not None and columns is not None else 0.0,
            "char_px": _CHAR_PX,
            "busy_steps": BUSY_STEPS,
            "cell_px": CELL_PX,
            "heights": _HEIGHT.tolist(),
            "alphas": _ALPHA.tolist(),
            "range_style": _RANGE,
        },
        code=timeline_js.VIEW,
    )
    _follow(fig, view)
    present = np.unique(span_styles(table)).tolist() if n else []
    _legends(fig, [STYLES[s] for s in present], rows.states)
    return fig, span_source, state_source, columns


def _aggregate_columns(columns: Mapping[str, np.ndarray], lo: float, hi: float, bins: int, n_rows: int) -> dict:
    """``aggregate`` over compact columns (what the browser computes from the same arrays)."""
    start = np.asarray(columns["start"], dtype=np.float64)
    end = start + np.asarray(columns["dur"], dtype=np.float64)
    return aggregate(columns["row"], columns["style"], start, end, lo, hi, bins, n_rows, len(ALL_STYLES))


def cell_columns(cells: Mapping[str, np.ndarray], row_names: list[str]) -> dict[str, Any]:
    """``aggregate``'s cells as the drawn source's columns: neighbouring cells of a row with the same style and busy
    step (``BUSY_STEPS``) merged into one bar (counts summed, busy averaged), opacity from the step."""
    row = np.asarray(cells["row"], dtype=np.int64)
    bin_ = np.asarray(cells["bin"], dtype=np.int64)
    style = np.asarray(cells["style"], dtype=np.int64)
    busy = np.asarray(cells["busy"], dtype=np.float64)
    step = np.rint(busy * BUSY_STEPS).astype(np.int64)
    if row.size == 0:
        return {col: [] for col in _CELL_COLUMNS}
    new = np.ones(row.size, dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (style[1:] != style[:-1]) | (step[1:] != step[:-1]) | (bin_[1:] != bin_[:-1] + 1)
    first = np.flatnonzero(new)
    last = np.append(first[1:], row.size) - 1
    length = last - first + 1
    return {
        "left": np.asarray(cells["left"], dtype=np.float64)[first],
        "right": np.asarray(cells["right"], dtype=np.float64)[last],
        "row": np.array(row_names, dtype=object)[row[first]],
        "style": np.array(ALL_STYLES, dtype=object)[style[first]],
        "count": np.add.reduceat(np.asarray(cells["count"], dtype=np.int64), first),
        "busy": np.add.reduceat(busy, first) / length,
        "alpha": 0.25 + 0.75 * step[first] / BUSY_STEPS,
    }


def _follow(fig: Any, view: CustomJS) -> None:
    """Run ``view`` when the visible time range or the plot's width changes: on every change of the figure's range,
    and at the end of every interaction (``RangesUpdate``), which still reaches it after ``fig.x_range`` is replaced
    (``Comparison.figure`` shares one range between two timelines)."""
    fig.x_range.js_on_change("start", view)
    fig.x_range.js_on_change("end", view)
    fig.js_on_change("inner_width", view)
    fig.js_on_event("rangesupdate", view)


def _extent(table: Mapping[str, np.ndarray], t0_ns: int) -> tuple[float, float]:
    """The table's first start and last end in ms from ``t0_ns`` ((0, 1) for an empty table)."""
    if not len(table["start_ns"]):
        return 0.0, 1.0
    lo = (int(np.min(table["start_ns"])) - t0_ns) / 1e6
    hi = (int(np.max(table["end_ns"])) - t0_ns) / 1e6
    return lo, max(hi, lo + 1e-6)


def timeline_figure(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    stream_labels: Mapping[tuple[int, int], str] | None = None,
    *,
    t0_ns: int | None = None,
    states: bool = True,
    title: str = "timeline",
    width: int = 1000,
    row_px: int = 26,
    webgl: bool | None = None,
    webgl_threshold: int = WEBGL_THRESHOLD,
    detail_limit: int = DETAIL_LIMIT,
) -> Any:
    """A Bokeh figure of the spans: a row per (device, stream) and host thread, a colour per kind, launch links, the
    8 states under each device.

    ``t0_ns`` is time zero of the ms axis (default: the first span's start); WebGL draws it above ``webgl_threshold``
    spans unless ``webgl`` says otherwise; above ``detail_limit`` spans the browser draws what is in view (module
    docstring). Builds from arrays: 10^5 spans take a fraction of a second, 10^6 a few seconds.
    """
    return _static(
        table,
        device_names,
        stream_labels,
        t0_ns,
        states,
        title,
        width,
        row_px,
        webgl,
        webgl_threshold,
        detail_limit,
        overview=False,
    )


def _static(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None,
    stream_labels: Mapping[tuple[int, int], str] | None,
    t0_ns: int | None,
    states: bool,
    title: str,
    width: int,
    row_px: int,
    webgl: bool | None,
    webgl_threshold: int,
    detail_limit: int,
    overview: bool,
) -> Any:
    """A timeline on a fixed x range (the trace's extent, padded), alone or above its overview strip."""
    if t0_ns is None:
        t0_ns = int(np.min(table["start_ns"])) if len(table["start_ns"]) else 0
    lo, hi = _extent(table, t0_ns)
    pad = 0.02 * (hi - lo)
    x_range = Range1d(start=lo - pad, end=hi + pad, bounds=(lo - pad, hi + pad), name="timeline x range")
    rows = RowLayout(device_names, stream_labels, states=states)
    fig, _, _, columns = _timeline(
        table,
        rows,
        t0_ns,
        title=title,
        width=width,
        row_px=row_px,
        webgl=webgl,
        webgl_threshold=webgl_threshold,
        x_range=x_range,
        detail_limit=detail_limit,
        compact=overview,
    )
    if not overview or columns is None:
        return fig
    from bokeh.layouts import column

    strip = overview_figure(fig, columns, rows.top_to_bottom, (lo, hi), width=width)
    return column(fig, strip, sizing_mode="stretch_width", name="timeline view")


def overview_figure(
    fig: Any, columns: Mapping[str, np.ndarray], rows: list[str], extent: tuple[float, float], width: int = 1000
) -> Any:
    """The strip under a timeline: every row of the whole trace (``columns``: ``compact_columns``; ``rows`` top to
    bottom) in ``width`` cells, and a box (``RangeTool``) on the detail view's range: drag it to move the view, drag
    its edges to zoom."""
    lo, hi = extent
    pad = 0.02 * (hi - lo)
    overview = figure(
        height=max(50 + 5 * len(rows), 90),
        width=width,
        x_range=Range1d(start=lo - pad, end=hi + pad, name="overview x range"),
        y_range=FactorRange(factors=rows[::-1]),
        x_axis_label=_TIME_AXIS + "; drag the box to move the view, its edges to zoom",
        tools="",
        toolbar_location=None,
        sizing_mode="stretch_width",
        name="overview",
    )
    overview.yaxis.visible = False
    overview.ygrid.grid_line_color = None
    overview.xaxis.axis_label_text_font_size = "8pt"
    cells = _aggregate_columns(columns, lo - pad, hi + pad, width, len(rows))
    overview.hbar(
        y="row",
        left="left",
        right="right",
        height=1.0,
        fill_color=factor_cmap("style", [_ALL_COLORS[s] for s in ALL_STYLES], list(ALL_STYLES)),
        fill_alpha="alpha",
        line_color=None,
        source=ColumnDataSource(cell_columns(cells, rows), name="overview cell source"),
        name="overview cells",
    )
    selector = RangeTool(x_range=fig.x_range, name="overview range")
    selector.overlay.fill_color = "#636363"
    selector.overlay.fill_alpha = 0.15
    overview.add_tools(selector)
    return overview


def timeline_view(
    table: Mapping[str, np.ndarray],
    device_names: Mapping[int, str] | None = None,
    stream_labels: Mapping[tuple[int, int], str] | None = None,
    *,
    t0_ns: int | None = None,
    states: bool = True,
    title: str = "timeline",
    width: int = 1000,
    row_px: int = 26,
    webgl: bool | None = None,
    webgl_threshold: int = WEBGL_THRESHOLD,
    detail_limit: int = DETAIL_LIMIT,
) -> Any:
    """``timeline_figure`` above its overview strip, as one Bokeh column (the figure is its first child)."""
    return _static(
        table,
        device_names,
        stream_labels,
        t0_ns,
        states,
        title,
        width,
        row_px,
        webgl,
        webgl_threshold,
        detail_limit,
        overview=True,
    )


def device_names(trace: Any) -> dict[int, str]:
    """Row names of a trace's devices: the spec ("cuda:0") of a real device, the given name of a hand-built one."""
    return {n: (clock.name if clock.source == "records" else clock.key) for n, clock in trace.devices.items()}


def trace_start_ns(trace: Any, table: Mapping[str, np.ndarray]) -> int:
    """Time zero of a trace's pictures: when it started recording, or its first span for a hand-built trace."""
    if trace.started_ns:
        return int(trace.started_ns)
    return int(np.min(table["start_ns"])) if len(table["start_ns"]) else 0


def trace_timeline(trace: Any, **kw: Any) -> Any:
    """``Trace.timeline``: the timeline of a whole trace above its overview strip (waits for pending spans once it
    stopped); the detail figure is the column's first child (``name="timeline"``)."""
    table = trace.table()
    kw.setdefault("t0_ns", trace_start_ns(trace, table))
    devices = trace.devices
    if "title" not in kw:
        real = [f"{c.key} = {c.name} ({c.source})" for c in devices.values() if c.source != "records"]
        kw["title"] = "timeline" + (f": {'; '.join(real)}" if real else "")
    return timeline_view(table, device_names(trace), trace.stream_labels, **kw)
