"""Counter tracks (``gw.trace(counters=True)``): the host's CPU and memory sampled beside the spans on the CPU backend,
what OpenCL (PoCL), a CUDA device without nvidia-ml-py or NVML and devices without a source say, a failing source,
the sampler's thread, Chrome "C" events and ``%%gpu --counters``. CUDA's own counters: test_cuda_counters.py."""

from __future__ import annotations

import json
import math
import sys
import threading
import time

import numpy as np
import psutil
import pytest

import gpuworkbench as gw
from gpuworkbench.trace import counter_sources
from gpuworkbench.trace.counter_offer import offer
from gpuworkbench.trace.counter_sources import CPU_UNIT, HOST, HOST_RATE_HZ, Counter
from gpuworkbench.trace.counters import COLUMNS, Sampler
from gpuworkbench.trace.export import HOST_PID

HOST_COUNTERS = {c.name: c.unit for c in counter_sources.HostSource.counters}
SAMPLED_S = 0.35


def counter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpuworkbench-counters")]


def work(dev: gw.Device, n: int = 8) -> None:
    """A short CPU workload: allocations and copies, then a pause the sampler samples through."""
    a = dev.alloc(1 << 16, "float32")
    h = np.ones(1 << 16, np.float32)
    for _ in range(n):
        a.copy_from_host(h)
    time.sleep(SAMPLED_S)


@pytest.fixture(scope="module")
def sampled():
    """One CPU-backend trace with counters over a short workload (shared: it sleeps SAMPLED_S)."""
    dev = gw.Device("cpu")
    with gw.trace(counters=True) as t:
        work(dev)
    return t


def test_cpu_trace_samples_each_host_counter_with_plausible_values(sampled):
    c = sampled.counters()
    assert list(c) == list(COLUMNS)
    assert set(c["device"].tolist()) == {HOST}
    assert {(n, u) for n, u in zip(c["name"], c["unit"])} == set(HOST_COUNTERS.items())
    for name, unit in HOST_COUNTERS.items():
        values = c["value"][c["name"] == name]
        known = values[np.isfinite(values)]
        assert known.size >= 1, name
        if unit == CPU_UNIT:
            assert ((known >= 0) & (known <= 100)).all(), (name, known)
        else:
            assert (known > 0).all(), (name, known)
    rss = c["value"][c["name"] == "process RSS"]
    used = c["value"][c["name"] == "host memory used"]
    total = psutil.virtual_memory().total
    assert rss.min() > 1 << 20 and used.max() < total  # bytes (not kB or pages) of this host


def test_samples_lie_inside_the_trace_at_about_the_stated_rate(sampled):
    c = sampled.counters()
    assert (c["time_ns"] >= sampled.started_ns).all() and (c["time_ns"] <= sampled.stopped_ns).all()
    assert c["time_ns"].max() == sampled.stopped_ns  # the last sample, taken as it stopped
    duration_s = (sampled.stopped_ns - sampled.started_ns) / 1e9
    assert duration_s >= SAMPLED_S
    for name in HOST_COUNTERS:
        times = c["time_ns"][c["name"] == name]
        assert np.all(np.diff(times) > 0), name  # one sample of each counter at a time, in order
        # never faster than the rate (+ the first at the start and the last at the stop)
        assert 3 <= times.size <= duration_s * HOST_RATE_HZ + 2, (name, times.size, duration_s)
    first = c["value"][(c["unit"] == CPU_UNIT) & (c["time_ns"] == c["time_ns"].min())]
    assert first.size == 2 and np.isnan(first).all()  # a share needs an interval: the first sample has none
    assert sampled.counter_sources["host"] == f"psutil, {HOST_RATE_HZ:g} Hz"
    assert "host" in sampled.counter_sources["cpu:0"]
    assert not [w for w in sampled.stats.warnings if w.startswith("counters")]


def test_a_reader_with_a_cursor_gets_each_sample_once(sampled):
    whole = sampled.counters()
    head = whole["time_ns"].size // 3
    rest = sampled.counters(since=head)
    assert rest["time_ns"].size == whole["time_ns"].size - head
    for column in whole:
        assert np.array_equal(rest[column], whole[column][head:], equal_nan=column == "value"), column
    assert sampled.counters(since=whole["time_ns"].size)["time_ns"].size == 0


