"""The panel's counter summary (notebook/counter_summary.py): means over the sampled time, peaks, one unit per counter,
the sources; on hand-made tables, on a real CPU trace with counters and (marked ``gpu``) on a CUDA trace's NVML ones."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from support import cuda_devices

import gpuworkbench as gw
from gpuworkbench.notebook.counter_summary import summarize, summarize_counter, summarize_trace
from gpuworkbench.trace import counter_sources
from gpuworkbench.trace.counter_sources import CPU_UNIT, HOST

MS = 1_000_000
NAN = float("nan")
GIB, MIB = 1 << 30, 1 << 20


def table(*rows: tuple[int, int, str, str, float]) -> dict[str, np.ndarray]:
    """A counters table (``Trace.counters()``'s columns) from (time_ns, device, name, unit, value) rows."""
    time_ns, device, name, unit, value = zip(*rows) if rows else ((), (), (), (), ())
    return {
        "time_ns": np.array(time_ns, np.int64),
        "device": np.array(device, np.int16),
        "name": np.array(name, dtype=object),
        "unit": np.array(unit, dtype=object),
        "value": np.array(value, np.float64),
    }


def test_a_share_is_averaged_over_the_time_each_sample_covers() -> None:
    # 100 % over the first 100 ms, 0 % over the next 300 ms: 25 % of the trace (the samples' plain mean is 50 %)
    row = summarize_counter("GPU busy", "%", np.array([0, 100 * MS, 400 * MS]), np.array([NAN, 100.0, 0.0]))
    assert row["mean"] == pytest.approx(25.0) and row["peak"] == 100.0 and row["samples"] == 2
    assert row["unit"] == "%" and row["text"] == "GPU busy 25 % (peak 100 %)"


def test_a_rate_is_averaged_over_time_and_shown_in_decimal_units() -> None:
    row = summarize_counter("PCIe RX", "bytes/s", np.array([0, 100 * MS, 200 * MS]), np.array([NAN, 3e9, 1e9]))
    assert row["unit"] == "GB/s" and row["mean"] == pytest.approx(2.0) and row["peak"] == pytest.approx(3.0)
    assert row["text"] == "PCIe RX 2.00 GB/s (peak 3.00 GB/s)"


def test_a_level_is_the_mean_of_its_samples_in_one_binary_unit_chosen_by_its_peak() -> None:
    # samples bunched early do not weigh less: bytes in use are read at an instant
    t = np.array([0, 1 * MS, 2 * MS, 500 * MS])
    row = summarize_counter("memory used", "bytes", t, np.array([512 * MIB, 512 * MIB, 512 * MIB, 2 * GIB]))
    assert row["unit"] == "GiB" and row["mean"] == pytest.approx(0.875) and row["peak"] == pytest.approx(2.0)
    assert row["text"] == "memory used 0.88 GiB (peak 2.00 GiB)"  # never "896 MiB (peak 2.00 GiB)"
    small = summarize_counter("process RSS", "bytes", t[:2], np.array([300 * MIB, 320 * MIB]))
    assert small["text"] == "process RSS 310 MiB (peak 320 MiB)"


@pytest.mark.parametrize(
    ("unit", "values", "text"),
    [
        (CPU_UNIT, [NAN, 10.0, 14.0], "host CPU 12 % of all cores (peak 14 %)"),
        (CPU_UNIT, [NAN, 0.2, 0.6], "host CPU 0.4 % of all cores (peak 0.6 %)"),
        ("MHz", [1980.0, 1980.0, 1755.0], "host CPU 1905 MHz (peak 1980 MHz)"),  # no exponent
        ("W", [96.5, 96.5, 96.5], "host CPU 96.5 W (peak 96.5 W)"),
        ("", [1.0, 2.0, 3.0], "host CPU 2.00 (peak 3.00)"),
        ("bytes", [0.0, 0.0, 0.0], "host CPU 0 B (peak 0 B)"),
    ],
)
def test_each_unit_reads_as_it_should(unit: str, values: list[float], text: str) -> None:
    t = np.array([0, 100 * MS, 200 * MS])
    assert summarize_counter("host CPU", unit, t, np.array(values))["text"] == text


def test_a_counter_without_any_value_says_so() -> None:
    row = summarize_counter("host CPU", CPU_UNIT, np.array([0, 5 * MS]), np.array([NAN, NAN]))
    assert row["mean"] is None and row["peak"] is None and row["samples"] == 0
    assert row["text"] == "host CPU n/a"
    once = summarize_counter("GPU busy", "%", np.array([7]), np.array([40.0]))  # no interval: the value stands
    assert once["mean"] == 40.0 and once["text"] == "GPU busy 40 % (peak 40 %)"


def test_rows_per_device_host_first_with_their_sources() -> None:
    counters = table(  # out of time order, as a merged table may be
        (200 * MS, 0, "GPU busy", "%", 50.0),
        (0, 0, "GPU busy", "%", NAN),
        (100 * MS, 0, "GPU busy", "%", 100.0),
        (0, HOST, "host memory used", "bytes", 4 * GIB),
        (0, 0, "memory used", "bytes", 1 * GIB),
        (200 * MS, 0, "memory used", "bytes", 3 * GIB),
        (0, HOST, "host CPU", CPU_UNIT, NAN),
        (200 * MS, HOST, "host CPU", CPU_UNIT, 30.0),
    )
    sources = {
        "host": "psutil, 10 Hz",
        "cuda:0": "NVML GPM, 10 Hz (CUPTI PM sampling: not in cupti-python 13.0.1)",
        "opencl:0": "none (PyOpenCL exposes no utilization or memory counter)",
    }
    rows = summarize(counters, sources, {0: "cuda:0", 1: "opencl:0"})
    json.dumps(rows, allow_nan=False)
    assert [r["device"] for r in rows] == ["host", "cuda:0", "opencl:0"]
    host, cuda, opencl = rows
    assert host["sampler"] == host["source"] == "psutil, 10 Hz"
    assert [c["text"] for c in host["counters"]] == [
        "host memory used 4.00 GiB (peak 4.00 GiB)",
        "host CPU 30 % of all cores (peak 30 %)",
    ]
    assert cuda["source"] == sources["cuda:0"] and cuda["sampler"] == "NVML GPM, 10 Hz"
    assert [c["text"] for c in cuda["counters"]] == [
        "GPU busy 75 % (peak 100 %)",
        "memory used 2.00 GiB (peak 3.00 GiB)",
    ]
    assert opencl == {"device": "opencl:0", "source": sources["opencl:0"], "sampler": "none", "counters": []}


def test_a_device_without_a_key_or_a_source_is_still_shown() -> None:
    rows = summarize(table((0, 3, "power", "W", 200.0)), {})
    assert rows == [
        {
            "device": "device 3",
            "source": "",
            "sampler": "",
            "counters": [
                {
                    "name": "power",
                    "unit": "W",
                    "mean": 200.0,
                    "peak": 200.0,
                    "samples": 1,
                    "text": "power 200 W (peak 200 W)",
                }
            ],
        }
    ]
    assert summarize(table(), {}) == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([1, 2], "must be a mapping of columns, not list"),
        ({"time_ns": [], "device": []}, "lacks column(s) name, unit, value"),
        ({**table((0, HOST, "host CPU", CPU_UNIT, 1.0)), "value": np.zeros(2)}, "columns differ in length"),
        ({**table((0, HOST, "host CPU", CPU_UNIT, 1.0)), "value": np.array(["lots"])}, "holds a non-number"),
    ],
)
def test_a_malformed_table_is_refused_by_name(bad: object, message: str) -> None:
    with pytest.raises(gw.InvalidArgument, match="counters table") as raised:
        summarize(bad, {})  # type: ignore[arg-type]
    assert message in str(raised.value)


