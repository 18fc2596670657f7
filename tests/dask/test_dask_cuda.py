"""gw.dask on two GPUs: dask_cuda's ``LocalCUDACluster`` (one worker process per GPU) running CuPy, traced as one
timeline.

CuPy's kernels are another library's work, so the cluster trace is started with ``others=True``: every worker's
trace records them through CUPTI from its start (dask_cuda's workers load ``cuda.core`` as they start, so CUPTI
starts with the trace). Each task sleeps ``GUARD_S``, issues a fixed sequence of CuPy ops on 1 Mi floats, reads the
sum back and sleeps ``GUARD_S`` again; how many kernels (and copies) one such call launches is first counted on each
worker by a local ``gw.trace(others=True)``. The merged trace must then hold, per worker, exactly tasks × that count
of kernels on that worker's own GPU, each inside one of that worker's Dask task spans (within the GPU clock's
recorded uncertainty plus ``SLACK_NS``), after the task's first guard sleep and before its last, with its launch call
on the task's own host row. ``statistics().ranges`` must put each task's kernels under that task's row alone, and a
second trace with ``counters=True`` must hold each worker's GPU samples (NVML) under that worker's GPU device.

Needs dask_cuda, CuPy and two CUDA devices; skipped otherwise (``GPUWB_REQUIRE_DASK_CUDA=1`` turns the skips into
failures, for a run on a GPU machine that must not pass by skipping). ``GPUWB_TEST_OUT=DIR`` also writes the report
(``DIR/dask_cuda/report.json``) and the trace's export (per-worker ranks and the merged ``cluster.json``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.trace.spans import HOST_KINDS, KIND_CODE, KINDS

pytestmark = pytest.mark.gpu

REQUIRED = os.environ.get("GPUWB_REQUIRE_DASK_CUDA", "") == "1"
if not REQUIRED:
    pytest.importorskip("distributed")
    pytest.importorskip("dask_cuda")
    pytest.importorskip("cupy")


def _gpu_count() -> int:
    """CUDA devices this process may use, counted through NVML as dask_cuda does (no CUDA context made here)."""
    try:
        from dask_cuda.utils import get_n_gpus

        return int(get_n_gpus())
    except Exception:  # noqa: BLE001 - no driver, no NVML: no GPU
        return 0


def _missing() -> str:
    """Why this machine cannot run these tests ("" when it can)."""
    try:
        import cupy  # noqa: F401
        import dask_cuda  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as exc:
        return f"could not import {exc.name!r}: {exc}"
    n = _gpu_count()
    return "" if n >= 2 else f"needs 2 CUDA devices, found {n}"


MISSING = _missing()
if MISSING and not REQUIRED:
    pytest.skip(MISSING, allow_module_level=True)

TASKS_PER_WORKER = 4
N_ELEMS = 1 << 20
CUPY_OPS = 8  # the CuPy calls cupy_work issues (a reduction may launch more than one kernel: counted, not assumed)
GUARD_S = 0.002  # host-only sleep at both ends of a task: its kernels are ≥ 2 ms inside its span
SLACK_NS = 200_000  # on top of the GPU clock's recorded error: task times are time.time() floats, mapped by samples
DEVICE_KINDS = tuple(k for k in KINDS if k not in HOST_KINDS)


def cupy_work(seed: int) -> tuple[float, int]:
    """A fixed sequence of CuPy ops on the worker's GPU; (the sum read back, how many CuPy ops it issued)."""
    import cupy as cp

    x = cp.arange(N_ELEMS, dtype=cp.float32)  # 1
    x *= 0.5  # 2
    x += seed  # 3
    y = cp.sqrt(x)  # 4
    y = y * y  # 5
    y -= x  # 6
    return float(cp.abs(y).sum().get()), CUPY_OPS  # 7 (abs), 8 (sum), then a copy back


def cupy_task(seed: int) -> dict:
    """A Dask task: guard sleep, the CuPy work, guard sleep."""
    time.sleep(GUARD_S)
    value, ops = cupy_work(seed)
    time.sleep(GUARD_S)
    return {"value": value, "ops": ops, "thread": threading.get_ident()}