def test_the_sampler_ends_with_the_trace(sampled):
    sampled.counters()  # a stopped trace's reader waits for its last sample
    assert f"gpuworkbench-counters-{sampled.id}" not in counter_threads()
    dev = gw.Device("cpu")
    with gw.trace(counters=True) as t:
        dev.alloc(1024, "float32").copy_from_host(np.ones(1024, np.float32))
        deadline = time.monotonic() + 5
        while f"gpuworkbench-counters-{t.id}" not in counter_threads() and time.monotonic() < deadline:
            time.sleep(0.001)  # a pooled thread takes the sampler's name as it picks the loop up
        assert f"gpuworkbench-counters-{t.id}" in counter_threads()
        while not len(t.counters()["name"]) and time.monotonic() < deadline:
            time.sleep(0.001)  # its first samples: a trace stopped before them has its last ones only
    deadline = time.monotonic() + 5
    while f"gpuworkbench-counters-{t.id}" in counter_threads() and time.monotonic() < deadline:
        time.sleep(0.01)  # nobody reads it: the thread ends by itself
    assert f"gpuworkbench-counters-{t.id}" not in counter_threads()
    c = t.counters()  # however short the trace (a loaded host may stretch it past a period), it has a first and a
    names = c["name"].tolist()  # last sample of each counter
    assert set(names) == set(HOST_COUNTERS) and all(names.count(n) >= 2 for n in HOST_COUNTERS), names


