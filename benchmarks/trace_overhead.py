"""Where a CUPTI-traced launch's extra time goes, on a CUDA machine: CUPTI itself, the external-id push/pop, our
front end, the harvester. Rounds interleave the variants so that drift hits them all alike; medians are reported.

Usage: python benchmarks/trace_overhead.py [--count 5000] [--rounds 5] [--json out.json]
       python benchmarks/trace_overhead.py --pairs 60 --count 2000   (the launch-loop ratio, drift-paired)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
from bench_common import write_json

EMPTY = 'extern "C" __global__ void empty(float* x) {}'


def per_launch_us(loop: Callable[[], None], count: int, repeat: int = 3, cpu: list | None = None) -> float:
    """Median wall µs per launch; ``cpu`` gets the calling thread's CPU µs per launch of each run."""
    times = []
    for _ in range(repeat):
        c0, t0 = time.thread_time(), time.perf_counter()
        loop()
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append((time.thread_time() - c0) / count * 1e6)
    return statistics.median(times) / count * 1e6


class Flusher(threading.Thread):
    """Flushes a bare CuptiSource every 10 ms, as the trace's harvester would (without our join); ``bare``: only
    CUPTI's flush, the buffers dropped undecoded (what a consumer costing no Python would leave)."""

    def __init__(self, src, bare: bool = False) -> None:
        super().__init__(daemon=True)
        self.src, self.halt, self.records, self.bare = src, threading.Event(), 0, bare

    def run(self) -> None:
        while not self.halt.wait(0.01):
            if self.bare:
                self.src._raw.flush_all(0)
                self.src._take_incoming()
                continue
            cols = self.src.flush_columns()
            self.records += 0 if cols is None else cols["start"].size


def api_costs(cp, raw, arr, stream, count: int) -> None:
    """µs per call of single CUDA API calls with CUPTI off, and on with each set of API carrier kinds."""
    from gpuworkbench.trace import cupti as cupti_mod
    from gpuworkbench.trace.cupti import kinds

    event = cp.cuda.Event(block=False, disable_timing=True)
    rt = cp.cuda.runtime

    def each(call: Callable[[], object]) -> Callable[[], None]:
        def loop() -> None:
            for _ in range(count):
                call()
            stream.synchronize()

        return loop

    calls = {
        "cudaGetDevice": each(rt.getDevice),
        "cudaEventRecord": each(lambda: event.record(stream)),
        "cudaEventQuery": each(lambda: event.done),
        "cuLaunchKernel": each(lambda: raw((1,), (32,), (arr,), stream=stream)),
    }
    table: dict[str, dict[str, float]] = {}
    settings = {"off": None, "driver+runtime": ("DRIVER", "RUNTIME"), "driver": ("DRIVER",), "none": ()}
    for _ in range(3):
        for setting, carriers in settings.items():
            src = None
            if carriers is not None:
                kinds.API_CARRIER_KINDS = carriers
                src = cupti_mod.new_source()
                src.start()
            pushes = {}
            if src is not None:
                push, pop, kind = src.external_id_calls()
                pushes["push+pop cupti-python"] = each(lambda push=push, pop=pop, kind=kind: (push(kind, 5), pop(kind)))
                for label, loader in (("CDLL", ctypes.CDLL), ("PyDLL", ctypes.PyDLL)):
                    lib = loader(src._raw.path)
                    cpush, cpop = lib.cuptiActivityPushExternalCorrelationId, lib.cuptiActivityPopExternalCorrelationId
                    cpush.argtypes, cpush.restype = [ctypes.c_int, ctypes.c_uint64], ctypes.c_int
                    cpop.argtypes, cpop.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_int
                    ref = None  # NULL: the popped id is not wanted
                    pushes[f"push+pop ctypes {label}"] = each(
                        lambda cpush=cpush, cpop=cpop, ref=ref, kind=kind: (cpush(kind, 5), cpop(kind, ref))
                    )
            for name, loop in {**calls, **pushes}.items():
                loop()
                table.setdefault(setting, {}).setdefault(name, []).append(per_launch_us(loop, count))
            if src is not None:
                src.stop()
                src.flush_columns()
    kinds.API_CARRIER_KINDS = ("DRIVER", "RUNTIME")
    medians = {s: {n: round(statistics.median(v), 2) for n, v in c.items()} for s, c in table.items()}
    print(json.dumps(medians, indent=1))


