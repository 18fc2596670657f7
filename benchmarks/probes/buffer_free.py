"""What ``Buffer.free`` costs on CUDA. GPU machine only.

``python benchmarks/probes/buffer_free.py``:
- how long a free of a 4 KiB buffer takes while a 2 ms kernel runs on another stream: ours, a bare
  cudaMalloc/cudaFree pair and CuPy's pool (cudaFree waits for the whole device);
- an iteration of the loop below (alloc, launch on the new buffer, free) with its three steps timed apart;
- ABBA rounds of a loop that allocates 4 KiB, launches an empty kernel on it and frees it: as it stands, with
  ``Device.prune_streams`` (a free prunes the streams the buffer was used on, so that done ops keep no view of its
  memory) replaced by a no-op, and the same loop in raw CuPy (whose free does not wait for the kernel); also a free
  after 18 launches on two streams, where the newest op of one stream is not the one the free waited for.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import cupy as cp

import gpuworkbench as gw
from gpuworkbench.device import Device

EMPTY = 'extern "C" __global__ void empty(float* x) {}'
SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""
COUNT, ROUNDS = 2000, 12


def free_beside_a_kernel(dev: gw.Device) -> None:
    """A free while a 2 ms kernel runs on another stream, in ms (the median of 5)."""
    spin, rt, pool = cp.RawKernel(SPIN, "spin"), cp.cuda.runtime, cp.cuda.MemoryPool()

    def ours() -> None:
        dev.alloc(1024, "float32").free()

    def cupy_pool() -> None:
        block = pool.malloc(4096)
        del block  # back to the pool

    frees: dict[str, Callable[[], None]] = {
        "ours": ours,
        "cudaMalloc + cudaFree": lambda: rt.free(rt.malloc(4096)),
        "CuPy's pool": cupy_pool,
    }
    print("== a 4 KiB alloc and free while a 2 ms kernel runs on another stream, ms (median of 5)")
    busy = cp.cuda.Stream(non_blocking=True)
    for name, fn in frees.items():
        fn()
        took = []
        for _ in range(5):
            with busy:
                spin((1,), (1,), (cp.uint64(2_000_000),))
            t0 = time.perf_counter()
            fn()
            took.append((time.perf_counter() - t0) * 1e3)
            busy.synchronize()
        print(f"  {name:<44} {statistics.median(took):7.3f}")


def pieces(dev: gw.Device) -> None:
    """The alloc, the launch on the new buffer and the free of one loop iteration, timed apart."""
    s = dev.create_stream("pieces")
    k = dev.compile(EMPTY, "empty")
    took: list[tuple[int, int, int]] = []
    for _ in range(3000):
        t0 = time.perf_counter_ns()
        b = dev.alloc(1024, "float32")
        t1 = time.perf_counter_ns()
        k(1, 32, (b,), stream=s)
        t2 = time.perf_counter_ns()
        b.free()
        took.append((t1 - t0, t2 - t1, time.perf_counter_ns() - t2))
    alloc, launch, free = (statistics.median(x[j] for x in took[500:]) / 1000 for j in range(3))
    print(f"== one iteration's pieces, µs (medians): alloc {alloc:.2f}, launch {launch:.2f}, free {free:.2f}")
    s.close()


def main() -> None:
    dev = gw.Device("cuda:0")
    free_beside_a_kernel(dev)
    pieces(dev)
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