def test_a_real_cpu_trace_summarizes_the_hosts_counters() -> None:
    dev = gw.Device("cpu")
    with gw.trace(counters=True) as trace:
        buf = dev.alloc(1 << 18)
        for _ in range(20):
            buf.copy_from_host(np.ones(1 << 18, np.float32))
        time.sleep(0.35)  # a few samples at 10 Hz
    rows = summarize_trace(trace)
    json.dumps(rows, allow_nan=False)
    assert [r["device"] for r in rows] == ["host", "cpu:0"]
    host, cpu = rows
    assert host["source"] == trace.counter_sources["host"] == "psutil, 10 Hz" == host["sampler"]
    expected = [(c.name, c.unit) for c in counter_sources.HostSource.counters]
    assert [(c["name"], c["unit"] if c["unit"] == CPU_UNIT else "bytes") for c in host["counters"]] == expected
    c = trace.counters()
    for row in host["counters"]:
        values = c["value"][c["name"] == row["name"]]
        known = values[np.isfinite(values)]
        assert row["samples"] == known.size >= 1, row
        if row["unit"] == CPU_UNIT:
            assert 0 <= known.min() <= row["mean"] <= row["peak"] == known.max() <= 100, row
        else:  # bytes, in the binary unit its peak reads best in
            scale = 1 << (10 * ["B", "KiB", "MiB", "GiB", "TiB"].index(row["unit"]))
            assert 1 <= row["peak"] < 1024 and row["peak"] * scale == known.max(), row
            assert row["mean"] * scale == pytest.approx(known.mean()), row
        assert row["text"].startswith(row["name"] + " ") and "(peak " in row["text"]
    # the CPU backend's counters are the host's: its row says so and carries none
    assert cpu["counters"] == [] and cpu["source"] == trace.counter_sources["cpu:0"]
    assert "the host's counters" in cpu["source"]


