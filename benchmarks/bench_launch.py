"""The launch path: host time per kernel launch, elementwise call and small async copy, on whatever device is found.

``python benchmarks/bench_launch.py [--device SPEC] [--rounds R] [--count N] [--quick] [--json out.json]``

On CUDA every figure has raw CuPy beside it, in ABBA-interleaved rounds of the same process (the order of the
variants flips every round, so drift of the host hits both alike): an empty ``cupy.RawKernel`` against a gw ``Kernel``
untraced and traced (a fresh ``gw.trace()`` per round, 200 warm-up launches before its timing starts), the same
with a second, int32 argument that changes every launch (no launch then repeats an earlier one's objects), a
``cupy.ElementwiseKernel`` against the same ``gw.elementwise``, and CuPy's ``ndarray.set`` / ``ndarray.get`` of 4 KiB
from / into pinned memory against ``copy_from_host_async`` / ``copy_to_host_async``. A round is ``count`` ops then one
synchronize; a figure is the median over rounds of (round time / count), and a ratio the median of the rounds'
ratios. Targets: Kernel ≤ 1.25 × RawKernel, elementwise ≤ 1.25 ×
ElementwiseKernel, copies ≤ 1.25 × set/get, traced ≤ 1.2 × untraced.

On the CPU and OpenCL backends only the workbench's own figures: the host time to enqueue (the loop before the
synchronize) and the time per op with the synchronize; CPU target: enqueue ≤ 10 µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_common import write_json

import gpuworkbench as gw

EMPTY = {
    "cuda": 'extern "C" __global__ void empty(float* x) {}',
    "cuda_scalar": 'extern "C" __global__ void empty_n(float* x, int n) {}',
    "opencl": "__kernel void empty(__global float* x) {}",
}
COPY_ELEMENTS = 1024  # 4 KiB of float32
ELEMENTWISE_N = 1024
#: After ``cuptiFinalize`` launches stay slower for a moment (H200: 1.1-1.35 x over the next 40 ms of launches, as
#: before 0.5 s later): the untraced rounds after a traced one start once it has passed.
SETTLE_S = 0.3
TARGETS = {"kernel": 1.2, "kernel_scalar": 1.2, "elementwise": 1.2, "h2d": 1.2, "d2h": 1.2, "user_loop": 1.2}
TARGETS.update({"traced": 1.2, "after_trace": 1.05})
TARGETS["cpu_enqueue_us"] = 10.0


def _empty_cpu(x: np.ndarray) -> None:
    """The CPU backend's empty kernel."""


def timed_round(fn: Callable[[], Any], sync: Callable[[], Any], count: int) -> tuple[float, float]:
    """(µs per op to enqueue, µs per op including the final synchronize) for ``count`` calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t1 - t0) / count * 1e6, (t2 - t0) / count * 1e6


def interleaved(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run every variant once per round, in ABBA order (reversed every other round); each returns µs per op."""
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            out[name].append(variants[name]())
    return out


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values)}


def ratio(num: list[float], den: list[float]) -> dict[str, float]:
    return summary([a / b for a, b in zip(num, den)])


def traced_loop(fn: Callable[[], Any], sync: Callable[[], Any], count: int) -> float:
    """µs per op inside a fresh trace, after 200 warm-up ops (CUPTI start and clock alignment are not timed). CUPTI
    is let go after it (``cupti.let_go``), so that untraced blocks run as in a process that never traced rather than
    beside a lingering source."""
    with gw.trace() as t:
        for _ in range(200):
            fn()
        sync()
        per_op = timed_round(fn, sync, count)[1]
    t.wait_pending()
    if not gw.cupti.let_go() and not gw.cupti.detached():
        raise RuntimeError("CUPTI could not be let go: the untraced rounds would run with it attached")
    time.sleep(SETTLE_S)
    return per_op


