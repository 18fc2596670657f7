"""What CUDA counters cost a traced run, and whether their figures agree with ``nvidia-smi dmon``'s (needs a CUDA GPU,
CuPy, cupti-python and nvidia-ml-py; the agreement part also needs ``nvidia-smi``).

    python benchmarks/bench_counters.py [--quick] [--pairs 40] [--json out.json]

Cost: the 16 x 64 MiB pipeline run (``bench_any_cuda.pipeline_setup``) inside a fresh ``gw.trace()`` against inside a
fresh ``gw.trace(counters=True)``, in interleaved pairs (ABBA), 0.1 s between runs; each run's wall time includes
starting and stopping its trace. The median of the per-pair ratios is the figure (target <= 1.01). The first trace
with counters in the process (NVML started, the GPU's counters probed) is timed apart.

Agreement: ~6 s on cuda:0 in three 2 s segments that start on whole wall-clock seconds, each at a constant load: a
kernel that keeps every SM busy and an idle gap, in turn, with a period of 11 ms (short beside any window NVML
averages over, and no divisor of GPM's 50 ms), 30 %, 80 % and 55 % of the time busy; traced with counters while
``nvidia-smi dmon -s pu -d 1 -o DT`` runs beside it. dmon stamps its lines to the second and prints at a fraction
of a second of its own, so each segment compares the mean of our samples inside it (0.1 s from its ends; a GPM
figure counts where the middle of its interval falls) with dmon's lines that lie wholly inside it (stamped from its
start + 1 s to its end - 1 s): GPU busy and SM active against dmon's ``sm``, power against ``pwr``. Figures: each
segment's ratio and the ratio of the means over the segments (target within 5 %).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_any_cuda import pipeline_setup  # noqa: E402
from bench_common import write_json  # noqa: E402

GAP_S = 0.1
COST_TARGET = 1.01
AGREEMENT_TARGET = 0.05
PERIOD_S = 0.011
SEGMENTS = (0.30, 0.80, 0.55)  # busy share of each segment
SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def emit(row: dict, results: list[dict]) -> None:
    results.append(row)
    print(json.dumps(row), flush=True)


# ------------------------------------------------------------------------------------------------------------- cost


def timed(gw, pipe, inputs, outputs, counters: bool) -> float:
    """One pipeline run inside a fresh trace (with counters or not): ms, trace start and stop included."""
    t0 = time.perf_counter_ns()
    with gw.trace(counters=counters) as t:
        pipe.run(inputs, outputs)
    ms = (time.perf_counter_ns() - t0) / 1e6
    t.wait_pending()
    if counters:
        t.counters()  # the sampler's last sample is in: the next run starts from a quiet process
    return ms


def cost(gw, pairs: int, results: list[dict]) -> None:
    _gw, _dev, pipe, inputs, outputs = pipeline_setup()
    timed(gw, pipe, inputs, outputs, False)
    time.sleep(GAP_S)
    first = timed(gw, pipe, inputs, outputs, True)  # NVML starts, the device's counters are probed
    with gw.trace(counters=True) as t:
        pipe.run(inputs[:1], outputs[:1])
    sources = t.counter_sources
    runs: dict[str, list[float]] = {"traced": [], "traced with counters": []}
    for p in range(pairs):
        for counters in (False, True) if p % 2 == 0 else (True, False):
            time.sleep(GAP_S)
            runs["traced with counters" if counters else "traced"].append(timed(gw, pipe, inputs, outputs, counters))
    ratios = [a / b for a, b in zip(runs["traced with counters"], runs["traced"])]
    median = statistics.median(ratios)
    emit(
        {
            "what": "pipeline 16x64MiB: traced with counters against traced",
            "ms_median_traced": statistics.median(runs["traced"]),
            "ms_median_with_counters": statistics.median(runs["traced with counters"]),
            "ratio_median_of_pairs": median,
            "target": f"<= {COST_TARGET}",
            "met": median <= COST_TARGET,
            "first_trace_with_counters_ms": first,
            "pairs": pairs,
            "counter_sources": sources,
            "all": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        },
        results,
    )


# -------------------------------------------------------------------------------------------------------- agreement


def spin_kernel(cp):
    """The spinning kernel and its grid (4 blocks per SM), with the GPU's cycles per second measured."""
    spin = cp.RawKernel(SPIN, "spin")
    grid = (cp.cuda.Device(0).attributes["MultiProcessorCount"] * 4,)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    cycles = 20_000_000
    spin(grid, (128,), (np.int64(1000),))
    start.record()
    spin(grid, (128,), (np.int64(cycles),))
    end.record()
    end.synchronize()
    per_s = cycles / (cp.cuda.get_elapsed_time(start, end) / 1e3)
    return spin, grid, per_s