def test_a_trace_without_counters_has_no_summary() -> None:
    with gw.trace() as trace:
        gw.Device("cpu").alloc(16).free()
    assert summarize_trace(trace) == []


@pytest.mark.gpu
def test_a_cuda_trace_summarizes_nvmls_counters_beside_the_hosts() -> None:
    """On a GPU with nvidia-ml-py: cuda:0's row says NVML sampled it, and each of its counters reads in one unit
    (shares within 0..100 %, memory in use holding the 256 MiB allocated here)."""
    (dev,) = cuda_devices(1)
    pytest.importorskip("pynvml")
    held = dev.alloc(256 << 20, "uint8")
    host = np.ones(256 << 20, np.uint8)
    with gw.trace(counters=True) as trace:
        deadline = time.perf_counter() + 0.8  # several samples at GPM's 10 Hz (6 Hz without GPM)
        while time.perf_counter() < deadline:
            held.copy_from_host(host)
    rows = {row["device"]: row for row in summarize_trace(trace)}
    held.free()
    json.dumps(list(rows.values()), allow_nan=False)
    cuda = rows["cuda:0"]
    assert cuda["source"] == trace.counter_sources["cuda:0"] and cuda["sampler"].startswith("NVML"), cuda
    counters = {c["name"]: c for c in cuda["counters"]}
    assert "memory used" in counters and "GPU busy" in counters, counters
    used = counters["memory used"]
    assert used["unit"] in ("MiB", "GiB") and used["peak"] * (1024 if used["unit"] == "GiB" else 1) >= 256, used
    for row in counters.values():
        assert "e+" not in row["text"] and row["text"].startswith(row["name"]), row
        if row["unit"] == "%" and row["mean"] is not None:
            assert 0 <= row["mean"] <= row["peak"] <= 100, row
    assert rows["host"]["sampler"] == "psutil, 10 Hz" and rows["host"]["counters"]
