"""``gw.timeit``: device time per call from the trace's spans, charged to the samples they ran in; adaptive stopping;
the L2 flush outside the samples; graph replay; one unit per table; bad input refused with the trace left clean."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import BACKENDS

import gpuworkbench as gw
from gpuworkbench.trace import recorder
from gpuworkbench.trace.spans import table_from_records
from gpuworkbench.trace.timeit import flush_size, host_cache_bytes, per_sample
from gpuworkbench.trace.timeit_result import Distribution, median_interval, table_unit

N = 1 << 20
#: Quick runs: one warm-up call and a small budget (no assertion depends on how long anything took).
QUICK = {"warmup": 1, "budget_s": 0.2, "min_samples": 6, "max_samples": 40}
#: The tests that need one backend only run on the CPU's.
on_cpu = pytest.mark.parametrize("device", ["cpu"], indirect=True)


@pytest.fixture
def workload(request: pytest.FixtureRequest, device: gw.Device):
    """An elementwise kernel over 1M floats and a 4 MiB upload on ``device``'s default stream."""
    a, b = device.alloc(N), device.alloc(N)
    host = np.ones(N, np.float32)
    kernel = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")

    def statement() -> None:
        kernel(a, b)
        a.copy_from_host_async(host, device.default_stream)

    yield statement
    device.synchronize()
    a.free()
    b.free()


@pytest.mark.parametrize("device", BACKENDS, indirect=True)
def test_device_time_comes_from_the_kernel_and_the_copy(workload, device):
    result = gw.timeit(workload, **QUICK)
    assert 6 <= result.samples <= 40
    assert result.device_ns.shape == result.host_ns.shape == (result.samples,)
    assert result.device_time_ns > 0 and result.host_time_ns > 0
    kernel = result.kernels["scale_add"]
    assert kernel.kind == "kernel" and kernel.per_call == 1 and np.all(kernel.counts == 1)
    (copy,) = result.copies.values()
    assert copy.kind == "h2d" and copy.per_call == 1
    # a sample's device time is the union of its spans: at least each one, at most their sum
    assert np.all(result.device_ns >= kernel.per_sample_ns)
    assert np.all(result.device_ns <= kernel.per_sample_ns + copy.per_sample_ns)
    assert device.spec in result.devices[0]
    assert result.trace is not None and not result.trace.recording


@on_cpu
def test_text_names_the_kernel_and_writes_each_table_in_one_unit(workload, device):
    result = gw.timeit(workload, **QUICK)
    text = str(result)
    first, second = text.split("device work per call, by name")
    assert "device time" in first and "host time" in first
    assert "scale_add" in second and "h2d 4.0 MiB" in second
    # the tables only: the header may name the time budget ("stopped: the time budget (0.2 s) was spent")
    for table in (first.split("time per call", 1)[1], second.split("\ndevice time:")[0]):
        units = set(re.findall(r"\d (s|ms|µs|ns)\b", table))
        assert len(units) == 1, f"several units in one table: {units}\n{table}"
    assert str(result.samples) in first
    html = result._repr_html_()
    assert "<table" in html and "scale_add" in html


@on_cpu
def test_sampling_stops_at_the_budget_or_max_samples(workload, device):
    spent = gw.timeit(workload, warmup=0, budget_s=0.01, min_samples=3, precision=1e-9)
    assert spent.samples >= 3 and "time budget" in spent.stopped
    capped = gw.timeit(workload, warmup=0, budget_s=60, min_samples=2, max_samples=4, precision=1e-9)
    assert capped.samples == 4 and "max_samples" in capped.stopped
    loose = gw.timeit(workload, warmup=0, budget_s=60, min_samples=6, max_samples=10_000, precision=0.99)
    assert loose.samples < 10_000 and "95 % interval" in loose.stopped


@on_cpu
def test_flush_runs_outside_the_samples(workload, device):
    result = gw.timeit(workload, flush_l2=True, **QUICK)
    table = result.trace.table()
    memsets = [n for n in table["name"] if str(n).startswith("memset")]
    assert len(memsets) == result.samples  # one flush before each sample ...
    assert not any(op.kind == "memset" for op in result.copies.values())  # ... and none counted in a sample
    assert set(result.kernels) == {"scale_add"}
    assert any("L2 flushed" in note for note in result.notes)
    assert device.held_bytes == 2 * 4 * N  # the flush buffer is freed again


