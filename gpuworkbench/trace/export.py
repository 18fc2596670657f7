"""Export a trace as Chrome-trace JSON in the Kineto layout (what PyTorch's profiler writes; Perfetto opens it).

The layout follows what HolisticTraceAnalysis (HTA) parses: ``distributedInfo.rank`` before ``traceEvents``; one process
per device (pid = device number) with one thread per stream; device work as ``X`` events of category ``kernel``,
``gpu_memcpy`` or ``gpu_memset`` whose ``args`` carry ``stream``, ``device``, ``correlation``, ``bytes`` and ``memory
bandwidth (GB/s)`` (kernels: ``grid`` and ``block`` as [x, y, z], and where known ``registers per thread`` and ``shared
memory``, static and dynamic, as Kineto writes them); copies and memsets named as CUPTI names them ("Memcpy HtoD (Pinned
-> Device)", "Memset (Device)"), which is how HTA tells memory kernels from compute kernels. ``deviceProperties`` carry
each CUDA device's limits as Kineto names them (``DeviceLimits.properties``). Host-side work lives in a separate host
process: tid 1 is the workbench's own row (allocations, frees, markers, and each op's enqueue as a ``cuda_runtime``
event where no API call of the trace enqueued it), tid ``k`` >= 2 host thread row ``-k`` (``thread_stream(k - 2)``): its
``api`` calls as ``cuda_runtime`` events and its ``range`` regions as ``user_annotation`` events. An API call and the
device span it enqueued share ``args.correlation`` (their ``corr``) and an ``ac2g`` flow arrow; spans without a ``corr``
get correlation ids of their own, from ``gpuworkbench.synthetic_correlation_from`` on. A ``range`` on a device stream is
a ``gpu_user_annotation`` there.
Memory rows are PyTorch's ``[memory]`` instant events on the workbench's row: other libraries' bytes as "Total
Allocated", with ``held_bytes`` and ``used_bytes`` beside it. Counter samples (``gw.trace(counters=True)``) are ``C``
events, which Perfetto draws as counter tracks: named by the counter, their one arg keyed by its unit (Perfetto names
the track "host CPU % of all cores"), in the host process for the host's counters and in a device's process for its
own; samples without a value (NaN) are left out, as JSON has no NaN.

Kineto's stream numbers are positive and HTA treats stream <= 0 as host work in places, so our stream ``s`` is
exported as tid and ``args.stream`` ``s + 1``; the row's name keeps our number ("stream 0 pipeline-h2d"). The
``gpuworkbench`` block (origin, stream offset, stream labels) lets ``load_trace`` read the file back exactly.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import astuple
from typing import Any

import numpy as np

from .spans import HOST_KINDS, KIND_CODE, KINDS, unpack_dim3

#: Chrome-trace categories of device work, as Kineto names them.
_CATEGORY = {"h2d": "gpu_memcpy", "d2h": "gpu_memcpy", "d2d": "gpu_memcpy", "memset": "gpu_memset", "kernel": "kernel"}
#: Host-side kinds and their categories: allocations and API calls are runtime calls, markers and ranges annotations.
_HOST_CATEGORY = {
    "alloc": "cuda_runtime",
    "free": "cuda_runtime",
    "api": "cuda_runtime",
    "marker": "user_annotation",
    "range": "user_annotation",
}
_COPY_KIND = {"h2d": "HtoD", "d2h": "DtoH", "d2d": "DtoD"}
_HOST_MEMORY = {1: "Pinned", 0: "Pageable"}  # CUPTI's memory kinds; "Host" where the backend cannot tell
#: The host-side calls that enqueue each kind, as the CUDA runtime names them (used for cuda and rocm devices).
_CUDA_RUNTIME_CALL = {
    "h2d": "cudaMemcpyAsync",
    "d2h": "cudaMemcpyAsync",
    "d2d": "cudaMemcpyAsync",
    "memset": "cudaMemsetAsync",
    "kernel": "cudaLaunchKernel",
}
#: Offset between our stream numbers and the exported (Kineto) ones.
STREAM_OFFSET = 1
#: The host process: a pid no device number reaches (Kineto uses the OS pid, which may be 1 in a container).
HOST_PID = 1_000_000
_HOST_TID = 1


def _device_name(kind: str, pinned: int, name: str) -> str:
    """The span's name as CUPTI (and so Kineto and HTA) names copies and memsets; kernels keep their own names."""
    host = _HOST_MEMORY.get(pinned, "Host")
    if kind == "h2d":
        return f"Memcpy HtoD ({host} -> Device)"
    if kind == "d2h":
        return f"Memcpy DtoH (Device -> {host})"
    if kind == "d2d":
        return "Memcpy DtoD (Device -> Device)"
    if kind == "memset":
        return "Memset (Device)"
    return name or kind


