"""Does the NUMA node of pinned host memory bound two pipelines on two GPUs? GPU machine with 2 GPUs only.

``python benchmarks/probes/numa_pinned.py``: prints each GPU's PCI NUMA node and local CPUs, then times the plain
CuPy pipeline of ``bench_multi_gpu.py`` (one GPU, and two at once) with its pinned buffers allocated as usual and
allocated from a thread bound to the GPU's local CPUs (pinned pages then come from that node).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading

import cupy as cp
import cupyx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_multi_gpu import at_once, raw_pipeline  # noqa: E402

BATCHES, ELEMS, ROUNDS = 32, 8 << 20, 5


def local_cpus(index: int) -> tuple[int, set[int]]:
    bus = cp.cuda.runtime.deviceGetPCIBusId(index).lower()
    base = f"/sys/bus/pci/devices/{bus}"
    node = int(open(f"{base}/numa_node").read().strip()) if os.path.exists(f"{base}/numa_node") else -1
    cpus: set[int] = set()
    if os.path.exists(f"{base}/local_cpulist"):
        for part in open(f"{base}/local_cpulist").read().strip().split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return node, cpus


def buffers(index: int, cpus: set[int] | None) -> tuple[list, list]:
    out: list = []

    def alloc() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        with cp.cuda.Device(index):
            ins = [cupyx.empty_pinned((ELEMS,), np.float32) for _ in range(BATCHES)]
            outs = [cupyx.empty_pinned((ELEMS,), np.float32) for _ in range(BATCHES)]
            for a in ins + outs:
                a[:] = 1  # touch
        out.extend([ins, outs])

    th = threading.Thread(target=alloc)
    th.start()
    th.join()
    return out[0], out[1]


def two(work: list) -> float:
    return at_once([lambda i=i: raw_pipeline(cp, i, *work[i]) for i in (0, 1)])


def main() -> None:
    print(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout)
    print(subprocess.run(["lscpu"], capture_output=True, text=True).stdout[-900:])
    places = [local_cpus(i) for i in (0, 1)]
    for i, (node, cpus) in enumerate(places):
        print(f"cuda:{i} NUMA node {node}, {len(cpus)} local CPUs")
    for label, pick in (("default", lambda i: None), ("local", lambda i: places[i][1] or None)):
        work = [buffers(i, pick(i)) for i in (0, 1)]
        raw_pipeline(cp, 0, *work[0]), two(work)  # warm
        ones, twos = [], []
        for _ in range(ROUNDS):
            ones.append(raw_pipeline(cp, 0, *work[0]))
            twos.append(two(work))
        one, both = statistics.median(ones) * 1e3, statistics.median(twos) * 1e3
        print(f"{label} pinned: one GPU {one:.1f} ms, two GPUs {both:.1f} ms, ratio {both / one:.3f}")
        del work


if __name__ == "__main__":
    main()
