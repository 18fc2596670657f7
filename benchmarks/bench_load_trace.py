"""Time ``gw.load_trace`` of a PyTorch-profiler-layout (Kineto) trace of 1.5 M events (the targets, on a 2-core
machine: >= 100 MB/s of JSON, plain and gzip-compressed; peak RSS <= 2x the file; ``summary()`` and ``statistics()``
<= 1 s each; a 1 M-event trace from file to a built ``trace.timeline()`` in <= 3 s), and the reload of our own export.

Each load runs in a fresh child process, which reports the load's time and MB/s (of the JSON, uncompressed), its
peak RSS (VmHWM after the load, the imports included; where the loader starts a helper process, that one's peak too:
pages it shares with the loading process count in both), then the times of ``summary()``, ``statistics()`` and
``timeline()`` (pandas' import, which the first table makes, and Bokeh's timed apart).

The file is written the way Kineto writes one: per training op a ``cpu_op`` range holding a ``cuda_runtime`` launch,
the kernel or copy it enqueued on one of four streams (``args.device`` / ``stream`` / ``correlation``, grid and block),
and the ``ac2g`` flow pair between them; python_function events too.
Run from the repository root:
``python benchmarks/bench_load_trace.py [events] [--timeline-events N] [--repeat N] [--keep DIR] [--json out.json]
[--threaded | --alone | --pinned]`` (``--keep``: write the files there, and reuse those an earlier run wrote for the
same sizes).

By default a load of a large file forks a helper process that decodes every other piece (``kineto_helper.helper_kind``:
Linux, two cores or more; forked where no other thread runs and no CUDA library is loaded, as in a script).
``--threaded`` loads the way a notebook kernel or a process with CUDA loaded does: the child starts an idle thread
first, so the helper is spawned (a fresh interpreter) instead. ``--alone`` loads without a helper: the decode runs on
one core (the thread that gunzips a ``.gz`` file may still run on another). ``--pinned`` pins the child to one CPU
(no helper either): the decode, the gunzip and everything else share that core.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

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


def write_files(folder: str, n_events: int, packed: bool) -> tuple[str, str | None]:
    """The plain file of ``n_events`` (and its gzip-compressed copy where ``packed``), reused where present."""
    plain = os.path.join(folder, f"kineto-{n_events}.json")
    gz = plain + ".gz" if packed else None
    if not os.path.exists(plain):
        with open(plain + ".part", "w") as f:
            json.dump(kineto_events(n_events), f)
        os.replace(plain + ".part", plain)
    if gz and not os.path.exists(gz):
        with open(plain, "rb") as src, gzip.open(gz + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        os.replace(gz + ".part", gz)
    return plain, gz


# ---------------------------------------------------------------------------------------------- the child


def child(path: str, views: bool, cores: str) -> None:
    """Load ``path`` (in this fresh process) and print the figures as one JSON line (``cores``: "threaded", "alone"
    or "pinned", see the module's docstring; "" as ``load_trace`` decides)."""
    if cores == "pinned":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    elif cores == "threaded":  # a notebook kernel runs threads: the helper is spawned, not forked
        threading.Thread(target=time.sleep, args=(1e6,), name="bench-idle", daemon=True).start()
    import gpuworkbench as gw

    if cores == "alone":  # the load without a helper process
        from gpuworkbench.trace import kineto_read

        kineto_read.helper_kind = lambda where: None

    out: dict = {"rss_before_mb": _peak_mb()}
    t0 = time.perf_counter()
    trace = gw.load_trace(path)
    out["load_s"] = time.perf_counter() - t0
    out["peak_rss_mb"] = _peak_mb()
    out["helper_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    out["spans"] = len(trace)
    if views:
        t0 = time.perf_counter()
        import pandas  # noqa: F401  (the tables' library, imported at the first table: timed apart, as Bokeh's)

        out["pandas_import_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        trace.summary()
        out["summary_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        trace.statistics()
        out["statistics_s"] = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            import gpuworkbench.viz  # noqa: F401  (Bokeh's import, timed apart)

            out["viz_import_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            trace.timeline()
            out["timeline_s"] = time.perf_counter() - t0
        except ImportError:
            pass
    print(json.dumps(out))


def results_cores(cores: str) -> str:
    """How the loads run, in words."""
    return {
        "threaded": "another thread running (a spawned helper)",
        "alone": "one core (no helper process)",
        "pinned": "pinned to one CPU",
    }.get(cores, "helper where it helps")


def _peak_mb() -> float:
    """This process's peak RSS in MB: VmHWM (ru_maxrss keeps the peak of the process that forked it before exec)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: str, views: bool, repeat: int, cores: str = "") -> dict:
    """The figures of the fastest of ``repeat`` loads, each in a fresh process (the largest peak RSS of them)."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, __file__, "--child", path, "--cores", cores] + (["--views"] if views else []),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise SystemExit(f"the load of {path} failed:\n{done.stderr}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["load_s"])
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    best["helper_peak_rss_mb"] = max(r["helper_peak_rss_mb"] for r in runs)
    best["load_s_all"] = [r["load_s"] for r in runs]
    return best


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", nargs="?", type=int, default=1_500_000)
    parser.add_argument("--timeline-events", type=int, default=1_000_000, help="events of the file-to-timeline file")
    parser.add_argument("--keep", help="write the files to this folder, reusing those there (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=3, help="loads of each file (each in a fresh process)")
    parser.add_argument("--json", help="also write the results here")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--threaded", action="store_true", help="load as a notebook kernel does (a spawned helper)")
    how.add_argument("--alone", action="store_true", help="load without a helper process, on one core")
    how.add_argument("--pinned", action="store_true", help="load pinned to one CPU (no helper, gunzip on that CPU)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cores", default="", help=argparse.SUPPRESS)
    parser.add_argument("--views", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        return child(opts.child, opts.views, opts.cores)
    cores = "pinned" if opts.pinned else "threaded" if opts.threaded else "alone" if opts.alone else ""
    folder = opts.keep or tempfile.mkdtemp(prefix="gpuwb-bench-")
    os.makedirs(folder, exist_ok=True)
    t0 = time.perf_counter()
    plain, packed = write_files(folder, opts.events, packed=True)
    json_mb, gz_mb = os.path.getsize(plain) / 1e6, os.path.getsize(packed) / 1e6
    print(f"{opts.events} events: {json_mb:.1f} MB of JSON, {gz_mb:.1f} MB gzip-compressed (written or found in "
          f"{time.perf_counter() - t0:.0f} s); CPU cores: {os.cpu_count()}; loads: {results_cores(cores)}")  # fmt: skip
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_cores": os.cpu_count(),
        "events": opts.events,
        "json_mb": json_mb,
        "json_gz_mb": gz_mb,
        "repeat": opts.repeat,
        "cores": results_cores(cores),
    }
    own = os.path.join(folder, f"own-{opts.events}.json.gz")
    if not os.path.exists(own):
        import gpuworkbench as gw

        gw.load_trace(plain).to_chrome_trace(own)
    for label, path in (("json", plain), ("json.gz", packed), ("own export", own)):
        r = measure(path, views=label == "json", repeat=opts.repeat, cores=cores)
        results[label] = r
        helper = f", helper process {r['helper_peak_rss_mb']:.0f} MB" if r["helper_peak_rss_mb"] > 1 else ""
        if label == "own export":  # its own JSON: no MB/s against the Kineto file's size
            rss = f"peak RSS {r['peak_rss_mb']:.0f} MB{helper}"
            print(f"{label:10} load {r['load_s']:.2f} s; {rss}; {r['spans']} spans (best of {opts.repeat})")
            continue
        r["mb_per_s"], r["peak_rss_x_file"] = json_mb / r["load_s"], r["peak_rss_mb"] / json_mb
        print(
            f"{label:10} load {r['load_s']:.2f} s = {r['mb_per_s']:.0f} MB/s of JSON; peak RSS {r['peak_rss_mb']:.0f} "
            f"MB = {r['peak_rss_x_file']:.2f}x the JSON (before the load {r['rss_before_mb']:.0f} MB{helper}); "
            f"{r['spans']} spans (best of {opts.repeat}: {' '.join(f'{s:.2f}' for s in r['load_s_all'])} s)"
        )
        if "summary_s" in r:
            views = f"{'':10} summary() {r['summary_s']:.2f} s, statistics() {r['statistics_s']:.2f} s"
            views += f" (pandas' import {r['pandas_import_s']:.2f} s apart)"
            if "timeline_s" in r:
                views += f", timeline() {r['timeline_s']:.2f} s (Bokeh's import {r['viz_import_s']:.2f} s apart)"
            print(views)
    n = min(opts.timeline_events, opts.events)
    path = plain if n == opts.events else write_files(folder, n, packed=False)[0]
    r = measure(path, views=True, repeat=opts.repeat, cores=cores)
    r["events"], r["json_mb"] = n, os.path.getsize(path) / 1e6
    r["file_to_timeline_s"] = r["load_s"] + r.get("timeline_s", float("nan"))
    results["file_to_timeline"] = r
    print(
        f"file to timeline, {n} events ({r['json_mb']:.0f} MB): load {r['load_s']:.2f} s + timeline() "
        f"{r.get('timeline_s', float('nan')):.2f} s = {r['file_to_timeline_s']:.2f} s ({r['spans']} spans)"
    )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    if not opts.keep:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
