"""Export a trace as Chrome-trace JSON in the Kineto layout (what PyTorch's profiler writes; Perfetto opens it).

The layout follows what HolisticTraceAnalysis (HTA) parses: ``distributedInfo.rank`` before ``traceEvents``; one
process per device (pid = device number) with one thread per stream; device work as ``X`` events of category
``kernel``, ``gpu_memcpy`` or ``gpu_memset`` whose ``args`` carry ``stream``, ``device``, ``correlation``, ``bytes``
and ``memory bandwidth (GB/s)``; copies and memsets named as CUPTI names them ("Memcpy HtoD (Pinned -> Device)",
"Memset (Device)"), which is how HTA tells memory kernels from compute kernels. Host-side work lives in a separate
host process: each op's enqueue as a ``cuda_runtime`` event linked to its device span by ``correlation`` and an
``ac2g`` flow arrow, and allocations and frees.

Kineto's stream numbers are positive and HTA treats stream ≤ 0 as host work in places, so our stream ``s`` is
exported as tid and ``args.stream`` ``s + 1``; the row's name keeps our number ("stream 0 pipeline-h2d").
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import numpy as np

from .spans import KINDS

#: Chrome-trace categories of device work, as Kineto names them.
_CATEGORY = {"h2d": "gpu_memcpy", "d2h": "gpu_memcpy", "d2d": "gpu_memcpy", "memset": "gpu_memset", "kernel": "kernel"}
#: Host-side kinds and their categories: allocations are runtime calls, markers are annotations.
_HOST_CATEGORY = {"alloc": "cuda_runtime", "free": "cuda_runtime", "marker": "user_annotation"}
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


def chrome_trace(trace: Any, path: str | None = None, runtime_events: bool = True) -> dict:
    """The trace as a Chrome-trace dict in the Kineto layout (times in µs from the first event).

    Written to ``path`` as JSON when given (gzip-compressed when it ends in ``.gz``, which HTA and Perfetto read).
    ``runtime_events`` adds each op's enqueue on the host, linked to its span; leave it off to halve a huge file.
    """
    table = trace.table()
    clocks = trace.devices
    labels = trace.stream_labels
    kind_col = [KINDS[int(k)] for k in table["kind"]]
    start_col, end_col = table["start_ns"].astype(np.int64), table["end_ns"].astype(np.int64)
    enqueue_col = table["enqueue_ns"].astype(np.int64)
    times = [start_col] + ([enqueue_col[enqueue_col >= 0]] if runtime_events else [])
    origin = int(min(t.min() for t in times if t.size)) if start_col.size else 0
    backend = {dev: clock.key.partition(":")[0] for dev, clock in clocks.items()}

    events: list[dict] = []

    def meta(what: str, pid: int, tid: int, **args: Any) -> None:
        events.append({"ph": "M", "name": what, "pid": pid, "tid": tid, "args": args})

    host_kinds = {"alloc", "free", "marker"}
    has_host = any(k in host_kinds for k in kind_col) or (runtime_events and bool((enqueue_col >= 0).any()))
    if has_host:
        meta("process_name", HOST_PID, 0, name="host")
        meta("process_sort_index", HOST_PID, 0, sort_index=-1)
        meta("thread_name", HOST_PID, _HOST_TID, name="host (enqueue, alloc/free)")
        meta("thread_sort_index", HOST_PID, _HOST_TID, sort_index=0)
    devices = sorted(set(clocks) | {int(d) for d in table["device"]})
    for dev in devices:
        clock = clocks.get(dev)
        meta("process_name", dev, 0, name=f"{clock.key} {clock.name}" if clock else f"device {dev}")
        meta("process_sort_index", dev, 0, sort_index=dev)
        if clock is not None:
            alignment = f"timestamps: {clock.source}, alignment ±{clock.error_ns / 1000:.1f} us"
            meta("process_labels", dev, 0, labels=alignment)
    device_rows = sorted(
        {(int(d), int(s)) for d, s, k in zip(table["device"], table["stream"], kind_col) if k not in host_kinds}
    )
    for dev, sid in device_rows:
        tid = sid + STREAM_OFFSET
        meta("thread_name", dev, tid, name=f"stream {sid} {labels.get((dev, sid), '')}".strip())
        meta("thread_sort_index", dev, tid, sort_index=tid)

    for i in np.argsort(start_col, kind="stable"):
        kind = kind_col[i]
        start, end = int(start_col[i]), int(end_col[i])
        dev, sid, nbytes = int(table["device"][i]), int(table["stream"][i]), int(table["bytes"][i])
        name = str(table["name"][i])
        if kind in host_kinds:
            args: dict[str, Any] = {"device": dev}
            if nbytes:
                args["bytes"] = nbytes
            events.append(
                {
                    "ph": "X",
                    "cat": _HOST_CATEGORY[kind],
                    "name": name or kind,
                    "pid": HOST_PID,
                    "tid": _HOST_TID,
                    "ts": _us(start - origin),
                    "dur": _us(end - start),
                    "args": args,
                }
            )
            continue
        correlation = int(i) + 1
        pinned = int(table["pinned"][i])
        tid = sid + STREAM_OFFSET
        args = {"device": dev, "stream": tid, "correlation": correlation}
        if name and kind != "kernel":
            args["op"] = name
        if nbytes:
            args["bytes"] = nbytes
        if kind in _COPY_KIND:
            args["copy kind"] = _COPY_KIND[kind]
            if pinned >= 0:
                args["pinned"] = bool(pinned)
        if kind in _COPY_KIND or kind == "memset":
            args["memory bandwidth (GB/s)"] = round(nbytes / (end - start), 3) if end > start else None
        enqueue = int(enqueue_col[i])
        if enqueue >= 0:
            args["enqueued (us)"] = _us(enqueue - origin)
        events.append(
            {
                "ph": "X",
                "cat": _CATEGORY[kind],
                "name": _device_name(kind, pinned, name),
                "pid": dev,
                "tid": tid,
                "ts": _us(start - origin),
                "dur": _us(end - start),
                "args": args,
            }
        )
        if runtime_events and enqueue >= 0:
            ts = _us(enqueue - origin)
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": _runtime_name(kind, backend.get(dev, "")),
                    "pid": HOST_PID,
                    "tid": _HOST_TID,
                    "ts": ts,
                    "dur": 0,
                    "args": {"correlation": correlation, "device": dev, "op": name or kind},
                }
            )
            flow = {"cat": "ac2g", "name": "ac2g", "id": correlation}
            events.append({"ph": "s", **flow, "pid": HOST_PID, "tid": _HOST_TID, "ts": ts})
            events.append({"ph": "f", "bp": "e", **flow, "pid": dev, "tid": tid, "ts": _us(start - origin)})

    doc = {
        "schemaVersion": 1,
        # HTA finds a file's rank with the regex '"rank":\s+(\d+)', so this must come before the events.
        "distributedInfo": {"backend": "none", "rank": 0, "world_size": 1},
        "deviceProperties": [{"id": d, "name": c.name, "timestamps": c.source} for d, c in sorted(clocks.items())],
        "displayTimeUnit": "ns",
        "gpuworkbench": {
            "origin_host_ns": origin,
            "stream_offset": STREAM_OFFSET,
            "dropped": trace.stats.dropped,
            "lost": trace.stats.lost,
        },
        "traceEvents": events,
    }
    if path is not None:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "wt") as f:
            json.dump(doc, f)
    return doc
