"""Which CUDA calls wait for a kernel that never ends: measured, so that persistent.py guards exactly those.

Run on the GPU machine: ``python benchmarks/probes/persistent_probe.py``; prints JSON. For each call, a spinning kernel
(polling a flag in mapped host memory) runs on its own non-blocking stream while another thread makes the call; if
the call has not returned after 2 s it is marked as waiting, the flag is set so that the kernel exits, and the call
is then seen to return. Nothing here can hang: every wait is bounded and the kernel is always released.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

SPIN = r"""
extern "C" __global__ void spin(volatile long long* flag) { while (flag[0] == 0) { } }
"""
TINY = r"""
extern "C" __global__ void tiny(float* p) { p[threadIdx.x] += 1.0f; }
"""
LIMIT_S = 2.0


def main() -> None:
    import cupy as cp

    rt = cp.cuda.runtime
    host = int(rt.hostAlloc(64, 2))
    getter = getattr(rt, "hostGetDevicePointer", None)
    device_ptr = int(getter(host, 0)) if getter else int(rt.pointerGetAttributes(host).devicePointer)
    import ctypes

    flag = np.frombuffer((ctypes.c_int64 * 8).from_address(host), dtype=np.int64)
    flag[:] = 0
    spin = cp.RawKernel(SPIN, "spin")
    spin.compile() if hasattr(spin, "compile") else None
    tiny = cp.RawKernel(TINY, "tiny")
    data = cp.zeros(32, cp.float32)
    tiny((1,), (32,), (data,))
    cp.cuda.Device().synchronize()
    persistent_stream = cp.cuda.Stream(non_blocking=True)
    side = cp.cuda.Stream(non_blocking=True)
    pageable = np.zeros(1 << 20, np.uint8)
    results: dict = {
        "cupy": cp.__version__,
        "driver": rt.driverGetVersion(),
        "CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING", "(unset: lazy)"),
        "hostGetDevicePointer_in_cupy": getter is not None,
    }
    leftovers: list = []
    counter = [0]

    def probe(name: str, call, prepare=None) -> None:
        state = prepare() if prepare else None
        flag[0] = 0
        spin((1,), (1,), (np.uint64(device_ptr),), stream=persistent_stream)
        time.sleep(0.05)
        kernel_was_running = not persistent_stream.done  # asked before the call: a blocked call may hold a lock
        box: dict = {}
        done = threading.Event()

        def run() -> None:
            t0 = time.perf_counter()
            try:
                box["value"] = call(state)
            except Exception as exc:  # noqa: BLE001 - the driver's answer is the finding
                box["error"] = f"{type(exc).__name__}: {exc}"
            box["s"] = time.perf_counter() - t0
            done.set()

        threading.Thread(target=run, daemon=True).start()
        returned = done.wait(LIMIT_S)
        flag[0] = 1  # a plain store: the kernel exits, and a call that waited for it returns
        done.wait(20)
        persistent_stream.synchronize()
        results[name] = {
            "returned_while_kernel_ran": returned,
            "kernel_was_running": kernel_was_running,
            "seconds": round(box.get("s", float("nan")), 4),
            **({"error": box["error"]} if "error" in box else {}),
        }
        if "value" in box and box["value"] is not None:
            leftovers.append(box["value"])

    def new_module(_):
        counter[0] += 1
        src = f'extern "C" __global__ void fresh{counter[0]}(float* p) {{ p[threadIdx.x] *= 2.0f; }}'
        k = cp.RawModule(code=src).get_function(f"fresh{counter[0]}")
        k((1,), (32,), (data,), stream=side)
        side.synchronize()

    def async_pair(_):
        p = int(rt.mallocAsync(1 << 20, side.ptr))
        side.synchronize()
        rt.freeAsync(p, side.ptr)
        side.synchronize()

    def free_async_of_malloc(p):
        rt.freeAsync(p, side.ptr)
        side.synchronize()

    def launch_loaded(_):
        tiny((1,), (32,), (data,), stream=side)
        side.synchronize()

    def event_on_side(_):
        e = cp.cuda.Event()
        e.record(side)
        e.synchronize()

    def stream_pair(_):
        s = rt.streamCreateWithFlags(1)
        rt.streamDestroy(s)

    def memcpy_async(_):
        rt.memcpyAsync(data.data.ptr, pageable.ctypes.data, 128, 1, side.ptr)
        side.synchronize()

    probe("cudaDeviceSynchronize (control: must wait)", lambda _: rt.deviceSynchronize())
    probe("cudaMalloc", lambda _: ("device", int(rt.malloc(1 << 20))))
    probe("cudaFree of cudaMalloc memory", lambda p: rt.free(p), lambda: int(rt.malloc(1 << 20)))
    probe("cudaFreeAsync of cudaMalloc memory", free_async_of_malloc, lambda: int(rt.malloc(1 << 20)))
    probe("cudaMallocAsync + cudaFreeAsync on a side stream", async_pair)
    probe("cudaHostAlloc", lambda _: ("host", int(rt.hostAlloc(1 << 20, 0))))
    probe("cudaFreeHost", lambda p: rt.freeHost(p), lambda: int(rt.hostAlloc(1 << 20, 0)))
    probe("cupy alloc_pinned_memory", lambda _: cp.cuda.alloc_pinned_memory(1 << 20) and None)
    probe("launch an already loaded kernel on another stream + sync it", launch_loaded)
    probe("compile + load a new module, launch, sync its stream", new_module)
    probe(
        "cudaMemcpy pageable H2D (legacy default stream)",
        lambda _: rt.memcpy(data.data.ptr, pageable.ctypes.data, 128, 1),
    )
    probe("cudaMemcpyAsync on a side stream + sync", memcpy_async)
    probe("stream create + destroy", stream_pair)
    probe("event record + synchronize on a side stream", event_on_side)
    probe("cudaMemGetInfo", lambda _: rt.memGetInfo() and None)
    probe("cupy.cuda.Stream.null.synchronize", lambda _: cp.cuda.Stream.null.synchronize())
    for item in leftovers:
        if isinstance(item, tuple):
            (rt.free if item[0] == "device" else rt.freeHost)(item[1])
    results.update(gpuworkbench_probe(cp))
    rt.freeHost(host)
    print(json.dumps(results, indent=2))


def gpuworkbench_probe(cp) -> dict:
    """Through gpuworkbench: a trace started while a persistent kernel runs, and one running before it starts.

    Each step's end time is kept, so that a wait shows where it happened; after 8 s the kernel is released.
    """
    import gpuworkbench as gw
    from gpuworkbench.persistent import ring

    dev = gw.Device("cuda:0")
    found: dict = {}
    for order in ("kernel, then trace", "trace, then kernel"):
        buf = dev.alloc(1024, "float32")
        buf.copy_from_host(np.ones(1024, np.float32))
        holder: dict = {}
        steps: list = []
        done = threading.Event()

        def run(order=order, buf=buf, holder=holder, steps=steps, done=done) -> None:
            t0 = time.perf_counter()

            def step(name: str) -> None:
                steps.append((name, round(time.perf_counter() - t0, 4)))

            try:
                if order == "kernel, then trace":
                    holder["pk"] = dev.persistent()
                    step("persistent kernel started")
                t = gw.trace()
                t.__enter__()
                buf.copy_from_host(np.ones(1024, np.float32))
                step("trace started, first copy")
                if "pk" not in holder:
                    holder["pk"] = dev.persistent()
                    step("persistent kernel started")
                pk = holder["pk"]
                pk.scale(buf, 2.0)
                step("SCALE answered")
                holder["ok"] = bool((buf.copy_to_host() == 2).all())
                step("copied back")
                extra = dev.alloc(1 << 20, "float32")
                extra.free()
                step("alloc + free")
                t.__exit__(None, None, None)
                step("trace stopped")
                holder["pending_done"] = t.wait_pending(timeout_s=5)
                step("wait_pending")
                holder["spans"] = len(t.spans)
                holder["source"] = next(iter(t.devices.values())).source
                step("spans read")
            except Exception as exc:  # noqa: BLE001
                holder["error"] = f"{type(exc).__name__}: {exc}"
            done.set()

        threading.Thread(target=run, daemon=True).start()
        returned = done.wait(8)
        if not returned and "pk" in holder:
            ring.I64.pack_into(holder["pk"]._mv, ring.STOP, 1)  # release the kernel
            done.wait(20)
        if "pk" in holder:
            holder.pop("pk").stop()
        buf.free()
        found[f"gw trace (auto), {order}"] = {"returned_while_kernel_ran": returned, "steps": steps, **holder}
    return found


if __name__ == "__main__":
    main()