def measure_per_task(seed: int) -> list[dict[str, int]]:
    """On one worker, in its task thread: the device work of one ``cupy_work`` call, by kind, as a local
    ``gw.trace(others=True)`` sees it; twice, after a warm-up call (kernels compiled and loaded, memory pool filled)."""
    import cupy  # noqa: F401 - loaded before the trace starts: CUPTI starts with it

    cupy_work(seed)
    counts = []
    for _ in range(2):
        with gw.trace(others=True) as t:
            cupy_work(seed)
        table = t.table()
        counts.append(dict(Counter(KINDS[k] for k in table["kind"].tolist() if KINDS[k] in DEVICE_KINDS)))
    return counts


def gpu_identity() -> dict:
    """``client.run`` target: which physical GPU this worker's device 0 is."""
    import cupy as cp

    return {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "pci": cp.cuda.Device(0).pci_bus_id,
        "name": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "pid": os.getpid(),
    }


@pytest.fixture(scope="module")
def client():
    if MISSING:  # GPUWB_REQUIRE_DASK_CUDA=1: each test fails (the rest of the session still runs)
        pytest.fail(MISSING, pytrace=False)
    import cloudpickle
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import this test module
    cluster = LocalCUDACluster(n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=40)
    c = Client(cluster)
    c.wait_for_workers(2, timeout=120)
    yield c
    c.close()
    cluster.close()


@dataclass
class Run:
    t: gw.dask.ClusterTrace
    addresses: list[str]
    gpus: dict[str, dict]
    per_task: dict[str, dict[str, int]]  # address -> device work of one task, by kind (local trace)
    results: dict[str, list[dict]]
    keys: dict[str, list[str]]
    report: dict


def _worker(t, address: str) -> dict:
    return next(w for w in t.workers if w["address"] == address)


def _gpu_device(t, address: str) -> int:
    """The trace device number of the worker's GPU (its CUDA device 0, seen by CUPTI)."""
    mine = [d for d in _worker(t, address)["devices"] if t.devices[d].key == f"{address} cuda:0"]
    assert len(mine) == 1, (address, {d: t.devices[d].key for d in t.devices}, t.stats.warnings)
    return mine[0]


def _tasks_of(t, address: str) -> dict[str, np.ndarray]:
    rows = (t.tasks["worker"] == t.workers.index(_worker(t, address))) & (t.tasks["action"] == 0)
    return {c: v[rows] for c, v in t.tasks.items()}


def _kernels_of(table, dev: int) -> np.ndarray:
    return np.flatnonzero((table["device"] == dev) & (table["kind"] == KIND_CODE["kernel"]))


def _tolerance(t, dev: int) -> int:
    return max(int(t.devices[dev].error_ns), 0) + SLACK_NS


def _placement(t, table, address: str) -> dict:
    """Each kernel of the worker's GPU against the worker's task spans: the task containing it (index or -1), and per
    task the lead (first kernel start - task start) and trail (task end - last kernel end)."""
    dev = _gpu_device(t, address)
    tol = _tolerance(t, dev)
    tasks = _tasks_of(t, address)
    kernels = _kernels_of(table, dev)
    owner = []
    for i in kernels.tolist():
        inside = np.flatnonzero(
            (tasks["start_ns"] - tol <= table["start_ns"][i]) & (table["end_ns"][i] <= tasks["end_ns"] + tol)
        )
        owner.append(int(inside[0]) if inside.size == 1 else (-1 if inside.size == 0 else -2))
    owner_arr = np.array(owner, np.int64)
    lead, trail = [], []
    for j in range(len(tasks["key"])):
        mine = kernels[owner_arr == j]
        if mine.size:
            lead.append(int(table["start_ns"][mine].min() - tasks["start_ns"][j]))
            trail.append(int(tasks["end_ns"][j] - table["end_ns"][mine].max()))
    return {
        "dev": dev,
        "tol": tol,
        "tasks": tasks,
        "kernels": kernels,
        "owner": owner_arr,
        "lead": lead,
        "trail": trail,
    }


def _us(ns: float) -> float:
    return round(float(ns) / 1e3, 1)


