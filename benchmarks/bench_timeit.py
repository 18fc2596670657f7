"""``gw.timeit`` against ``cupyx.profiler.benchmark`` and ``torch.profiler`` on an NVIDIA GPU.

    python benchmarks/bench_timeit.py [--rounds 5] [--budget 1.0] [--only accuracy,flush,graph] [--json out.json]

``accuracy``: a CuPy ``RawKernel`` that spins one thread for a number of ``clock64()`` cycles (picked from the SM
clock so that it runs about 5 µs, 50 µs and 1 ms) is measured three ways, interleaved round by round (each way first
in turn): ``gw.timeit`` (device time per call from the trace's CUPTI spans), ``cupyx.profiler.benchmark`` (median of
its CUDA-event ``gpu_times``) and ``torch.profiler`` with ``ProfilerActivity.CUDA`` (Kineto's kernel durations of the
same CuPy kernel). torch.profiler runs in a worker process of its own, asked for each round in turn: after a
profiler has run, CUPTI's timestamps in that process are CPU ticks, which a micro-benchmark should not be mixed with.
Printed: per size the medians over rounds and the ratios ours / cupyx and ours / torch.

``flush``: a sum over 8 MiB of float32 (it fits in L2) with ``flush_l2=True`` against warm, interleaved.
``graph``: a statement of 20 tiny kernels, plain against ``graph=True`` (host time per call, and device time), for
CuPy's ``RawKernel`` (CuPy's stream capture) and for ``gw.elementwise`` (a gpuworkbench graph).

Without CuPy or a CUDA device it prints why and exits 0 (the JSON, if asked for, says ``skipped``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import write_json  # noqa: E402

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""
TARGETS_US = (5, 50, 1000)
TINY_KERNELS = 20


def gpu_missing() -> str:
    """Why the benchmark cannot run here ("" when CuPy sees a CUDA device)."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy finds no CUDA device"
    except Exception as exc:  # noqa: BLE001 - no driver, no device: the reason is the message
        return f"CuPy finds no CUDA device ({exc})"
    return ""


def spin_kernel(cp: Any) -> Any:
    return cp.RawKernel(SPIN, "spin")


def cycles_for(cp: Any, us: float) -> int:
    """``clock64()`` cycles for about ``us`` µs at the SM clock the device reports (kHz)."""
    khz = cp.cuda.Device().attributes["ClockRate"]
    return max(1, int(us * khz / 1000))


# --------------------------------------------------------------------------- torch.profiler, in a worker process
def torch_worker() -> None:
    """Answer one JSON line per request line: Kineto's durations (ns) of ``repeats`` spin kernels of ``cycles``."""
    import numpy as np

    try:
        import cupy as cp
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        for _ in sys.stdin:
            print(json.dumps({"error": f"no torch or CuPy: {exc}"}), flush=True)
        return
    torch.cuda.init()
    kernel = spin_kernel(cp)
    for line in sys.stdin:
        request = json.loads(line)
        cycles, repeats = np.int64(request["cycles"]), int(request["repeats"])
        for _ in range(10):
            kernel((1,), (1,), (cycles,))
        cp.cuda.Device().synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                kernel((1,), (1,), (cycles,))
                cp.cuda.Device().synchronize()
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        durations = [
            float(e["dur"]) * 1e3 for e in events if e.get("cat") == "kernel" and "spin" in str(e.get("name", ""))
        ]
        print(json.dumps({"durations_ns": durations}), flush=True)


