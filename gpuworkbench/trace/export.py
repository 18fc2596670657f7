"""Export a trace as Chrome-trace JSON in the Kineto layout (what PyTorch's profiler writes; Perfetto opens it)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .spans import KINDS

#: Chrome-trace categories, as Kineto names them.
_CATEGORY = {
    "h2d": "gpu_memcpy",
    "d2h": "gpu_memcpy",
    "d2d": "gpu_memcpy",
    "memset": "gpu_memset",
    "kernel": "kernel",
    "alloc": "gpu_user_annotation",
    "free": "gpu_user_annotation",
    "marker": "gpu_user_annotation",
}
_COPY_KIND = {"h2d": "HtoD", "d2h": "DtoH", "d2d": "DtoD"}
_HOST_TID = 0  # row for host-side events (allocations, frees)


def chrome_trace(trace: Any, path: str | None = None) -> dict:
    """The trace as a Chrome-trace dict: one process per device, one thread per stream, times in µs.

    Written to ``path`` as JSON when given. Copies carry bytes and GB/s in ``args``.
    """
    table = trace.table()
    clocks = trace.devices
    labels = trace.stream_labels
    origin = int(table["start_ns"].min()) if len(table["start_ns"]) else 0
    events: list[dict] = []
    for dev, clock in sorted(clocks.items()):
        events.append(
            {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": f"{clock.key} {clock.name}"}}
        )
        events.append({"ph": "M", "name": "process_sort_index", "pid": dev, "tid": 0, "args": {"sort_index": dev}})
        events.append(
            {
                "ph": "M",
                "name": "process_labels",
                "pid": dev,
                "tid": 0,
                "args": {"labels": f"timestamps: {clock.source}, alignment ±{clock.error_ns / 1000:.1f} us"},
            }
        )
    streams = sorted({(int(d), int(s)) for d, s in zip(table["device"], table["stream"])})
    for dev, sid in streams:
        tid = _HOST_TID if sid < 0 else sid + 1
        name = "host (alloc/free)" if sid < 0 else f"stream {sid} {labels.get((dev, sid), '')}".strip()
        events.append({"ph": "M", "name": "thread_name", "pid": dev, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": dev, "tid": tid, "args": {"sort_index": tid}})
    for i in np.argsort(table["start_ns"], kind="stable"):
        kind = KINDS[int(table["kind"][i])]
        start, end = int(table["start_ns"][i]), int(table["end_ns"][i])
        sid, nbytes = int(table["stream"][i]), int(table["bytes"][i])
        args: dict[str, Any] = {"stream": sid, "device": int(table["device"][i])}
        if nbytes:
            args["bytes"] = nbytes
        if kind in _COPY_KIND:
            args["copy kind"] = _COPY_KIND[kind]
            args["memory bandwidth (GB/s)"] = round(nbytes / (end - start), 3) if end > start else None
            pinned = int(table["pinned"][i])
            if pinned >= 0:
                args["pinned"] = bool(pinned)
        if int(table["enqueue_ns"][i]) >= 0:
            args["enqueued (us)"] = round((int(table["enqueue_ns"][i]) - origin) / 1000, 3)
        events.append(
            {
                "ph": "X",
                "cat": _CATEGORY[kind],
                "name": str(table["name"][i]) or kind,
                "pid": int(table["device"][i]),
                "tid": _HOST_TID if sid < 0 else sid + 1,
                "ts": (start - origin) / 1000,
                "dur": (end - start) / 1000,
                "args": args,
            }
        )
    doc = {
        "schemaVersion": 1,
        "displayTimeUnit": "ns",
        "traceEvents": events,
        "deviceProperties": [{"id": d, "name": c.name, "timestamps": c.source} for d, c in sorted(clocks.items())],
        "gpuworkbench": {"origin_host_ns": origin, "dropped": trace.stats.dropped, "lost": trace.stats.lost},
    }
    if path is not None:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc
