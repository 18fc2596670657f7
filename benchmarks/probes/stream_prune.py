"""What pruning a stream's ops in flight costs a CUDA launch loop. GPU machine only.

``python benchmarks/probes/stream_prune.py``: a prune asks the newest op's completion, which on CUDA records an event
and queries it. ABBA rounds of 5 000 empty-kernel launches with no prune, with the streams' own (every 1 024 ops) and
with a prune every 64 ops; the backend's prepared launch with and without the stream's tracking; our front end with
the backend's call replaced by a constant; and the pieces of one prune.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import gpuworkbench as gw
from gpuworkbench.backends.base import DONE
from gpuworkbench.kernels.raw import Kernel

EMPTY = 'extern "C" __global__ void empty(float* x) {}'
COUNT, ROUNDS = 5000, 12


def main() -> None:
    dev = gw.Device("cuda:0")
    backend = dev.backend_device
    s = dev.create_stream("prune")
    k = dev.compile(EMPTY, "empty")
    stub = Kernel(dev, k._raw, "empty", None)
    b = dev.alloc(1, "float32")
    for kernel in (k, stub):
        for _ in range(5):
            kernel(1, 32, (b,), stream=s)
    s.synchronize()
    entry = next(iter(k._repeats.values()))
    prepared, values, raw = entry[2], entry[3], s.raw
    stub._launch_prepared = lambda prepared, stream: DONE  # the front end alone

    def no_prune() -> None:
        k(1, 32, (b,), stream=s)
        s.appended = 1  # never a multiple of the prune interval

    def every_64() -> None:
        k(1, 32, (b,), stream=s)
        if s.appended & 63 == 0:
            s.prune_now()

    def tracked_64() -> None:
        s.inflight.append((backend.launch_prepared(prepared, raw), values))
        s.appended += 1
        if s.appended & 63 == 0:
            s.prune_now()

    variants: dict[str, Callable[[], object]] = {
        "Kernel, no prune": no_prune,
        "Kernel, the streams' own prune": lambda: k(1, 32, (b,), stream=s),
        "Kernel, a prune every 64 ops": every_64,
        "backend.launch_prepared": lambda: backend.launch_prepared(prepared, raw),
        "backend.launch_prepared + tracking, prune every 64": tracked_64,
        "Kernel, backend's call a constant": lambda: stub(1, 32, (b,), stream=s),
    }
    times: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(ROUNDS):
        for name in names if r % 2 == 0 else reversed(names):
            t0 = time.perf_counter()
            for _ in range(COUNT):
                variants[name]()
            s.synchronize()
            times[name].append((time.perf_counter() - t0) / COUNT * 1e6)
    print("== a launch loop, µs per launch (medians of rounds)")
    for name in names:
        print(f"  {name:<52} {statistics.median(times[name]):6.2f}")

    def cost(fn: Callable[[], object], n: int = 2000) -> float:
        out = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            out.append(time.perf_counter_ns() - t0)
        return statistics.median(out) / 1000

    marker = backend.record(raw)
    s.synchronize()
    print("== one prune's pieces, µs (medians)")
    print(f"  record an event on the stream                        {cost(lambda: backend.record(raw)):6.2f}")
    print(f"  ask a done event                                     {cost(marker.done):6.2f}")
    pruned = []
    for i in range(64 * 200):
        k(1, 32, (b,), stream=s)
        if i & 63 == 63:
            t0 = time.perf_counter_ns()
            s.prune_now()
            pruned.append(time.perf_counter_ns() - t0)
    s.synchronize()
    print(f"  a prune every 64 launches                            {statistics.median(pruned) / 1000:6.2f}")
    b.free()
    s.close()


if __name__ == "__main__":
    main()
