"""Time ``gw.load_trace`` + ``summary()`` on a PyTorch-profiler-layout trace of 70 000 events (the target: <= 3 s on
a 2-core machine), for both the plain and the gzip-compressed file, and our own export of the loaded trace.

The file is written the way Kineto writes one: per training op a ``cpu_op`` range holding a ``cuda_runtime`` launch,
the kernel or copy it enqueued on one of four streams (``args.device`` / ``stream`` / ``correlation``, grid and block),
and the ``ac2g`` flow pair between them; python_function events too, which the loader skips.
Run from the repository root: ``python benchmarks/bench_load_trace.py [events] [--keep DIR] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import gpuworkbench as gw  # noqa: E402

PID = 31337
COPIES = ("Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memcpy HtoD (Pageable -> Device)")


def kineto_events(n_events: int) -> dict:
    """A Kineto document of about ``n_events`` trace events (6 per op plus a python_function every 4 ops)."""
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": 0, "args": {"name": "python3"}},
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": PID, "args": {"name": "thread (python3)"}},
        {"name": "process_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    events += [
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": s, "args": {"name": f"stream {s}"}}
        for s in (7, 13, 14, 15)
    ]
    host_ts, device_free = 1000.0, {7: 0.0, 13: 0.0, 14: 0.0, 15: 0.0}
    op = 0
    while len(events) < n_events:
        tid = PID if op % 5 else PID + 1  # a second host thread (a backward or data-loader thread)
        stream = (7, 13, 14, 15)[op % 4]
        correlation = 1000 + op
        launch = host_ts + 2.0
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": f"aten::op{op % 37}", "pid": PID, "tid": tid, "ts": round(host_ts, 3),
             "dur": 9.5, "args": {"External id": op, "Record function id": 0, "Sequence number": op}}
        )  # fmt: skip
        copy = op % 10 == 9
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync" if copy else "cudaLaunchKernel", "pid": PID,
             "tid": tid, "ts": round(launch, 3), "dur": 4.25, "args": {"External id": op, "cbid": 211,
                                                                         "correlation": correlation}}
        )  # fmt: skip
        start = max(device_free[stream], launch + 5.0) + (op % 3)
        duration = 12.0 + (op % 17) if not copy else 40.0
        args = {"External id": op, "device": 0, "context": 1, "stream": stream, "correlation": correlation}
        if copy:
            name, cat = COPIES[op % 3], "gpu_memcpy"
            args |= {"bytes": 1 << 22, "memory bandwidth (GB/s)": 100.0}
        else:
            name, cat = f"void at::native::kernel_{op % 53}<float>(float*, int)", "kernel"
            args |= {"queued": 0, "grid": [128 + op % 7, 1, 1], "block": [256, 1, 1], "registers per thread": 32}
        events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": round(start, 3), "dur": duration,
             "args": args}
        )  # fmt: skip
        events.append({"ph": "s", "id": correlation, "pid": PID, "tid": tid, "ts": round(launch, 3), "cat": "ac2g",
                       "name": "ac2g"})  # fmt: skip
        events.append({"ph": "f", "id": correlation, "pid": 0, "tid": stream, "ts": round(start, 3), "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})  # fmt: skip
        if op % 4 == 0:
            events.append(
                {"ph": "X", "cat": "python_function", "name": "model.py(80): forward", "pid": PID, "tid": tid,
                 "ts": round(host_ts - 1.0, 3), "dur": 15.0, "args": {"Python id": op}}
            )  # fmt: skip
        device_free[stream] = start + duration
        host_ts += 11.0
        op += 1
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": events[:n_events],
        "traceName": "bench.json",
    }


def timed(path: str) -> tuple[float, float, object]:
    """Seconds to load ``path`` and to summarise the loaded trace, and the trace."""
    t0 = time.perf_counter()
    trace = gw.load_trace(path)
    t1 = time.perf_counter()
    trace.summary()
    return t1 - t0, time.perf_counter() - t1, trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", nargs="?", type=int, default=70_000)
    parser.add_argument("--keep", help="write the files to this folder (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    opts = parser.parse_args()
    folder = opts.keep or tempfile.mkdtemp(prefix="gpuwb-bench-")
    os.makedirs(folder, exist_ok=True)
    doc = kineto_events(opts.events)
    plain, packed = os.path.join(folder, "kineto.json"), os.path.join(folder, "kineto.json.gz")
    with open(plain, "w") as f:
        json.dump(doc, f)
    with gzip.open(packed, "wt") as f:
        json.dump(doc, f)
    sizes = f"{os.path.getsize(plain) / 1e6:.1f} MB ({os.path.getsize(packed) / 1e6:.1f} MB gzip-compressed)"
    print(f"{len(doc['traceEvents'])} events, {sizes}")
    print(f"CPU cores: {os.cpu_count()}")
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_cores": os.cpu_count(),
        "events": len(doc["traceEvents"]),
        "json_mb": os.path.getsize(plain) / 1e6,
        "json_gz_mb": os.path.getsize(packed) / 1e6,
        "repeat": opts.repeat,
    }
    for label, path in (("json", plain), ("json.gz", packed)):
        best = min((timed(path) for _ in range(opts.repeat)), key=lambda r: r[0] + r[1])
        load_s, summary_s, trace = best
        print(
            f"{label:8} load {load_s:.3f} s + summary {summary_s:.3f} s = {load_s + summary_s:.3f} s "
            f"(best of {opts.repeat}; {len(trace)} spans)"
        )
        results[label] = {"load_s": load_s, "summary_s": summary_s, "spans": len(trace)}
    own = os.path.join(folder, "own.json.gz")
    trace.to_chrome_trace(own)
    load_s, summary_s, again = min((timed(own) for _ in range(opts.repeat)), key=lambda r: r[0] + r[1])
    print(f"own export of it: load {load_s:.3f} s + summary {summary_s:.3f} s ({len(again)} spans)")
    results["own_export"] = {"load_s": load_s, "summary_s": summary_s, "spans": len(again)}
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
