"""gw.dask: a trace of a real two-process Dask cluster on the CPU backend, merged onto the client's clock.

One ``LocalCluster`` (2 worker processes, 1 thread each) serves the module. The traced run enqueues a known number of
gpuworkbench ops per task, so the merged span counts are exact; one worker reports its clock shifted by 5 ms (the
plugin's test hook) and the client must measure that shift back. The last test kills a worker mid-trace.
The analysis rules are tested on hand-made tables, without a cluster.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter

import numpy as np
import pytest
import support

import gpuworkbench as gw
from gpuworkbench.dask.summary import TASK_COLUMNS, advise_workers, summarize_workers
from gpuworkbench.trace.spans import KIND_CODE, KINDS, table_from_records

SHIFT_NS = 5_000_000
N = 2048


def gw_task(n: int, seed: int) -> float:
    """Enqueues exactly: 2 allocs, an h2d copy, a kernel, a d2h copy, 2 frees on the worker's CPU device."""
    dev = gw.Device("cpu")
    f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1")
    a = np.full(n, seed, np.float32)
    x, y = dev.alloc(n, "float32"), dev.alloc(n, "float32")
    x.copy_from_host(a)
    f(x, y)
    out = y.copy_to_host()
    x.free()
    y.free()
    return float(out.sum())


PER_GW_TASK = {"alloc": 2, "free": 2, "h2d": 1, "kernel": 1, "d2h": 1}


async def die() -> None:
    """Ends the worker's process at once (``client.run(..., wait=False)`` takes coroutine functions only)."""
    os._exit(1)


def numpy_task(seed: int) -> float:
    return float(np.sort(np.random.default_rng(seed).random(50_000))[-1])


@pytest.fixture(scope="module")
def client():
    yield from support.dask_client(__name__)


def _workers(client) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


def _run(client, addresses: list[str], gw_per_worker: int, numpy_per_worker: int) -> dict[str, list[str]]:
    """Submit tasks pinned to each worker; the keys each worker ran."""
    keys: dict[str, list[str]] = {}
    futures = []
    for i, address in enumerate(addresses):
        pinned = {"workers": [address], "allow_other_workers": False, "pure": False}
        mine = [client.submit(gw_task, N, 10 * i + j, **pinned) for j in range(gw_per_worker)]
        mine += [client.submit(numpy_task, 10 * i + j, **pinned) for j in range(numpy_per_worker)]
        futures += mine
        keys[address] = [str(f.key) for f in mine]
    client.gather(futures)
    return keys


@pytest.fixture(scope="module")
def traced(client):
    addresses = _workers(client)
    began = time.perf_counter()
    with gw.dask.trace(client, clock_shift_ns={addresses[1]: SHIFT_NS}) as t:
        keys = _run(client, addresses, gw_per_worker=3, numpy_per_worker=2)
    return t, addresses, keys, time.perf_counter() - began


def _worker(t, address: str) -> dict:
    return next(w for w in t.workers if w["address"] == address)


def test_merged_span_counts_are_exact(traced):
    t, addresses, _, _ = traced
    table = t.table()
    assert not t.stats.warnings, t.stats.warnings
    for address in addresses:
        w = _worker(t, address)
        assert len(w["devices"]) == 1
        dev = w["devices"][0]
        assert t.devices[dev].key == f"{address} cpu:0"
        counts = Counter(KINDS[k] for k in table["kind"][table["device"] == dev])
        assert counts == {kind: 3 * n for kind, n in PER_GW_TASK.items()}
    assert len(t) == len(addresses) * (3 * sum(PER_GW_TASK.values()) + 5)  # + one task row per task


