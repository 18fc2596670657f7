"""Overlap, idle time, the 8-state breakdown, gap causes and advice: pure functions of span tables.

Every number follows DESIGN §6. Per device, K is the union of kernel, device-to-device copy and memset intervals, H of
H2D, D of D2H, C = H ∪ D and A = K ∪ C, all clipped to the window W. Durations are never summed across streams: each
figure is the length of a union. Functions take the columnar table of ``trace/spans.py`` and never a backend object.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from gpuworkbench.errors import InvalidArgument
from gpuworkbench.trace.spans import HOST_KINDS, KIND_CODE, KINDS, PEER_ROUTES, parse_peer_copy

#: Intervals as two int64 arrays ``(starts, ends)``; the functions below return them sorted, disjoint and non-touching.
Intervals = tuple[np.ndarray, np.ndarray]

#: The 8 states of a device at one instant, named by which engines are busy (H2D, D2H, kernels).
STATES: tuple[str, ...] = ("idle", "K", "H", "D", "H+K", "D+K", "H+D", "H+D+K")

#: Gap causes, in the order of their integer codes.
GAP_CAUSES: tuple[str, ...] = ("host-wait", "launch", "other")

#: Launch gaps are shorter than this (DESIGN §6, θ).
DEFAULT_THETA_NS = 5_000

# Bit masks of the sweep: H = 1, D = 2, K = 4; the state name of every mask.
_H, _D, _K = 1, 2, 4
_STATE_OF_MASK: tuple[str, ...] = ("idle", "H", "D", "H+D", "K", "H+K", "D+K", "H+D+K")

_H2D, _D2H, _KERNEL = KIND_CODE["h2d"], KIND_CODE["d2h"], KIND_CODE["kernel"]
# alloc, free, markers, API calls and host ranges happen on the host: they never count as busy device time.
_IS_WORK = np.array([name not in HOST_KINDS for name in KINDS])
_IS_K = np.array([name in ("kernel", "d2d", "memset") for name in KINDS])

# Advice thresholds (see the docstring of ``_advise`` for what each one decides).
_HOST_WAIT_SHARE = 0.5  # host-wait time / all gap time on a stream
_HOST_WAIT_MIN_WINDOW_SHARE = 0.1  # host-wait time on a stream / |W|
_LAUNCH_MIN_KERNELS = 20
_LAUNCH_MAX_MEDIAN_NS = 10_000
_LAUNCH_GAP_RATIO = 0.5  # median gap before a kernel / median kernel duration
_SERIAL_UNION_SHARE = 0.9  # |union of one direction| / sum of its durations
_SERIAL_BLOCKED_SHARE = 0.1  # time a ready copy waited on another stream's copy / |union of that direction|
_SERIAL_MAX_HIDDEN_SHARE = 0.5  # |that direction ∩ (K ∪ other direction)| / |that direction|
_SMALL_SHARE = 0.5  # kernels of a library op below its crossover / all its kernels of known size (more than this)

_REQUIRED_COLUMNS = ("kind", "device", "stream", "start_ns", "end_ns", "enqueue_ns", "bytes", "pinned")


# --- interval algebra ---------------------------------------------------------------------------------------------


def _empty() -> Intervals:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _merge_sorted(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge intervals already sorted by start (empty ones dropped); touching intervals merge."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return _empty()
    reach = np.maximum.accumulate(ends)
    new_run = np.empty(starts.size, dtype=bool)
    new_run[0] = True
    new_run[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new_run)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], reach[last]


def union(starts: Any, ends: Any) -> Intervals:
    """The sorted, merged intervals covering exactly the time the given ones cover (touching merge, empty drop).

    Every DESIGN §6 quantity is the length of a union, so that time covered by several streams counts once.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    return _merge_sorted(starts[order], ends[order])