def test_without_counters_nothing_is_sampled_and_no_thread_starts():
    dev = gw.Device("cpu")
    before = counter_threads()
    with gw.trace() as t:
        dev.alloc(1024, "float32").copy_from_host(np.ones(1024, np.float32))
        during = counter_threads()
    assert during == before
    c = t.counters()
    assert list(c) == list(COLUMNS) and all(v.size == 0 for v in c.values())
    assert t.counter_sources == {}
    built = gw.Trace.from_records([{"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 5}])
    assert built.counters()["name"].size == 0


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_counters_takes_only_a_bool(bad):
    with pytest.raises(gw.InvalidArgument, match=f"counters must be True or False, not {bad!r}"):
        gw.trace(counters=bad)
    with pytest.raises(gw.InvalidArgument, match="counters"):
        gw.Trace(counters=bad)


class Failing:
    """A host source whose second sample raises."""

    device = HOST
    counters = (Counter("ticks", "count"),)
    rate_hz = 50.0

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def sample(self) -> list[float]:
        self.calls += 1
        if self.calls >= 2:
            raise OSError("sensor gone")
        return [float(self.calls)]

    def describe(self) -> str:
        return "a test source, 50 Hz"

    def close(self) -> None:
        self.closed = True


def test_a_source_that_raises_gives_one_warning_and_the_spans_stay(monkeypatch):
    source = Failing()
    monkeypatch.setattr(counter_sources, "host_source", lambda: source)
    dev = gw.Device("cpu")
    with gw.trace(counters=True) as t:
        a = dev.alloc(1 << 12, "float32")
        for _ in range(5):
            a.copy_from_host(np.ones(1 << 12, np.float32))
        time.sleep(0.1)  # 5 periods: the source fails at its second sample and is never asked again
    c = t.counters()
    failed = [w for w in t.stats.warnings if "failed" in w]
    assert failed == ["counters: host (a test source, 50 Hz) failed: OSError('sensor gone'); its samples end"]
    assert source.calls == 2 and source.closed
    assert c["value"].tolist() == [1.0] and c["name"].tolist() == ["ticks"]
    kinds = [s.kind for s in t.spans]
    assert kinds.count("h2d") == 5 and kinds.count("alloc") == 1


class Miscounting(Failing):
    """A source that returns two values for its one counter."""

    def sample(self) -> list[float]:
        self.calls += 1
        return [1.0, 2.0]


def test_a_source_that_returns_the_wrong_number_of_values_is_dropped(monkeypatch):
    monkeypatch.setattr(counter_sources, "host_source", Miscounting)
    with gw.trace(counters=True) as t:
        gw.Device("cpu").alloc(1024, "float32")
    assert t.counters()["value"].size == 0
    assert [w for w in t.stats.warnings if w.startswith("counters")] == [
        "counters: host (a test source, 50 Hz) failed: ValueError('2 values for 1 counters'); its samples end"
    ]


def test_pocl_says_it_offers_none_and_the_host_is_sampled():
    opencl = [d for d in gw.devices() if d.backend == "opencl"]
    if not opencl:
        pytest.skip("no OpenCL device (pip install pyopencl[pocl])")
    dev = gw.Device("opencl:0")
    with gw.trace(counters=True) as t:
        dev.alloc(1024, "float32").copy_from_host(np.ones(1024, np.float32))
    c = t.counters()
    notes = [w for w in t.stats.warnings if w.startswith("counters")]
    assert notes == [
        "counters: opencl:0 (PoCL) offers none; the host's CPU and memory are sampled instead"
        " (this device runs on them)"
    ]
    assert t.counter_sources["opencl:0"].startswith("none (PyOpenCL exposes no utilization or memory counter)")
    assert set(c["device"].tolist()) == {HOST} and set(c["name"].tolist()) == set(HOST_COUNTERS)


def test_what_other_devices_offer():
    host = "psutil, 10 Hz"
    rocm = offer(0, "rocm:0", "AMD Instinct MI300X", host)
    assert rocm.source is None and rocm.says == "none: no source for this device in this build"
    assert rocm.note == "counters: no source for rocm:0 in this build; the host's CPU and memory are sampled instead"
    gpu = offer(1, "webgpu:0", "AMD Radeon Pro W7900", host)
    assert gpu.note == (
        "counters: webgpu:0 (AMD Radeon Pro W7900) offers none; the host's CPU and memory are sampled instead"
    )
    assert "runs on the host" not in gpu.says
    lavapipe = offer(1, "webgpu:0", "llvmpipe (LLVM 15.0.6, 256 bits) (CPU) via Vulkan", host)
    assert lavapipe.note.endswith("(this device runs on them)")
    cpu = offer(2, "cpu:0", "Intel Xeon", host)
    assert cpu.note == "" and host in cpu.says


def test_a_cuda_device_without_nvidia_ml_py_says_so_and_the_host_is_still_sampled(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as where nvidia-ml-py is not installed
    cuda = offer(0, "cuda:0", "NVIDIA H100 80GB HBM3", "psutil, 10 Hz")
    assert cuda.source is None
    assert cuda.says == "none: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    assert cuda.note == (
        "counters: cuda:0 (NVIDIA H100 80GB HBM3) has none: nvidia-ml-py is not installed (pip install nvidia-ml-py);"
        " the host's CPU and memory are sampled instead"
    )
    warnings: list[str] = []
    sampler = Sampler("gpuworkbench-counters-test", lambda: [(0, "cuda:0", "NVIDIA H100 80GB HBM3")], warnings.append)
    sampler.start()
    time.sleep(0.25)
    sampler.stop(time.perf_counter_ns())
    sampler.join()
    c = sampler.table()
    assert warnings == [cuda.note]
    assert sampler.sources == {"host": f"psutil, {HOST_RATE_HZ:g} Hz", "cuda:0": cuda.says}
    assert set(c["device"].tolist()) == {HOST} and set(c["name"].tolist()) == set(HOST_COUNTERS)
    assert (c["name"] == "host memory used").sum() >= 3


def test_a_cuda_device_where_nvml_does_not_start_says_why():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        why = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML starts here (a GPU machine): tests/trace/test_cuda_counters.py reads it")
    cuda = offer(3, "cuda:1", "NVIDIA H200", "psutil, 10 Hz")
    assert cuda.source is None and cuda.says == f"none: NVML did not start ({why})"
    assert cuda.note.startswith(f"counters: cuda:1 (NVIDIA H200) has none: NVML did not start ({why});")


def test_export_writes_counter_events(sampled, tmp_path):
    doc = sampled.to_chrome_trace(str(tmp_path / "t.json"))
    events = doc["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    c = sampled.counters()
    assert len(counters) == int(np.isfinite(c["value"]).sum())
    assert {(e["name"], *e["args"]) for e in counters} == set(HOST_COUNTERS.items())
    assert all(e["pid"] == HOST_PID and e["ts"] >= 0 and math.isfinite(*e["args"].values()) for e in counters)
    origin = doc["gpuworkbench"]["origin_host_ns"]
    first = min(counters, key=lambda e: e["ts"])
    assert round(origin / 1000 + first["ts"], 3) == round(int(c["time_ns"].min()) / 1000, 3)
    names = [e for e in events if e["ph"] == "M" and e["pid"] == HOST_PID and e["name"] == "process_name"]
    assert names and names[0]["args"]["name"] == "host"
    assert not [e for e in gw.Trace().to_chrome_trace()["traceEvents"] if e["ph"] == "C"]


def test_gpu_cell_magic_records_counters_with_the_option(shell):
    cell = "a = gw.Device('cpu').alloc(1024, 'float32')\na.copy_from_host(np.ones(1024, np.float32))\n"
    shell.user_ns.update(gw=gw, np=np)
    try:
        shell.run_cell_magic("gpu", "--counters --no-show -o with_counters", cell)
        shell.run_cell_magic("gpu", "--no-show -o without", cell)
        assert set(shell.user_ns["with_counters"].counters()["name"].tolist()) == set(HOST_COUNTERS)
        assert shell.user_ns["without"].counters()["name"].size == 0
    finally:
        for name in ("a", "with_counters", "without"):
            shell.user_ns.pop(name, None)


# ---------------------------------------------------------------------------------------------- load_trace


def finite_rows(c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keep = np.isfinite(c["value"])
    return {k: v[keep] for k, v in c.items()}


def test_an_export_with_counters_loads_back_the_same_counters(sampled, tmp_path):
    path = str(tmp_path / "t.json")
    sampled.to_chrome_trace(path)
    loaded = gw.load_trace(path)
    want, got = finite_rows(sampled.counters()), loaded.counters()
    assert list(got) == list(COLUMNS) and got["name"].size == want["name"].size > 0
    for column in ("device", "name", "unit", "value"):
        assert got[column].tolist() == want[column].tolist(), column
    assert np.abs(got["time_ns"] - want["time_ns"]).max() <= 1000
    assert got["device"].dtype == np.int16 and got["value"].dtype == np.float64
    assert loaded.counter_sources == {"host": f"read from {path}"}
    assert loaded.counting  # drawn with its counter tracks, as the recorded one


def test_an_exported_counter_of_a_device_comes_back_on_that_device(sampled, tmp_path):
    doc = sampled.to_chrome_trace()
    (dev, clock), *_ = sampled.devices.items()
    moved = next(e for e in doc["traceEvents"] if e["ph"] == "C")
    moved["pid"] = dev
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    loaded = gw.load_trace(path)
    c = loaded.counters()
    assert c["device"].tolist().count(dev) == 1 and (c["device"] == HOST).sum() == c["device"].size - 1
    assert c["name"][c["device"] == dev].tolist() == [moved["name"]]
    assert loaded.counter_sources == {"host": f"read from {path}", clock.key: f"read from {path}"}


def chrome_doc(*counters: dict) -> dict:
    """A Chrome trace from elsewhere: one kernel on GPU 0 (pid 0), host work in pid 4242, and ``counters``."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5, "args": {"device": 0}}
    call = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 1, "ts": 8, "dur": 1}
    return {"traceEvents": [kernel, call, *counters]}


def test_counter_events_from_elsewhere_load_as_a_track_per_series(tmp_path):
    doc = chrome_doc(
        {"ph": "C", "name": "queue", "pid": 4242, "tid": 1, "ts": 20.5, "args": {"reads": 3, "writes": 1.25}},
        {"ph": "C", "name": "queue", "pid": 4242, "ts": 12, "id": 7, "args": {"reads": "4"}},
        {"ph": "C", "name": "power", "pid": 0, "ts": 15, "args": {"W": 250}},
    )
    path = tmp_path / "chrome.json"
    path.write_text(json.dumps(doc))
    loaded = gw.load_trace(path)
    c = loaded.counters()
    assert c["name"].tolist() == ["queue id: 7 reads", "power W", "queue reads", "queue writes"]  # in time order
    assert c["time_ns"].tolist() == [12_000, 15_000, 20_500, 20_500]
    assert c["value"].tolist() == [4.0, 250.0, 3.0, 1.25]
    assert c["device"].tolist() == [HOST, 0, HOST, HOST]  # pid 0 is GPU 0's process; the others the host's
    assert c["unit"].tolist() == [""] * 4
    assert loaded.counter_sources == {"host": f"read from {path}", "cuda:0": f"read from {path}"}


def test_a_trace_without_counter_events_has_an_empty_counters_table(tmp_path):
    path = tmp_path / "chrome.json"
    path.write_text(json.dumps(chrome_doc()))
    loaded = gw.load_trace(path)
    c = loaded.counters()
    assert list(c) == list(COLUMNS) and all(v.size == 0 for v in c.values())
    assert loaded.counter_sources == {} and not loaded.counting


def test_counter_values_that_are_no_number_are_skipped(tmp_path):
    values = {"ok": 2, "word": "many", "flag": True, "list": [1], "none": None, "huge": "1e999"}
    path = tmp_path / "chrome.json"
    path.write_text(json.dumps(chrome_doc({"ph": "C", "name": "c", "pid": 4242, "ts": 1, "args": values})))
    c = gw.load_trace(path).counters()
    assert c["name"].tolist() == ["c ok"] and c["value"].tolist() == [2.0]
    path.write_text(json.dumps(chrome_doc({"ph": "C", "name": "c", "pid": 4242, "ts": 1, "args": {"v": math.nan}})))
    assert gw.load_trace(path).counters()["name"].size == 0  # NaN (Python's json writes it): no value


@pytest.mark.parametrize("ts", [math.nan, math.inf, None, "soon"])
def test_a_counter_event_without_a_finite_ts_is_refused(tmp_path, ts):
    event = {"ph": "C", "name": "bad counter", "pid": 4242, "args": {"v": 1}}
    if ts is not None:
        event["ts"] = ts
    path = tmp_path / "chrome.json"
    path.write_text(json.dumps(chrome_doc(event)))
    named = r"traceEvents\[2\] \('bad counter'\)" if ts != "soon" else "ts is not a number"
    with pytest.raises(gw.GpuError, match=f"cannot load trace .*{named}"):
        gw.load_trace(path)