def workload(cp, spin, grid, per_s: float, segment_s: float) -> list[tuple[float, float, float]]:
    """The segments, each from a whole wall-clock second: (start, end, busy share), wall seconds."""
    time.sleep(1 - time.time() % 1)
    done = []
    for share in SEGMENTS:
        begin = time.time()
        end = begin + segment_s
        busy_cycles = np.int64(share * PERIOD_S * per_s)
        while time.time() < end:
            t0 = time.perf_counter()
            spin(grid, (128,), (busy_cycles,))
            cp.cuda.Device(0).synchronize()
            left = PERIOD_S - (time.perf_counter() - t0)
            if left > 0:
                time.sleep(left)
        done.append((begin, time.time(), share))
    return done


def read_dmon(text: str, index: int) -> dict[int, dict[str, float]]:
    """dmon's lines for GPU ``index``: wall-clock second (the stamp) -> column -> value (NaN for "-")."""
    names: list[str] = []
    found: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.lstrip("#").split()
            if "gpu" in words and not names:
                names = words
            continue
        words = line.split()
        if not names or len(words) != len(names):
            continue
        row = dict(zip(names, words))
        if row.get("gpu") != str(index):
            continue
        found[int(stamp(row["Date"], row["Time"]))] = {
            k: number(v) for k, v in row.items() if k not in ("Date", "Time")
        }
    return found


def stamp(date: str, clock: str) -> float:
    """dmon's local date and time as seconds since the epoch."""
    for layout in ("%Y%m%d %H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y/%m/%d %H:%M:%S"):
        try:
            return datetime.datetime.strptime(f"{date} {clock}", layout).timestamp()
        except ValueError:
            continue
    raise ValueError(f"dmon's date and time {date} {clock} are in no layout known here")


def number(word: str) -> float:
    try:
        return float(word)
    except ValueError:
        return float("nan")


def ours_per_segment(t, number_: int, name: str, wall_minus_perf: int, half_ns: float, segments) -> list[float]:
    """Our mean of counter ``name`` on trace device ``number_`` over each segment, 0.1 s from its ends (a sample
    counts where the middle of its interval falls: ``half_ns`` before it for a GPM figure, 0 for power)."""
    c = t.counters()
    keep = (c["device"] == number_) & (c["name"] == name) & np.isfinite(c["value"])
    at = (c["time_ns"][keep] + wall_minus_perf - half_ns) / 1e9
    values = c["value"][keep]
    means = []
    for begin, end, _ in segments:
        inside = (at >= begin + 0.1) & (at <= end - 0.1)
        means.append(float(values[inside].mean()) if inside.any() else float("nan"))
    return means


def dmon_per_segment(lines: dict[int, dict[str, float]], column: str, segments) -> list[float]:
    """The mean of dmon's ``column`` over its lines that lie wholly inside each segment. A line stamped S was printed
    in [S, S + 1) and covers the second before its printing: wholly inside [begin, end) for S from begin + 1 to
    end - 1, whatever the fraction of a second dmon prints at."""
    means = []
    for begin, end, _ in segments:
        got = [lines[s][column] for s in range(int(begin) + 1, int(end)) if s in lines and column in lines[s]]
        got = [v for v in got if np.isfinite(v)]
        means.append(float(np.mean(got)) if got else float("nan"))
    return means


