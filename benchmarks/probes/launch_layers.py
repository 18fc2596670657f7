"""Where a launch's and a small copy's host time goes, layer by layer, beside raw CuPy. GPU machine only.

``python benchmarks/probes/launch_layers.py``: ABBA-interleaved rounds of each layer (raw CuPy as a user calls it,
CuPy called as the backend calls it, the backend's own entry point, the public API), then a cProfile of the public
call, so that the cost of each layer is the difference of two neighbouring figures measured in one process.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import cupy as cp
import cupyx
import numpy as np

import gpuworkbench as gw

EMPTY = 'extern "C" __global__ void empty(float* x) {}'
EMPTY_N = 'extern "C" __global__ void empty_n(float* x, int n) {}'
COUNT, ROUNDS = 5000, 16


def per_op(fn: Callable[[], object], sync: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    for _ in range(COUNT):
        fn()
    sync()
    return (time.perf_counter() - t0) / COUNT * 1e6


def table(title: str, variants: dict[str, Callable[[], object]], sync: dict[str, Callable[[], object]]) -> None:
    names = list(variants)
    for n in names:
        per_op(variants[n], sync[n])
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names if r % 2 == 0 else reversed(names):
            times[n].append(per_op(variants[n], sync[n]))
    base = times[names[0]]
    print(f"== {title}")
    for n in names:
        ratio = statistics.median([a / b for a, b in zip(times[n], base)])
        print(f"  {n:<44} {statistics.median(times[n]):7.2f} us  {ratio:5.3f} x")


def profile(title: str, fn: Callable[[], object], sync: Callable[[], object]) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(COUNT):
        fn()
    prof.disable()
    sync()
    print(f"== cProfile: {title}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def main() -> None:
    dev = gw.Device("cuda:0")
    backend = dev.backend_device
    s = dev.create_stream("layers")
    raw_stream = cp.cuda.Stream(non_blocking=True)
    raw = cp.RawKernel(EMPTY, "empty")
    arr = cp.empty(1, cp.float32)
    k = dev.compile(EMPTY, "empty")
    b = dev.alloc(1, "float32")
    ptr = np.uint64(b.handle)
    values = (ptr,)
    bk, bs = k._raw, s.raw
    func = raw.kernel
    prepared = backend.prepare_launch(bk, (1,), (32,), [ptr])
    params = np.array([int(ptr)], dtype=np.uint64)
    param_ptrs = np.array([params.ctypes.data], dtype=np.uint64)
    pp = int(param_ptrs.ctypes.data)
    drv = cp.cuda.driver

    def cupy_with() -> None:
        with raw_stream:
            raw((1,), (32,), (arr,))

    variants = {
        "cupy RawKernel, with stream (baseline)": cupy_with,
        "cupy RawKernel, stream=, ndarray arg": lambda: raw((1,), (32,), (arr,), stream=raw_stream),
        "cupy RawKernel, stream=, np.uint64 arg": lambda: raw((1,), (32,), values, stream=raw_stream),
        "driver.launchKernel, prebuilt params": lambda: drv.launchKernel(
            func.ptr, 1, 1, 1, 32, 1, 1, 0, raw_stream.ptr, pp, 0
        ),
        "driver.launchKernel, our function": lambda: drv.launchKernel(
            bk.ptr, 1, 1, 1, 32, 1, 1, 0, raw_stream.ptr, pp, 0
        ),
        "driver.launchKernel, our stream": lambda: drv.launchKernel(func.ptr, 1, 1, 1, 32, 1, 1, 0, bs.ptr, pp, 0),
        "prepared call, our function and stream": lambda: prepared.call(bs.ptr, prepared.params, 0),
        "gw backend.launch": lambda: backend.launch(bk, (1,), (32,), values, bs, False),
        "gw backend.launch_prepared": lambda: backend.launch_prepared(prepared, bs),
        "gw Kernel": lambda: k(1, 32, (b,), stream=s),
    }
    rs, gs = raw_stream.synchronize, s.synchronize
    on_raw = ("cupy", "driver.launchKernel, prebuilt", "driver.launchKernel, our function")
    table("empty kernel launch", variants, {n: (rs if n.startswith(on_raw) else gs) for n in variants})
    profile("gw Kernel", variants["gw Kernel"], gs)

    # a scalar that changes every launch: no launch repeats an earlier one's objects
    raw_n = cp.RawKernel(EMPTY_N, "empty_n")
    k_n = dev.compile(EMPTY_N, "empty_n")
    bk_n = k_n._raw
    counter = iter(range(1 << 62))
    scalar = {
        "cupy RawKernel, with stream, new int32 (baseline)": lambda: raw_n(
            (1,), (32,), (arr, np.int32(next(counter) & 0xFFFF)), stream=raw_stream
        ),
        "gw backend.launch, new int32": lambda: backend.launch(
            bk_n, (1,), (32,), (ptr, np.int32(next(counter) & 0xFFFF)), bs, False
        ),
        "gw Kernel, new int32": lambda: k_n(1, 32, (b, np.int32(next(counter) & 0xFFFF)), stream=s),
    }
    scalar["gw backend.launch, new int32"]()
    slots = backend._packed.get((bk_n, (1,), (32,), np.uint64, np.int32))
    if slots:
        scalar["PackedLaunch.launch, new int32"] = lambda: slots.launch(bs.ptr, (ptr, np.int32(next(counter) & 0xFFFF)))
    table("empty kernel launch, a new scalar each time", scalar, {n: (rs if n[:3] == "cup" else gs) for n in scalar})
    profile("gw Kernel, new int32", scalar["gw Kernel, new int32"], gs)

    n = 1024
    cp_dev = cp.zeros(n, cp.float32)
    cp_pinned = cupyx.empty_pinned((n,), np.float32)
    buf = dev.alloc(n, "float32")
    pinned = dev.empty_pinned(n, "float32")
    h, hp = buf.handle, pinned.ctypes.data
    rt = cp.cuda.runtime
    copies = {
        "cupy set (baseline)": lambda: cp_dev.set(cp_pinned, stream=raw_stream),
        "runtime.memcpyAsync": lambda: rt.memcpyAsync(h, hp, 4096, 1, bs.ptr),
        "gw backend.copy_h2d": lambda: backend.copy_h2d(h, 0, pinned, bs, False),
        "gw copy_from_host_async": lambda: buf.copy_from_host_async(pinned, s),
    }
    table("4 KiB pinned h2d", copies, {n: (rs if n.startswith("cupy") else gs) for n in copies})
    profile("gw copy_from_host_async", copies["gw copy_from_host_async"], gs)
    gets = {
        "cupy get (baseline)": lambda: cp_dev.get(stream=raw_stream, out=cp_pinned, blocking=False),
        "gw backend.copy_d2h": lambda: backend.copy_d2h(pinned, h, 0, bs, False),
        "gw copy_to_host_async": lambda: buf.copy_to_host_async(pinned, s),
    }
    table("4 KiB pinned d2h", gets, {n: (rs if n.startswith("cupy") else gs) for n in gets})
    micro = {"pinned.ctypes.data": lambda: pinned.ctypes.data, "is_pinned": lambda: backend.is_pinned(pinned)}
    for name, fn in micro.items():
        t0 = time.perf_counter()
        for _ in range(COUNT):
            fn()
        print(f"  {name}: {(time.perf_counter() - t0) / COUNT * 1e6:.3f} us")


if __name__ == "__main__":
    main()