def _sweep(parts: list[Intervals], weights: list[int], points: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries ``b`` and values ``v``: on ``[b[i], b[i+1])`` the summed weights of the parts covering it.

    Each part must be a union (disjoint), so with weights 1, 2, 4 the value is a bit mask of which parts cover.
    """
    times = np.concatenate([p[0] for p in parts] + [p[1] for p in parts] + [np.asarray(points, dtype=np.int64)])
    deltas = np.concatenate(
        [np.full(p[0].size, w, dtype=np.int64) for p, w in zip(parts, weights, strict=True)]
        + [np.full(p[1].size, -w, dtype=np.int64) for p, w in zip(parts, weights, strict=True)]
        + [np.zeros(len(points), dtype=np.int64)]
    )
    order = np.argsort(times, kind="stable")
    times = times[order]
    values = np.cumsum(deltas[order])
    last_at_time = np.ones(times.size, dtype=bool)
    last_at_time[:-1] = times[1:] != times[:-1]
    return times[last_at_time], values[last_at_time]


def _select(bounds: np.ndarray, values: np.ndarray, wanted: int) -> Intervals:
    keep = values[:-1] == wanted
    return _merge_sorted(bounds[:-1][keep], bounds[1:][keep])


def _normal(a: Intervals) -> Intervals:
    return union(a[0], a[1])


def intersection(a: Intervals, b: Intervals) -> Intervals:
    """The time covered by both ``a`` and ``b``, as a union.

    Overlap is |C ∩ K|: the copy time during which some kernel also ran.
    """
    bounds, values = _sweep([_normal(a), _normal(b)], [1, 2])
    return _select(bounds, values, 3)


def difference(a: Intervals, b: Intervals) -> Intervals:
    """The time covered by ``a`` and not by ``b``, as a union.

    Exposed copy time is |C \\ K|: copy time that no kernel hides.
    """
    bounds, values = _sweep([_normal(a), _normal(b)], [1, 2])
    return _select(bounds, values, 1)


def clip(a: Intervals, start: int, end: int) -> Intervals:
    """The part of ``a`` inside the window ``[start, end]``, as a union.

    Every figure is measured inside one window W, so spans reaching outside it count only in part.
    """
    starts, ends = _normal(a)
    return _merge_sorted(np.maximum(starts, start), np.minimum(ends, end))


def total_length(a: Intervals) -> int:
    """Total time (ns) covered by ``a``, which must be a union (as every function here returns).

    The |X| of DESIGN §6.
    """
    return int(np.sum(a[1] - a[0]))


def _covered(states: dict[str, int], *engines: str) -> int:
    """Time (ns) during which any of ``engines`` ("H", "D", "K") was busy, read off the 8 states."""
    return sum(ns for state, ns in states.items() if any(e in state.split("+") for e in engines))


# --- advice and summaries -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    """One finding about a trace, named by a stable ``code``, with a message in the user's words.

    Codes: ``pageable-memory``, ``one-stream``, ``host-wait``, ``launch-bound``, ``same-direction-copies``,
    ``too-small-for-gpu``.
    """

    code: str
    message: str
    severity: str = "warning"  # "warning" (costs time now) or "info" (worth knowing)
    device: int = 0


@dataclass(frozen=True)
class CrossoverPoint:
    """Where a library op starts to beat NumPy on one device, as ``gw.crossover`` measured it.

    Kernel spans named ``kernel`` whose ``bytes`` (what the launch read and wrote) are below ``bytes`` ran at sizes
    where NumPy on the host was faster. ``size`` is the crossover in the op's ``unit`` ("n" for an n × n matmul,
    "elements" otherwise), None when the device never won up to ``largest``; ``with_copies`` likewise, counting the
    host↔device copies.
    """

    op: str
    kernel: str
    bytes: int
    size: int | None
    unit: str
    largest: int
    with_copies: int | None = None


#: Crossover points per device number, each by kernel span name: what ``summarize(crossover=...)`` takes.
Crossovers = Mapping[int, Mapping[str, CrossoverPoint]]


@dataclass(frozen=True)
class DeviceSummary:
    """The DESIGN §6 figures of one device over one window W (times in ns, percentages 0–100).

    ``window_source`` is "ops" (first op start to last op end) or "cell" (a window passed in, e.g. a cell's wall time).
    ``gap_ns`` holds per stream the gap time per cause; gaps are never summed across streams.
    """

    device: int
    window_start_ns: int
    window_end_ns: int
    window_source: str  # "ops" or "cell"
    window_ns: int  # |W|
    overlap_pct: float | None  # 100·|C ∩ K| / |C|; None without copies
    exposed_copy_ns: int  # |C \ K|
    h2d_overlap_pct: float | None  # 100·|H ∩ K| / |H|
    d2h_overlap_pct: float | None  # 100·|D ∩ K| / |D|
    idle_pct: float | None  # 100·(|W| − |A|) / |W|; None when |W| = 0
    states: dict[str, int]  # the 8 states (STATES) -> ns; sums to window_ns
    pipeline_efficiency: float | None  # max(|H|, |K|, |D|) / |W|: the busiest engine's share (fill/drain not known)
    stream_busy: dict[int, float]  # stream -> |S| / |W| (0–1), S the union of that stream's ops
    bandwidth_gbps: dict[str, float | None]  # "h2d"/"d2h" -> bytes / summed copy durations (bytes/ns = GB/s)
    op_counts: dict[str, int]  # kind -> spans in the window, alloc/free/marker included
    gap_ns: dict[int, dict[str, int]]  # stream -> gap cause -> ns
    gap_counts: dict[str, int]  # gap cause -> number of gaps on all streams
    advice: list[Advice]

    @property
    def kernel_ns(self) -> int:
        """|K|: time some kernel, device copy or memset ran."""
        return _covered(self.states, "K")

    @property
    def h2d_ns(self) -> int:
        """|H|: time some host-to-device copy ran."""
        return _covered(self.states, "H")

    @property
    def d2h_ns(self) -> int:
        """|D|: time some device-to-host copy ran."""
        return _covered(self.states, "D")

    @property
    def copy_ns(self) -> int:
        """|C| = |H ∪ D|."""
        return _covered(self.states, "H", "D")

    @property
    def active_ns(self) -> int:
        """|A| = |K ∪ C|: time the device did anything."""
        return self.window_ns - self.states["idle"]

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        return asdict(self)

    def __str__(self) -> str:
        return _text({self.device: self}, self.advice)

    def _repr_html_(self) -> str:
        return _html({self.device: self}, self.advice)


#: The DeviceSummary fields that ``Summary`` forwards to its first device.
_FORWARDED = (
    "window_start_ns",
    "window_end_ns",
    "window_source",
    "window_ns",
    "overlap_pct",
    "exposed_copy_ns",
    "h2d_overlap_pct",
    "d2h_overlap_pct",
    "idle_pct",
    "states",
    "pipeline_efficiency",
    "stream_busy",
    "bandwidth_gbps",
    "op_counts",
    "gap_ns",
    "gap_counts",
    "kernel_ns",
    "h2d_ns",
    "d2h_ns",
    "copy_ns",
    "active_ns",
)


@dataclass(frozen=True)
class Summary:
    """A trace's figures, one ``DeviceSummary`` per device; ``summary.overlap_pct`` etc. read the first device.

    Most traces use one device, so its figures are one attribute away; ``advice`` gathers every device's, then the
    cross-device advice. ``cross_device`` holds the figures across devices (None with one device and no peer copy).
    """

    devices: dict[int, DeviceSummary]
    cross_device: CrossDevice | None = None

    @property
    def first_device(self) -> DeviceSummary:
        """The summary of the lowest-numbered device (the only one, usually)."""
        if not self.devices:
            raise ValueError("the trace holds no spans, so there is no device to summarise")
        return self.devices[min(self.devices)]

    @property
    def advice(self) -> list[Advice]:
        """Advice for every device, device by device, then the cross-device advice."""
        per_device = [item for device in sorted(self.devices) for item in self.devices[device].advice]
        return per_device + (self.cross_device.advice if self.cross_device is not None else [])

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        out: dict[str, Any] = {"devices": {device: ds.to_dict() for device, ds in sorted(self.devices.items())}}
        if self.cross_device is not None:
            out["cross_device"] = self.cross_device.to_dict()
        return out

    def __str__(self) -> str:
        return _text(self.devices, self.advice, self.cross_device)

    def _repr_html_(self) -> str:
        return _html(self.devices, self.advice, self.cross_device)


def _forward(name: str) -> property:
    return property(lambda self: getattr(self.first_device, name), doc=f"``{name}`` of the first device.")


for _name in _FORWARDED:
    setattr(Summary, _name, _forward(_name))
del _name


# --- per-device columns -------------------------------------------------------------------------------------------


@dataclass
class _DeviceSpans:
    """One device's spans inside its window, start/end clipped to it; ``duration`` is the unclipped duration."""

    device: int
    w0: int
    w1: int
    source: str
    kind: np.ndarray
    stream: np.ndarray
    start: np.ndarray
    end: np.ndarray
    enqueue: np.ndarray
    bytes: np.ndarray
    pinned: np.ndarray
    duration: np.ndarray
    index: np.ndarray  # the rows of the table these spans are

    def rows(self, mask: np.ndarray) -> Intervals:
        return self.start[mask], self.end[mask]


def _check_table(table: Mapping[str, np.ndarray]) -> None:
    missing = [col for col in _REQUIRED_COLUMNS if col not in table]
    if missing:
        raise InvalidArgument(f"span table lacks column(s) {', '.join(missing)}; build it with trace.spans.empty_table")


def _check_window(window: tuple[int, int] | None) -> tuple[int, int] | None:
    if window is None:
        return None
    start, end = int(window[0]), int(window[1])
    if end < start:
        raise InvalidArgument(f"window ends ({end} ns) before it starts ({start} ns)")
    return start, end


def _device_spans(table: Mapping[str, np.ndarray], device: int, window: tuple[int, int] | None) -> _DeviceSpans:
    rows = np.flatnonzero(np.asarray(table["device"]) == device)
    kind = np.asarray(table["kind"])[rows]
    start = np.asarray(table["start_ns"], dtype=np.int64)[rows]
    end = np.asarray(table["end_ns"], dtype=np.int64)[rows]
    if window is None:
        work = _IS_WORK[kind]
        w0, w1 = (int(start[work].min()), int(end[work].max())) if work.any() else (0, 0)
        source = "ops"
        inside = np.ones(rows.size, dtype=bool)
    else:
        w0, w1 = window
        source = "cell"
        inside = (end >= w0) & (start <= w1)
    rows, kind, start, end = rows[inside], kind[inside], start[inside], end[inside]
    return _DeviceSpans(
        device=device,
        w0=w0,
        w1=w1,
        source=source,
        kind=kind,
        stream=np.asarray(table["stream"])[rows],
        start=np.clip(start, w0, w1),
        end=np.clip(end, w0, w1),
        enqueue=np.asarray(table["enqueue_ns"], dtype=np.int64)[rows],
        bytes=np.asarray(table["bytes"], dtype=np.int64)[rows],
        pinned=np.asarray(table["pinned"])[rows],
        duration=end - start,
        index=rows,
    )


def _engine_sweep(spans: _DeviceSpans) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries and H/D/K bit masks of the device's states, covering its whole window."""
    h = union(*spans.rows(spans.kind == _H2D))
    d = union(*spans.rows(spans.kind == _D2H))
    k = union(*spans.rows(_IS_K[spans.kind]))
    return _sweep([h, d, k], [_H, _D, _K], points=(spans.w0, spans.w1))


def _states(spans: _DeviceSpans) -> dict[str, int]:
    bounds, masks = _engine_sweep(spans)
    lengths, masks = np.diff(bounds), masks[:-1]
    by_mask = [int(lengths[masks == m].sum()) for m in range(8)]
    by_mask[0] = (spans.w1 - spans.w0) - sum(by_mask[1:])
    return {state: by_mask[_STATE_OF_MASK.index(state)] for state in STATES}


# --- gaps -----------------------------------------------------------------------------------------------------------


def _gaps(
    device: np.ndarray, stream: np.ndarray, start: np.ndarray, end: np.ndarray, enqueue: np.ndarray, theta_ns: int
) -> dict[str, np.ndarray]:
    """Every gap between consecutive ops of one stream (ordered by start), with its cause code.

    Columns: ``order`` (the ops sorted by device, stream, start), ``after`` (position in ``order`` of the op after each
    gap), ``start_ns``, ``end_ns``, ``code`` (index into GAP_CAUSES), and ``lead`` (max(0, gap) before every op that
    has a predecessor on its stream, -1 for the first op of a stream).
    """
    order = np.lexsort((start, stream, device))
    s_dev, s_stream, s_start, s_end, s_enq = device[order], stream[order], start[order], end[order], enqueue[order]
    same_stream = (s_dev[1:] == s_dev[:-1]) & (s_stream[1:] == s_stream[:-1])
    prev_end = s_end[:-1]
    gap = s_start[1:] - prev_end
    lead = np.full(order.size, -1, dtype=np.int64)
    lead[1:][same_stream] = np.maximum(gap[same_stream], 0)
    is_gap = same_stream & (gap > 0)
    after = np.flatnonzero(is_gap) + 1
    enq = s_enq[after]
    host_wait = (enq >= 0) & (enq > prev_end[after - 1])
    code = np.where(host_wait, 0, np.where(gap[after - 1] < theta_ns, 1, 2)).astype(np.int8)
    return {
        "order": order,
        "after": after,
        "start_ns": prev_end[after - 1],
        "end_ns": s_start[after],
        "code": code,
        "lead": lead,
    }


def gap_causes(table: Mapping[str, np.ndarray], theta_ns: int = DEFAULT_THETA_NS) -> dict[str, np.ndarray]:
    """Every idle gap between consecutive ops of a stream, classified as host-wait, launch or other (DESIGN §6).

    host-wait: the op after the gap was enqueued after the previous op ended; launch: shorter than ``theta_ns``;
    other: the rest (a sync or event wait). Returns columns ``device``, ``stream``, ``start_ns``, ``end_ns``, ``cause``
    (strings) and ``op_index`` (the table row of the op after the gap). alloc/free/marker spans are not ops here.
    """
    _check_table(table)
    work_rows = np.flatnonzero(_IS_WORK[np.asarray(table["kind"])])
    device = np.asarray(table["device"])[work_rows]
    stream = np.asarray(table["stream"])[work_rows]
    gaps = _gaps(
        device,
        stream,
        np.asarray(table["start_ns"], dtype=np.int64)[work_rows],
        np.asarray(table["end_ns"], dtype=np.int64)[work_rows],
        np.asarray(table["enqueue_ns"], dtype=np.int64)[work_rows],
        theta_ns,
    )
    op_rows = work_rows[gaps["order"][gaps["after"]]]
    return {
        "device": device[gaps["order"][gaps["after"]]],
        "stream": stream[gaps["order"][gaps["after"]]],
        "start_ns": gaps["start_ns"],
        "end_ns": gaps["end_ns"],
        "cause": np.array(GAP_CAUSES, dtype=object)[gaps["code"]],
        "op_index": op_rows,
    }


# --- summaries ------------------------------------------------------------------------------------------------------


def _pct(part: int, whole: int) -> float | None:
    return None if whole == 0 else 100.0 * part / whole


def _bandwidth(spans: _DeviceSpans, code: int) -> float | None:
    """Bytes per ns (= GB/s) while copying: total bytes over the summed durations of that direction's copies."""
    sel = spans.kind == code
    busy = int(spans.duration[sel].sum())
    return None if busy == 0 else float(spans.bytes[sel].sum()) / busy


def _summarize_device(spans: _DeviceSpans, theta_ns: int, small: list[Advice] | None = None) -> DeviceSummary:
    window_ns = spans.w1 - spans.w0
    states = _states(spans)
    h, d, k, c = _covered(states, "H"), _covered(states, "D"), _covered(states, "K"), _covered(states, "H", "D")
    exposed = states["H"] + states["D"] + states["H+D"]  # |C \ K|

    work = _IS_WORK[spans.kind]
    w_stream, w_start, w_end = spans.stream[work], spans.start[work], spans.end[work]
    gaps = _gaps(np.zeros(w_stream.size, np.int16), w_stream, w_start, w_end, spans.enqueue[work], theta_ns)
    sorted_stream = w_stream[gaps["order"]]
    gap_len = gaps["end_ns"] - gaps["start_ns"]

    stream_busy: dict[int, float] = {}
    gap_ns: dict[int, dict[str, int]] = {}
    bounds = np.flatnonzero(np.diff(sorted_stream)) + 1
    for lo, hi in zip(np.append(0, bounds), np.append(bounds, sorted_stream.size), strict=True):
        if lo == hi:
            continue
        stream = int(sorted_stream[lo])
        idx = gaps["order"][lo:hi]
        busy = total_length(_merge_sorted(w_start[idx], w_end[idx]))
        stream_busy[stream] = busy / window_ns if window_ns else 0.0
        g_lo, g_hi = np.searchsorted(gaps["after"], [lo, hi])  # this stream's gaps, as gaps are sorted by stream
        codes, lengths = gaps["code"][g_lo:g_hi], gap_len[g_lo:g_hi]
        gap_ns[stream] = {cause: int(lengths[codes == i].sum()) for i, cause in enumerate(GAP_CAUSES)}

    summary_without_advice = DeviceSummary(
        device=spans.device,
        window_start_ns=spans.w0,
        window_end_ns=spans.w1,
        window_source=spans.source,
        window_ns=window_ns,
        overlap_pct=_pct(c - exposed, c),
        exposed_copy_ns=exposed,
        h2d_overlap_pct=_pct(states["H+K"] + states["H+D+K"], h),
        d2h_overlap_pct=_pct(states["D+K"] + states["H+D+K"], d),
        idle_pct=_pct(states["idle"], window_ns),
        states=states,
        pipeline_efficiency=max(h, k, d) / window_ns if window_ns else None,
        stream_busy=dict(sorted(stream_busy.items())),
        bandwidth_gbps={"h2d": _bandwidth(spans, _H2D), "d2h": _bandwidth(spans, _D2H)},
        op_counts={KINDS[code]: int(n) for code, n in enumerate(np.bincount(spans.kind, minlength=len(KINDS))) if n},
        gap_ns=dict(sorted(gap_ns.items())),
        gap_counts={cause: int(np.count_nonzero(gaps["code"] == i)) for i, cause in enumerate(GAP_CAUSES)},
        advice=[],
    )
    kernel_leads = gaps["lead"][spans.kind[work][gaps["order"]] == _KERNEL]
    advice = _advise(spans, summary_without_advice, kernel_leads[kernel_leads >= 0])
    return replace(summary_without_advice, advice=advice + (small or []))


def summarize(
    table: Mapping[str, np.ndarray],
    window: tuple[int, int] | None = None,
    theta_ns: int = DEFAULT_THETA_NS,
    crossover: Crossovers | None = None,
) -> Summary:
    """The DESIGN §6 figures of every device in ``table``: overlap, idle, 8 states, efficiency, bandwidth, advice.

    ``window`` = (start_ns, end_ns), e.g. a cell's wall time, replaces W = [first op start, last op end]; spans are
    clipped to it. ``crossover``: per device number, the measured crossover of each library kernel (by span name;
    ``gw.crossover`` makes them), for the advice ``too-small-for-gpu``. Vectorised, so that a 10^6-span table
    summarises in well under a second.
    """
    _check_table(table)
    window = _check_window(window)
    devices = [int(d) for d in np.unique(np.asarray(table["device"]))]
    found = {}
    for d in devices:
        spans = _device_spans(table, d, window)
        points = crossover.get(d) if crossover else None
        small = _too_small(spans, table, points) if points else None
        found[d] = _summarize_device(spans, theta_ns, small)
    return Summary(found, cross_device(table, window))


def state_segments(
    table: Mapping[str, np.ndarray], device: int = 0, window: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    """Consecutive segments covering the device's window, each in one of the 8 states (idle included).

    The timeline's overlap strip draws them: ``start_ns``, ``end_ns`` (int64) and ``state`` (strings from STATES).
    """
    _check_table(table)
    spans = _device_spans(table, device, _check_window(window))
    bounds, masks = _engine_sweep(spans)
    names = np.array(_STATE_OF_MASK, dtype=object)
    return {"start_ns": bounds[:-1], "end_ns": bounds[1:], "state": names[masks[:-1]]}


# --- advice ---------------------------------------------------------------------------------------------------------


def _advise(spans: _DeviceSpans, summary: DeviceSummary, kernel_leads: np.ndarray) -> list[Advice]:
    """The advice codes, each decided by one rule.

    - ``pageable-memory``: some H2D or D2H span has ``pinned == 0``.
    - ``one-stream``: the device ran copies (H2D/D2H) and kernels, and every op on one stream.
    - ``host-wait``: on some stream, host-wait gaps are ≥ 50 % of its gap time and ≥ 10 % of |W|.
    - ``launch-bound``: ≥ 20 kernels, median kernel duration < 10 µs, and the median gap before a kernel (on its
      stream, 0 when back to back) ≥ half the median kernel duration.
    - ``same-direction-copies``: for one direction X (H2D or D2H): ≥ 2 streams issue X copies; |X| ≥ 90 % of the sum
      of their durations (they ran one at a time); for ≥ 10 % of |X| a copy was enqueued and its own stream idle, yet
      it waited while another stream's X copy ran (one copy engine per direction); and < 50 % of |X| overlaps kernels
      or the other direction, so the extra streams bought little overlap. A healthy multi-stream pipeline, whose
      copies wait on each other but hide behind kernels, does not fire.
    """
    device = spans.device
    found: list[Advice] = []
    work = _IS_WORK[spans.kind]
    is_copy = (spans.kind == _H2D) | (spans.kind == _D2H)

    pageable = is_copy & (spans.pinned == 0)
    if pageable.any():
        found.append(
            Advice(
                "pageable-memory",
                f"{_count(int(pageable.sum()), 'copy', 'copies')} "
                f"({_format_bytes(int(spans.bytes[pageable].sum()))}) used pageable host memory: such a copy is "
                "staged through a driver buffer and cannot overlap with kernels. Allocate the host array with "
                "dev.empty_pinned(...).",
                device=device,
            )
        )

    streams = np.unique(spans.stream[work])
    if is_copy.any() and _IS_K[spans.kind].any() and streams.size == 1:
        found.append(
            Advice(
                "one-stream",
                f"all {int(work.sum())} ops ran on stream {int(streams[0])}, so copies and kernels could not overlap. "
                "Put the copies and kernels of different batches on different streams (dev.stream_pool(n)).",
                device=device,
            )
        )

    waiting = []
    for stream, by_cause in summary.gap_ns.items():
        total = sum(by_cause.values())
        waited = by_cause["host-wait"]
        if total and waited >= _HOST_WAIT_SHARE * total and waited >= _HOST_WAIT_MIN_WINDOW_SHARE * summary.window_ns:
            waiting.append(f"stream {stream} for {_format_ns(waited)} ({_pct(waited, summary.window_ns):.0f} % of W)")
    if waiting:
        found.append(
            Advice(
                "host-wait",
                f"the device waited for the host: {', '.join(waiting)}. Ops were enqueued only after the previous op "
                "had finished, the mark of a blocking call (a synchronous copy_to_host, synchronize, ev.wait()) "
                "between ops. Enqueue the next work before waiting on the last.",
                device=device,
            )
        )

    kernel = spans.kind == _KERNEL
    if kernel.sum() >= _LAUNCH_MIN_KERNELS and kernel_leads.size:
        median_ns = float(np.median(spans.end[kernel] - spans.start[kernel]))
        median_gap = float(np.median(kernel_leads))
        if median_ns < _LAUNCH_MAX_MEDIAN_NS and median_gap >= _LAUNCH_GAP_RATIO * median_ns:
            found.append(
                Advice(
                    "launch-bound",
                    f"{int(kernel.sum())} kernels took {_format_ns(median_ns)} each (median) with "
                    f"{_format_ns(median_gap)} gaps between them: launching costs as much as the work. Fuse small "
                    "kernels, give each more work, or replay them as a graph (op.graph_on(stream)).",
                    device=device,
                )
            )

    for code, label in ((_H2D, "H2D"), (_D2H, "D2H")):
        message = _serialised_copies(spans, code, label)
        if message:
            found.append(Advice("same-direction-copies", message, severity="info", device=device))
    return found


def _too_small(
    spans: _DeviceSpans, table: Mapping[str, np.ndarray], points: Mapping[str, CrossoverPoint]
) -> list[Advice]:
    """``too-small-for-gpu``, once per library op: of its kernels whose size is known (``bytes`` > 0, spans named as
    a measured crossover's ``kernel``), more than half read and wrote fewer bytes than the op does at its measured
    crossover (at any size measured, where the device never won), so NumPy on the host would have been faster."""
    if "name" not in table:
        return []
    kernel = (spans.kind == _KERNEL) & (spans.bytes > 0)
    if not kernel.any():
        return []
    names = np.asarray(table["name"], dtype=object)[spans.index[kernel]]
    nbytes = spans.bytes[kernel]
    found = []
    for name in sorted(points):
        point = points[name]
        mine = names == name
        count = int(np.count_nonzero(mine))
        if count == 0:
            continue
        below = int(np.count_nonzero(nbytes[mine] < point.bytes))
        if below <= _SMALL_SHARE * count:
            continue
        ran = f"{below} of {count} {point.op} kernels ({name})"
        if point.size is None:
            where = (
                f"{ran} ran at sizes where this device did not beat NumPy on the host in any size measured (up to "
                f"{_format_size(point.largest, point.unit)})"
            )
        else:
            where = (
                f"{ran} ran below {_format_size(point.size, point.unit)}, the size from which this device beats "
                "NumPy on the host"
            )
            if point.with_copies is not None:
                where += f" ({_format_size(point.with_copies, point.unit)} counting the copies)"
        found.append(
            Advice(
                "too-small-for-gpu",
                f"{where}, as gw.crossover measured. At these sizes the launch and the copies cost more than the "
                "work: give each call more work (batch rows or matrices together), or keep such small ops on the host.",
                device=spans.device,
            )
        )
    return found


def _format_size(size: int, unit: str) -> str:
    """A crossover size in its op's unit: "n = 512" (an n × n matmul) or "65,536 elements"."""
    return f"n = {size}" if unit == "n" else f"{size:,} elements"


def _serialised_copies(spans: _DeviceSpans, code: int, label: str) -> str | None:
    """The same-direction-copies message for one direction, or None when the rule (see ``_advise``) does not fire."""
    sel = spans.kind == code
    streams = np.unique(spans.stream[sel])
    if streams.size < 2:
        return None
    copies = union(*spans.rows(sel))
    copy_ns = total_length(copies)
    if copy_ns == 0 or copy_ns < _SERIAL_UNION_SHARE * int((spans.end[sel] - spans.start[sel]).sum()):
        return None
    others = union(*spans.rows(_IS_K[spans.kind] | (spans.kind == (_D2H if code == _H2D else _H2D))))
    if total_length(intersection(copies, others)) >= _SERIAL_MAX_HIDDEN_SHARE * copy_ns:
        return None
    work = _IS_WORK[spans.kind]
    blocked_parts = []
    for stream in streams:
        mine = spans.stream == stream
        ready = sel & mine & (spans.enqueue >= 0) & (spans.enqueue < spans.start)
        waits = union(np.maximum(spans.enqueue[ready], spans.w0), spans.start[ready])
        idle_waits = difference(waits, union(*spans.rows(work & mine)))
        blocked_parts.append(intersection(idle_waits, union(*spans.rows(sel & ~mine))))
    blocked = union(np.concatenate([p[0] for p in blocked_parts]), np.concatenate([p[1] for p in blocked_parts]))
    blocked_ns = total_length(blocked)
    if blocked_ns == 0 or blocked_ns < _SERIAL_BLOCKED_SHARE * copy_ns:
        return None
    return (
        f"{label} copies on streams {', '.join(str(int(s)) for s in streams)} ran one at a time: for "
        f"{_format_ns(blocked_ns)} a copy was ready on an idle stream but waited for another stream's {label} copy. "
        f"A device has one copy engine per direction, so splitting a copy over streams does not speed it up; "
        f"overlap {label} with kernels or the other direction instead (a pipeline of batches)."
    )


# --- across devices -------------------------------------------------------------------------------------------------

# device-imbalance fires when, among the devices that ran kernels, the busiest was busy at least this many times as
# long as the least busy one, and longer by at least _IMBALANCE_MIN_NS (so that short or near-even traces stay quiet).
_IMBALANCE_RATIO = 1.25
_IMBALANCE_MIN_NS = 1_000_000


@dataclass(frozen=True)
class PeerCopies:
    """The peer copies of one source, destination and route (``trace.spans.PEER_ROUTES``), devices named by spec.

    ``time_ns`` is the union of their spans; ``bandwidth_gbps`` = bytes / ``time_ns`` (bytes per ns = GB/s)."""

    source: str
    destination: str
    route: str
    count: int
    bytes: int
    time_ns: int
    bandwidth_gbps: float | None
    direct_path: bool  # the driver reported a direct path (taken or not)


@dataclass(frozen=True)
class CrossDevice:
    """Figures across the trace's devices over one window W (first op of any device to the last op of any).

    ``busy_ns``: per device |A|, the union of its device work in W; ``busy_pct`` = 100·|A| / |W|. The slowest device
    is the one whose work ends last: ``waited_ns`` says, per device, how long after its own last op it waited for the
    slowest one's (0 for the slowest), what joining the devices' results costs. ``peer_copy_ns`` is the union of every
    peer copy's span. Advice codes: ``device-imbalance``, ``peer-copy-staged``.
    """

    window_start_ns: int
    window_end_ns: int
    window_ns: int
    busy_ns: dict[int, int]
    busy_pct: dict[int, float | None]
    slowest_device: int
    waited_ns: dict[int, int]
    peer_copies: list[PeerCopies]
    peer_copy_ns: int
    advice: list[Advice]

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        return asdict(self)


def cross_device(table: Mapping[str, np.ndarray], window: tuple[int, int] | None = None) -> CrossDevice | None:
    """Busy time per device, the slowest device and the others' wait for it, peer copies with their bandwidth, and the
    advice ``device-imbalance`` and ``peer-copy-staged``; None when fewer than two devices worked and no peer copy ran.

    ``window`` = (start_ns, end_ns) replaces W, as in ``summarize``. Peer copies are the ``d2d`` spans named by
    ``trace.spans.peer_copy_name`` (a table without names has none)."""
    _check_table(table)
    window = _check_window(window)
    kind = np.asarray(table["kind"])
    work = _IS_WORK[kind]
    device = np.asarray(table["device"], dtype=np.int64)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    names = table.get("name")
    peer_rows = []
    if names is not None:
        for i in np.flatnonzero(kind == KIND_CODE["d2d"]).tolist():
            route = parse_peer_copy(str(names[i]))
            if route is not None:
                peer_rows.append((i, route))
    working = [int(d) for d in np.unique(device[work])]
    if len(working) < 2 and not peer_rows:
        return None
    if window is None:
        w0, w1 = (int(start[work].min()), int(end[work].max())) if work.any() else (0, 0)
    else:
        w0, w1 = window
    busy: dict[int, int] = {}
    last_end: dict[int, int] = {}
    for d in working:
        rows = work & (device == d)
        busy[d] = total_length(clip((start[rows], end[rows]), w0, w1))
        last_end[d] = min(int(end[rows].max()), w1)
    slowest = max(working, key=lambda d: (last_end[d], busy[d], -d)) if working else -1
    peer_idx = np.array([i for i, _ in peer_rows], dtype=np.int64)
    return CrossDevice(
        window_start_ns=w0,
        window_end_ns=w1,
        window_ns=w1 - w0,
        busy_ns=busy,
        busy_pct={d: _pct(b, w1 - w0) for d, b in busy.items()},
        slowest_device=slowest,
        waited_ns={d: last_end[slowest] - last_end[d] for d in working},
        peer_copies=_peer_copies(peer_rows, table, start, end, w0, w1),
        peer_copy_ns=total_length(clip((start[peer_idx], end[peer_idx]), w0, w1)),
        advice=_imbalance(working, busy, kind, device) + _staged(peer_rows, table, device),
    )


def _peer_copies(
    rows: list[tuple[int, tuple[str, str, str]]],
    table: Mapping[str, np.ndarray],
    start: np.ndarray,
    end: np.ndarray,
    w0: int,
    w1: int,
) -> list[PeerCopies]:
    """The peer copies grouped by (source, destination, route), in order of first appearance."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, key in rows:
        groups.setdefault(key, []).append(i)
    nbytes_col = np.asarray(table["bytes"], dtype=np.int64)
    found = []
    for (src, dst, route), idx in groups.items():
        time_ns = total_length(clip((start[idx], end[idx]), w0, w1))
        nbytes = int(nbytes_col[idx].sum())
        found.append(
            PeerCopies(
                source=src,
                destination=dst,
                route=route,
                count=len(idx),
                bytes=nbytes,
                time_ns=time_ns,
                bandwidth_gbps=nbytes / time_ns if time_ns else None,
                direct_path=route != PEER_ROUTES[1],
            )
        )
    return found


def _imbalance(working: list[int], busy: dict[int, int], kind: np.ndarray, device: np.ndarray) -> list[Advice]:
    """``device-imbalance``: among the devices that ran kernels (two or more), the busiest was busy ≥ 1.25 × as long
    as the least busy one and ≥ 1 ms longer (devices that only received copies are not compared)."""
    ran_kernels = [d for d in working if np.any((kind == _KERNEL) & (device == d))]
    if len(ran_kernels) < 2:
        return []
    most = max(ran_kernels, key=lambda d: (busy[d], -d))
    least = min(ran_kernels, key=lambda d: (busy[d], d))
    hi, lo = busy[most], busy[least]
    if hi - lo < _IMBALANCE_MIN_NS or hi < _IMBALANCE_RATIO * lo:
        return []
    mean = sum(busy[d] for d in ran_kernels) / len(ran_kernels)
    ratio = f"{hi / lo:.2f} ×" if lo else "the other idle"
    return [
        Advice(
            "device-imbalance",
            f"device {most} was busy {_format_ns(hi)}, device {least} {_format_ns(lo)} ({ratio}; this advice fires "
            f"from {_IMBALANCE_RATIO} × and 1 ms apart): the devices that ran kernels were unevenly loaded, and "
            f"whatever waits for all of them waits for the busiest. Spread evenly, each would be busy "
            f"{_format_ns(mean)}, {_format_ns(hi - mean)} less than device {most}: give each device work in "
            "proportion to its speed.",
            device=most,
        )
    ]


def _staged(
    rows: list[tuple[int, tuple[str, str, str]]], table: Mapping[str, np.ndarray], device: np.ndarray
) -> list[Advice]:
    """``peer-copy-staged``, once per (source, destination): a peer copy went through host memory although the
    driver reports a direct path between the two devices (its span's route is "staged, direct path unused")."""
    staged: dict[tuple[str, str], list[int]] = {}
    for i, (src, dst, route) in rows:
        if route == PEER_ROUTES[2]:
            staged.setdefault((src, dst), []).append(i)
    nbytes_col = np.asarray(table["bytes"], dtype=np.int64)
    return [
        Advice(
            "peer-copy-staged",
            f"{_count(len(idx), 'peer copy', 'peer copies')} ({_format_bytes(int(nbytes_col[idx].sum()))}) from {src} "
            f"to {dst} went through host memory although the driver reports a direct path between them: peer access "
            "could not be enabled (a GPU reaches at most 8 peers; some virtual machines refuse it). A direct copy "
            "moves the bytes once, device to device, instead of twice through the host.",
            device=int(device[idx[0]]),
        )
        for (src, dst), idx in staged.items()
    ]


def _cross_rows(cross: CrossDevice) -> list[tuple[str, str]]:
    """(name, value) pairs of the cross-device figures."""
    busy = ", ".join(f"{d}: {_format_pct(cross.busy_pct[d])}" for d in sorted(cross.busy_ns)) or "n/a"
    others = sorted((d, ns) for d, ns in cross.waited_ns.items() if d != cross.slowest_device)
    waited = ", ".join(f"{d}: {_format_ns(ns)}" for d, ns in others) or "none"
    rows = [("window W", _format_ns(cross.window_ns)), ("busy % per device", busy)]
    if cross.busy_ns:
        rows.append(("slowest device", f"{cross.slowest_device}; the others waited for it: {waited}"))
    for pc in cross.peer_copies:
        bandwidth = "n/a" if pc.bandwidth_gbps is None else f"{pc.bandwidth_gbps:.3g} GB/s"
        rows.append(
            (
                f"peer copy {pc.source} → {pc.destination}",
                f"{_count(pc.count, 'copy', 'copies')}, {_format_bytes(pc.bytes)} in {_format_ns(pc.time_ns)}, "
                f"{bandwidth} ({pc.route})",
            )
        )
    if cross.peer_copies:
        rows.append(("peer copy time", _format_ns(cross.peer_copy_ns)))
    return rows


# --- rendering ------------------------------------------------------------------------------------------------------


def _format_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def _format_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _format_pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def _rows(ds: DeviceSummary) -> list[tuple[str, str]]:
    """(name, value) pairs of one device, named as DESIGN §6 names them."""
    w = ds.window_ns
    states = "  ".join(f"{s} {_format_pct(_pct(ns, w))}" for s, ns in ds.states.items() if ns) or "n/a"
    busy = ", ".join(f"{s}: {100 * f:.1f} %" for s, f in ds.stream_busy.items()) or "n/a"
    bandwidth = ", ".join(
        f"{direction.upper()} {'n/a' if v is None else f'{v:.3g} GB/s'}" for direction, v in ds.bandwidth_gbps.items()
    )
    gaps = ", ".join(f"{cause} {n}" for cause, n in ds.gap_counts.items())
    ops = ", ".join(f"{kind} {n}" for kind, n in ds.op_counts.items()) or "none"
    if not ds.window_ns and all(kind in HOST_KINDS for kind in ds.op_counts):  # e.g. a CPU-only PyTorch profile
        return [("device work", "none in this trace"), ("host spans", ops)]
    efficiency = "n/a" if ds.pipeline_efficiency is None else f"{ds.pipeline_efficiency:.2f}"
    return [
        ("window W", f"{_format_ns(w)} (from {ds.window_source})"),
        ("overlap %", _format_pct(ds.overlap_pct)),
        ("exposed copy time", _format_ns(ds.exposed_copy_ns)),
        ("H2D overlap %", _format_pct(ds.h2d_overlap_pct)),
        ("D2H overlap %", _format_pct(ds.d2h_overlap_pct)),
        ("idle %", _format_pct(ds.idle_pct)),
        ("pipeline efficiency", efficiency),
        ("8-state breakdown", states),
        ("stream busy", busy),
        ("bandwidth", bandwidth),
        ("gap causes (count)", gaps),
        ("ops", ops),
    ]


def _text(devices: dict[int, DeviceSummary], advice: list[Advice], cross: CrossDevice | None = None) -> str:
    if not devices:
        return "no spans traced"
    lines = []
    for device, ds in sorted(devices.items()):
        lines.append(f"device {device}")
        lines += [f"  {name:<20} {value}" for name, value in _rows(ds)]
    if cross is not None:
        lines.append("across devices")
        lines += [f"  {name:<20} {value}" for name, value in _cross_rows(cross)]
    if advice:
        lines.append("advice")
        prefix = len(devices) > 1
        lines += [f"  [{a.code}] {f'device {a.device}: ' if prefix else ''}{a.message}" for a in advice]
    return "\n".join(lines)


def _html(devices: dict[int, DeviceSummary], advice: list[Advice], cross: CrossDevice | None = None) -> str:
    if not devices:
        return "<p>no spans traced</p>"
    ordered = [ds for _, ds in sorted(devices.items())]
    head = "".join(f"<th>device {ds.device}</th>" for ds in ordered)
    columns = [_rows(ds) for ds in ordered]
    body = "".join(
        f"<tr><th style='text-align:left'>{html.escape(name)}</th>"
        + "".join(f"<td style='text-align:left'>{html.escape(col[i][1])}</td>" for col in columns)
        + "</tr>"
        for i, (name, _) in enumerate(columns[0])
    )
    out = f"<table class='gpuworkbench-summary'><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>"
    if cross is not None:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(name)}</th><td style='text-align:left'>"
            f"{html.escape(value)}</td></tr>"
            for name, value in _cross_rows(cross)
        )
        out += "<table class='gpuworkbench-cross-device'><thead><tr><th colspan='2'>across devices</th></tr></thead>"
        out += f"<tbody>{rows}</tbody></table>"
    if advice:
        items = "".join(
            f"<li><b>{html.escape(a.code)}</b> ({html.escape(a.severity)}, device {a.device}): {html.escape(a.message)}"
            "</li>"
            for a in advice
        )
        out += f"<ul class='gpuworkbench-advice'>{items}</ul>"
    return out


# --- the workers of a cluster (gpuworkbench.dask) -------------------------------------------------------------------

#: Columns of a cluster trace's task table: the worker (an index into its workers), the task key, the action (an index
#: into TASK_ACTIONS), start and end on the trace's clock, and the host row (stream) it was drawn on.
TASK_COLUMNS: dict[str, Any] = {
    "worker": np.int32,
    "key": object,
    "action": np.int8,
    "start_ns": np.int64,
    "end_ns": np.int64,
    "stream": np.int32,
}
TASK_ACTIONS: tuple[str, ...] = ("compute", "transfer")
_IMBALANCE_WAIT_SHARE = 0.2  # the other workers' mean wait for the straggler / |W|
_BETWEEN_TASKS_SHARE = 0.2  # device idle between a worker's tasks / its active window
_BETWEEN_TASKS_MIN_NS = 1_000_000


@dataclass(frozen=True)
class WorkerSummary:
    """One Dask worker over the cluster's window W (ns): T is the union of its tasks' compute intervals (over all its
    threads), X of its incoming transfers, A of its devices' work; its active window runs from its first task or op
    to its last (``last_ns``, when it finished). ``idle_transfer_ns`` / ``idle_scheduler_ns``: time in the active
    window when no task computed and its devices were idle, while data came in (X) / while nothing did (it waited
    for the scheduler to hand it work)."""

    worker: str
    tasks: int
    first_ns: int
    last_ns: int
    compute_ns: int  # |T|
    transfer_ns: int  # |X|
    device_ns: int  # |A|
    busy_ns: int  # |T ∪ A|
    idle_ns: int  # |W| − |T ∪ A|
    waited_ns: int  # the straggler's last_ns − this worker's last_ns
    idle_transfer_ns: int
    idle_scheduler_ns: int


def summarize_workers(
    table: Mapping[str, np.ndarray],
    tasks: Mapping[str, np.ndarray],
    workers: list[str],
    worker_devices: Mapping[int, list[int]],
) -> tuple[dict[str, WorkerSummary], tuple[int, int]]:
    """Each worker's busy and idle time, its waits between tasks and its wait for the straggler, over the cluster's
    window W (first task or device op of any worker to the last); returns the summaries by worker and W.

    ``tasks``: TASK_COLUMNS; ``worker_devices``: worker index -> the device numbers of its device work."""
    kind, device = np.asarray(table["kind"]), np.asarray(table["device"])
    start, end = np.asarray(table["start_ns"], np.int64), np.asarray(table["end_ns"], np.int64)
    t_worker, t_action = np.asarray(tasks["worker"]), np.asarray(tasks["action"])
    t_start, t_end = np.asarray(tasks["start_ns"], np.int64), np.asarray(tasks["end_ns"], np.int64)
    parts = {}
    for w in range(len(workers)):
        work = _IS_WORK[kind] & np.isin(device, list(worker_devices.get(w, [])))
        mine = t_worker == w
        compute, transfer = mine & (t_action == 0), mine & (t_action == 1)
        parts[w] = (
            union(t_start[compute], t_end[compute]),
            union(t_start[transfer], t_end[transfer]),
            union(start[work], end[work]),
            int(compute.sum()),
        )
    bounds = [(int(p[0].min()), int(p[1].max())) for part in parts.values() for p in part[:3] if p[0].size]
    window = (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (0, 0)
    spans = {w: [p for p in part[:3] if p[0].size] for w, part in parts.items()}
    first = {w: min((int(p[0][0]) for p in s), default=window[0]) for w, s in spans.items()}
    last = {w: max((int(p[1][-1]) for p in s), default=window[0]) for w, s in spans.items()}
    finish = max(last.values(), default=window[0])
    out = {}
    for w, (compute, transfer, device_work, count) in parts.items():
        busy = _union_of(compute, device_work)
        waiting = difference((np.array([first[w]]), np.array([last[w]])), busy)
        on_transfer = intersection(waiting, transfer)
        out[workers[w]] = WorkerSummary(
            worker=workers[w],
            tasks=count,
            first_ns=first[w],
            last_ns=last[w],
            compute_ns=total_length(compute),
            transfer_ns=total_length(transfer),
            device_ns=total_length(device_work),
            busy_ns=total_length(busy),
            idle_ns=(window[1] - window[0]) - total_length(busy),
            waited_ns=finish - last[w] if spans[w] else 0,
            idle_transfer_ns=total_length(on_transfer),
            idle_scheduler_ns=total_length(waiting) - total_length(on_transfer),
        )
    return out, window


def _union_of(a: Intervals, b: Intervals) -> Intervals:
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def advise_workers(workers: Mapping[str, WorkerSummary], window: tuple[int, int]) -> list[Advice]:
    """The cluster's advice codes, each decided by one rule (``device`` is -1: they name workers, not devices).

    - ``worker-imbalance``: ≥ 2 workers ran tasks and the others waited for the one that finished last (the
      straggler) for ≥ 20 % of |W| on average.
    - ``gpu-idle-between-tasks``: a worker with device work had its devices idle, no task computing, for ≥ 20 % of
      its active window and ≥ 1 ms, waiting on transfers or on the scheduler.
    """
    found: list[Advice] = []
    w_ns = window[1] - window[0]
    ran = [s for s in workers.values() if s.tasks]
    if len(ran) >= 2 and w_ns > 0:
        straggler = max(ran, key=lambda s: s.last_ns)
        others = [s for s in ran if s is not straggler]
        mean_wait = sum(s.waited_ns for s in others) / len(others)
        if mean_wait >= _IMBALANCE_WAIT_SHARE * w_ns:
            median_busy = float(np.median([s.busy_ns for s in ran]))
            found.append(
                Advice(
                    "worker-imbalance",
                    f"worker {straggler.worker} finished last: the other {_count(len(others), 'worker', 'workers')} "
                    f"waited for it {_format_ns(mean_wait)} on average ({100 * mean_wait / w_ns:.0f} % of W); it "
                    f"was busy {_format_ns(straggler.busy_ns)} against a median of {_format_ns(median_busy)} with "
                    f"{straggler.tasks} tasks. Split the work into more, smaller tasks (smaller chunks) so that the "
                    "scheduler can even it out, or look at what makes that worker slow.",
                    device=-1,
                )
            )
    for s in workers.values():
        active = s.last_ns - s.first_ns
        idle = s.idle_transfer_ns + s.idle_scheduler_ns
        if s.device_ns and active > 0 and idle >= _BETWEEN_TASKS_MIN_NS and idle >= _BETWEEN_TASKS_SHARE * active:
            found.append(
                Advice(
                    "gpu-idle-between-tasks",
                    f"on worker {s.worker} the devices sat idle between tasks for {_format_ns(idle)} "
                    f"({100 * idle / active:.0f} % of its active time): {_format_ns(s.idle_transfer_ns)} waiting for "
                    f"data from other workers, {_format_ns(s.idle_scheduler_ns)} waiting for the scheduler. Give "
                    "each task more device work (larger chunks), keep data where it is used (client.persist, "
                    "scatter), and submit work ahead so that the next task is ready when one ends.",
                    device=-1,
                )
            )
    return found