def bench_cuda(dev: gw.Device, rounds: int, count: int) -> dict[str, Any]:
    import cupy as cp
    import cupyx

    out: dict[str, Any] = {"cupy": cp.__version__}
    raw_stream = cp.cuda.Stream(non_blocking=True)
    s = dev.create_stream("bench-launch")

    raw_sync, gw_sync = raw_stream.synchronize, s.synchronize
    # Kernel launches: raw RawKernel / gw Kernel untraced / gw Kernel traced
    raw = cp.RawKernel(EMPTY["cuda"], "empty")
    arr = cp.empty(1, cp.float32)
    k = dev.compile(EMPTY["cuda"], "empty")
    b = dev.alloc(1, "float32")

    def raw_kernel() -> None:
        with raw_stream:
            raw((1,), (32,), (arr,))

    def gw_kernel() -> None:
        k(1, 32, (b,), stream=s)

    # as a user writes it: literal dims, block 1; its traced rounds are not let go after (CUPTI lingers, as in a
    # script that traces one loop and then runs the next untraced)
    def raw_user() -> None:
        with raw_stream:
            raw((1,), (1,), (arr,))

    def gw_user() -> None:
        k(1, 1, (b,), stream=s)

    def gw_user_traced() -> float:
        with gw.trace() as t:
            per_op = timed_round(gw_user, gw_sync, count)[1]
        t.wait_pending()
        return per_op

    # a scalar argument that changes every launch (a loop index): no launch repeats an earlier one's objects
    raw_n = cp.RawKernel(EMPTY["cuda_scalar"], "empty_n")
    k_n = dev.compile(EMPTY["cuda_scalar"], "empty_n")
    counter = iter(range(1 << 62))

    def raw_kernel_scalar() -> None:
        with raw_stream:
            raw_n((1,), (32,), (arr, np.int32(next(counter) & 0xFFFF)))

    def gw_kernel_scalar() -> None:
        k_n(1, 32, (b, np.int32(next(counter) & 0xFFFF)), stream=s)

    # elementwise: cupy.ElementwiseKernel / gw.elementwise, y = x + 1 over ELEMENTWISE_N float32
    cp_ew = cp.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", "gw_bench_add1")
    cx, cy = cp.zeros(ELEMENTWISE_N, cp.float32), cp.zeros(ELEMENTWISE_N, cp.float32)
    gw_ew = gw.elementwise("float32 x, float32 y", "y = x + 1", name="gw_bench_add1")
    gx, gy = dev.alloc(ELEMENTWISE_N, "float32"), dev.alloc(ELEMENTWISE_N, "float32")

    def raw_ew() -> None:
        with raw_stream:
            cp_ew(cx, cy)

    def gw_elementwise() -> None:
        gw_ew(gx, gy, stream=s)

    # 4 KiB copies from / into pinned memory
    cp_dev = cp.zeros(COPY_ELEMENTS, cp.float32)
    cp_pinned = cupyx.empty_pinned((COPY_ELEMENTS,), np.float32)
    gw_buf = dev.alloc(COPY_ELEMENTS, "float32")
    gw_pinned = dev.empty_pinned(COPY_ELEMENTS, "float32")
    cp_pinned[:] = 1
    gw_pinned[:] = 1
    try:
        cp_dev.get(stream=raw_stream, out=cp_pinned, blocking=False)
        get_kwargs: dict[str, Any] = {"blocking": False}
    except TypeError:  # a CuPy without get(blocking=): get with a stream returns once enqueued there anyway
        get_kwargs = {}
    raw_stream.synchronize()
    out["cupy_get"] = f"ndarray.get(stream=, out=pinned{', blocking=False' if get_kwargs else ''})"

    def raw_h2d() -> None:
        cp_dev.set(cp_pinned, stream=raw_stream)

    def gw_h2d() -> None:
        gw_buf.copy_from_host_async(gw_pinned, s)

    def raw_d2h() -> None:
        cp_dev.get(stream=raw_stream, out=cp_pinned, **get_kwargs)

    def gw_d2h() -> None:
        gw_buf.copy_to_host_async(gw_pinned, s)

    warm = ((raw_user, raw_sync), (gw_user, gw_sync), (raw_kernel, raw_sync), (gw_kernel, gw_sync))
    warm += ((raw_kernel_scalar, raw_sync), (gw_kernel_scalar, gw_sync))
    for fn, sync in (*warm, (raw_ew, raw_sync), (gw_elementwise, gw_sync)):
        timed_round(fn, sync, 500)  # compile, warm caches and pools
    for fn, sync in ((raw_h2d, raw_sync), (gw_h2d, gw_sync), (raw_d2h, raw_sync), (gw_d2h, gw_sync)):
        timed_round(fn, sync, 500)

    def per_op(fn: Callable[[], Any], sync: Callable[[], Any]) -> Callable[[], float]:
        return lambda: timed_round(fn, sync, count)[1]

    groups = {
        "kernel": {
            "cupy": per_op(raw_kernel, raw_sync),
            "gw": per_op(gw_kernel, gw_sync),
            "gw_traced": lambda: traced_loop(gw_kernel, gw_sync, count),
        },
        "kernel_scalar": {"cupy": per_op(raw_kernel_scalar, raw_sync), "gw": per_op(gw_kernel_scalar, gw_sync)},
        "elementwise": {"cupy": per_op(raw_ew, raw_sync), "gw": per_op(gw_elementwise, gw_sync)},
        "h2d": {"cupy": per_op(raw_h2d, raw_sync), "gw": per_op(gw_h2d, gw_sync)},
        "d2h": {"cupy": per_op(raw_d2h, raw_sync), "gw": per_op(gw_d2h, gw_sync)},
        "user_loop": {"cupy": per_op(raw_user, raw_sync), "gw": per_op(gw_user, gw_sync), "gw_traced": gw_user_traced},
    }
    for group, variants in groups.items():
        times = interleaved(variants, rounds)
        result: dict[str, Any] = {f"{n}_us": summary(v) for n, v in times.items()}
        result["rounds"] = {n: [round(x, 3) for x in v] for n, v in times.items()}
        result["gw_over_cupy"] = ratio(times["gw"], times["cupy"])
        result["target"] = TARGETS[group]
        result["met"] = result["gw_over_cupy"]["median"] <= TARGETS[group]
        if "gw_traced" in times:
            result["traced_over_untraced"] = ratio(times["gw_traced"], times["gw"])
            result["traced_target"] = TARGETS["traced"]
            result["traced_met"] = result["traced_over_untraced"]["median"] <= TARGETS["traced"]
        out[group] = result
        print(f"{group}: " + ", ".join(f"{n} {v['median']:.2f} µs" for n, v in result.items() if n.endswith("_us")))
        print(f"  gw / cupy {result['gw_over_cupy']['median']:.3f} (target ≤ {TARGETS[group]}, met: {result['met']})")
        if "traced_over_untraced" in result:
            print(f"  traced / untraced {result['traced_over_untraced']['median']:.3f} (target ≤ {TARGETS['traced']})")
    for buf in (b, gx, gy, gw_buf):
        buf.free()
    s.close()
    return out


