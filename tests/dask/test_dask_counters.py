"""gw.dask with counters and host ranges: a real two-process Dask cluster on the CPU backend.

``gw.dask.trace(client, counters=True)`` samples counters in every worker; the merged trace's ``counters()`` holds
each worker's samples on the client's clock under that worker's devices (its host's under its host device). One
worker reports its clock shifted by 10 s (the plugin's test hook): its samples must land inside the trace's window
all the same. The tasks open ``gw.range``s while the other worker's are open too: ``statistics().ranges`` counts each
worker's ops under its own ranges only.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import support

import gpuworkbench as gw
from gpuworkbench.errors import InvalidArgument

SHIFT_NS = 10_000_000_000
N = 2048
HOST_COUNTERS = {"host CPU", "process CPU", "host memory used", "process RSS"}
TASKS = 2  # per worker


def ranged_task(n: int, seed: int, hold_s: float) -> float:
    """Inside a range "work" held ``hold_s`` before and after: an h2d copy, a kernel in a range "compute", a d2h."""
    dev = gw.Device("cpu")
    f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1")
    a = np.full(n, seed, np.float32)
    x, y = dev.alloc(n, "float32"), dev.alloc(n, "float32")
    with gw.range("work"):
        time.sleep(hold_s)  # the other worker's "work" is open meanwhile: its ops must not count here
        x.copy_from_host(a)
        with gw.range("compute"):
            f(x, y)
            dev.synchronize()
        out = y.copy_to_host()
        time.sleep(hold_s)
    x.free()
    y.free()
    return float(out.sum())


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("psutil")
    yield from support.dask_client(__name__)


def _run(client, addresses: list[str], hold_s: float = 0.25) -> None:
    futures = [
        client.submit(ranged_task, N, 10 * i + j, hold_s, workers=[a], allow_other_workers=False, pure=False)
        for i, a in enumerate(addresses)
        for j in range(TASKS)
    ]
    client.gather(futures)


@pytest.fixture(scope="module")
def traced(client):
    addresses = sorted(client.scheduler_info()["workers"])
    with gw.dask.trace(client, counters=True, clock_shift_ns={addresses[1]: SHIFT_NS}) as t:
        _run(client, addresses)
    return t, addresses


def _worker(t, address: str) -> dict:
    return next(w for w in t.workers if w["address"] == address)


def test_each_workers_host_counters_are_under_its_host_device(traced):
    t, addresses = traced
    table = t.counters()
    assert t.counting and not [w for w in t.stats.warnings if "counters" in w], t.stats.warnings
    hosts = {_worker(t, a)["host_device"] for a in addresses}
    devices = {d for a in addresses for d in _worker(t, a)["devices"]}
    assert set(table["device"].tolist()) == hosts  # CPU devices run on the host: their counters are the host's
    for address in addresses:
        mine = table["device"] == _worker(t, address)["host_device"]
        names = table["name"][mine]
        assert set(names) == HOST_COUNTERS
        assert all((names == name).sum() >= 2 for name in HOST_COUNTERS)  # a sample at the start and at the stop
        memory = mine & (table["unit"] == "bytes")
        assert (table["value"][memory] > 0).all()
        shares = table["value"][mine & (table["unit"] == "% of all cores")]
        finite = shares[np.isfinite(shares)]
        assert finite.size and ((finite >= 0) & (finite <= 100)).all()
    assert not devices & set(table["device"].tolist())


def test_samples_are_shifted_onto_the_clients_clock(traced):
    """The shifted worker's samples were taken 10 s "later" on its clock: measured back, they lie in the window."""
    t, addresses = traced
    shifted = _worker(t, addresses[1])
    assert abs(shifted["offset_ns"] - SHIFT_NS) < 1_000_000
    table = t.counters()
    slack = max(w["error_ns"] for w in t.workers)
    assert table["time_ns"].min() >= t.started_ns - slack
    assert table["time_ns"].max() <= t.stopped_ns + slack
    assert (np.diff(table["time_ns"]) >= 0).all()
    for address in addresses:
        host = _worker(t, address)["host_device"]
        times = table["time_ns"][table["device"] == host]
        tasks = t.table()["device"] == host
        assert times.min() <= t.table()["start_ns"][tasks].min()  # the first sample as the worker's trace started