class TorchProfiler:
    """The worker process, asked for one measurement at a time."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "torch-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def median_ns(self, cycles: int, repeats: int) -> float:
        self.process.stdin.write(json.dumps({"cycles": cycles, "repeats": repeats}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline() or '{"error": "the worker ended"}')
        if "error" in answer or not answer["durations_ns"]:
            print(f"torch.profiler: {answer.get('error', 'no spin kernel in its trace')}", file=sys.stderr)
            return float("nan")
        return statistics.median(answer["durations_ns"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


# --------------------------------------------------------------------------- the three parts
def accuracy(gw: Any, cp: Any, rounds: int, budget_s: float) -> list[dict]:
    """Per target duration: ours, cupyx's and torch.profiler's medians per round, interleaved."""
    import numpy as np
    from cupyx.profiler import benchmark

    kernel = spin_kernel(cp)
    torch = TorchProfiler()
    rows = []
    try:
        for us in TARGETS_US:
            cycles = cycles_for(cp, us)
            args = (np.int64(cycles),)

            def statement(args: tuple = args) -> None:
                kernel((1,), (1,), args)

            repeats = max(20, min(2000, int(0.5e6 / us)))
            ways = {
                "ours": lambda st=statement: gw.timeit(st, budget_s=budget_s).device_time_ns,
                "cupyx": lambda st=statement, n=repeats: float(np.median(benchmark(st, n_repeat=n).gpu_times[0])) * 1e9,
                "torch": lambda c=cycles, n=repeats: torch.median_ns(c, n),
            }
            got: dict[str, list[float]] = {name: [] for name in ways}
            names = list(ways)
            for r in range(rounds):
                for name in names[r % 3 :] + names[: r % 3]:
                    got[name].append(ways[name]())
            row = {"target_us": us, "cycles": cycles, **{f"{k}_ns": v for k, v in got.items()}}
            row["ours_over_cupyx"] = statistics.median(o / c for o, c in zip(got["ours"], got["cupyx"]))
            row["ours_over_torch"] = statistics.median(o / t for o, t in zip(got["ours"], got["torch"]))
            rows.append(row)
            med = {k: statistics.median(v) / 1e3 for k, v in got.items()}
            print(
                f"~{us:>5} µs kernel: ours {med['ours']:9.2f} µs  cupyx {med['cupyx']:9.2f} µs  "
                f"torch {med['torch']:9.2f} µs  ours/cupyx {row['ours_over_cupyx']:.3f}  "
                f"ours/torch {row['ours_over_torch']:.3f}",
                flush=True,
            )
    finally:
        torch.close()
    return rows


def flush(gw: Any, cp: Any, rounds: int, budget_s: float) -> dict:
    """A sum over 8 MiB, warm against flushed, interleaved."""
    x = cp.ones(2 << 20, cp.float32)
    warm, flushed = [], []
    for r in range(rounds):
        for flush_l2 in (False, True) if r % 2 == 0 else (True, False):
            result = gw.timeit(lambda: x.sum(), budget_s=budget_s, flush_l2=flush_l2)
            (flushed if flush_l2 else warm).append(result.device_time_ns)
            note = next((n for n in result.notes if "L2 flushed" in n), "")
    out = {
        "warm_ns": warm,
        "flushed_ns": flushed,
        "flushed_over_warm": statistics.median(flushed) / statistics.median(warm),
    }
    w, f = statistics.median(warm) / 1e3, statistics.median(flushed) / 1e3
    print(f"sum over 8 MiB: warm {w:.2f} µs, flushed {f:.2f} µs ({out['flushed_over_warm']:.2f} ×); {note}", flush=True)
    return out


def graph(gw: Any, cp: Any, rounds: int, budget_s: float) -> dict:
    """20 tiny kernels per call, plain against graph=True: CuPy RawKernels and gw.elementwise launches."""
    tiny = cp.RawKernel(r'extern "C" __global__ void tiny(float* y) { y[threadIdx.x] += 1.0f; }', "tiny")
    y = cp.zeros(32, cp.float32)

    def cupy_statement() -> None:
        for _ in range(TINY_KERNELS):
            tiny((1,), (32,), (y,))

    dev = gw.Device("cuda:0")
    a = dev.alloc(32)
    add_one = gw.elementwise("float32 y", "y = y + 1", name="add_one")

    def gw_statement() -> None:
        for _ in range(TINY_KERNELS):
            add_one(a)

    out: dict[str, Any] = {}
    try:
        for label, statement in (("cupy", cupy_statement), ("gw", gw_statement)):
            got: dict[str, list[tuple[float, float]]] = {"plain": [], "graph": []}
            for r in range(rounds):
                for use_graph in (False, True) if r % 2 == 0 else (True, False):
                    result = gw.timeit(statement, budget_s=budget_s, graph=use_graph, device=dev)
                    got["graph" if use_graph else "plain"].append((result.host_time_ns, result.device_time_ns))
            summary = {
                way: {
                    "host_ns": statistics.median(h for h, _ in pairs),
                    "device_ns": statistics.median(d for _, d in pairs),
                }
                for way, pairs in got.items()
            }
            out[label] = {"rounds": got, **summary}
            p, g = summary["plain"], summary["graph"]
            print(
                f"{TINY_KERNELS} tiny {label} kernels: host per call plain {p['host_ns'] / 1e3:.1f} µs, graph "
                f"{g['host_ns'] / 1e3:.1f} µs ({g['host_ns'] / p['host_ns']:.2f} ×); device plain "
                f"{p['device_ns'] / 1e3:.1f} µs, graph {g['device_ns'] / 1e3:.1f} µs",
                flush=True,
            )
    finally:
        dev.synchronize()
        a.free()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per comparison (default 5)")
    parser.add_argument("--budget", type=float, default=1.0, help="gw.timeit's budget_s per measurement (default 1)")
    parser.add_argument("--only", default="accuracy,flush,graph", help="parts to run, separated by commas")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    parts = [p for p in args.only.split(",") if p]
    unknown = set(parts) - {"accuracy", "flush", "graph"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    why = gpu_missing()
    if why:
        print(f"bench_timeit: skipped: {why}")
        write_json(args.json, {"skipped": why})
        return
    import cupy as cp

    import gpuworkbench as gw

    props = cp.cuda.runtime.getDeviceProperties(0)
    results: dict[str, Any] = {"device": props["name"].decode(), "rounds": args.rounds, "budget_s": args.budget}
    print(
        f"bench_timeit on {results['device']}: {args.rounds} rounds, budget {args.budget} s per gw.timeit", flush=True
    )
    for part in parts:
        results[part] = {"accuracy": accuracy, "flush": flush, "graph": graph}[part](gw, cp, args.rounds, args.budget)
    write_json(args.json, results)


if __name__ == "__main__":
    if sys.argv[1:] == ["torch-worker"]:
        torch_worker()
    else:
        main()