def test_task_rows_carry_the_keys(traced):
    t, addresses, keys, _ = traced
    table = t.table()
    for address in addresses:
        host = _worker(t, address)["host_device"]
        rows = (table["device"] == host) & (table["kind"] == KIND_CODE["range"])
        assert sorted(table["name"][rows]) == sorted(keys[address])
        assert (table["stream"][rows] <= -2).all()  # a host thread row of that worker
        assert sorted(t.tasks["key"][t.tasks["worker"] == t.workers.index(_worker(t, address))]) == sorted(
            keys[address]
        )
        labels = {t.stream_labels[(host, int(s))] for s in np.unique(table["stream"][rows])}
        assert all("Dask" in label for label in labels), labels
    assert set(t.tasks) == set(TASK_COLUMNS)
    assert (t.tasks["end_ns"] >= t.tasks["start_ns"]).all()


def test_injected_clock_offset_is_recovered(traced):
    """The shifted worker reports every time 5 ms late: the offset comes back within 100 µs, and its spans land on
    the client's clock (inside the trace's window) all the same."""
    t, addresses, _, _ = traced
    plain, shifted = _worker(t, addresses[0]), _worker(t, addresses[1])
    print(
        f"\noffsets: {plain['offset_ns']} ns ± {plain['error_ns']} ns, {shifted['offset_ns']} ns ± "
        f"{shifted['error_ns']} ns (injected {SHIFT_NS} ns)"
    )
    assert abs(shifted["offset_ns"] - SHIFT_NS) < 100_000
    assert abs(plain["offset_ns"]) < 100_000  # one host: CLOCK_MONOTONIC is shared
    assert 0 < shifted["error_ns"] < 5_000_000
    table = t.table()
    assert table["start_ns"].min() >= t.started_ns and table["end_ns"].max() <= t.stopped_ns
    # each task's device work lies inside its task row on the merged clock
    for address in addresses:
        w = _worker(t, address)
        tasks = t.tasks["worker"] == t.workers.index(w)
        dev = table["device"] == w["devices"][0]
        starts, ends = t.tasks["start_ns"][tasks], t.tasks["end_ns"][tasks]
        for s, e in zip(table["start_ns"][dev], table["end_ns"][dev]):
            assert ((starts <= s) & (e <= ends)).any()


def test_summary_per_worker(traced):
    t, addresses, _, _ = traced
    s = t.summary()
    assert set(s.workers) == set(addresses)
    for address in addresses:
        ws = s.workers[address]
        assert ws.tasks == 5
        assert ws.busy_ns + ws.idle_ns == s.window_ns
        assert 0 < ws.device_ns <= ws.busy_ns
    assert s.straggler in addresses and s.workers[s.straggler].waited_ns == 0
    assert "straggler" in str(s) and "gpuworkbench-workers" in s._repr_html_()
    assert sorted(s.devices.devices) == sorted(d for w in t.workers for d in w["devices"])


def test_export_per_worker_files(traced, tmp_path):
    t, addresses, _, _ = traced
    paths = t.export(tmp_path)
    assert len(paths["ranks"]) == len(addresses)
    for rank, path in enumerate(paths["ranks"]):
        text = path.read_text()
        assert f'"rank": {rank}' in text[: text.index("traceEvents")]  # HTA's rank regex, before the events
        back = gw.load_trace(path)
        mine = t.worker_trace(rank)
        assert len(back) == len(mine)
        assert Counter(back.table()["kind"].tolist()) == Counter(mine.table()["kind"].tolist())
    merged = gw.load_trace(paths["merged"])
    assert len(merged) == len(t)
    assert sorted(merged.table()["name"].tolist()) == sorted(t.table()["name"].tolist())


def test_hta_reads_the_ranks(traced, tmp_path):
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    t, addresses, _, _ = traced
    t.export(tmp_path)
    analysis = TraceAnalysis(trace_dir=str(tmp_path / "ranks"))
    assert sorted(analysis.t.traces) == list(range(len(addresses)))