def poll_version(trace) -> Callable[[], None]:
    """Read ``trace.version`` at 20 Hz from a thread, as the live dashboard does (the trace then decodes its CUPTI
    records at every harvest); returns the function that stops the polling."""
    halt = threading.Event()

    def poll() -> None:
        while not halt.wait(0.05):
            trace.version  # noqa: B018  what a live view reads

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    return lambda: (halt.set(), poller.join())


def paired_blocks(gw, launch: Callable[[int], None], pairs: int, block: int, variants: dict) -> dict:
    """Untraced and traced blocks of ``block`` launches back to back, in ABBA order, a fresh trace (or source) per
    traced block: the host's speed drifts over seconds by more than tracing costs, and a pair of blocks some 30 ms
    apart sees the same host. Returns, per variant, the traced/untraced ratio of every pair."""
    ratios: dict[str, list[float]] = {name: [] for name in variants}

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        launch(n)
        return time.perf_counter() - t0

    for p in range(pairs):
        for name, make in variants.items():
            pair = [0.0, 0.0]
            for which in (0, 1) if p % 2 == 0 else (1, 0):
                if which == 0:
                    pair[0] = timed(block)
                    continue
                ctx = make()
                with ctx:
                    launch(200)  # warm: CUPTI's start, the trace's first op (clock alignment)
                    pair[1] = timed(block)
                    halt = getattr(ctx, "halt_watch", None)
                    if halt is not None:
                        halt()
                if isinstance(ctx, gw.Trace):
                    assert ctx.wait_pending(60) and ctx.stats.lost == 0, ctx.stats
                    ctx._thread.join(10)  # it releases CUPTI as it ends: the next block may start it
            ratios[name].append(pair[1] / pair[0])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--phases", action="store_true", help="only: the harvester's CPU per op, by phase")
    parser.add_argument("--api", action="store_true", help="only: CUPTI's cost per CUDA API call, by carrier set")
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="only: this many untraced/traced pairs of --count launches each, in ABBA order (the launch-loop ratio)",
    )
    parser.add_argument(
        "--carriers", action="store_true", help="with --pairs: bare CUPTI with each set of API record kinds instead"
    )
    parser.add_argument(
        "--bounds", action="store_true", help="only: ours untraced, with bare CUPTI on, traced without harvests, traced"
    )
    args = parser.parse_args()
    count = args.count

    import cupy as cp

    import gpuworkbench as gw
    from gpuworkbench.trace.cupti import new_source

    dev = gw.Device("cuda:0")
    k = dev.compile(EMPTY, "empty")
    b = dev.alloc(1, "float32")
    s = dev.create_stream("launch")
    raw = cp.RawKernel(EMPTY, "empty")
    arr = cp.empty(1, cp.float32)
    raw_stream = cp.cuda.Stream(non_blocking=True)

    def raw_loop() -> None:
        with raw_stream:
            for _ in range(count):
                raw((1,), (32,), (arr,))
        raw_stream.synchronize()

    def ours() -> None:
        for _ in range(count):
            k(1, 32, (b,), stream=s)
        s.synchronize()

    def raw_cupti(push: bool, bare: bool = False) -> float:
        src = new_source()
        src.start()
        p, q, kind = src.external_id_calls()
        flusher = Flusher(src, bare)
        flusher.start()

        def loop() -> None:
            with raw_stream:
                for i in range(count):
                    if push:
                        p(kind, i + 1)
                    raw((1,), (32,), (arr,))
                    if push:
                        q(kind)
            raw_stream.synchronize()

        loop()
        us = per_launch_us(loop, count)
        flusher.halt.set()
        flusher.join()
        src.stop()
        src.flush_columns()
        return us

    def traced(source: str, interval_s: float = 0.05, key: str = "", watch: bool = False) -> float:
        """µs per launch inside a trace. ``watch``: a thread polls ``t.version`` at 20 Hz, as a live dashboard does,
        so the harvester decodes at every wake-up; unwatched, a CUPTI trace defers decoding to after the loop, and
        ``drain_us`` (stop to every span made) and ``harvest_cpu_total_us`` (the harvester's CPU, drain included)
        show what that moved out of the loop."""
        key = key or f"{source}_{interval_s}" + ("_watched" if watch else "")
        with gw.trace(source=source, interval_s=interval_s) as t:
            unwatch = poll_version(t) if watch else None
            ours()
            cpu0 = t.stats.harvest_cpu_s
            main_cpu: list[float] = []
            us = per_launch_us(ours, count, cpu=main_cpu)
            harvest_cpu = t.stats.harvest_cpu_s - cpu0
            if unwatch is not None:
                unwatch()
        d0 = time.perf_counter()
        assert t.wait_pending(60)
        t._thread.join(10)  # its CUPTI source parks as it ends: let go below, so untraced blocks run without CUPTI
        gw.cupti.let_go()
        time.sleep(0.3)  # launches stay slower for a moment after cuptiFinalize (bench_launch.SETTLE_S)
        results.setdefault(f"drain_us_{key}", []).append((time.perf_counter() - d0) / (4 * count) * 1e6)
        results.setdefault(f"main_cpu_us_{key}", []).append(statistics.median(main_cpu))
        results.setdefault(f"harvest_cpu_us_{key}", []).append(harvest_cpu / (3 * count) * 1e6)
        results.setdefault(f"harvest_cpu_total_us_{key}", []).append(t.stats.harvest_cpu_s / (4 * count) * 1e6)
        assert t.stats.lost == 0, t.stats.warnings
        results.setdefault(f"spans_{key}", []).append(len(t))
        return us

    if args.api:
        api_costs(cp, raw, arr, raw_stream, count)
        return

    if args.pairs:

        def launch(n: int) -> None:
            for _ in range(n):
                k(1, 32, (b,), stream=s)
            s.synchronize()

        def watched() -> object:
            """A trace polled at 20 Hz, as a live dashboard polls it: decoded at every harvest while it records."""
            t = gw.trace(source="cupti")
            t.halt_watch = poll_version(t)
            return t

        class Bare:
            """CUPTI recording our launches with no trace: CUPTI's own share (``carriers``: its API record kinds)."""

            carriers = ("DRIVER", "RUNTIME")

            def __enter__(self) -> None:
                from gpuworkbench.trace.cupti import kinds

                saved, kinds.API_CARRIER_KINDS = kinds.API_CARRIER_KINDS, self.carriers
                try:
                    self.src = new_source()
                    self.src.start()
                finally:
                    kinds.API_CARRIER_KINDS = saved

            def __exit__(self, *exc: object) -> None:
                self.src.stop()
                self.src.flush_columns()

        class BareDriver(Bare):
            carriers = ("DRIVER",)

        class BareNoApi(Bare):
            carriers = ()

        variants = {"cupti": lambda: gw.trace(source="cupti"), "cupti_watched": watched, "bare_cupti": Bare}
        if args.carriers:
            variants = {"bare_cupti": Bare, "bare_cupti_driver_api": BareDriver, "bare_cupti_no_api": BareNoApi}
        launch(2000)
        ratios = paired_blocks(gw, launch, args.pairs, count, variants)
        out = {"device": dev.name, "date": time.strftime("%Y-%m-%d"), "block": count, "pairs": args.pairs}
        for name, values in ratios.items():
            q1, med, q3 = np.percentile(values, [25, 50, 75])
            out[name] = {
                "median": round(float(med), 4),
                "quartiles": [round(float(q1), 4), round(float(q3), 4)],
                "range": [round(min(values), 3), round(max(values), 3)],
                "pairs_at_most_1.2": f"{sum(v <= 1.2 for v in values)}/{len(values)}",
            }
        print(json.dumps(out, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"summary": out, "ratios": ratios}, f, indent=1)
        return

    def flush_each() -> float:
        """The earlier policy: a CUPTI flush at every harvest, 4 MiB buffers."""
        from gpuworkbench.trace.cupti import binding, source

        saved = source.FLUSH_IDLE_S, binding.BUFFER_BYTES
        source.FLUSH_IDLE_S, binding.BUFFER_BYTES = None, 4 << 20
        try:
            return traced("cupti", key="flush_each")
        finally:
            source.FLUSH_IDLE_S, binding.BUFFER_BYTES = saved

    def phases() -> None:
        """CPU time per op of each harvester phase, by wrapping them (one traced run)."""
        from gpuworkbench.trace import columns, recorder
        from gpuworkbench.trace.cupti import decode, join, ops, source, walk

        spent: dict[str, float] = {}
        targets = [
            (recorder.Trace, "harvest"),
            (source.CuptiSource, "flush_columns"),
            (decode.RecordDecoder, "decode"),
            (walk.RecordWalker, "walk"),
            (join.ExternalIdJoin, "join"),
            (ops.CuptiOps, "add_records"),
            (ops.CuptiOps, "harvest"),
            (ops.CuptiOps, "take_rows"),
            (ops.CuptiOps, "resolve"),
            (columns.Columns, "extend_columns"),
        ]
        saved = []
        for owner, name in targets:
            fn = getattr(owner, name)
            saved.append((owner, name, fn))

            def timed(*a, _fn=fn, _key=f"{owner.__name__}.{name}", **kw):
                c0 = time.thread_time()
                try:
                    return _fn(*a, **kw)
                finally:
                    spent[_key] = spent.get(_key, 0.0) + time.thread_time() - c0

            setattr(owner, name, timed)
        try:
            with gw.trace(source="cupti") as t:
                ours()
                spent.clear()
                cpu0 = t.stats.harvest_cpu_s
                for _ in range(3):
                    ours()
                total = t.stats.harvest_cpu_s - cpu0
            t.wait_pending(60)
            t._thread.join(10)
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)
        per_op = {k: round(v / (3 * count) * 1e6, 3) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
        per_op["harvester thread total"] = round(total / (3 * count) * 1e6, 3)
        print("harvester µs of CPU per op, by phase (nested phases are inside their callers):")
        print(json.dumps(per_op, indent=1))

    def bare_cupti() -> float:
        """Our untraced launches while a CuptiSource records (no external ids, nothing flushed until the end)."""
        src = new_source()
        src.start()
        try:
            return per_launch_us(ours, count)
        finally:
            src.stop()
            src.flush_columns()

    def untraced() -> float:
        cpu: list[float] = []
        us = per_launch_us(ours, count, cpu=cpu)
        results.setdefault("main_cpu_us_untraced", []).append(statistics.median(cpu))
        return us

    variants: dict[str, Callable[[], float]] = {
        "raw_cupy": lambda: per_launch_us(raw_loop, count),
        "raw_cupy_cupti_on": lambda: raw_cupti(False),
        "raw_cupy_cupti_push_pop": lambda: raw_cupti(True),
        "raw_cupy_cupti_push_pop_bare_flush": lambda: raw_cupti(True, bare=True),
        "ours_untraced": untraced,
        "ours_cupti": lambda: traced("cupti"),
        "ours_cupti_watched": lambda: traced("cupti", watch=True),
        "ours_cupti_flush_each_4MiB": flush_each,
        "ours_events": lambda: traced("events"),
    }
    pools = dev.backend_device._pools

    def counted(name: str, fn: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            before = sum(p.created for p in pools)
            us = fn()
            results.setdefault(f"events_created_{name}", []).append(sum(p.created for p in pools) - before)
            return us

        return run

    if args.bounds:
        variants = {
            "ours_untraced": untraced,
            "ours_untraced_cupti_on": bare_cupti,
            "ours_cupti_no_harvest": lambda: traced("cupti", interval_s=1000.0, key="no_harvest"),
            "ours_cupti": lambda: traced("cupti"),
            "ours_cupti_watched": lambda: traced("cupti", watch=True),
            "ours_cupti_again": lambda: traced("cupti", key="again"),
        }
        variants = {name: counted(name, fn) for name, fn in variants.items()}
    results: dict = {"device": dev.name, "count": count, "date": time.strftime("%Y-%m-%d")}
    raw_loop()
    ours()
    if args.phases:
        phases()
        return
    for r in range(args.rounds):
        for name, fn in variants.items():
            results.setdefault(name, []).append(fn())
        print(f"round {r}:", {n: round(results[n][-1], 2) for n in variants}, flush=True)
    summary = {n: statistics.median(results[n]) for n in variants}
    for name in variants:
        for base in ("ours_untraced", "raw_cupy"):
            if name.startswith(base[:5]) and name != base and base in variants:
                pairs = np.array(results[name]), np.array(results[base])
                summary[f"ratio_{name}"] = statistics.median(pairs[0] / pairs[1])
                summary[f"added_us_{name}"] = statistics.median(pairs[0] - pairs[1])
    for key, values in results.items():
        if key.startswith(("main_cpu", "harvest_cpu", "events_created", "drain_us")):
            summary[key] = statistics.median(values)
    results["median"] = summary
    print(json.dumps(summary, indent=1))
    write_json(args.json, results)


if __name__ == "__main__":
    main()
