"""What a freed buffer's prune of its streams costs on CUDA. GPU machine only.

``python benchmarks/probes/free_prune.py``: ``Buffer.free`` prunes the streams the buffer was used on, so that done ops
do not keep a view of its memory. ABBA rounds of a loop that allocates 4 KiB, launches an empty kernel on it and
frees it: as it stands, with ``Device.prune_streams`` replaced by a no-op, and the same loop written in raw CuPy
(whose free returns the block to its stream-ordered pool without waiting). Also a free after 16 launches on two
streams, where the newest op of one stream is not the one the free waited for.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import cupy as cp

import gpuworkbench as gw
from gpuworkbench.device import Device

EMPTY = 'extern "C" __global__ void empty(float* x) {}'
COUNT, ROUNDS = 2000, 12


def main() -> None:
    dev = gw.Device("cuda:0")
    s, other = dev.create_stream("free"), dev.create_stream("other")
    k = dev.compile(EMPTY, "empty")
    keep = dev.alloc(1, "float32")
    raw = cp.RawKernel(EMPTY, "empty")
    cs = cp.cuda.Stream(non_blocking=True)
    real_prune = Device.prune_streams

    def ours() -> None:
        b = dev.alloc(1024, "float32")
        k(1, 32, (b,), stream=s)
        b.free()

    def ours_two_streams() -> None:
        b = dev.alloc(1024, "float32")
        for _ in range(8):
            k(1, 32, (b,), stream=s)
            k(1, 32, (keep,), stream=other)
        k(1, 32, (b,), stream=other)
        k(1, 32, (keep,), stream=other)
        b.free()

    def cupy_loop() -> None:
        with cs:
            a = cp.empty(1024, cp.float32)
            raw((1,), (32,), (a,))
            del a

    variants: dict[str, tuple[Callable[[], None], bool]] = {
        "ours: alloc, launch, free": (ours, True),
        "ours, free without the prune": (ours, False),
        "ours: 18 launches on two streams, free": (ours_two_streams, True),
        "the same, free without the prune": (ours_two_streams, False),
        "raw CuPy: empty, launch, del": (cupy_loop, True),
    }
    for fn, _ in variants.values():
        for _ in range(50):
            fn()
    dev.synchronize()
    cs.synchronize()
    times: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for r in range(ROUNDS):
        for name in names if r % 2 == 0 else reversed(names):
            fn, prune = variants[name]
            Device.prune_streams = real_prune if prune else (lambda self, ids: None)  # type: ignore[method-assign]
            t0 = time.perf_counter()
            for _ in range(COUNT):
                fn()
            dev.synchronize()
            cs.synchronize()
            times[name].append((time.perf_counter() - t0) / COUNT * 1e6)
    Device.prune_streams = real_prune  # type: ignore[method-assign]
    print("== µs per loop iteration (medians of ABBA rounds)")
    for name in names:
        print(f"  {name:<44} {statistics.median(times[name]):7.2f}")
    keep.free()
    s.close()
    other.close()


if __name__ == "__main__":
    main()
