"""The DESIGN §6 figures of each device: overlap, idle, the 8 states, efficiency, bandwidth, gaps and their causes.

Per device, K is the union of kernel, device-to-device copy and memset intervals, H of H2D, D of D2H, C = H ∪ D and
A = K ∪ C, all clipped to the window W. Durations are never summed across streams: each figure is the length of a
union. Functions take the columnar table of ``trace/spans.py`` and never a backend object; vectorised, so that a
10^6-span table summarises in well under a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.spans import KINDS

from .advice import Advice, Crossovers, advise, low_occupancy, too_small
from .columns import D2H, H2D, IS_K, IS_WORK, KERNEL, DeviceSpans, check_table, check_window, device_spans
from .cross import cross_device
from .intervals import merge_sorted, share_pct, sweep, total_length, union
from .summary import DeviceSummary, Summary, covered

#: The 8 states of a device at one instant, named by which engines are busy (H2D, D2H, kernels).
STATES: tuple[str, ...] = ("idle", "K", "H", "D", "H+K", "D+K", "H+D", "H+D+K")

#: Gap causes, in the order of their integer codes.
GAP_CAUSES: tuple[str, ...] = ("host-wait", "launch", "other")

#: Launch gaps are shorter than this (DESIGN §6, θ).
DEFAULT_THETA_NS = 5_000

# Bit masks of the sweep: H = 1, D = 2, K = 4; the state name of every mask.
_H, _D, _K = 1, 2, 4
#: The state of each engine mask (bit 1: host, 2: copies, 4: kernels).
STATE_OF_MASK: tuple[str, ...] = ("idle", "H", "D", "H+D", "K", "H+K", "D+K", "H+D+K")


def _engine_sweep(spans: DeviceSpans) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries and H/D/K bit masks of the device's states, covering its whole window."""
    h = union(*spans.rows(spans.kind == H2D))
    d = union(*spans.rows(spans.kind == D2H))
    k = union(*spans.rows(IS_K[spans.kind]))
    return sweep([h, d, k], [_H, _D, _K], points=(spans.w0, spans.w1))


def _states(spans: DeviceSpans) -> dict[str, int]:
    bounds, masks = _engine_sweep(spans)
    lengths, masks = np.diff(bounds), masks[:-1]
    by_mask = [int(lengths[masks == m].sum()) for m in range(8)]
    by_mask[0] = (spans.w1 - spans.w0) - sum(by_mask[1:])
    return {state: by_mask[STATE_OF_MASK.index(state)] for state in STATES}


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
    check_table(table)
    work_rows = np.flatnonzero(IS_WORK[np.asarray(table["kind"])])
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


def _bandwidth(spans: DeviceSpans, code: int) -> float | None:
    """Bytes per ns (= GB/s) while copying: total bytes over the summed durations of that direction's copies."""
    sel = spans.kind == code
    busy = int(spans.duration[sel].sum())
    return None if busy == 0 else float(spans.bytes[sel].sum()) / busy


def _summarize_device(
    spans: DeviceSpans,
    theta_ns: int,
    small: list[Advice] | None = None,
    occupancy: tuple[Mapping[str, np.ndarray], DeviceLimits] | None = None,
) -> DeviceSummary:
    window_ns = spans.w1 - spans.w0
    states = _states(spans)
    h, d, k, c = covered(states, "H"), covered(states, "D"), covered(states, "K"), covered(states, "H", "D")
    exposed = states["H"] + states["D"] + states["H+D"]  # |C \ K|

    work = IS_WORK[spans.kind]
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
        busy = total_length(merge_sorted(w_start[idx], w_end[idx]))
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
        overlap_pct=share_pct(c - exposed, c),
        exposed_copy_ns=exposed,
        h2d_overlap_pct=share_pct(states["H+K"] + states["H+D+K"], h),
        d2h_overlap_pct=share_pct(states["D+K"] + states["H+D+K"], d),
        idle_pct=share_pct(states["idle"], window_ns),
        states=states,
        pipeline_efficiency=max(h, k, d) / window_ns if window_ns else None,
        stream_busy=dict(sorted(stream_busy.items())),
        bandwidth_gbps={"h2d": _bandwidth(spans, H2D), "d2h": _bandwidth(spans, D2H)},
        op_counts={KINDS[code]: int(n) for code, n in enumerate(np.bincount(spans.kind, minlength=len(KINDS))) if n},
        gap_ns=dict(sorted(gap_ns.items())),
        gap_counts={cause: int(np.count_nonzero(gaps["code"] == i)) for i, cause in enumerate(GAP_CAUSES)},
        advice=[],
    )
    kernel_leads = gaps["lead"][spans.kind[work][gaps["order"]] == KERNEL]
    advice = advise(spans, summary_without_advice, kernel_leads[kernel_leads >= 0]) + (small or [])
    if occupancy is not None:  # (the table, the device's limits)
        advice += low_occupancy(spans, *occupancy, summary_without_advice.active_ns)
    return replace(summary_without_advice, advice=advice)