def _runtime_name(kind: str, backend: str) -> str:
    if backend in ("cuda", "rocm"):
        return _CUDA_RUNTIME_CALL[kind]
    return "enqueue kernel" if kind == "kernel" else f"enqueue {kind}"


def _us(ns: int) -> float:
    """Nanoseconds as microseconds, rounded to the ns so that the JSON carries no float noise."""
    return round(ns / 1000, 3)


def _memory_events(memory: dict[str, np.ndarray], origin: int, backend: dict[int, str]) -> list[dict]:
    """Memory rows as PyTorch's ``[memory]`` instant events (in table order): other libraries' bytes as its
    allocator's "Total Allocated", and our own columns beside them, so that ``load_trace`` reads them back exactly."""
    rows = zip(*(memory[c].tolist() for c in ("device", "t_ns", "held_bytes", "used_bytes", "other_bytes")))
    return [
        {
            "ph": "i",
            "s": "t",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": HOST_PID,
            "tid": _HOST_TID,
            "ts": _us(t - origin),
            "args": {
                "Device Type": 1 if backend.get(dev) in ("cuda", "rocm") else 0,
                "Device Id": dev,
                "Total Allocated": other,
                "held_bytes": held,
                "used_bytes": used,
            },
        }
        for dev, t, held, used, other in rows
    ]


def _counter_events(counters: dict[str, np.ndarray], origin: int) -> list[dict]:
    """Counter samples as ``C`` events (in table order): the host's in the host process, a device's in its own."""
    rows = zip(*(counters[c].tolist() for c in ("time_ns", "device", "name", "unit", "value")))
    return [
        {
            "ph": "C",
            "cat": "counter",
            "name": name,
            "pid": HOST_PID if dev < 0 else dev,
            "tid": 0,
            "ts": _us(t - origin),
            "args": {unit: value},
        }
        for t, dev, name, unit, value in rows
        if math.isfinite(value)
    ]


def _host_tid(stream: int) -> int:
    """The host process's thread of a host row: 1 for the workbench's own row (-1), k for thread row -k."""
    return -stream if stream < 0 else _HOST_TID


def _host_thread_names(tids: set[int], labels: dict[tuple[int, int], str]) -> dict[int, str]:
    """A name per host thread: the workbench's row, or the label a device gives that thread row."""
    by_stream: dict[int, str] = {}
    for (_, stream), label in sorted(labels.items()):
        by_stream.setdefault(stream, label)
    return {
        tid: "host (enqueue, alloc/free)" if tid == _HOST_TID else by_stream.get(-tid, f"host thread {tid - 2}")
        for tid in sorted(tids)
    }


