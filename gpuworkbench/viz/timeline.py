"""The timeline: one row per device stream with a bar per span, and the 8 overlap states on a strip under each device.

Columns are built with NumPy from the span table (no loop over spans), so that a 10^5-span timeline builds in well
under a second; the live dashboard reuses ``RowLayout`` and ``span_columns`` to stream new spans into the same figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from bokeh.models import (
    BoxZoomTool,
    ColumnDataSource,
    FactorRange,
    HoverTool,
    Legend,
    PanTool,
    ResetTool,
    SaveTool,
    WheelZoomTool,
)
from bokeh.plotting import figure
from bokeh.transform import factor_cmap

from gpuworkbench.trace.analysis import STATES, state_segments
from gpuworkbench.trace.spans import KINDS

#: Fill colour of each span kind (alloc, free and markers are host bookkeeping: greys and red).
KIND_COLORS: dict[str, str] = {
    "h2d": "#1f77b4",
    "d2h": "#ff7f0e",
    "d2d": "#9467bd",
    "memset": "#8c564b",
    "kernel": "#2ca02c",
    "alloc": "#7f7f7f",
    "free": "#c7c7c7",
    "marker": "#d62728",
    "api": "#17becf",
    "range": "#bcbd22",
}

#: Fill colour of each of the 8 states on a device's strip: H blue, D orange, K green, darker where they overlap.
STATE_COLORS: dict[str, str] = {
    "idle": "#f2f2f2",
    "K": "#a1d99b",
    "H": "#9ecae1",
    "D": "#fdd0a2",
    "H+K": "#1b9e77",
    "D+K": "#b8a30b",
    "H+D": "#8c6bb1",
    "H+D+K": "#3f007d",
}

#: Above this many spans the figure draws with WebGL (canvas becomes slow to pan around 10^4 bars).
WEBGL_THRESHOLD = 5_000

_KIND_NAMES = np.array(KINDS, dtype=object)
_COPY_KINDS = np.array([k in ("h2d", "d2h", "d2d") for k in KINDS])
_BAR_HEIGHT = 0.8
_AXIS_PX = 90  # room for the title, the x axis and the toolbar


def _row_key(devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """One int64 per (device, stream) pair; stream -1 (the host row) sorts first within its device."""
    return np.asarray(devices, dtype=np.int64) * (1 << 32) + (np.asarray(streams, dtype=np.int64) + (1 << 31))


class RowLayout:
    """The timeline's rows: each (device, stream) seen so far with a unique label, and a state strip per device.

    Rows are ordered device by device (host row, streams by id, then the device's state strip), so that rows can be
    added as a live trace reveals new streams without relabelling the old ones.
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
            default = "host" if stream == -1 else f"host thread {-2 - stream}" if stream < -1 else f"stream {stream}"
            label = self.stream_labels.get((device, stream), default) if stream != -1 else default
            self._label_of[key] = self._unique(f"{self.device_label(device)} · {label}", str(stream))
        return bool(new)

    def labels(self, devices: np.ndarray, streams: np.ndarray) -> np.ndarray:
        """The row label of every span (an object array), for rows already added."""
        keys, inverse = np.unique(_row_key(devices, streams), return_inverse=True)
        names = np.array([self._label_of[int(k)] for k in keys], dtype=object)
        return names[inverse.reshape(-1)] if keys.size else np.zeros(0, dtype=object)

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
            keys = sorted(k for k in self._label_of if k >> 32 == device)
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
        # At least the legend's height (up to 11 kinds and states), so a one-row timeline is not squashed.
        return max(_AXIS_PX + row_px * max(len(self._label_of) + len(self._state_label_of), 1), 230)


def span_columns(table: Mapping[str, np.ndarray], rows: RowLayout, t0_ns: int) -> dict[str, np.ndarray]:
    """The timeline's ColumnDataSource columns for these spans (rows must already hold their streams).

    Times are ms from ``t0_ns``; ``gbps`` (bytes per ns) is NaN for spans that are not copies or last 0 ns.
    """
    kind = np.asarray(table["kind"], dtype=np.intp)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    duration = (end - start).astype(np.float64)
    nbytes = np.asarray(table["bytes"], dtype=np.float64)
    copy = _COPY_KINDS[kind] & (duration > 0)
    gbps = np.full(kind.size, np.nan)
    np.divide(nbytes, duration, out=gbps, where=copy)
    return {
        "left": (start - t0_ns) / 1e6,
        "right": (end - t0_ns) / 1e6,
        "row": rows.labels(table["device"], table["stream"]),
        "kind": _KIND_NAMES[kind],
        "name": np.asarray(table["name"], dtype=object),
        "bytes": nbytes,
        "gbps": gbps,
        "duration_us": duration / 1e3,
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


def _tooltips() -> list[tuple[str, str]]:
    return [
        ("name", "@name"),
        ("kind", "@kind"),
        ("row", "@row"),
        ("start", "@left{0,0.000} ms"),
        ("duration", "@duration_us{0,0.0} µs"),
        ("bytes", "@bytes{0,0}"),
        ("GB/s", "@gbps{0,0.00}"),
    ]


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
) -> tuple[Any, ColumnDataSource, ColumnDataSource | None]:
    """The timeline figure with its span source and state source (None when ``rows.states`` is off).

    Split from ``timeline_figure`` so that the live dashboard can keep the sources and stream into them.
    """
    n = len(table["kind"])
    rows.add(table["device"], table["stream"])
    if webgl is None:
        webgl = n > webgl_threshold
    hover = HoverTool(tooltips=_tooltips(), name="span hover")
    wheel = WheelZoomTool(dimensions="width")
    pan = PanTool(dimensions="width")
    fig = figure(
        title=title,
        width=width,
        height=rows.height(row_px),
        y_range=FactorRange(factors=rows.factors),
        x_axis_label="time since trace start (ms)",
        tools=[pan, wheel, BoxZoomTool(dimensions="width"), ResetTool(), SaveTool(), hover],
        active_drag=pan,
        active_scroll=wheel,
        output_backend="webgl" if webgl else "canvas",
        sizing_mode="stretch_width",
    )
    fig.ygrid.grid_line_color = None
    fig.toolbar.logo = None
    fig.add_layout(Legend(location="top_left", orientation="horizontal", label_text_font_size="8pt"), "above")

    state_source = None
    if rows.states:
        state_source = ColumnDataSource(state_columns(table, rows, t0_ns), name="states")
        strip = fig.hbar(
            y="row",
            left="left",
            right="right",
            height=_BAR_HEIGHT,
            fill_color=factor_cmap("state", [STATE_COLORS[s] for s in STATES], list(STATES)),
            line_color=None,
            source=state_source,
            legend_field="state",
            name="states",
        )
        fig.add_tools(
            HoverTool(
                renderers=[strip],
                tooltips=[("state", "@state"), ("start", "@left{0,0.000} ms"), ("duration", "@duration_us{0,0.0} µs")],
                name="state hover",
            )
        )

    span_source = ColumnDataSource(span_columns(table, rows, t0_ns), name="spans")
    kind_colors = factor_cmap("kind", [KIND_COLORS[k] for k in KINDS], list(KINDS))
    bars = fig.hbar(
        y="row",
        left="left",
        right="right",
        height=_BAR_HEIGHT,
        fill_color=kind_colors,
        line_color=kind_colors,  # an outline keeps zero-length spans (markers) visible
        line_width=1,
        source=span_source,
        legend_field="kind",
        name="spans",
    )
    hover.renderers = [bars]
    # The legend goes beside the rows, not over them: above a few rows it would squash them together.
    legend = fig.legend[0]
    legend.label_text_font_size = "8pt"
    legend.glyph_height = legend.glyph_width = 12
    legend.spacing = 0
    fig.legend.location = "top_left"
    fig.add_layout(legend, "right")
    return fig, span_source, state_source


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
) -> Any:
    """A Bokeh figure of the spans: one row per (device, stream), a colour per kind, the 8 states under each device.

    ``t0_ns`` is time zero of the ms axis (default: the first span's start); WebGL draws it above ``webgl_threshold``
    spans unless ``webgl`` says otherwise. Builds from arrays, so 10^5 spans take a fraction of a second.
    """
    if t0_ns is None:
        t0_ns = int(np.min(table["start_ns"])) if len(table["start_ns"]) else 0
    rows = RowLayout(device_names, stream_labels, states=states)
    fig, _, _ = build_timeline(
        table, rows, t0_ns, title=title, width=width, row_px=row_px, webgl=webgl, webgl_threshold=webgl_threshold
    )
    return fig


def device_names(trace: Any) -> dict[int, str]:
    """Row names of a trace's devices: the spec ("cuda:0") of a real device, the given name of a hand-built one."""
    return {n: (clock.name if clock.source == "records" else clock.key) for n, clock in trace.devices.items()}


def trace_start_ns(trace: Any, table: Mapping[str, np.ndarray]) -> int:
    """Time zero of a trace's pictures: when it started recording, or its first span for a hand-built trace."""
    if trace.started_ns:
        return int(trace.started_ns)
    return int(np.min(table["start_ns"])) if len(table["start_ns"]) else 0


def trace_timeline(trace: Any, **kw: Any) -> Any:
    """``Trace.timeline``: the timeline figure of a whole trace (waits for pending spans once it stopped)."""
    table = trace.table()
    kw.setdefault("t0_ns", trace_start_ns(trace, table))
    devices = trace.devices
    if "title" not in kw:
        real = [f"{c.key} = {c.name} ({c.source})" for c in devices.values() if c.source != "records"]
        kw["title"] = "timeline" + (f": {'; '.join(real)}" if real else "")
    return timeline_figure(table, device_names(trace), trace.stream_labels, **kw)