#: Script rounds: each of ours and CuPy's, SCRIPT_GAP_S apart, so that they span the second after the trace's end.
SCRIPT_ROUNDS, SCRIPT_GAP_S = 30, 0.02
#: Rounds that start within EARLY_S of the trace's end are "right after" it; after LATE_S, "later".
EARLY_S, LATE_S = 0.2, 0.5


def script_child(kind: str, count: int) -> dict[str, Any]:
    """One fresh process: warm launches, then (``after``) one traced loop, then at once rounds of untraced launches
    of ours and CuPy's, alternating, SCRIPT_GAP_S apart; each round's µs per launch and its start after that point."""
    import cupy as cp

    dev = gw.Device("cuda:0")
    raw, arr, raw_stream = cp.RawKernel(EMPTY["cuda"], "empty"), cp.empty(1, cp.float32), cp.cuda.Stream(True)
    k, b, s = dev.compile(EMPTY["cuda"], "empty"), dev.alloc(1, "float32"), dev.create_stream("script")

    def ours() -> None:
        k(1, 1, (b,), stream=s)

    def cupys() -> None:
        with raw_stream:
            raw((1,), (1,), (arr,))

    timed_round(ours, s.synchronize, 2000)
    timed_round(cupys, raw_stream.synchronize, 2000)
    if kind == "after":
        with gw.trace() as t:
            timed_round(ours, s.synchronize, 2000)
        t.wait_pending()
    t0 = time.perf_counter()
    rounds: dict[str, list[tuple[float, float]]] = {"gw": [], "cupy": []}
    pair = (("gw", ours, s.synchronize), ("cupy", cupys, raw_stream.synchronize))
    for r in range(SCRIPT_ROUNDS):
        for name, fn, sync in pair if r % 2 == 0 else pair[::-1]:
            at = time.perf_counter() - t0
            rounds[name].append((at, timed_round(fn, sync, count)[1]))
        time.sleep(SCRIPT_GAP_S)
    return {"rounds": rounds, "state": gw.cupti.state().split(":")[0]}


