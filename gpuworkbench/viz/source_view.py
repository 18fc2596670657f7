"""Which line did that: a traced cell's source with, beside each line, a bar of its device time and its op count.

Files with device work come in order (the traced cell first): a file ``linecache`` can read shows every line from the
first to the last that issued work (a few lines of context around; far-apart lines as windows), a file it cannot (a
loaded trace: ``Location.text``) only its lines with work. Tapping lines selects their spans in the timeline's span
source (the rest fade); tapping again or Escape clears. Rows and bars come from ``line_stats.line_columns``, the
numbers of ``trace.statistics().lines``; the link is a list of span indices per line, built with NumPy.
"""

from __future__ import annotations

import linecache
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bokeh.core.properties import value
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    GlyphRenderer,
    HBar,
    HoverTool,
    Plot,
    Range1d,
    TapTool,
    Text,
    Title,
    WheelPanTool,
)

from gpuworkbench._format import count, duration_ns
from gpuworkbench.trace.line_stats import UNKNOWN, line_columns
from gpuworkbench.trace.lines import Location, short_file
from gpuworkbench.trace.spans import HOST_KINDS

from .coded import lookup

#: Lines of context around the lines with work; windows with at most this many lines between them merge.
CONTEXT = 2
#: A readable file's lines shown whole up to this many from first to last line with work, else in windows.
WHOLE_UP_TO = 120
ROW_PX = 17
MAX_VISIBLE = 30  # rows shown at once; more scroll (wheel) inside the figure
FONT_PX = 11
CHAR_PX = 0.61 * FONT_PX  # a monospace character's width
MAX_CHARS = 90  # source text cut with an ellipsis past this
BAR_PX = 160
TITLE_CHAR_PX = 6.5  # a title character's mean width (9pt)
TITLE_PX, BORDER_PX = 26, 2
BAR_COLOR, TRACK_COLOR, PICK_COLOR = "#3182bd", "#eef2f7", "#ffe08a"
#: Text and track colours on a light page and on a dark one (the side panel's dark theme: Bokeh's dark_minimal).
INK = {
    False: {"number": "#969696", "source": "#252525", "file": "#08519c", "stats": "#525252", "track": TRACK_COLOR},
    True: {"number": "#8c8c8c", "source": "#e0e0e0", "file": "#9ecae1", "stats": "#bdbdbd", "track": "#3a3f47"},
}
#: The row source's columns: a source line's place, its numbers and the hover's text.
ROW_COLUMNS = ("y", "file", "line", "ops", "time_ns", "share_pct", "stats", "where", "function", "work", "sites")

#: args: rows (this view's row source), spans (the timeline's span source), members (span indices grouped by row),
#: first (row r's span indices are members[first[r]:first[r + 1]]). The selected lines' spans become the selection.
SELECT_SPANS = r"""
const out = []
for (const r of rows.selected.indices) for (let k = first[r]; k < first[r + 1]; k++) out.push(members[k])
spans.selected.indices = out
"""


@dataclass
class _File:
    """A file shown: the (line, text) of its locations that have spans, whether ``linecache`` reads it, its time."""

    keys: list[tuple[int, str]] = field(default_factory=list)  # (line, text) of rows with spans, first seen first
    readable: bool = False
    time_ns: int = 0


def _row_key(file: str, line: int, text: str, readable: bool) -> tuple[str, int, str]:
    """A row's identity: a readable file's line; an unreadable one's line and text (a loaded trace's calls)."""
    return (file, line, "" if readable else text)


def _windows(lines: Sequence[int], last: int) -> list[tuple[int, int]]:
    """The line ranges shown of a readable file of ``last`` lines whose ``lines`` issued work (sorted)."""
    lo, hi = max(lines[0] - CONTEXT, 1), min(lines[-1] + CONTEXT, last)
    if hi - lo < WHOLE_UP_TO:
        return [(lo, hi)]
    out: list[tuple[int, int]] = []
    for n in lines:
        a, b = max(n - CONTEXT, 1), min(n + CONTEXT, last)
        if out and a <= out[-1][1] + 1 + CONTEXT:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _clip(text: str) -> str:
    text = text.rstrip().expandtabs(4)
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "\u2026"