def chrome_trace(trace: Any, path: str | None = None, runtime_events: bool = True) -> dict:
    """The trace as a Chrome-trace dict in the Kineto layout (times in µs from the first event).

    Written to ``path`` as JSON when given (gzip-compressed when it ends in ``.gz``, which HTA and Perfetto read).
    ``runtime_events`` adds the enqueue of each op no API call of the trace enqueued, linked to its span; leave it
    off to halve a huge file (API calls the trace holds are spans and always written).
    """
    table = trace.table()
    clocks = trace.devices
    labels = trace.stream_labels
    n = len(table["kind"])
    kind_codes = table["kind"].astype(np.int64)
    kind_col = [KINDS[int(k)] for k in kind_codes]
    start_col, end_col = table["start_ns"].astype(np.int64), table["end_ns"].astype(np.int64)
    enqueue_col = table["enqueue_ns"].astype(np.int64)
    stream_col, device_col = table["stream"].astype(np.int64), table["device"].astype(np.int64)
    corr = table["corr"].astype(np.int64)
    loc = table["loc"].astype(np.int64) if "loc" in table else np.full(n, -1, np.int64)
    registers, shared = (table.get(c, np.full(n, -1, np.int64)).tolist() for c in ("registers", "shared_bytes"))
    is_host = np.isin(kind_codes, [KIND_CODE[k] for k in HOST_KINDS])
    on_device = (kind_codes == KIND_CODE["range"]) & (stream_col >= 0)  # a range on a device stream
    host = is_host & ~on_device
    device_work = ~is_host
    api = kind_codes == KIND_CODE["api"]
    # Device spans enqueued by an API call of the trace (same corr) link to it; the others get an enqueue event.
    called = device_work & (corr >= 0) & np.isin(corr, corr[api & (corr >= 0)])
    flows_from = set(corr[called].tolist())
    synthetic = int(corr.max()) + 1 if (corr >= 0).any() else 1
    correlation = np.where(corr >= 0, corr, synthetic + np.arange(n))
    enqueues = device_work & ~called & (enqueue_col >= 0) if runtime_events else np.zeros(n, bool)
    counters = trace.counters() if hasattr(trace, "counters") else None
    times = [start_col] + ([enqueue_col[enqueue_col >= 0]] if runtime_events else [])
    if counters is not None:
        times.append(counters["time_ns"])
    origin = int(min(t.min() for t in times if t.size)) if any(t.size for t in times) else 0
    backend = {dev: clock.key.partition(":")[0] for dev, clock in clocks.items()}

    events: list[dict] = []

    def meta(what: str, pid: int, tid: int, **args: Any) -> None:
        events.append({"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args})

    host_tids = {_host_tid(int(s)) for s in np.unique(stream_col[host]).tolist()}
    if enqueues.any():
        host_tids.add(_HOST_TID)
    if host_tids or (counters is not None and (counters["device"] < 0).any()):
        meta("process_name", HOST_PID, 0, name="host")
        meta("process_sort_index", HOST_PID, 0, sort_index=-1)
        for tid, name in _host_thread_names(host_tids, labels).items():
            meta("thread_name", HOST_PID, tid, name=name)
            meta("thread_sort_index", HOST_PID, tid, sort_index=tid - 1)
    devices = sorted(set(clocks) | {int(d) for d in table["device"]})
    for dev in devices:
        clock = clocks.get(dev)
        meta("process_name", dev, 0, name=f"{clock.key} {clock.name}" if clock else f"device {dev}")
        meta("process_sort_index", dev, 0, sort_index=dev)
        if clock is not None:
            alignment = f"timestamps: {clock.source}, alignment ±{clock.error_ns / 1000:.1f} us"
            meta("process_labels", dev, 0, labels=alignment)
    device_rows = sorted(set(zip(device_col[~host].tolist(), stream_col[~host].tolist())))
    for dev, sid in device_rows:
        tid = sid + STREAM_OFFSET
        meta("thread_name", dev, tid, name=f"stream {sid} {labels.get((dev, sid), '')}".strip())
        meta("thread_sort_index", dev, tid, sort_index=tid)

    for i in np.argsort(start_col, kind="stable").tolist():
        kind = kind_col[i]
        start, end, enqueue = int(start_col[i]), int(end_col[i]), int(enqueue_col[i])
        dev, sid, nbytes = int(device_col[i]), int(stream_col[i]), int(table["bytes"][i])
        name = str(table["name"][i])
        ts = _us(start - origin)
        if is_host[i]:
            args: dict[str, Any] = {"device": dev, "kind": kind}
            shown = name or kind
            if shown != name:
                args["op"] = name
            if nbytes:
                args["bytes"] = nbytes
            if corr[i] >= 0:
                args["correlation"] = int(corr[i])
            if enqueue >= 0:
                args["enqueued (us)"] = _us(enqueue - origin)
            if loc[i] >= 0:
                args["source location"] = int(loc[i])
            pid, tid = (dev, sid + STREAM_OFFSET) if on_device[i] else (HOST_PID, _host_tid(sid))
            category = "gpu_user_annotation" if on_device[i] else _HOST_CATEGORY[kind]
            span = {
                "ph": "X",
                "cat": category,
                "name": shown,
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": _us(end - start),
            }
            events.append({**span, "args": args})
            if kind == "api" and int(corr[i]) in flows_from:  # the arrow to the device work this call enqueued
                events.append(
                    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": int(corr[i]), "pid": pid, "tid": tid, "ts": ts}
                )
            continue
        pinned = int(table["pinned"][i])
        tid = sid + STREAM_OFFSET
        shown = _device_name(kind, pinned, name)
        args = {"device": dev, "stream": tid, "correlation": int(correlation[i])}
        if name != shown:
            args["op"] = name
        if nbytes:
            args["bytes"] = nbytes
        if kind in _COPY_KIND:
            args["copy kind"] = _COPY_KIND[kind]
            if pinned >= 0:
                args["pinned"] = bool(pinned)
        if kind in _COPY_KIND or kind == "memset":
            args["memory bandwidth (GB/s)"] = round(nbytes / (end - start), 3) if end > start else None
        if kind == "kernel":
            for dim in ("grid", "block"):
                xyz = unpack_dim3(table[dim][i])
                if xyz is not None:
                    args[dim] = list(xyz)
            for key, value in (("registers per thread", registers[i]), ("shared memory", shared[i])):
                if value >= 0:
                    args[key] = int(value)
        if enqueue >= 0:
            args["enqueued (us)"] = _us(enqueue - origin)
        if loc[i] >= 0:
            args["source location"] = int(loc[i])
        events.append(
            {
                "ph": "X",
                "cat": _CATEGORY[kind],
                "name": shown,
                "pid": dev,
                "tid": tid,
                "ts": ts,
                "dur": _us(end - start),
                "args": args,
            }
        )
        flow = {"cat": "ac2g", "name": "ac2g", "id": int(correlation[i])}
        if enqueues[i]:
            at = _us(enqueue - origin)
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": _runtime_name(kind, backend.get(dev, "")),
                    "pid": HOST_PID,
                    "tid": _HOST_TID,
                    "ts": at,
                    "dur": 0,
                    "args": {"correlation": int(correlation[i]), "device": dev, "op": name or kind, "kind": "enqueue"},
                }
            )
            events.append({"ph": "s", **flow, "pid": HOST_PID, "tid": _HOST_TID, "ts": at})
        if enqueues[i] or called[i]:
            events.append({"ph": "f", "bp": "e", **flow, "pid": dev, "tid": tid, "ts": ts})

    events += _memory_events(trace.memory_table(), origin, backend)
    if counters is not None:
        events += _counter_events(counters, origin)

    doc = {
        "schemaVersion": 1,
        # HTA finds a file's rank with the regex '"rank":\s+(\d+)', so this must come before the events.
        "distributedInfo": {"backend": "none", "rank": 0, "world_size": 1},
        "deviceProperties": [
            {"id": d, "name": c.name, "key": c.key, "timestamps": c.source, "alignment_error_ns": c.error_ns}
            | (c.limits.properties() if getattr(c, "limits", None) is not None else {})
            for d, c in sorted(clocks.items())
        ],
        "displayTimeUnit": "ns",
        "gpuworkbench": {
            "origin_host_ns": origin,
            "stream_offset": STREAM_OFFSET,
            "synthetic_correlation_from": synthetic,
            "stream_labels": [[d, s, label] for (d, s), label in sorted(labels.items())],
            "dropped": trace.stats.dropped,
            "lost": trace.stats.lost,
            # what each event's args["source location"] indexes (gw.trace(lines=True), %%gpu): the fields of
            # trace.lines.Location, and the line's text, which a reader elsewhere cannot look up
            "locations": [[*astuple(where)[:-1], where.source] for where in trace.locations],
        },
        "traceEvents": events,
    }
    if path is not None:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "wt") as f:
            json.dump(doc, f)
    return doc