def _make_report(t, table, addresses, gpus, per_task, results, elapsed_s) -> dict:
    workers = []
    windows = []
    for address in addresses:
        w = _worker(t, address)
        p = _placement(t, table, address)
        dev = p["dev"]
        on_dev = table["device"] == dev
        counts = dict(Counter(KINDS[k] for k in table["kind"][on_dev].tolist()))
        k = p["kernels"]
        if k.size:
            windows.append((int(table["start_ns"][k].min()), int(table["end_ns"][k].max())))
        workers.append(
            {
                "address": address,
                "pid": w["pid"],
                "gpu": gpus.get(address, {}),
                "trace_device": {"number": dev, "key": t.devices[dev].key, "name": t.devices[dev].name},
                "tasks": len(p["tasks"]["key"]),
                "cupy_ops_per_task": sorted({r["ops"] for r in results.get(address, [])}),
                "device_work_per_task": per_task.get(address, {}),
                "kernels_per_task": per_task.get(address, {}).get("kernel", 0),
                "kernels_in_trace": int(k.size),
                "kernels_expected": len(p["tasks"]["key"]) * per_task.get(address, {}).get("kernel", 0),
                "device_work_in_trace": counts,
                "clock_offset_us": _us(w["offset_ns"]),
                "clock_error_us": _us(w["error_ns"]),
                "clock_rtt_us": _us(w["rtt_ns"]),
                "clock_drift_us": _us(w["drift_ns"]),
                "gpu_clock_error_us": _us(t.devices[dev].error_ns),
                "tolerance_us": _us(p["tol"]),
                "lead_us_min_median": [_us(min(p["lead"])), _us(np.median(p["lead"]))] if p["lead"] else None,
                "trail_us_min_median": [_us(min(p["trail"])), _us(np.median(p["trail"]))] if p["trail"] else None,
                "kernels_outside_every_task": int((p["owner"] == -1).sum()),
                "kernels_in_several_tasks": int((p["owner"] == -2).sum()),
            }
        )
    overlap = 0
    if len(windows) == 2:
        overlap = max(0, min(windows[0][1], windows[1][1]) - max(windows[0][0], windows[1][0]))
    return {
        "spans": len(t),
        "gather_ms": round(t.gather_s * 1e3, 1),
        "traced_run_s": round(elapsed_s, 3),
        "guard_us": _us(GUARD_S * 1e9),
        "gpu_windows_overlap_ms": round(overlap / 1e6, 3),
        "warnings": list(t.stats.warnings),
        "workers": workers,
    }


def _print_report(report: dict) -> None:
    lines = [
        f"\n=== gw.dask + dask_cuda: {len(report['workers'])} workers, {report['spans']} spans in one trace, "
        f"gathered in {report['gather_ms']} ms; both GPUs' kernel windows overlap {report['gpu_windows_overlap_ms']} ms"
    ]
    for w in report["workers"]:
        g = w["gpu"]
        lines += [
            f"worker {w['address']} (pid {w['pid']}): GPU {g.get('name')} PCI {g.get('pci')} "
            f"CUDA_VISIBLE_DEVICES={g.get('visible')} -> trace device {w['trace_device']['number']} "
            f"'{w['trace_device']['key']}'",
            f"  tasks {w['tasks']}; per task (local gw.trace(others=True)): {w['device_work_per_task']} from "
            f"{w['cupy_ops_per_task']} CuPy ops; kernels in merged trace {w['kernels_in_trace']} "
            f"(expected {w['kernels_expected']}); device work {w['device_work_in_trace']}",
            f"  clock offset {w['clock_offset_us']} us ± {w['clock_error_us']} us (rtt {w['clock_rtt_us']} us, "
            f"drift {w['clock_drift_us']} us); GPU clock error {w['gpu_clock_error_us']} us; "
            f"tolerance {w['tolerance_us']} us",
            f"  first kernel after task start (min, median) {w['lead_us_min_median']} us; task end after last "
            f"kernel {w['trail_us_min_median']} us (guard sleeps {report['guard_us']} us); outside every task "
            f"{w['kernels_outside_every_task']}, in several {w['kernels_in_several_tasks']}",
        ]
    lines.append(f"warnings: {report['warnings']}")
    print("\n".join(lines))