def line_rows(
    table: Mapping[str, np.ndarray], locations: Sequence[Location], focus: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The source view's rows, top to bottom, and the row of every location (-1: not shown; one more entry, last,
    for spans without a location: the "(unknown)" row's, or -1).

    A row is a dict: ``kind`` ("header", "line", "gap"), ``file``, ``line``, ``text``, and for lines ``ops``,
    ``kernels``, ``copies``, ``time_ns``, ``share_pct`` (0 without device work) and ``sites`` (the functions the line
    called that issued its work)."""
    stats = line_columns(table, locations)
    work: dict[tuple[str, int, str], list[float]] = {}
    readable = {f: bool(linecache.getlines(f)) for f in {loc.file for loc in locations}}
    for file, line, source, *numbers in zip(
        stats["file"], stats["line"], stats["source"], stats["ops"], stats["kernels"], stats["copies"],
        stats["device_time_ns"], stats["share_pct"],
    ):  # fmt: skip
        key = _row_key(str(file), int(line), str(source), readable.get(str(file), False))
        if key in work:
            work[key] = [a + b for a, b in zip(work[key], numbers)]
        else:
            work[key] = list(numbers)
    files: dict[str, _File] = {}
    for (file, _, _), numbers in work.items():
        entry = files.setdefault(file, _File(readable=readable.get(file, False)))
        entry.time_ns += int(numbers[3])
    used = np.zeros(len(locations) + 1, bool)
    if "loc" in table and len(locations):
        codes = np.asarray(table["loc"], np.int64)
        used[np.unique(codes[(codes >= 0) & (codes < len(locations))])] = True
    sites: dict[tuple[str, int, str], set[str]] = {}
    for i, loc in enumerate(locations):
        if loc.file in files and used[i]:
            entry = files[loc.file]
            key = _row_key(loc.file, loc.line, loc.source, entry.readable)
            entry.keys.append((loc.line, key[2] or loc.source))
            if loc.nested:
                sites.setdefault(key, set()).add(f"{loc.site_function} at {short_file(loc.site_file)}:{loc.site_line}")
    focused = [f for f in files if f in set(focus) and f != UNKNOWN]
    rest = sorted((f for f in files if f not in focused and f != UNKNOWN), key=lambda f: -files[f].time_ns)
    order = focused + rest + ([UNKNOWN] if UNKNOWN in files else [])

    rows: list[dict[str, Any]] = []
    at: dict[tuple[str, int, str], int] = {}

    def add_line(file: str, line: int, text: str, key: tuple[str, int, str]) -> None:
        ops, kernels, copies, time_ns, share = work.get(key, (0, 0, 0, 0, 0.0))
        at[key] = len(rows)
        rows.append(
            {
                "kind": "line", "file": file, "line": line, "text": text, "ops": int(ops), "kernels": int(kernels),
                "copies": int(copies), "time_ns": int(time_ns), "share_pct": float(share),
                "sites": sorted(sites.get(key, ())),
            }
        )  # fmt: skip

    for file in order:
        entry = files[file]
        header = "work with no recorded line" if file == UNKNOWN else short_file(file)
        rows.append({"kind": "header", "file": file, "line": 0, "text": header})
        if file == UNKNOWN:
            add_line(file, 0, "(unknown)", (UNKNOWN, 0, ""))
            continue
        if entry.readable:
            text = linecache.getlines(file)
            shown = sorted({n for n, _ in entry.keys})
            for w, (a, b) in enumerate(_windows(shown, len(text))):
                if w:
                    rows.append({"kind": "gap", "file": file, "line": 0, "text": "\u22ee"})
                for n in range(a, b + 1):
                    add_line(file, n, text[n - 1], (file, n, ""))
        else:
            for n, source in sorted(dict.fromkeys(entry.keys), key=lambda k: k[0]):  # a line's calls in trace order
                add_line(file, n, source, (file, n, source))

    row_of = np.full(len(locations) + 1, -1, np.int64)
    for i, loc in enumerate(locations):
        entry = files.get(loc.file)
        if entry is not None:
            row_of[i] = at.get(_row_key(loc.file, loc.line, loc.source, entry.readable), -1)
    row_of[-1] = at.get((UNKNOWN, 0, ""), -1)
    return rows, row_of


def spans_by_row(loc: np.ndarray, kind: np.ndarray, row_of: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Span indices grouped by source row: (members, first), row r's spans being ``members[first[r]:first[r + 1]]``.

    ``loc``: each span's location code (-1: none), ``kind``: its kind's name; spans without a location go to the
    unknown row (``row_of``'s last entry) when they are device work."""
    loc = np.asarray(loc, np.int64)
    row = row_of[np.where(loc >= 0, np.minimum(loc, row_of.size - 1), row_of.size - 1)] if loc.size else loc
    host = lookup(kind, HOST_KINDS.__contains__, bool) if loc.size else np.zeros(0, bool)
    row = np.where((loc < 0) & host, -1, row)
    members = np.flatnonzero(row >= 0)
    members = members[np.argsort(row[members], kind="stable")]
    first = np.searchsorted(row[members], np.arange(n_rows + 1)) if n_rows else np.zeros(1, np.int64)
    return members.astype(np.int64), first.astype(np.int64)


def _span_source(timeline: Any) -> ColumnDataSource | None:
    """The timeline's span source, from its figure, a column holding it (``Trace.timeline()``) or the source itself.

    Walks children and renderers only: ``Model.select_one`` would visit every model of the timeline (tens of ms)."""
    if timeline is None or isinstance(timeline, ColumnDataSource):
        return timeline
    for renderer in getattr(timeline, "renderers", ()):
        if renderer.name == "spans":
            return renderer.data_source
    for child in getattr(timeline, "children", ()):
        found = _span_source(child[0] if isinstance(child, tuple) else child)
        if found is not None:
            return found
    return None


class _Layout:
    """Where things sit across the figure, in pixels (the x range is the frame's width in pixels)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        longest = max((len(_clip(r["text"])) for r in rows if r["kind"] == "line"), default=0)
        digits = max((len(str(r["line"])) for r in rows), default=1)
        self.number = 8 + digits * CHAR_PX  # right edge of the line numbers
        self.source = self.number + 10
        self.bar = self.source + max(longest, 24) * CHAR_PX + 16
        self.stats = self.bar + BAR_PX + 8
        self.width = int(self.stats + 28 * CHAR_PX)


def _row_columns(rows: list[dict[str, Any]], lines: list[int], locations: Sequence[Location]) -> dict[str, list]:
    """The row source: one entry per source line (what a tap picks), with the numbers and the hover's text."""
    functions: dict[tuple[str, int], set[str]] = {}
    for loc in locations:
        functions.setdefault((loc.file, loc.line), set()).add(loc.function)
    data: dict[str, list] = {c: [] for c in ROW_COLUMNS}
    for i in lines:
        r = rows[i]
        stats = f"{count(r['ops'], 'op', 'ops')} \u00b7 {duration_ns(r['time_ns'])} ({r['share_pct']:.0f} %)"
        split = f"{count(r['kernels'], 'kernel', 'kernels')}, {count(r['copies'], 'copy', 'copies')}"
        sites = "; ".join(r["sites"][:3]) + (" \u2026" if len(r["sites"]) > 3 else "")
        data["y"].append(i)
        data["file"].append(r["file"])
        data["line"].append(r["line"])
        data["ops"].append(r["ops"])
        data["time_ns"].append(r["time_ns"])
        data["share_pct"].append(r["share_pct"])
        data["stats"].append(stats if r["ops"] else "")
        known = r["file"] != UNKNOWN
        data["where"].append(f"{short_file(r['file'])}:{r['line']}" if known else "(no recorded line)")
        data["function"].append(", ".join(sorted(functions.get((r["file"], r["line"]), ()))) or "\u2014")
        data["work"].append(f"{stats} \u2014 {split}" if r["ops"] else "no device work")
        data["sites"].append(sites or "\u2014")
    return data


def _label_columns(
    rows: list[dict[str, Any]], data: Mapping[str, list], at: _Layout, dark: bool = False
) -> dict[str, list]:
    """Every text of the figure in one source: line numbers, source text, the lines' numbers, file headers."""
    out: dict[str, list] = {"x": [], "y": [], "text": [], "align": [], "color": [], "style": []}

    def put(x: float, y: int, text: str, align: str, color: str, style: str = "normal") -> None:
        out["x"].append(x)
        out["y"].append(y)
        out["text"].append(text)
        out["align"].append(align)
        out["color"].append(color)
        out["style"].append(style)

    ink = INK[dark]
    for y, r in enumerate(rows):
        if r["kind"] == "line":
            if r["file"] != UNKNOWN:
                put(at.number, y, str(r["line"]), "right", ink["number"])
            put(at.source, y, _clip(r["text"]), "left", ink["source"])
        else:
            put(2, y, r["text"], "left", ink["file"], "bold")
    for y, stats in zip(data["y"], data["stats"]):
        if stats:
            put(at.stats, y, stats, "left", ink["stats"])
    return out


def _bar_columns(data: Mapping[str, list], at: _Layout, dark: bool = False) -> dict[str, list]:
    """A track and a bar per line with device work, the bar's length its device time over the largest line's."""
    top = max(data["time_ns"], default=0) or 1
    out: dict[str, list] = {"y": [], "left": [], "right": [], "color": [], "line": []}
    for y, line, ops, time_ns in zip(data["y"], data["line"], data["ops"], data["time_ns"]):
        if not ops:
            continue
        track = (at.bar + BAR_PX, INK[dark]["track"])
        for right, color in (track, (at.bar + max(BAR_PX * time_ns / top, 1.0), BAR_COLOR)):
            out["y"].append(y)
            out["left"].append(at.bar)
            out["right"].append(right)
            out["color"].append(color)
            out["line"].append(line)
    return out


@dataclass
class SourceValues:
    """What the source view shows of a trace, before any Bokeh model (``source_figure`` and ``reuse`` read it)."""

    n: int  # rows (files' headers, lines, gaps)
    visible: int
    width: int
    title: str
    linked: bool
    spans: Any  # the timeline's span source, or None
    data: dict[str, list]
    bars: dict[str, list]
    labels: dict[str, list]
    members: list[int]
    first: list[int]


def source_values(
    trace: Any,
    spans: Any,
    *,
    title: str | None = None,
    dark: bool = False,
    table: Mapping[str, np.ndarray] | None = None,
) -> SourceValues:
    """``source_figure``'s data for ``trace``, linked to ``spans`` (the timeline's span source, or None); ``table``:
    ``trace.table()`` where the caller read it already."""
    table = trace.table() if table is None else table
    locations = list(getattr(trace, "locations", None) or [])
    lines_of = getattr(trace, "lines", None)
    rows, row_of = line_rows(table, locations, sorted(getattr(lines_of, "focus", ())))
    n = len(rows)
    at = _Layout(rows)
    lines = [i for i, r in enumerate(rows) if r["kind"] == "line"]
    data = _row_columns(rows, lines, locations)
    linked = spans is not None and len(spans.data.get("loc", ())) > 0
    if title is None:
        title = "device time by source line"
        if linked:
            title += " (tap a line: its spans on the timeline)"
        elif not lines:
            title += ": no device work was issued from a recorded line"
        if n > MAX_VISIBLE:
            title += "; the wheel scrolls the lines"
    members: list[int] = []
    first: list[int] = []
    if linked:
        position = np.full(n + 1, -1, np.int64)  # a row of ``rows`` -> its entry in the row source (-1: no line)
        position[lines] = np.arange(len(lines))
        found, starts = spans_by_row(spans.data["loc"], spans.data["kind"], position[row_of], len(lines))
        members, first = found.tolist(), starts.tolist()
    return SourceValues(
        n=n,
        visible=min(n, MAX_VISIBLE) or 1,
        width=max(at.width, int(TITLE_CHAR_PX * len(title))),
        title=title,
        linked=linked,
        spans=spans if linked else None,
        data=data,
        bars=_bar_columns(data, at, dark),
        labels=_label_columns(rows, data, at, dark),
        members=members,
        first=first,
    )


def source_figure(trace: Any, timeline: Any = None, *, title: str | None = None, dark: bool = False) -> Any:
    """The annotated source of a trace's lines as a Bokeh plot (module docstring): per line its number, its text, a
    bar of its device time and "N ops · 1.2 ms (34 %)". Tapping lines selects their spans in ``timeline`` (a
    ``Trace.timeline()`` column, its figure or its span source); without one the view stands alone. ``dark``: colours
    for a dark page."""
    v = source_values(trace, _span_source(timeline), title=title, dark=dark)
    n, visible, width, title, linked = v.n, v.visible, v.width, v.title, v.linked
    plot = Plot(
        title=Title(text=title, text_font_size="9pt", text_font_style="normal"),
        frame_width=width,
        frame_height=visible * ROW_PX,
        width=width + 2 * BORDER_PX,  # the frame's size decides (x is in pixels: a stretched frame would move the
        height=visible * ROW_PX + TITLE_PX,  # bars under the text); these say so to Bokeh's check of fixed sizes
        sizing_mode="fixed",
        frame_align=False,  # in a column with the timeline, its frame would move right to line up with the timeline's
        x_range=Range1d(0, width),
        y_range=Range1d(visible - 0.5, -0.5, bounds=(-0.5, max(n, 1) - 0.5)),
        toolbar_location=None,
        min_border=BORDER_PX,
        outline_line_color=None,
        name="source view",
    )
    rows_source = ColumnDataSource(v.data, name="source rows")
    # Whole-row strips under the text: what a tap hits, and what shows the picked lines.
    strip = {"y": "y", "left": 0, "right": width, "height": 1.0, "line_color": None}
    unpicked = HBar(**strip, fill_color=PICK_COLOR, fill_alpha=0.0)
    picks = GlyphRenderer(
        data_source=rows_source,
        glyph=unpicked,
        selection_glyph=HBar(**strip, fill_color=PICK_COLOR, fill_alpha=0.9),
        nonselection_glyph=unpicked,
        hover_glyph=HBar(**strip, fill_color="#000000", fill_alpha=0.06),
        name="source picks",
    )
    bars = GlyphRenderer(
        data_source=ColumnDataSource(v.bars, name="source bars"),
        glyph=HBar(y="y", left="left", right="right", height=0.6, fill_color="color", line_color=None),
        name="bars",
    )
    text = Text(
        x="x", y="y", text="text", text_align="align", text_color="color", text_font_style="style",
        text_font=value("monospace"), text_font_size=f"{FONT_PX}px", text_baseline="middle",
    )  # fmt: skip
    labels = GlyphRenderer(data_source=ColumnDataSource(v.labels, name="source labels"), glyph=text, name="labels")
    plot.renderers = [picks, bars, labels]
    tips = [("line", "@where"), ("in", "@function"), ("device", "@work"), ("issued in", "@sites")]
    plot.add_tools(HoverTool(renderers=[picks], tooltips=tips, name="source hover"))
    if n > MAX_VISIBLE:
        wheel = WheelPanTool(dimension="height")
        plot.add_tools(wheel)
        plot.toolbar.active_scroll = wheel
    if linked:
        plot.add_tools(TapTool(renderers=[picks], mode="toggle"))
        link = CustomJS(
            args={"rows": rows_source, "spans": v.spans, "members": v.members, "first": v.first},
            code=SELECT_SPANS,
            name="source link",
        )
        rows_source.selected.js_on_change("indices", link)
    return plot
