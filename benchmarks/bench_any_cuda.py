"""Seeing other libraries' CUDA work, and what it costs (needs a CUDA GPU, CuPy, PyTorch and cupti-python).

    python benchmarks/bench_any_cuda.py proof [--rounds 12]  # CuPy + PyTorch work: a trace against torch.profiler
    python benchmarks/bench_any_cuda.py noise [--rounds 12]  # overlap of each capture against itself and the other
    python benchmarks/bench_any_cuda.py events [--rounds 16]  # each capture's overlap against its run's CUDA events
    python benchmarks/bench_any_cuda.py launch [--rounds 8]  # empty launches: let go, our trace, torch.profiler
    python benchmarks/bench_any_cuda.py cost      # trace start, the first trace of a process, idle and launch cost
    python benchmarks/bench_any_cuda.py coexist   # torch.profiler inside and after a gpuworkbench trace

Each prints one JSON object per result. ``proof`` runs one mixed workload (PyTorch matmuls and ReLU on a stream of its
own, CuPy H2D from pinned and pageable memory, an elementwise expression and a reduction on another) twice a round,
in alternating order: once inside ``gw.trace()`` and once inside ``torch.profiler.profile(activities=[CUDA])`` (CUPTI
under both; the profiler is ground truth), and compares kernel counts per stream, per-kernel durations, copy bytes
and overlap.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)


def time_calls(owner: object, name: str, label: str, times: dict[str, list[float]], per_arg: bool = False) -> None:
    """Wrap ``owner.name`` so that each call's duration (ms) is appended to ``times[label]`` (``per_arg``: to
    ``times[f"{label} {first argument's name}"]``)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            key = f"{label} {getattr(args[0], 'name', args[0])}" if per_arg and args else label
            times.setdefault(key, []).append((time.perf_counter_ns() - t0) / 1e6)

    setattr(owner, name, wrapper)


def _option(name: str, default: int) -> int:
    """An integer option given as ``name N`` after the mode, else ``default``."""
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


# -- the mixed workload --------------------------------------------------------------------------------------------


class Workload:
    """PyTorch and CuPy work on two streams; ``run()`` enqueues it all and waits."""

    def __init__(self) -> None:
        import cupy as cp
        import cupyx
        import torch

        self.cp, self.torch = cp, torch
        self.a = torch.randn(2048, 2048, device="cuda")
        self.host = np.ones(8 << 20, np.float32)  # 32 MiB, pageable
        self.pinned = cupyx.empty_pinned(self.host.shape, np.float32)
        self.pinned[:] = 1
        self.torch_stream = torch.cuda.Stream()
        self.cupy_stream = cp.cuda.Stream(non_blocking=True)
        self.out = cp.empty(self.host.shape, cp.float32)
        self.scale = cp.ElementwiseKernel("float32 x", "float32 y", "y = 2 * x + 1", "scale_add")
        self.run()

    def _mark(self, stream, tag: str) -> None:
        """A point of the run after an op on ``stream`` (``MarkedWorkload`` records an event there); nothing here."""

    def run(self) -> None:
        torch, cp = self.torch, self.cp
        mark, ts, cs = self._mark, self.torch_stream, self.cupy_stream
        with torch.cuda.stream(ts):
            mark(ts, "torch")
            c = self.a
            for i in range(4):
                c = c @ self.a
                mark(ts, f"mm{i}")
            torch.relu(c)
            mark(ts, "relu")
        with cs:
            x = cp.empty(self.host.shape, cp.float32)
            y = cp.empty_like(x)
            mark(cs, "cupy")
            x.set(self.pinned, stream=cs)  # pinned H2D, async
            mark(cs, "h2d_pinned")
            y.set(self.host, stream=cs)  # pageable H2D
            mark(cs, "h2d_pageable")
            self.scale(x, self.out)
            mark(cs, "scale")
            total = self.out.sum()  # a reduction ...
            mark(cs, "sum")
            float(total)  # ... and its D2H of one value, after the last mark
        torch.cuda.synchronize()