def test_counter_sources_name_each_workers_sources(traced):
    t, addresses = traced
    sources = t.counter_sources
    for address in addresses:
        assert "psutil" in sources[f"{address} host"]
        assert "CPU backend" in sources[f"{address} cpu:0"]
    assert len(sources) == 2 * len(addresses)


def test_the_counter_tracks_and_the_export_tell_the_workers_apart(traced):
    t, addresses = traced
    figure = t.counters_plot()
    names = {r.name for r in figure.renderers}
    assert names == {f"counter:{a}: {c}" for a in addresses for c in HOST_COUNTERS}
    doc = t.to_chrome_trace()
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == int(np.isfinite(t.counters()["value"]).sum())
    pids = {e["pid"] for e in counters}
    assert pids == {_worker(t, a)["host_device"] for a in addresses}


def test_a_workers_own_trace_holds_its_counters_on_its_host(traced):
    t, addresses = traced
    merged = t.counters()
    for address in addresses:
        index = [w["address"] for w in t.workers].index(address)
        mine = t.worker_trace(index)
        table = mine.counters()
        assert set(table["device"].tolist()) == {-1}
        host = merged["device"] == _worker(t, address)["host_device"]
        assert table["value"].tolist() == pytest.approx(merged["value"][host].tolist(), nan_ok=True)
        assert set(mine.counter_sources) == {"host", "cpu:0"}


def test_host_ranges_count_each_workers_ops_only(traced):
    """Each worker's ops (of unknown thread: the workbench's own) are placed by time within its own process: the
    other worker's "work", open at the same time, does not count them."""
    t, addresses = traced
    stats = t.statistics()
    ranges = {r["name"]: r for r in stats.ranges.to_dict("records")}
    work, compute = ranges["work"], ranges["compute"]
    runs = len(addresses) * TASKS
    assert (work["count"], work["ops"], work["kernels"], work["copies"]) == (runs, 3 * runs, runs, 2 * runs)
    assert (compute["count"], compute["ops"], compute["kernels"]) == (runs, runs, runs)
    keys = [str(k) for k in t.tasks["key"]]
    assert all((ranges[k]["ops"], ranges[k]["kernels"]) == (3, 1) for k in keys)  # each task row holds its own
    assert work["device_ns"] == sum(stats.device_time_ns.values()) > 0  # every op is under a "work"


def test_without_counters_no_samples_and_a_bad_value_is_refused(client):
    addresses = sorted(client.scheduler_info()["workers"])
    with gw.dask.trace(client) as t:
        _run(client, addresses, hold_s=0.0)
    assert not t.counting and len(t.counters()["time_ns"]) == 0 and t.counter_sources == {}
    assert set(t.counters()) == {"time_ns", "device", "name", "unit", "value"}
    with pytest.raises(InvalidArgument, match="counters"):
        gw.dask.trace(client, counters="yes")


def test_a_live_trace_shows_counters_while_recording(client):
    addresses = sorted(client.scheduler_info()["workers"])
    with gw.dask.trace(client, live=True, interval_s=0.2, counters=True) as t:
        _run(client, addresses, hold_s=0.1)
        deadline = time.monotonic() + 10
        while len(t.counters()["time_ns"]) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen_live = len(t.counters()["time_ns"])
    assert seen_live > 0
    table = t.counters()
    assert len(table["time_ns"]) >= seen_live
    hosts = {w["host_device"] for w in t.workers}
    assert set(table["device"].tolist()) == hosts
    assert all(math.isfinite(v) for v in table["value"][table["unit"] == "bytes"])