def test_flush_size_is_twice_the_host_cache_on_the_cpu(cpu, tmp_path):
    nbytes, why = flush_size(cpu)
    cache = host_cache_bytes()
    assert nbytes == (2 * cache if cache else 64 << 20)
    assert "cache" in why or "not known" in why
    for index, size in (("index0", "32K"), ("index3", "36608K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert host_cache_bytes(str(tmp_path)) == 36608 << 10


@on_cpu
def test_graph_replays_a_recorded_capture_on_the_cpu(workload, device):
    result = gw.timeit(workload, graph=True, **QUICK)
    assert set(result.kernels) == {"timeit/scale_add"}
    assert result.kernels["timeit/scale_add"].per_call == 1
    assert any("no native graphs" in note for note in result.notes)


def test_graph_refuses_what_it_cannot_capture(cpu):
    with pytest.raises(gw.InvalidArgument, match="enqueued none"):
        gw.timeit(lambda: None, graph=True, device=cpu, **QUICK)
    other = cpu.create_stream("elsewhere")
    buf = cpu.alloc(1024)
    try:
        with pytest.raises(gw.InvalidArgument, match="outside the capture"):
            gw.timeit(lambda: (buf.fill_bytes(1), buf.fill_bytes(2, other)), graph=True, **QUICK)
    finally:
        other.close()
        buf.free()
    assert recorder.active() == []


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((3,), {}, "calls a function"),
        ((print,), {"budget_s": 0}, "budget_s"),
        ((print,), {"budget_s": -1.0}, "budget_s"),
        ((print,), {"warmup": -1}, "warmup"),
        ((print,), {"min_samples": 0}, "min_samples"),
        ((print,), {"min_samples": 5, "max_samples": 4}, "max_samples"),
        ((print,), {"precision": 0}, "precision"),
        ((print,), {"flush_l2": "yes"}, "flush_l2"),
        ((print,), {"device": 42}, "device"),
    ],
)
def test_bad_input_is_named_and_leaves_no_trace(cpu, args, kwargs, message):
    with pytest.raises(gw.InvalidArgument, match=message):
        gw.timeit(*args, **kwargs)
    assert recorder.active() == []


def test_an_error_in_the_call_stops_the_trace_and_frees_the_flush(cpu):
    calls = []

    def fails() -> None:
        calls.append(1)
        if len(calls) > 2:
            raise KeyError("boom")

    with pytest.raises(KeyError):
        gw.timeit(fails, warmup=1, flush_l2=True, device=cpu)
    assert recorder.active() == [] and cpu.held_bytes == 0


def test_arguments_pass_through_to_the_call(cpu):
    seen = []
    result = gw.timeit(lambda x, *, y: seen.append((x, y)), 1, y=2, warmup=0, min_samples=2, max_samples=8)
    assert set(seen) == {(1, 2)} and len(seen) == result.samples
    assert result.device_time_ns == 0 and result.host_time_ns > 0
    assert any("no device work" in note for note in result.notes)


def test_spans_are_charged_to_the_window_holding_their_midpoint():
    records = [
        {"kind": "kernel", "stream": 0, "start_ns": 10, "end_ns": 50, "name": "k"},
        {"kind": "kernel", "stream": 1, "start_ns": 40, "end_ns": 80, "name": "k"},  # overlaps: union 10..80
        {"kind": "h2d", "stream": 0, "start_ns": 210, "end_ns": 260, "name": "up"},
        {"kind": "kernel", "stream": 0, "start_ns": 296, "end_ns": 306, "name": "k"},  # past the end, within tolerance
        {"kind": "kernel", "stream": 0, "start_ns": 140, "end_ns": 160, "name": "k"},  # in the gap: no sample's
        {"kind": "api", "stream": -2, "start_ns": 20, "end_ns": 30, "name": "cudaLaunchKernel"},  # host: never counted
        {"kind": "memset", "stream": 7, "start_ns": 220, "end_ns": 230, "name": "flush"},  # the excluded stream
    ]
    windows = np.array([[0, 100], [200, 300]], np.int64)
    device_ns, ops, outside, used = per_sample(table_from_records(records), windows, tolerance=10, exclude=(0, 7))
    assert device_ns.tolist() == [70, 60]
    assert ops["k"].per_sample_ns.tolist() == [80, 10] and ops["k"].counts.tolist() == [2, 1]
    assert ops["up"].kind == "h2d" and ops["up"].per_sample_ns.tolist() == [0, 50]
    assert "flush" not in ops and outside == 1 and used == {0}


def test_median_interval_from_order_statistics():
    x = np.arange(10.0)
    assert median_interval(x) == (1.0, 8.0)  # P(B <= 1) = 11/1024 <= 2.5 % < P(B <= 2) for B ~ binomial(10, 1/2)
    assert median_interval(np.arange(5.0)) == (0.0, 4.0)  # too few samples: the whole range
    exact = median_interval(np.arange(300.0))
    approx = median_interval(np.arange(301.0))
    assert abs(exact[0] - approx[0]) <= 1 and abs(exact[1] - approx[1]) <= 2
    tight = Distribution.of(np.linspace(990.0, 1010.0, 50))
    assert tight.within(0.02) and not tight.within(0.0001)
    assert not Distribution.of([1.0, 1.0, 1.0]).within(0.5)  # under 6 samples, never precise


def test_one_unit_per_table_follows_the_largest_median():
    small, large = Distribution.of([2_000.0] * 6), Distribution.of([3_500_000.0] * 6)
    assert table_unit([small, large])[:2] == ("ms", 1e6)
    assert table_unit([small])[:2] == ("µs", 1e3)
    assert table_unit([Distribution.of([0.0] * 6)])[0] == "ns"


def test_the_benchmark_explains_itself_without_a_gpu():
    """``benchmarks/bench_timeit.py --help`` needs no GPU (the GPU parts run on the GPU machine)."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_timeit.py"
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "cupyx.profiler.benchmark" in done.stdout and "--json" in done.stdout and "--rounds" in done.stdout