class MarkedWorkload(Workload):
    """The same work with a CUDA event recorded after each op on its stream (and before the first): ``event_spans``
    then gives the run's device work as those events bound it, a reference that needs no CUPTI."""

    STEPS = (("torch", ("mm0", "mm1", "mm2", "mm3", "relu")), ("cupy", ("h2d_pinned", "h2d_pageable", "scale", "sum")))

    def run(self) -> None:
        self.marks: dict[str, object] = {}
        super().run()

    def _mark(self, stream, tag: str) -> None:
        cp = self.cp
        if stream is self.torch_stream:
            stream = cp.cuda.ExternalStream(stream.cuda_stream)
        event = cp.cuda.Event()
        event.record(stream)
        self.marks[tag] = event

    def event_spans(self) -> list[dict]:
        """The last run's ops as span dicts (``torch_spans``' form), each from the event before it to its own."""
        elapsed, first = self.cp.cuda.get_elapsed_time, self.marks["torch"]
        out = []
        for stream, (start_tag, tags) in enumerate(self.STEPS, 1):
            before = start_tag
            for tag in tags:
                kind = "h2d" if tag.startswith("h2d") else "kernel"
                out.append(
                    {
                        "kind": kind,
                        "stream": stream,
                        "start_ns": round(elapsed(first, self.marks[before]) * 1e6),
                        "end_ns": round(elapsed(first, self.marks[tag]) * 1e6),
                        "bytes": self.host.nbytes if kind == "h2d" else 0,
                        "name": tag,
                        "pinned": int(tag == "h2d_pinned") if kind == "h2d" else -1,
                    }
                )
                before = tag
        return out