@pytest.fixture(scope="module")
def run(client) -> Run:
    addresses = sorted(client.scheduler_info()["workers"])
    assert len(addresses) == 2, addresses
    gpus = client.run(gpu_identity)
    pinned = {"allow_other_workers": False, "pure": False}
    measured = client.gather(
        {a: client.submit(measure_per_task, 1, workers=[a], **pinned) for a in addresses}, errors="raise"
    )
    per_task = {}
    for address, (first, second) in measured.items():
        assert first == second, f"{address}: one cupy_work call's device work varies: {first} then {second}"
        assert first.get("kernel", 0) >= CUPY_OPS, f"{address}: {first}"
        per_task[address] = first
    began = time.perf_counter()
    with gw.dask.trace(client, others=True) as t:
        futures = {
            a: [client.submit(cupy_task, 10 * i + j, workers=[a], **pinned) for j in range(TASKS_PER_WORKER)]
            for i, a in enumerate(addresses)
        }
        results = client.gather(futures)
    elapsed = time.perf_counter() - began
    keys = {a: [str(f.key) for f in fs] for a, fs in futures.items()}
    table = t.table()
    try:
        report = _make_report(t, table, addresses, gpus, per_task, results, elapsed)
        _print_report(report)
    except AssertionError as exc:  # no GPU device for a worker: the tests say so; the report says what there was
        report = {
            "error": repr(exc),
            "spans": len(t),
            "devices": {n: [c.key, c.name, c.source] for n, c in t.devices.items()},
            "warnings": list(t.stats.warnings),
        }
        print(f"\n=== no full report: {report}")
    out = os.environ.get("GPUWB_TEST_OUT")
    if out:
        folder = Path(out) / "dask_cuda"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.json").write_text(json.dumps(report, indent=1, default=str))
        t.export(folder)
    return Run(t, addresses, gpus, per_task, results, keys, report)


def test_one_trace_holds_both_gpus(run):
    """One merged trace: each worker's GPU is a device of its own, the two are different physical GPUs, and both
    carry kernels; every kernel lies inside the client's trace window."""
    t = run.t
    assert sorted(w["address"] for w in t.workers) == run.addresses
    assert not any(w["lost"] for w in t.workers)
    assert len({g["pci"] for g in run.gpus.values()}) == 2, run.gpus
    table = t.table()
    devices = [_gpu_device(t, a) for a in run.addresses]
    assert len(set(devices)) == 2
    kernel_devices = set(table["device"][table["kind"] == KIND_CODE["kernel"]].tolist())
    assert kernel_devices == set(devices), (kernel_devices, devices)
    for address, dev in zip(run.addresses, devices):
        assert run.gpus[address]["name"] in t.devices[dev].name
        k = _kernels_of(table, dev)
        tol = _tolerance(t, dev) + max(_worker(t, address)["error_ns"], 0)
        assert table["start_ns"][k].min() >= t.started_ns - tol and table["end_ns"][k].max() <= t.stopped_ns + tol
    troubles = ("not recorded", "CUPTI not used", "no CUPTI record", "harvester error", "left the cluster", "failed")
    bad = [w for w in t.stats.warnings if any(s in w for s in troubles)]
    assert not bad, t.stats.warnings
    assert t.stats.lost == 0 and t.stats.dropped == 0


def test_kernel_counts_match_each_workers_own_count(run):
    """Per worker: its kernels in the merged trace = its tasks × the kernels one task launched by the worker's own
    local count; the same for every other kind of device work (copies back)."""
    t = run.t
    table = t.table()
    for address in run.addresses:
        tasks = _tasks_of(t, address)
        assert sorted(tasks["key"].tolist()) == sorted(run.keys[address])
        assert len(tasks["key"]) == TASKS_PER_WORKER
        assert all(r["ops"] == CUPY_OPS for r in run.results[address])
        dev = _gpu_device(t, address)
        kernels = _kernels_of(table, dev)
        assert kernels.size == TASKS_PER_WORKER * run.per_task[address]["kernel"], run.report
        device_work = Counter(
            KINDS[k] for k in table["kind"][table["device"] == dev].tolist() if KINDS[k] in DEVICE_KINDS
        )
        assert device_work == {kind: TASKS_PER_WORKER * n for kind, n in run.per_task[address].items()}