def _phase(rounds: list[tuple[float, float]], early: bool) -> float:
    """The median µs per launch of the rounds right after the trace (early) or later."""
    return statistics.median(us for at, us in rounds if (at < EARLY_S if early else at > LATE_S))


def bench_after_trace(processes: int, count: int) -> dict[str, Any]:
    """Untraced launches right after a trace, in a script, against a process that never traced: ``processes`` fresh
    processes of each kind, alternating; ours and CuPy's per launch right after (< EARLY_S) and later (> LATE_S), as
    medians over processes, and the ratios after / never."""
    import json
    import subprocess

    runs: dict[str, list[dict[str, Any]]] = {"never": [], "after": []}
    for i in range(2 * processes):
        kind = ("never", "after")[(i + i // 2) % 2]  # never, after, after, never, ...
        cmd = [sys.executable, __file__, "--child", kind, "--count", str(count)]
        runs[kind].append(json.loads(subprocess.check_output(cmd).decode().strip().splitlines()[-1]))
    out: dict[str, Any] = {"states_after": [r["state"] for r in runs["after"]]}
    for kind, done in runs.items():
        for who in ("gw", "cupy"):
            for early in (True, False):
                values = [_phase(r["rounds"][who], early) for r in done]
                out[f"{kind} {who} {'right after' if early else 'later'} µs"] = statistics.median(values)
    for who in ("gw", "cupy"):
        for when in ("right after", "later"):
            out[f"{who} {when}: after / never"] = out[f"after {who} {when} µs"] / out[f"never {who} {when} µs"]
    out["after_over_never"] = out["gw right after: after / never"]
    out["target"] = TARGETS["after_trace"]
    out["met"] = out["after_over_never"] <= TARGETS["after_trace"]
    for who in ("gw", "cupy"):
        first, later = out[f"{who} right after: after / never"], out[f"{who} later: after / never"]
        print(f"{who}: untraced right after a trace / never traced "
              f"{out[f'after {who} right after µs']:.2f} / {out[f'never {who} right after µs']:.2f} µs = "
              f"{first:.3f}; later {later:.3f}")  # fmt: skip
    print(f"  CUPTI after the rounds: {', '.join(out['states_after'])}")
    return out


def bench_host(dev: gw.Device, rounds: int, count: int) -> dict[str, Any]:
    """CPU / OpenCL: the workbench's own figures (enqueue host time and time per op), traced beside untraced."""
    language = dev.caps.kernel_language
    s = dev.create_stream("bench-launch")
    b = dev.alloc(1, "float32")
    k = dev.compile(_empty_cpu if language == "python" else EMPTY[language], "empty")
    ew = gw.elementwise("float32 x, float32 y", "y = x + 1", name="gw_bench_add1")
    x, y = dev.alloc(ELEMENTWISE_N, "float32"), dev.alloc(ELEMENTWISE_N, "float32")
    buf = dev.alloc(COPY_ELEMENTS, "float32")
    pinned = dev.empty_pinned(COPY_ELEMENTS, "float32")
    pinned[:] = 1
    x.fill_bytes(0, s)
    ops = {
        "kernel": lambda: k(1, 1, (b,), stream=s),
        "elementwise": lambda: ew(x, y, stream=s),
        "h2d": lambda: buf.copy_from_host_async(pinned, s),
        "d2h": lambda: buf.copy_to_host_async(pinned, s),
    }
    sync = s.synchronize
    for fn in ops.values():
        timed_round(fn, sync, 200)
    out: dict[str, Any] = {}
    enqueue: dict[str, list[float]] = {n: [] for n in ops}
    variants: dict[str, Callable[[], float]] = {}
    for name, fn in ops.items():

        def run(name: str = name, fn: Callable[[], Any] = fn) -> float:
            enq, total = timed_round(fn, sync, count)
            enqueue[name].append(enq)
            return total

        variants[name] = run
    variants["kernel_traced"] = lambda: traced_loop(ops["kernel"], sync, count)
    times = interleaved(variants, rounds)
    for name in ops:
        out[name] = {"enqueue_us": summary(enqueue[name]), "per_op_us": summary(times[name])}
    out["kernel"]["traced_per_op_us"] = summary(times["kernel_traced"])
    out["kernel"]["traced_over_untraced"] = ratio(times["kernel_traced"], times["kernel"])
    if language == "python":
        for name in ("kernel", "elementwise"):
            out[name]["target_enqueue_us"] = TARGETS["cpu_enqueue_us"]
            out[name]["met"] = out[name]["enqueue_us"]["median"] <= TARGETS["cpu_enqueue_us"]
    for name, r in out.items():
        line = f"{name}: enqueue {r['enqueue_us']['median']:.2f} µs, per op {r['per_op_us']['median']:.2f} µs"
        if "traced_over_untraced" in r:
            line += f", traced / untraced {r['traced_over_untraced']['median']:.3f}"
        print(line)
    for buffer in (b, x, y, buf):
        buffer.free()
    s.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", help="a device spec (cuda:0, opencl:0, cpu); default: the best device found")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 24 on CUDA, 9 elsewhere)")
    parser.add_argument("--count", type=int, help="ops per round (default 5000 on CUDA, 2000 elsewhere)")
    parser.add_argument("--quick", action="store_true", help="4 rounds of 500: checks that it runs, not figures")
    parser.add_argument("--script", type=int, default=6, help="fresh processes of each kind for 'right after a trace'")
    parser.add_argument("--child", choices=("never", "after"), help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.child:
        import json

        print(json.dumps(script_child(args.child, args.count or 1000)))
        return
    dev = gw.Device(args.device) if args.device else gw.Device()
    cuda = dev.backend_kind is gw.BackendKind.CUDA
    rounds = args.rounds or (4 if args.quick else 24 if cuda else 9)
    count = args.count or (500 if args.quick else 5000 if cuda else 2000)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "device": f"{dev.spec} {dev.name}",
        "python": sys.version.split()[0],
        "rounds": rounds,
        "count": count,
        "quick": args.quick,
    }
    print(f"{dev.spec} {dev.name}: {rounds} rounds × {count} ops", flush=True)
    results["results"] = bench_cuda(dev, rounds, count) if cuda else bench_host(dev, rounds, count)
    if cuda and args.script:
        results["results"]["after_trace"] = bench_after_trace(args.script, 1000)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