def torch_spans(path: str) -> list[dict]:
    """A torch.profiler Chrome trace's device work as span dicts (kind, stream, start_ns, end_ns, bytes, name)."""
    events = json.load(open(path))["traceEvents"]
    out = []
    for e in events:
        cat, name = e.get("cat"), e.get("name", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or e.get("ph") != "X":
            continue
        if cat == "kernel":
            kind = "kernel"
        elif cat == "gpu_memset":
            kind = "memset"
        else:
            kind = {"HtoD": "h2d", "DtoH": "d2h"}.get(name.split()[1] if len(name.split()) > 1 else "", "d2d")
        start = round(e["ts"] * 1000)
        pinned = 1 if "Pinned" in name else 0 if "Pageable" in name else -1
        out.append(
            {
                "kind": kind,
                "stream": int(e["args"].get("stream", 0)),
                "start_ns": start,
                "end_ns": start + round(e["dur"] * 1000),
                "bytes": int(e["args"].get("bytes", 0)),
                "name": name,
                "pinned": pinned,
            }
        )
    return out


def profiler_spans(prof) -> list[dict]:
    """A finished torch.profiler session's device work: ``torch_spans`` of its exported Chrome trace."""
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    try:
        return torch_spans(path)
    finally:
        os.unlink(path)


def device_spans(table: dict) -> list[dict]:
    """A trace table's device work as span dicts, in ``torch_spans``' form (stream ids as CUPTI's)."""
    from gpuworkbench.trace.cupti.foreign import FOREIGN_STREAM_BASE
    from gpuworkbench.trace.spans import KINDS

    columns = ("kind", "stream", "start_ns", "end_ns", "bytes", "name", "pinned")
    return [
        {
            "kind": KINDS[int(k)],
            "stream": int(s) - FOREIGN_STREAM_BASE,
            "start_ns": int(a),
            "end_ns": int(b),
            "bytes": int(n),
            "name": str(m),
            "pinned": int(p),
        }
        for k, s, a, b, n, m, p in zip(*(table[c] for c in columns))
        if KINDS[int(k)] in ("kernel", "h2d", "d2h", "d2d", "memset")
    ]


def overlap_noise() -> None:
    """How far two captures of the proof's workload differ in overlap when nothing differs but the run: paired
    differences (12 alternating rounds) of our trace against itself, torch.profiler against itself, and the two."""
    import torch  # noqa: F401
    from torch.profiler import ProfilerActivity, profile

    import gpuworkbench as gw
    from gpuworkbench.trace.analysis import summarize

    work = Workload()

    def overlap(spans: list[dict]) -> float:
        return summarize(gw.Trace.from_records(spans).table()).overlap_pct

    def ours() -> float:
        with gw.trace(others=True) as t:
            work.run()
        return overlap(device_spans(t.table()))

    def theirs() -> float:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            work.run()
        return overlap(profiler_spans(prof))

    capture = {"ours": ours, "torch": theirs}
    for a, b in (("ours", "ours"), ("torch", "torch"), ("ours", "torch")):
        diffs = []
        for r in range(_option("--rounds", 12)):
            if r % 2 == 0:
                x = capture[a]()
                y = capture[b]()
            else:
                y = capture[b]()
                x = capture[a]()
            diffs.append(x - y)
        emit(
            what=f"overlap, {a} - {b}",
            paired_median=statistics.median(diffs),
            abs_median=statistics.median(abs(d) for d in diffs),
            all=[round(d, 2) for d in diffs],
        )


def against_events() -> None:
    """One run seen twice: in each round, the workload with CUDA events after each op runs with no CUPTI (events
    alone), inside ``gw.trace()`` and inside torch.profiler, in alternating order; each capture's overlap is compared
    with the overlap its own run's events give. CUPTI serves one client at a time, so the two tools never see the same
    run; the events in each run are the common reference. Also the pageable copy's duration, as each capture and as
    its run's events see it."""
    import torch  # noqa: F401
    from torch.profiler import ProfilerActivity, profile

    import gpuworkbench as gw
    from gpuworkbench.trace import cupti as cupti_source
    from gpuworkbench.trace.analysis import summarize

    work = MarkedWorkload()

    def overlap(spans: list[dict]) -> float:
        return summarize(gw.Trace.from_records(spans).table()).overlap_pct

    def pageable_us(spans: list[dict]) -> float:
        return next((s["end_ns"] - s["start_ns"]) / 1e3 for s in spans if s["kind"] == "h2d" and s["pinned"] == 0)

    def events_only() -> list[dict]:
        cupti_source.let_go()
        work.run()
        return work.event_spans()

    def ours() -> list[dict]:
        with gw.trace(others=True) as t:
            work.run()
        t.wait_pending()
        return device_spans(t.table())

    def theirs() -> list[dict]:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            work.run()
        return profiler_spans(prof)

    captures = {"events": events_only, "ours": ours, "torch": theirs}
    theirs(), ours()  # each tool's first capture of the process, untimed
    rows: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in captures}
    names = list(captures)
    for r in range(_option("--rounds", 16)):
        for name in names if r % 2 == 0 else names[::-1]:
            spans = captures[name]()
            marks = work.event_spans()
            rows[name].append((overlap(spans), overlap(marks), pageable_us(spans), pageable_us(marks)))
    for name in names:
        v = rows[name]
        emit(
            capture=name,
            overlap_median=round(statistics.median(x[0] for x in v), 2),
            events_overlap_median=round(statistics.median(x[1] for x in v), 2),
            minus_events_paired=round(statistics.median(x[0] - x[1] for x in v), 2),
            pageable_us=round(statistics.median(x[2] for x in v), 1),
            pageable_minus_events_us=round(statistics.median(x[2] - x[3] for x in v), 1),
            all=[round(x[0], 2) for x in v],
        )
    gap = [a[0] - a[1] - (b[0] - b[1]) for a, b in zip(rows["ours"], rows["torch"])]
    emit(
        what="overlap minus its run's events: ours - torch.profiler's, per round",
        paired_median=round(statistics.median(gap), 2),
        abs_median=round(statistics.median(abs(g) for g in gap), 2),
        all=[round(g, 2) for g in gap],
    )