def summarize(
    table: Mapping[str, np.ndarray],
    window: tuple[int, int] | None = None,
    theta_ns: int = DEFAULT_THETA_NS,
    crossover: Crossovers | None = None,
    limits: Mapping[int, DeviceLimits | None] | None = None,
    counters: Mapping[str, np.ndarray] | None = None,
) -> Summary:
    """The DESIGN §6 figures of every device in ``table``: overlap, idle, 8 states, efficiency, bandwidth, advice.

    ``window`` = (start_ns, end_ns), e.g. a cell's wall time, replaces W = [first op start, last op end]; spans are
    clipped to it. ``crossover``: per device number, the measured crossover of each library kernel (by span name;
    ``gw.crossover`` makes them), for the advice ``too-small-for-gpu``; ``limits``: per device number, its
    ``DeviceLimits`` (a trace's devices have them on CUDA), for the advice ``low-occupancy``; ``counters``: a trace's
    counter samples (``Trace.counters()``), for how busy each device's SMs were over W. Vectorised, so that a 10^6-span
    table summarises in well under a second.
    """
    check_table(table)
    window = check_window(window)
    devices = [int(d) for d in np.unique(np.asarray(table["device"]))]
    found = {}
    for d in devices:
        spans = device_spans(table, d, window)
        points = crossover.get(d) if crossover else None
        small = too_small(spans, table, points) if points else None
        device_limits = (limits or {}).get(d)
        found[d] = _summarize_device(spans, theta_ns, small, None if device_limits is None else (table, device_limits))
        if counters is not None:
            found[d] = _with_sm_activity(found[d], counters)
    return Summary(found, cross_device(table, window))


#: The counters that say how busy a device's SMs were, in order of preference (``counter_nvml.py``).
SM_COUNTERS = ("SM active", "GPU busy")


def _with_sm_activity(ds: DeviceSummary, counters: Mapping[str, np.ndarray]) -> DeviceSummary:
    """``ds`` with the mean of its device's SM counter over its window W (samples stamped inside W: each covers the
    interval before it), where the trace sampled one there."""
    device = np.asarray(counters["device"])
    t = np.asarray(counters["time_ns"], np.int64)
    inside = (device == ds.device) & (t > ds.window_start_ns) & (t <= ds.window_end_ns)
    names = np.asarray(counters["name"], dtype=object)
    values = np.asarray(counters["value"], np.float64)
    for name in SM_COUNTERS:
        picked = values[inside & (names == name)]
        picked = picked[np.isfinite(picked)]
        if picked.size:
            return replace(ds, sm_active_pct=float(picked.mean()), sm_counter=name)
    return ds


def state_segments(
    table: Mapping[str, np.ndarray], device: int = 0, window: tuple[int, int] | None = None
) -> dict[str, np.ndarray]:
    """Consecutive segments covering the device's window, each in one of the 8 states (idle included).

    The timeline's overlap strip draws them: ``start_ns``, ``end_ns`` (int64), ``state`` (strings from STATES) and
    ``mask`` (each state's engine mask: ``STATE_OF_MASK[mask]`` is its name).
    """
    check_table(table)
    spans = device_spans(table, device, check_window(window))
    bounds, masks = _engine_sweep(spans)
    names = np.array(STATE_OF_MASK, dtype=object)
    return {"start_ns": bounds[:-1], "end_ns": bounds[1:], "state": names[masks[:-1]], "mask": masks[:-1]}