def test_each_kernel_lies_inside_its_task(run):
    """Every kernel of a worker's GPU lies inside exactly one of that worker's task spans (within the GPU clock's
    recorded error + SLACK_NS), after the task's first guard sleep and before its last; each task holds one task's
    worth of kernels."""
    t = run.t
    table = t.table()
    for address in run.addresses:
        p = _placement(t, table, address)
        assert (p["owner"] >= 0).all(), run.report
        per_task = np.bincount(p["owner"], minlength=len(p["tasks"]["key"]))
        assert per_task.tolist() == [run.per_task[address]["kernel"]] * len(p["tasks"]["key"])
        guard = int(GUARD_S * 1e9)
        assert min(p["lead"]) >= guard - p["tol"], run.report
        assert min(p["trail"]) >= guard - p["tol"], run.report


def test_launch_calls_sit_on_the_task_rows(run):
    """Each kernel is linked (``corr``) to its launch call, an ``api`` span on the worker's host rows: on the same row
    (the worker's task thread) as the task that contains the kernel, and inside that task on the host clock."""
    t = run.t
    table = t.table()
    api = table["kind"] == KIND_CODE["api"]
    for address in run.addresses:
        p = _placement(t, table, address)
        host = _worker(t, address)["host_device"]
        calls = np.flatnonzero(api & (table["device"] == host))
        by_corr = {int(table["corr"][i]): i for i in calls.tolist()}
        for kernel, task in zip(p["kernels"].tolist(), p["owner"].tolist()):
            assert task >= 0, run.report
            corr = int(table["corr"][kernel])
            assert corr >= 0 and corr in by_corr, (address, table["name"][kernel])
            call = by_corr[corr]
            assert table["stream"][call] == p["tasks"]["stream"][task]
            assert table["enqueue_ns"][kernel] == table["start_ns"][call]
            assert p["tasks"]["start_ns"][task] - SLACK_NS <= table["start_ns"][call] <= p["tasks"]["end_ns"][task]


def test_each_task_range_holds_its_own_kernels(run):
    """``statistics().ranges``: each task's row is a range holding exactly one task's kernels, each placed by its
    launch call's thread (``corr``, matched within its own worker: two workers' CUPTI correlation ids overlap)."""
    t = run.t
    ranges = {r["name"]: r for r in t.statistics().ranges.to_dict("records")}
    for address in run.addresses:
        for key in run.keys[address]:
            assert ranges[key]["kernels"] == run.per_task[address]["kernel"], (key, ranges[key], run.report)
            assert ranges[key]["device_ns"] > 0


def test_counters_of_each_workers_gpu_and_host(client):
    """``counters=True``: each worker samples its GPU (NVML) and its host; the merged trace holds the GPU's samples
    under that worker's GPU device and the host's under its host device, inside the trace's window."""
    addresses = sorted(client.scheduler_info()["workers"])
    pinned = {"allow_other_workers": False, "pure": False}
    with gw.dask.trace(client, others=True, counters=True) as t:
        futures = [client.submit(cupy_task, i, workers=[a], **pinned) for i, a in enumerate(addresses) for _ in "ab"]
        client.gather(futures)
        time.sleep(0.5)  # a few samples at NVML's rate
    table = t.counters()
    sources = t.counter_sources
    print(f"\ncounter sources: {sources}")
    slack = max(w["error_ns"] for w in t.workers)
    assert table["time_ns"].min() >= t.started_ns - slack and table["time_ns"].max() <= t.stopped_ns + slack
    for address in addresses:
        gpu, host = _gpu_device(t, address), _worker(t, address)["host_device"]
        assert "GPU busy" in set(table["name"][table["device"] == gpu]), (address, sources, t.stats.warnings)
        assert "host CPU" in set(table["name"][table["device"] == host])
        assert f"{address} cuda:0" in sources and f"{address} host" in sources
    assert set(table["device"].tolist()) <= {d for w in t.workers for d in [w["host_device"], *w["devices"]]}