def launch_cost() -> None:
    """An empty-kernel launch loop with CUPTI let go, inside ``gw.trace()``, inside torch.profiler (activities=
    [CUDA]) and inside ``gw.trace()`` with CUPTI's API-call records off, in alternating order (``--rounds``, 8): µs per
    launch and the median of paired ratios to let go. What CUPTI's activity tracing costs a launch under each tool,
    and how much of it the API-call records are."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import gpuworkbench as gw
    from gpuworkbench.trace import cupti as cupti_source

    loop, n = empty_launches(), 3000
    torch.zeros(1, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]):  # each tool's first capture of the process, untimed
        loop(200)
    with gw.trace() as t:
        loop(200)
    t.wait_pending()

    def untraced() -> float:
        cupti_source.let_go()
        time.sleep(0.05)
        loop(50)
        return loop(n)

    def ours() -> float:
        with gw.trace() as t:
            loop(50)
            us = loop(n)
        t.wait_pending()
        return us

    def theirs() -> float:
        with profile(activities=[ProfilerActivity.CUDA]):
            loop(50)
            return loop(n)

    def ours_without_calls() -> float:
        """Ours with no API-call records (no launch links, no placing by calls): what those records cost."""
        cupti_source.let_go()  # the next source enables its kinds afresh, without the carriers
        kinds, cupti_source.kinds.API_CARRIER_KINDS = cupti_source.kinds.API_CARRIER_KINDS, ()
        try:
            us = ours()
        finally:
            cupti_source.let_go()
            cupti_source.kinds.API_CARRIER_KINDS = kinds
        return us

    captures = {"untraced": untraced, "ours": ours, "torch": theirs, "ours, no API-call records": ours_without_calls}
    us: dict[str, list[float]] = {k: [] for k in captures}
    names = list(captures)
    for r in range(_option("--rounds", 8)):
        for name in names if r % 2 == 0 else names[::-1]:
            us[name].append(captures[name]())
    for name in names:
        emit(
            capture=name,
            us_per_launch=round(statistics.median(us[name]), 3),
            ratio=round(statistics.median(a / b for a, b in zip(us[name], us["untraced"])), 3),
            all=[round(x, 2) for x in us[name]],
        )


def proof() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import gpuworkbench as gw
    from gpuworkbench.trace.analysis import summarize
    from gpuworkbench.trace.spans import KINDS

    work = Workload()
    rounds = []
    for r in range(_option("--rounds", 12)):
        # ABBA: which capture runs first alternates; torch.profiler records device activity only, as the trace does
        for who in ("ours", "torch") if r % 2 == 0 else ("torch", "ours"):
            if who == "ours":
                with gw.trace(others=True) as t:
                    work.run()
                table = t.table()
            else:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    work.run()
        theirs = profiler_spans(prof)
        ours = device_spans(table)

        def per_stream(spans: list[dict], kind: str) -> dict[int, list[dict]]:
            out: dict[int, list[dict]] = {}
            for s in sorted(spans, key=lambda s: s["start_ns"]):
                if s["kind"] == kind:
                    out.setdefault(s["stream"], []).append(s)
            return out

        ok, tk = per_stream(ours, "kernel"), per_stream(theirs, "kernel")
        diffs, pairs = [], []
        for sid in set(ok) & set(tk):
            if len(ok[sid]) == len(tk[sid]):
                for a, b in zip(ok[sid], tk[sid]):
                    da, db = a["end_ns"] - a["start_ns"], b["end_ns"] - b["start_ns"]
                    diffs.append(abs(da - db))
                    pairs.append((sid, a["name"][:40], b["name"][:40], da, db))
        copies = {
            who: sorted((s["kind"], s["bytes"], s["pinned"]) for s in spans if s["kind"] in ("h2d", "d2h", "d2d"))
            for who, spans in (("ours", ours), ("torch", theirs))
        }
        copy_ns = {
            who: {
                f"{kind} {'pinned' if pinned else 'pageable'}": sum(
                    s["end_ns"] - s["start_ns"] for s in spans if (s["kind"], s["pinned"]) == (kind, pinned)
                )
                for kind, pinned in {(s["kind"], s["pinned"]) for s in spans if s["kind"] in ("h2d", "d2h", "d2d")}
            }
            for who, spans in (("ours", ours), ("torch", theirs))
        }
        overlap = {
            who: summarize(gw.Trace.from_records(spans).table()).overlap_pct if spans else None
            for who, spans in (("ours", ours), ("torch", theirs))
        }
        rounds.append(
            {
                "kernels_per_stream": {
                    "ours": {k: len(v) for k, v in ok.items()},
                    "torch": {k: len(v) for k, v in tk.items()},
                },
                "kernel_duration_abs_diff_ns_median": statistics.median(diffs) if diffs else None,
                "kernel_duration_abs_diff_ns_max": max(diffs) if diffs else None,
                "copies_equal": copies["ours"] == copies["torch"],
                "copies": copies,
                "copy_ns": copy_ns,
                "overlap_pct": overlap,
                "kernel_pairs": pairs,
                "api_spans": int((table["kind"] == KINDS.index("api")).sum()),
                "linked": int(((table["corr"] >= 0) & (table["kind"] == KINDS.index("kernel"))).sum()),
                "spans": {"ours": len(ours), "torch": len(theirs), "trace": len(table["kind"])},
                "source": t.devices[0].source if t.devices else None,
                "warnings": t.stats.warnings,
                "lost": t.stats.lost,
            }
        )
    for r in rounds:
        emit(what="proof", **r)
    # The two captures are separate runs of the same work (CUPTI serves one client at a time): what they share is
    # the distribution of each figure over rounds, so the summary compares medians over rounds.
    ours_overlap = [r["overlap_pct"]["ours"] for r in rounds if r["overlap_pct"]["ours"] is not None]
    torch_overlap = [r["overlap_pct"]["torch"] for r in rounds if r["overlap_pct"]["torch"] is not None]
    emit(
        what="proof summary",
        rounds=len(rounds),
        kernel_counts_equal=sum(r["kernels_per_stream"]["ours"] == r["kernels_per_stream"]["torch"] for r in rounds),
        copies_equal=sum(r["copies_equal"] for r in rounds),
        kernel_duration_abs_diff_ns_median_per_round=[r["kernel_duration_abs_diff_ns_median"] for r in rounds],
        overlap_pct_median={"ours": statistics.median(ours_overlap), "torch": statistics.median(torch_overlap)},
        overlap_points_apart=abs(statistics.median(ours_overlap) - statistics.median(torch_overlap)),
        overlap_points_apart_paired=statistics.median(
            r["overlap_pct"]["ours"] - r["overlap_pct"]["torch"]
            for r in rounds
            if None not in (r["overlap_pct"]["ours"], r["overlap_pct"]["torch"])
        ),
        overlap_pct_per_round=[r["overlap_pct"] for r in rounds],
        copy_ns_ours_minus_torch_median={
            key: statistics.median(r["copy_ns"]["ours"][key] - r["copy_ns"]["torch"].get(key, 0) for r in rounds)
            for key in rounds[0]["copy_ns"]["ours"]
        },
    )
    del torch


# -- costs ---------------------------------------------------------------------------------------------------------


def pipeline_setup():
    import gpuworkbench as gw

    dev = gw.Device()
    kernel = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
    n = (64 << 20) // 4
    inputs = [dev.empty_pinned(n, "float32") for _ in range(16)]
    outputs = [dev.empty_pinned(n, "float32") for _ in range(16)]
    pipe = gw.Pipeline(dev, lambda x, y, s: kernel(x, y, stream=s)).__enter__()
    pipe.run(inputs[:1], outputs[:1])
    return gw, dev, pipe, inputs, outputs


def empty_launches():
    """``loop(n)``: n raw CuPy launches of an empty kernel, then a synchronize; µs per launch."""
    import cupy as cp

    kernel = cp.RawKernel('extern "C" __global__ void e() {}', "e")

    def loop(n: int = 4000) -> float:
        t = time.perf_counter()
        for _ in range(n):
            kernel((1,), (1,), ())
        cp.cuda.Device().synchronize()
        return (time.perf_counter() - t) / n * 1e6

    return loop


def timed_run(gw, pipe, inputs, outputs, traced: bool):
    """One ``pipe.run``, inside a fresh ``gw.trace()`` or not: (ms it took, the trace or None)."""
    t0 = time.perf_counter_ns()
    if traced:
        with gw.trace() as t:
            pipe.run(inputs, outputs)
    else:
        t = None
        pipe.run(inputs, outputs)
    return (time.perf_counter_ns() - t0) / 1e6, t


def traced_pairs(gw, pipe, inputs, outputs, count: int, gap_s: float = 0.0) -> list[dict[str, float]]:
    """``count`` ABBA pairs of one ``pipe.run`` untraced and inside a fresh ``gw.trace()``: ms of each, ``gap_s``
    slept before every run."""
    pairs = []
    for p in range(count):
        pair = {}
        for which in ("untraced", "traced") if p % 2 == 0 else ("traced", "untraced"):
            time.sleep(gap_s)
            pair[which] = timed_run(gw, pipe, inputs, outputs, which == "traced")[0]
        pairs.append(pair)
    return pairs


def child(mode: str) -> None:
    """One fresh process: the first trace of a process around a pipeline run, or the launch loop's idle cost."""
    if mode in ("first-traced", "first-traced-loaded", "first-untraced"):
        gw, dev, pipe, inputs, outputs = pipeline_setup()
        if mode == "first-traced-loaded":  # what ``%load_ext gpuworkbench`` does before the first cell
            gw._prepare_tracing()
        time.sleep(1.0)  # a notebook's pause between cells
        t0 = time.perf_counter()
        if mode != "first-untraced":
            with gw.trace():
                pipe.run(inputs, outputs)
        else:
            pipe.run(inputs, outputs)
        emit(mode=mode, ms=(time.perf_counter() - t0) * 1e3)
        return
    import gpuworkbench as gw

    loop = empty_launches()
    loop(500)
    if mode == "idle-after-trace":
        with gw.trace() as t:
            loop(500)
        t.wait_pending()
        t._thread.join(5)
    elif mode == "idle-ready":
        with gw.trace() as t:
            loop(500)
        t.wait_pending()
        loop(10)  # lets the lingering source go; CUPTI is initialized again REATTACH_S later
        deadline = time.monotonic() + 10
        while not gw.cupti.state().startswith("ready") and time.monotonic() < deadline:
            time.sleep(0.05)
    elif mode == "idle-prepared":
        gw.cupti.prepare()  # CUPTI attached, a source parked for LINGER_S: the loop runs while it lingers
    elif mode == "idle-after-linger":
        gw.cupti.LINGER_S = 0.05
        with gw.trace() as t:
            loop(500)
        t.wait_pending()
        deadline = time.monotonic() + 5
        while not gw.cupti.detached() and time.monotonic() < deadline:
            loop(10)  # CUPTI is let go at a CUDA call's exit
    emit(mode=mode, us=statistics.median(loop() for _ in range(9)))


