"""Several GPUs: peer copies against raw CuPy's, and two pipelines on two GPUs at once against one alone.

Run where at least two CUDA devices are: ``python benchmarks/bench_multi_gpu.py [--quick] [--json out.json]``; with
fewer it writes ``{"skipped": ...}`` and exits 0. Targets:

- peer copy bandwidth (``Buffer.copy_from`` between cuda:0 and cuda:1, untraced) ≥ 0.97 × raw CuPy's
  ``cudaMemcpyPeerAsync`` of the same bytes on a stream of the destination, with peer access enabled as ours does;
  samples ABBA-interleaved (ours, raw, raw, ours, ...), each the wall time of ``COPIES`` copies then a stream sync;
  medians compared. Also printed: CuPy's ``MemoryPointer.copy_from_device_async`` (its own cross-device copy) and
  the bandwidth a traced peer copy's span shows.
- two ``Pipeline.run`` (one per GPU, each from its own thread, both traced in one trace) take ≤ 1.1 × the wall time
  of one ``Pipeline.run`` on one GPU, traced; samples ABBA-interleaved (one, two, two, one, ...), medians compared.
  The traced two-GPU run's cross-device summary (busy % per device, slowest device, wait) is recorded too.
  Beside it, in the same process, the same pipeline written in plain CuPy (three streams, two slots, the same
  copies and kernel) on one GPU and on two at once: what the host's PCIe and memory give two GPUs copying together,
  which bounds any library's ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time

import numpy as np
from bench_common import write_json

COPIES = 10  # peer copies per bandwidth sample
PEER_TARGET = 0.97
PIPELINE_TARGET = 1.1


def cuda_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver: no CUDA device
        return 0


def abba(a, b, rounds: int) -> tuple[list[float], list[float]]:
    """Samples of ``a()`` and ``b()`` (each returns seconds), in the order a b b a, ``rounds`` times."""
    got_a, got_b = [], []
    for _ in range(rounds):
        got_a.append(a())
        got_b.append(b())
        got_b.append(b())
        got_a.append(a())
    return got_a, got_b


def peer_copies(gw, cp, nbytes: int, rounds: int, src_index: int, dst_index: int) -> dict:
    """Bandwidth of ``dst.copy_from(src)`` against raw ``cudaMemcpyPeerAsync`` (GB/s, medians of ABBA samples)."""
    rt = cp.cuda.runtime
    src_dev, dst_dev = gw.Device(src_index, backend="cuda"), gw.Device(dst_index, backend="cuda")
    n = nbytes // 4
    data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    ours_stream = dst_dev.create_stream("bench-peer")
    with src_dev.alloc(n) as x, dst_dev.alloc(n) as y:
        x.copy_from_host(data)
        route = dst_dev.backend_device.peer_route(src_dev.backend_device)
        with cp.cuda.Device(src_index):
            raw_src = cp.asarray(data)
        with cp.cuda.Device(dst_index):
            raw_dst = cp.empty(n, cp.float32)
            raw_stream = cp.cuda.Stream(non_blocking=True)
            if route.possible:
                try:
                    rt.deviceEnablePeerAccess(src_index)  # as ours did (already enabled: the error says so)
                except rt.CUDARuntimeError:
                    pass

        def ours() -> float:
            t0 = time.perf_counter()
            for _ in range(COPIES):
                y.copy_from(x, stream=ours_stream)
            ours_stream.synchronize()
            return time.perf_counter() - t0

        def raw() -> float:
            with cp.cuda.Device(dst_index):
                t0 = time.perf_counter()
                for _ in range(COPIES):
                    rt.memcpyPeerAsync(raw_dst.data.ptr, dst_index, raw_src.data.ptr, src_index, nbytes, raw_stream.ptr)
                raw_stream.synchronize()
                return time.perf_counter() - t0

        def cupy_copy() -> float:
            with cp.cuda.Device(dst_index):
                t0 = time.perf_counter()
                for _ in range(COPIES):
                    raw_dst.data.copy_from_device_async(raw_src.data, nbytes, raw_stream)
                raw_stream.synchronize()
                return time.perf_counter() - t0

        ours(), raw(), cupy_copy()  # warm-up
        ours_s, raw_s = abba(ours, raw, rounds)
        cupy_s = [cupy_copy() for _ in range(rounds)]
        correct = bool(np.array_equal(y.copy_to_host(), data)) and bool(cp.asnumpy(raw_dst).tobytes() == data.tobytes())
        with gw.trace() as t:
            for _ in range(COPIES):
                y.copy_from(x, stream=ours_stream)
            ours_stream.synchronize()
        cross = t.summary().cross_device
    ours_stream.close()

    def gbps(samples: list[float]) -> float:
        return COPIES * nbytes / statistics.median(samples) / 1e9

    result = {
        "source": f"cuda:{src_index}",
        "destination": f"cuda:{dst_index}",
        "bytes": nbytes,
        "route": "direct" if route.direct else "staged, direct path unused" if route.possible else "staged",
        "ours_gbps": gbps(ours_s),
        "raw_memcpy_peer_gbps": gbps(raw_s),
        "cupy_copy_from_device_gbps": gbps(cupy_s),
        "traced_span_gbps": cross.peer_copies[0].bandwidth_gbps if cross and cross.peer_copies else None,
        "samples": {"ours_s": ours_s, "raw_s": raw_s, "cupy_s": cupy_s},
        "correct": correct,
    }
    result["ratio"] = result["ours_gbps"] / result["raw_memcpy_peer_gbps"]
    result["target_met"] = result["ratio"] >= PEER_TARGET
    return result


def at_once(calls: list) -> float:
    """Run each callable on a thread of its own, released together by a barrier; the wall time until all are done
    (the first error any raised is raised here)."""
    barrier = threading.Barrier(len(calls) + 1)
    errors: list[BaseException] = []

    def runner(call) -> None:
        barrier.wait()
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(c,)) for c in calls]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return wall


def raw_pipeline(cp, index: int, inputs: list, outputs: list, depth: int = 2) -> float:
    """The Pipeline's schedule in plain CuPy on GPU ``index``: upload, y = 2x + 1, download, ``depth`` slots in
    flight on three streams ordered by events; returns the wall time."""
    kernel = cp.ElementwiseKernel("float32 x", "float32 y", "y = 2*x + 1", "raw_affine")
    nbytes = inputs[0].nbytes
    with cp.cuda.Device(index):
        up, comp, down = (cp.cuda.Stream(non_blocking=True) for _ in range(3))
        ins = [cp.empty(inputs[0].size, cp.float32) for _ in range(depth)]
        outs = [cp.empty(inputs[0].size, cp.float32) for _ in range(depth)]
        computed: list = [None] * depth
        downloaded: list = [None] * depth
        t0 = time.perf_counter()
        for i, (src, dst) in enumerate(zip(inputs, outputs)):
            s = i % depth
            if computed[s] is not None:
                up.wait_event(computed[s])
            cp.cuda.runtime.memcpyAsync(ins[s].data.ptr, src.ctypes.data, nbytes, 1, up.ptr)
            comp.wait_event(up.record())
            if downloaded[s] is not None:
                comp.wait_event(downloaded[s])
            with comp:
                kernel(ins[s], outs[s])
            computed[s] = comp.record()
            down.wait_event(computed[s])
            cp.cuda.runtime.memcpyAsync(dst.ctypes.data, outs[s].data.ptr, nbytes, 2, down.ptr)
            downloaded[s] = down.record()
        down.synchronize()
        return time.perf_counter() - t0


def raw_pipelines(cp, work: list, rounds: int) -> tuple[list[float], list[float]]:
    """Samples of one raw CuPy pipeline on GPU 0 and of two at once (one per GPU, two threads), ABBA-interleaved."""

    def one() -> float:
        return raw_pipeline(cp, 0, work[0][1], work[0][2])

    def two() -> float:
        return at_once([lambda i=i: raw_pipeline(cp, i, work[i][1], work[i][2]) for i in (0, 1)])

    one(), two()  # compile and warm
    return abba(one, two, rounds)


def pipelines(gw, batches: int, batch_elems: int, rounds: int) -> dict:
    """Wall time of two Pipeline.run on two GPUs from two threads against one on one GPU, all traced."""
    kernel = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="affine")
    devs = [gw.Device(i, backend="cuda") for i in (0, 1)]
    work = []
    for dev in devs:
        inputs = [dev.empty_pinned(batch_elems, "float32") for _ in range(batches)]
        outputs = [dev.empty_pinned(batch_elems, "float32") for _ in range(batches)]
        for i, a in enumerate(inputs):
            a[:] = i
        pipe = gw.Pipeline(dev, lambda x, y, s: kernel(x, y, stream=s), depth=2, label=f"pipe{dev.index}")
        pipe.run(inputs[:1], outputs[:1])  # warm-up: slots and the kernel, outside the timings
        work.append((pipe, inputs, outputs))
    summaries: list = []

    def one() -> float:
        pipe, inputs, outputs = work[0]
        with gw.trace():
            t0 = time.perf_counter()
            pipe.run(inputs, outputs)
            return time.perf_counter() - t0

    def two(traced: bool = True) -> float:
        with gw.trace() if traced else contextlib.nullcontext() as t:
            wall = at_once([lambda w=w: w[0].run(w[1], w[2]) for w in work])
        if traced:
            summaries.append(t)
        return wall

    def untraced_one() -> float:
        pipe, inputs, outputs = work[0]
        t0 = time.perf_counter()
        pipe.run(inputs, outputs)
        return time.perf_counter() - t0

    one(), two()  # warm-up: each trace's first op of a device aligns its clock
    summaries.clear()
    one_s, two_s = abba(one, two, rounds)
    untraced, untraced_two = abba(untraced_one, lambda: two(traced=False), rounds)
    import cupy as cp

    raw_one, raw_two = raw_pipelines(cp, work, rounds)
    correct = all(
        float(o[0]) == 2 * i + 1 and float(o[-1]) == 2 * i + 1 for _, _, outs in work for i, o in enumerate(outs)
    )
    cross = summaries[-1].summary().cross_device
    for pipe, _, _ in work:
        pipe.close()
    result = {
        "batches": batches,
        "batch_bytes": batch_elems * 4,
        "one_gpu_traced_s": statistics.median(one_s),
        "two_gpus_traced_s": statistics.median(two_s),
        "one_gpu_untraced_s": statistics.median(untraced),
        "two_gpus_untraced_s": statistics.median(untraced_two),
        "raw_cupy_one_gpu_s": statistics.median(raw_one),
        "raw_cupy_two_gpus_s": statistics.median(raw_two),
        "raw_cupy_ratio": statistics.median(raw_two) / statistics.median(raw_one),
        "samples": {
            "one_s": one_s,
            "two_s": two_s,
            "untraced_s": untraced,
            "untraced_two_s": untraced_two,
            "raw_one_s": raw_one,
            "raw_two_s": raw_two,
        },
        "cross_device": None if cross is None else cross.to_dict(),
        "correct": correct,
    }
    result["ratio"] = result["two_gpus_traced_s"] / result["one_gpu_traced_s"]
    result["target_met"] = result["ratio"] <= PIPELINE_TARGET
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that it runs, not figures to quote")
    args = parser.parse_args()
    count = cuda_count()
    if count < 2:
        results: dict = {"skipped": f"needs 2 CUDA devices, found {count}"}
        print(results["skipped"])
    else:
        import cupy as cp

        import gpuworkbench as gw

        sizes = [16 << 20] if args.quick else [64 << 20, 256 << 20]
        rounds = 3 if args.quick else 10
        results = {"devices": [gw.Device(i, backend="cuda").name for i in (0, 1)], "peer": []}
        for nbytes in sizes:
            for src, dst in ((0, 1), (1, 0)):
                results["peer"].append(peer_copies(gw, cp, nbytes, rounds, src, dst))
        batches, elems = (8, 1 << 20) if args.quick else (32, 8 << 20)
        results["pipelines"] = pipelines(gw, batches, elems, 3 if args.quick else 7)
        results["target_met"] = all(p["target_met"] for p in results["peer"]) and results["pipelines"]["target_met"]
        print(f"devices: {', '.join(results['devices'])}")
        print(f"peer copies, {COPIES} per sample, ABBA-interleaved, medians (target ours >= {PEER_TARGET} x raw):")
        for p in results["peer"]:
            span = "n/a" if p["traced_span_gbps"] is None else f"{p['traced_span_gbps']:.1f}"
            print(
                f"  {p['source']} -> {p['destination']} {p['bytes'] >> 20} MiB ({p['route']}): "
                f"ours {p['ours_gbps']:.1f} GB/s, raw memcpyPeerAsync {p['raw_memcpy_peer_gbps']:.1f}, "
                f"CuPy copy_from_device {p['cupy_copy_from_device_gbps']:.1f}, traced span {span}; "
                f"ratio {p['ratio']:.3f} ({'met' if p['target_met'] else 'NOT met'}); correct {p['correct']}"
            )
        pl = results["pipelines"]
        print(
            f"pipelines, {pl['batches']} batches of {pl['batch_bytes'] >> 20} MiB, traced, medians (target two <= "
            f"{PIPELINE_TARGET} x one): one GPU {pl['one_gpu_traced_s'] * 1e3:.1f} ms, two GPUs at once "
            f"{pl['two_gpus_traced_s'] * 1e3:.1f} ms, ratio {pl['ratio']:.3f} "
            f"({'met' if pl['target_met'] else 'NOT met'}); untraced: one GPU {pl['one_gpu_untraced_s'] * 1e3:.1f} ms, "
            f"two GPUs {pl['two_gpus_untraced_s'] * 1e3:.1f} ms; "
            f"correct {pl['correct']}"
        )
        print(
            f"  the same pipeline in plain CuPy: one GPU {pl['raw_cupy_one_gpu_s'] * 1e3:.1f} ms, two GPUs at once "
            f"{pl['raw_cupy_two_gpus_s'] * 1e3:.1f} ms, ratio {pl['raw_cupy_ratio']:.3f} (the host's bound)"
        )
        if pl["cross_device"]:
            cross = pl["cross_device"]
            codes = [a["code"] for a in cross["advice"]]
            print(
                f"  across devices (last two-GPU run): busy % {cross['busy_pct']}, slowest device "
                f"{cross['slowest_device']}, waited {cross['waited_ns']} ns, advice {codes}"
            )
    write_json(args.json, results, indent=2)


if __name__ == "__main__":
    main()
