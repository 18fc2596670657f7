"""Where the time of one kernel launch through gpuworkbench goes (cProfile), beside raw CuPy. GPU machine only."""

from __future__ import annotations

import cProfile
import pstats
import time

import gpuworkbench as gw

EMPTY = 'extern "C" __global__ void empty(float* x) {}'


def main(n: int = 20000) -> None:
    dev = gw.Device("cuda:0")
    k = dev.compile(EMPTY, "empty")
    b = dev.alloc(1, "float32")
    s = dev.create_stream("launch")
    for label, traced in (("untraced", False), ("traced", True)):
        t = gw.trace(source="events").start() if traced else None
        for _ in range(2):
            t0 = time.perf_counter()
            for _ in range(n):
                k(1, 32, (b,), stream=s)
            enq = time.perf_counter() - t0
            s.synchronize()
            print(f"{label}: enqueue {enq / n * 1e6:.2f} us per launch")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(n):
            k(1, 32, (b,), stream=s)
        profile.disable()
        s.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
        if t is not None:
            t.stop()


if __name__ == "__main__":
    main()