def test_live_gathers_while_recording(client):
    addresses = _workers(client)
    with gw.dask.trace(client, live=True, interval_s=0.2) as t:
        _run(client, addresses, gw_per_worker=1, numpy_per_worker=0)
        deadline = time.monotonic() + 10
        while len(t) < 2 * sum(PER_GW_TASK.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen_live = len(t)
    assert seen_live >= 2 * sum(PER_GW_TASK.values())
    assert len(t) == 2 * (sum(PER_GW_TASK.values()) + 1)


def _others_state(name: str, dask_worker=None) -> dict:
    """``client.run`` target: whether this worker's trace of session ``name`` records other libraries' CUDA work, and
    whether a CUDA library was loaded in the worker (then CUPTI starts with the trace)."""
    from gpuworkbench.trace.recorder_cupti import cuda_in_process

    trace = getattr(dask_worker.plugins.get(name), "trace", None)
    return {"others": None if trace is None else trace.others, "cuda": cuda_in_process()}


def test_others_reaches_every_worker_trace(client):
    """``gw.dask.trace(client, others=True)`` makes each worker's trace a ``Trace(others=True)`` (what CuPy's kernels
    need, tests/dask/test_dask_cuda.py); left out, each worker's GPUWB_TRACE_OTHERS decides (on unless "0"). A worker
    with no CUDA library loaded when its trace started says that no other library's work was recorded, where others
    was asked for by name."""
    addresses = _workers(client)
    default = os.environ.get("GPUWB_TRACE_OTHERS", "1") != "0"
    with gw.dask.trace(client, others=True) as t:
        on = client.run(_others_state, t.plugin_name)
        _run(client, addresses, gw_per_worker=1, numpy_per_worker=0)
    with gw.dask.trace(client) as plain:
        unset = client.run(_others_state, plain.plugin_name)
    assert {a: s["others"] for a, s in on.items()} == dict.fromkeys(addresses, True)
    assert {a: s["others"] for a, s in unset.items()} == dict.fromkeys(addresses, default)
    table = t.table()
    for address in addresses:
        said = [w for w in t.stats.warnings if address in w and "no CUDA library" in w]
        assert bool(said) == (not on[address]["cuda"]), t.stats.warnings
        dev = _worker(t, address)["devices"][0]
        counts = Counter(KINDS[k] for k in table["kind"][table["device"] == dev])
        assert counts == PER_GW_TASK  # the workbench's own ops, as without others
    assert not [w for w in plain.stats.warnings if "others=True" in w]


def test_gw_live_follows_the_cluster(client):
    """``gw.live(client=...)``: the dashboard streams the cluster's spans while it runs, gathered at ≥ 2 Hz."""
    pytest.importorskip("jupyter_bokeh")
    addresses = _workers(client)
    dash = gw.live(client=client, rate_hz=10)
    try:
        began = time.monotonic()
        _run(client, addresses, gw_per_worker=1, numpy_per_worker=0)
        while dash.spans_streamed == 0 and time.monotonic() - began < 10:
            time.sleep(0.05)
        streamed_live = dash.spans_streamed
        time.sleep(max(0.0, 2.1 - (time.monotonic() - began)))  # 5 gatherings due at 2.5 Hz
        elapsed = time.monotonic() - began
    finally:
        dash.stop()
    assert streamed_live > 0 and not dash.errors
    live_gathers = len(dash.trace.gathers) - 1  # the last one is the stop's
    assert live_gathers / elapsed >= 2.0, (live_gathers, elapsed)
    assert len(dash.trace) == 2 * (sum(PER_GW_TASK.values()) + 1)


def test_import_does_not_load_dask():
    import subprocess

    code = (
        "import sys, gpuworkbench as gw; assert 'distributed' not in sys.modules; "
        "gw.dask.ClusterSummary; assert 'distributed' not in sys.modules; "  # the summary is NumPy alone
        "gw.dask.trace; assert 'distributed' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_worker_killed_mid_trace(client):
    """One worker dies (os._exit) mid-trace: the other's spans are intact, the dead one is named in the warnings, and
    the worker the nanny starts in its place joins the trace."""
    addresses = _workers(client)
    victim, survivor = addresses
    with gw.dask.trace(client) as t:
        _run(client, addresses, gw_per_worker=2, numpy_per_worker=0)
        client.run(die, workers=[victim], wait=False)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            now = _workers(client)
            if victim not in now and len(now) == 2:
                break
            time.sleep(0.1)
        newcomer = next(a for a in _workers(client) if a not in addresses)
        client.submit(gw_task, N, 1, workers=[newcomer], allow_other_workers=False, pure=False).result()
    table = t.table()
    assert any(victim in w and "left the cluster mid-trace" in w for w in t.stats.warnings), t.stats.warnings
    assert _worker(t, victim)["lost"]
    for address, tasks in ((survivor, 2), (newcomer, 1)):
        dev = _worker(t, address)["devices"][0]
        counts = Counter(KINDS[k] for k in table["kind"][table["device"] == dev])
        assert counts == {kind: tasks * n for kind, n in PER_GW_TASK.items()}


# --- the analysis rules, on hand-made tables --------------------------------------------------------------------


def _tasks(rows: list[tuple[int, str, int, int, int]]) -> dict[str, np.ndarray]:
    return {
        "worker": np.array([r[0] for r in rows], np.int32),
        "key": np.array([r[1] for r in rows], object),
        "action": np.array([r[2] for r in rows], np.int8),
        "start_ns": np.array([r[3] for r in rows], np.int64),
        "end_ns": np.array([r[4] for r in rows], np.int64),
        "stream": np.full(len(rows), -2, np.int32),
    }


MS = 1_000_000


def test_worker_imbalance_names_the_straggler():
    table = table_from_records(
        [{"kind": "kernel", "device": 1, "stream": 0, "start_ns": 0, "end_ns": 10 * MS}]
        + [{"kind": "kernel", "device": 3, "stream": 0, "start_ns": 0, "end_ns": 2 * MS}]
    )
    tasks = _tasks([(0, "a", 0, 0, 10 * MS), (1, "b", 0, 0, 2 * MS)])
    figures, window = summarize_workers(table, tasks, ["slow", "fast"], {0: [1], 1: [3]})
    assert window == (0, 10 * MS)
    assert figures["fast"].waited_ns == 8 * MS and figures["slow"].waited_ns == 0
    assert figures["fast"].busy_ns == 2 * MS and figures["fast"].idle_ns == 8 * MS
    advice = advise_workers(figures, window)
    assert [a.code for a in advice] == ["worker-imbalance"]
    assert "slow" in advice[0].message
    balanced, window = summarize_workers(
        table, _tasks([(0, "a", 0, 0, 10 * MS), (1, "b", 0, 0, 9 * MS)]), ["x", "y"], {0: [1], 1: [3]}
    )
    assert not [a for a in advise_workers(balanced, window) if a.code == "worker-imbalance"]


def test_gpu_idle_between_tasks_splits_transfers_and_scheduler():
    # worker 0: tasks at 0-2 and 6-8 ms, device work inside them, a transfer 2-4 ms, nothing 4-6 ms
    table = table_from_records(
        [
            {"kind": "kernel", "device": 1, "stream": 0, "start_ns": 0, "end_ns": 2 * MS},
            {"kind": "kernel", "device": 1, "stream": 0, "start_ns": 6 * MS, "end_ns": 8 * MS},
        ]
    )
    tasks = _tasks([(0, "a", 0, 0, 2 * MS), (0, "b", 1, 2 * MS, 4 * MS), (0, "b", 0, 6 * MS, 8 * MS)])
    figures, window = summarize_workers(table, tasks, ["w"], {0: [1]})
    w = figures["w"]
    assert (w.idle_transfer_ns, w.idle_scheduler_ns, w.transfer_ns, w.compute_ns) == (2 * MS, 2 * MS, 2 * MS, 4 * MS)
    advice = advise_workers(figures, window)
    assert [a.code for a in advice] == ["gpu-idle-between-tasks"]
    # no device work: nothing to say about devices
    plain, window = summarize_workers(table_from_records([]), tasks, ["w"], {0: []})
    assert not advise_workers(plain, window)