def cost() -> None:
    import gpuworkbench as gw

    # In-process: untraced pipeline runs against runs inside a fresh trace each, in ABBA pairs.
    gw_, dev, pipe, inputs, outputs = pipeline_setup()
    with gw.trace():
        pipe.run(inputs[:1], outputs[:1])  # the process's first trace: setup done
    pairs = traced_pairs(gw, pipe, inputs, outputs, 20)
    ratio = [p["traced"] / p["untraced"] for p in pairs]
    delta = [p["traced"] - p["untraced"] for p in pairs]
    emit(
        what="pipeline 16x64MiB, fresh trace per run",
        untraced_ms=statistics.median(p["untraced"] for p in pairs),
        traced_ms=statistics.median(p["traced"] for p in pairs),
        ratio_median=statistics.median(ratio),
        delta_ms_median=statistics.median(delta),
        ratios=[round(r, 4) for r in ratio],
    )
    empty = []
    for _ in range(50):
        t0 = time.perf_counter()
        with gw.trace():
            pass
        empty.append((time.perf_counter() - t0) * 1e3)
    emit(what="with gw.trace(): pass", ms_median=statistics.median(empty), ms_max=max(empty))
    starts = []
    for _ in range(30):
        t = gw.trace()
        t0 = time.perf_counter()
        t.start()
        starts.append((time.perf_counter() - t0) * 1e3)
        t.stop()
        t.wait_pending()
        t._thread.join(5)
    emit(what="Trace.start() alone, CUPTI handed over between traces", ms_median=statistics.median(starts))

    def run_children(modes: list[str], rounds: int, key: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(rounds):
            for m in modes if r % 2 == 0 else modes[::-1]:
                p = subprocess.run([sys.executable, HERE, "child", m], capture_output=True, text=True)
                try:
                    out[m].append(json.loads(p.stdout.strip().splitlines()[-1])[key])
                except (IndexError, ValueError, KeyError):
                    emit(child_failed=m, stderr=p.stderr[-2000:])
        return out

    first = run_children(["first-untraced", "first-traced", "first-traced-loaded"], 6, "ms")
    emit(
        what="first trace of a process around one pipeline run (fresh processes, 1 s after setup)",
        **{m: {"median_ms": statistics.median(v), "all": [round(x, 2) for x in v]} for m, v in first.items() if v},
    )
    idle = run_children(["never", "idle-prepared", "idle-after-trace", "idle-after-linger", "idle-ready"], 6, "us")
    emit(
        what="empty-launch loop, us per launch, in processes that never traced / only prepared / traced once (the "
        "loop's first launch lets CUPTI go) / traced once, linger over (CUPTI let go) / traced once, CUPTI "
        "initialized again with no kind on",
        **{m: {"median_us": statistics.median(v), "all": [round(x, 3) for x in v]} for m, v in idle.items() if v},
    )


def coexist() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import gpuworkbench as gw

    a = torch.randn(1024, 1024, device="cuda")

    def torch_kernels(prof) -> int:
        path = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(path)
        n = sum(1 for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel")
        os.unlink(path)
        return n

    def work() -> None:
        for _ in range(3):
            (a @ a).relu_()
        torch.cuda.synchronize()

    work()
    with gw.trace(others=True) as t:
        work()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as inside:
            work()
        work()
    n_ours = int((t.table()["kind"] == 4).sum())
    emit(
        what="torch.profiler inside a trace",
        torch_kernels=torch_kernels(inside),
        trace_kernels=n_ours,
        warnings=t.stats.warnings,
        lost=t.stats.lost,
    )
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as after:
        work()
    emit(what="torch.profiler after a trace", torch_kernels=torch_kernels(after))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as holding:
        with gw.trace(others=True) as t2:
            work()
    emit(
        what="a trace inside torch.profiler",
        torch_kernels=torch_kernels(holding),
        trace_spans=len(t2.spans),
        warnings=t2.stats.warnings,
    )
    with gw.trace(others=True) as t3:
        work()
    emit(what="a trace after all that", kernels=int((t3.table()["kind"] == 4).sum()), warnings=t3.stats.warnings)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "proof"
    if what == "child":
        child(sys.argv[2])
    else:
        {
            "proof": proof,
            "noise": overlap_noise,
            "events": against_events,
            "launch": launch_cost,
            "cost": cost,
            "coexist": coexist,
        }[what]()
