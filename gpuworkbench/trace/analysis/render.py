"""A summary as text (``print(summary)``) and as an HTML table (a notebook's display): a column per device, the
figures across devices, then the advice; figures named as DESIGN §6 names them."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from gpuworkbench._format import count, decimal_bytes, duration_ns, percent
from gpuworkbench.trace.spans import HOST_KINDS

from .intervals import share_pct

if TYPE_CHECKING:
    from .advice import Advice
    from .cross import CrossDevice
    from .summary import DeviceSummary


def _cross_rows(cross: CrossDevice) -> list[tuple[str, str]]:
    """(name, value) pairs of the cross-device figures."""
    busy = ", ".join(f"{d}: {percent(cross.busy_pct[d])}" for d in sorted(cross.busy_ns)) or "n/a"
    others = sorted((d, ns) for d, ns in cross.waited_ns.items() if d != cross.slowest_device)
    waited = ", ".join(f"{d}: {duration_ns(ns)}" for d, ns in others) or "none"
    rows = [("window W", duration_ns(cross.window_ns)), ("busy % per device", busy)]
    if cross.busy_ns:
        rows.append(("slowest device", f"{cross.slowest_device}; the others waited for it: {waited}"))
    for pc in cross.peer_copies:
        bandwidth = "n/a" if pc.bandwidth_gbps is None else f"{pc.bandwidth_gbps:.3g} GB/s"
        rows.append(
            (
                f"peer copy {pc.source} → {pc.destination}",
                f"{count(pc.count, 'copy', 'copies')}, {decimal_bytes(pc.bytes)} in {duration_ns(pc.time_ns)}, "
                f"{bandwidth} ({pc.route})",
            )
        )
    if cross.peer_copies:
        rows.append(("peer copy time", duration_ns(cross.peer_copy_ns)))
    return rows


def _sm_rows(ds: DeviceSummary) -> list[tuple[str, str]]:
    """How busy the SMs were (the device's counters), where sampled; and what that says of an overlap."""
    if ds.sm_active_pct is None:
        return []
    value = f"{percent(ds.sm_active_pct)} (counter {ds.sm_counter!r})"
    if ds.overlap_pct is not None and ds.overlap_pct >= 50 and ds.sm_active_pct < 25:
        value += (
            f": copies overlapped kernels {percent(ds.overlap_pct)} of their time, but the SMs were "
            f"{percent(ds.sm_active_pct)} busy: the copies bound this work, not the kernels"
        )
    return [("SMs active (counters)", value)]


def _rows(ds: DeviceSummary) -> list[tuple[str, str]]:
    """(name, value) pairs of one device, named as DESIGN §6 names them."""
    w = ds.window_ns
    states = "  ".join(f"{s} {percent(share_pct(ns, w))}" for s, ns in ds.states.items() if ns) or "n/a"
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
        ("window W", f"{duration_ns(w)} (from {ds.window_source})"),
        ("overlap %", percent(ds.overlap_pct)),
        ("exposed copy time", duration_ns(ds.exposed_copy_ns)),
        ("H2D overlap %", percent(ds.h2d_overlap_pct)),
        ("D2H overlap %", percent(ds.d2h_overlap_pct)),
        ("idle %", percent(ds.idle_pct)),
        *_sm_rows(ds),
        ("pipeline efficiency", efficiency),
        ("8-state breakdown", states),
        ("stream busy", busy),
        ("bandwidth", bandwidth),
        ("gap causes (count)", gaps),
        ("ops", ops),
    ]


def summary_text(devices: dict[int, DeviceSummary], advice: list[Advice], cross: CrossDevice | None = None) -> str:
    """The summary as text: a block per device, then the figures across devices, then the advice."""
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


def summary_html(devices: dict[int, DeviceSummary], advice: list[Advice], cross: CrossDevice | None = None) -> str:
    """The summary as HTML: a table with a column per device, a table across devices, and a list of the advice."""
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
