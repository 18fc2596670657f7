"""The user's loop of ``bench_launch.py`` round by round: whether an untraced round is slower right after a traced one
(CUPTI left lingering, so that the first untraced launch lets it go), for ours and for raw CuPy alike. GPU only.

    python benchmarks/probes/user_loop_rounds.py [--rounds 12] [--count 5000]

``bench`` order: CuPy, ours, traced, then reversed (as ``bench_launch.py``'s user loop): ours follows a traced round
in every other round, CuPy's never. ``both`` order: a traced round before each untraced one, ours and CuPy's
alternating first. Prints each untraced round's µs per launch and what came before it, and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_launch import EMPTY, timed_round  # noqa: E402

import gpuworkbench as gw  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args()
    import cupy as cp

    dev = gw.Device("cuda:0")
    s = dev.create_stream("user-loop")
    raw_stream = cp.cuda.Stream(non_blocking=True)
    raw = cp.RawKernel(EMPTY["cuda"], "empty")
    arr = cp.empty(1, cp.float32)
    k = dev.compile(EMPTY["cuda"], "empty")
    b = dev.alloc(1, "float32")

    def raw_user() -> None:
        with raw_stream:
            raw((1,), (1,), (arr,))

    def gw_user() -> None:
        k(1, 1, (b,), stream=s)

    def untraced(fn, sync) -> float:
        return timed_round(fn, sync, args.count)[1]

    def traced() -> float:
        with gw.trace() as t:
            per_op = timed_round(gw_user, s.synchronize, args.count)[1]
        t.wait_pending()
        return per_op

    runs = {"cupy": lambda: untraced(raw_user, raw_stream.synchronize), "gw": lambda: untraced(gw_user, s.synchronize)}
    for fn, sync in ((raw_user, raw_stream.synchronize), (gw_user, s.synchronize)):
        timed_round(fn, sync, 1000)
    orders = {
        "bench": lambda r: ["cupy", "gw", "traced"] if r % 2 == 0 else ["traced", "gw", "cupy"],
        "both": lambda r: ["traced", "cupy", "traced", "gw"] if r % 2 == 0 else ["traced", "gw", "traced", "cupy"],
    }
    for order, sequence in orders.items():
        got: dict[tuple[str, bool], list[float]] = {}
        pairs: dict[str, list[float]] = {"cupy": [], "gw": []}
        for r in range(args.rounds):
            before = ""
            for name in sequence(r):
                if name == "traced":
                    traced()
                else:
                    us = runs[name]()
                    got.setdefault((name, before == "traced"), []).append(us)
                    pairs[name].append(us)
                    print(f"{order} round {r:2d} {name:4s} after {before or 'start':6s}: {us:.2f} µs", flush=True)
                before = name
        ratio = statistics.median(g / c for g, c in zip(pairs["gw"], pairs["cupy"]))
        print(f"{order}: median of paired ratios ours / CuPy {ratio:.3f}")
        for (name, after), values in sorted(got.items()):
            print(f"{order}: {name:4s} {'after a traced round' if after else 'after an untraced one'}: "
                  f"median {statistics.median(values):.2f} µs over {len(values)}")  # fmt: skip
    b.free()
    s.close()


if __name__ == "__main__":
    main()