def compare(ours: list[float], theirs: list[float]) -> dict:
    """Per segment, ours / dmon's, and the ratio of their means over the segments both have."""
    both = [(a, b) for a, b in zip(ours, theirs) if np.isfinite(a) and np.isfinite(b) and b > 0]
    if not both:
        return {"compared": 0, "ours": ours, "dmon": theirs}
    ratio = float(np.mean([a for a, _ in both]) / np.mean([b for _, b in both]))
    return {
        "ratio_of_means": round(ratio, 4),
        "ratios": [round(a / b, 3) for a, b in both],
        "ours": [round(a, 2) for a in ours],
        "dmon": theirs,
        "met": abs(ratio - 1) <= AGREEMENT_TARGET,
    }


def agreement(gw, segment_s: float, results: list[dict]) -> None:
    import cupy as cp
    import pynvml

    from gpuworkbench.trace import counter_nvml

    if shutil.which("nvidia-smi") is None:
        emit({"what": "agreement with nvidia-smi dmon", "skipped": "nvidia-smi is not on PATH"}, results)
        return
    pynvml.nvmlInit()
    index = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(counter_nvml.pci_bus_id(0)))
    dev = gw.Device("cuda:0")
    spin, grid, per_s = spin_kernel(cp)
    dmon = subprocess.Popen(
        ["nvidia-smi", "dmon", "-s", "pu", "-d", "1", "-o", "DT", "-i", str(index)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(1.5)
        with gw.trace(counters=True) as t:
            wall_minus_perf = time.time_ns() - time.perf_counter_ns()
            buffer = dev.alloc(1024, "float32")  # our op: cuda:0 joins the trace, its counters start
            buffer.copy_from_host(np.ones(1024, np.float32))
            time.sleep(0.5)
            segments = workload(cp, spin, grid, per_s, segment_s)
        buffer.free()
        time.sleep(1.5)
    finally:
        dmon.terminate()
        text = dmon.communicate(timeout=10)[0]
    number_ = next(n for n, clock in t.devices.items() if clock.key == "cuda:0")
    says = t.counter_sources.get("cuda:0", "")
    gpm = says.startswith("NVML GPM")
    half_ns = 0.5e9 / (counter_nvml.GPM_RATE_HZ if gpm else counter_nvml.PLAIN_RATE_HZ)
    lines = read_dmon(text, index)
    row: dict = {
        "what": "agreement with nvidia-smi dmon (per segment of constant load)",
        "counter_sources": says,
        "segments": [{"share": share, "seconds": round(end - begin, 2)} for begin, end, share in segments],
        "dmon_lines": len(lines),
        "target": f"ratio of means within {AGREEMENT_TARGET:.0%}",
    }
    for ours, column, interval in (("GPU busy", "sm", True), ("SM active", "sm", True), ("power", "pwr", False)):
        mine = ours_per_segment(t, number_, ours, wall_minus_perf, half_ns if interval else 0.0, segments)
        row[f"{ours} / dmon {column}"] = compare(mine, dmon_per_segment(lines, column, segments))
    if not lines:
        row["dmon_output"] = text[-2000:]
    emit(row, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 pairs: checks that it runs")
    parser.add_argument("--pairs", type=int, default=None, help="pairs of the cost part (default 40; --quick 6)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    import gpuworkbench as gw

    results: list[dict] = []
    cost(gw, args.pairs or (6 if args.quick else 40), results)
    agreement(gw, 2.0, results)  # --quick too: a segment needs 2 s to hold one whole dmon line
    write_json(args.json, results)


if __name__ == "__main__":
    main()
