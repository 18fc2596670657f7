"""How each kernel was launched: grid, block, registers per thread and shared memory in the span table, read from a
Kineto trace, written to and read back from our export, summed up in ``statistics().kernels`` with the theoretical
occupancy they allow, and the ``low-occupancy`` advice; our own kernels report what they know on every backend.

(CUPTI's kernel records: tests/trace/cupti/test_cupti_launch_shapes.py; a GPU against CUDA's own numbers:
tests/trace/test_cuda_launch_shapes.py; the tooltip: tests/viz/test_timeline_launch.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import open_device

import gpuworkbench as gw
from gpuworkbench.trace.analysis import summarize
from gpuworkbench.trace.columns import DeviceClock
from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import KIND_CODE, pack_dim3, table_from_records, unpack_dim3
from gpuworkbench.trace.statistics import KERNEL_COLUMNS, statistics

US = 1_000
#: An H100 as PyTorch's profiler lists it in ``deviceProperties`` (libkineto's DeviceProperties.cpp).
KINETO_H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_029_158_912, "computeMajor": 9,
               "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
               "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
               "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
               "sharedMemPerMultiprocessor": 233472}  # fmt: skip
H100 = DeviceLimits.from_properties(KINETO_H100)


def kernel(name: str, start_us: float, dur_us: float, block: int, registers: int, shared: int, **extra) -> dict:
    return {"kind": "kernel", "stream": 0, "start_ns": int(start_us * US), "end_ns": int((start_us + dur_us) * US),
            "name": name, "grid": (128, 1, 1), "block": (block, 1, 1), "registers": registers, "shared_bytes": shared,
            **extra}  # fmt: skip


def kernels_by_name(stats) -> dict[str, dict]:
    return {row["name"]: row for row in stats.kernels.to_dict("records")}


# --- a Kineto trace ---------------------------------------------------------------------------------------------------


def kineto_doc() -> dict:
    """Two kernels as PyTorch's profiler writes them (its args as measured on the H200), each launched by a runtime
    call: a GEMM at 202 registers per thread and 48 KiB of shared memory, and an elementwise kernel."""
    events = []
    for i, (name, ts, dur, regs, shared, block) in enumerate(
        (("sm90_gemm", 100.0, 80.0, 202, 49152, 256), ("elementwise_kernel", 200.0, 20.0, 28, 0, 128))
    ):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,
                       "ts": ts - 10, "dur": 4.0, "args": {"cbid": 211, "correlation": 100 + i}})  # fmt: skip
        args = {"External id": 1 + i, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 100 + i,
                "registers per thread": regs, "shared memory": shared, "blocks per SM": 0.97, "warps per SM": 7.76,
                "grid": [128, 1, 1], "block": [block, 1, 1], "est. achieved occupancy %": 12}  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                       "args": args})  # fmt: skip
    return {"schemaVersion": 1, "deviceProperties": [KINETO_H100], "traceEvents": events}


def test_a_kineto_traces_kernels_carry_their_launch_shape_and_its_device_its_limits(tmp_path):
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(kineto_doc()))
    t = gw.load_trace(path)
    table = t.table()
    kernels = table["kind"] == KIND_CODE["kernel"]
    assert table["name"][kernels].tolist() == ["sm90_gemm", "elementwise_kernel"]
    assert table["registers"][kernels].tolist() == [202, 28]
    assert table["shared_bytes"][kernels].tolist() == [49152, 0]
    assert [unpack_dim3(b) for b in table["block"][kernels]] == [(256, 1, 1), (128, 1, 1)]
    assert (table["registers"][~kernels] == -1).all() and (table["shared_bytes"][~kernels] == -1).all()
    assert t.devices[0].limits == H100
    rows = kernels_by_name(t.statistics())
    assert rows["sm90_gemm"]["occupancy_pct"] == 12.5 and rows["elementwise_kernel"]["occupancy_pct"] == 100.0
    advice = [a for a in t.summary().advice if a.code == "low-occupancy"]
    assert len(advice) == 1 and advice[0].message.startswith("sm90_gemm (80 % of device time)")
    assert "202 registers per thread" in advice[0].message and "registers bind" in advice[0].message


def test_a_kineto_trace_without_device_limits_has_no_occupancy_and_no_advice(tmp_path):
    doc = kineto_doc()
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(doc))
    t = gw.load_trace(path)
    assert t.devices[0].limits is None
    rows = kernels_by_name(t.statistics())
    assert np.isnan(rows["sm90_gemm"]["occupancy_pct"]) and rows["sm90_gemm"]["registers"] == 202
    assert "low-occupancy" not in [a.code for a in t.summary().advice]


def test_launch_args_that_are_strings_or_absent_read_as_the_loader_reads_ints(tmp_path):
    doc = kineto_doc()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["args"]["registers per thread"] = "202"
    del kernels[1]["args"]["shared memory"]
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps(doc))
    table = gw.load_trace(path).table()
    mine = table["kind"] == KIND_CODE["kernel"]
    assert table["registers"][mine].tolist() == [202, 28] and table["shared_bytes"][mine].tolist() == [49152, -1]


# --- our export -------------------------------------------------------------------------------------------------------


def test_an_export_writes_launch_shapes_and_device_limits_as_kineto_does_and_reads_them_back(tmp_path):
    records = [kernel("gemm", 100, 50, 256, 202, 49152), kernel("axpy", 200, 10, 256, 16, 0),
               {"kind": "kernel", "stream": 0, "start_ns": 300 * US, "end_ns": 310 * US, "name": "unknown"},
               {"kind": "h2d", "stream": 1, "start_ns": 0, "end_ns": 50 * US, "bytes": 4096}]  # fmt: skip
    t = Trace.from_records(records)
    t._devices[0] = DeviceClock(key="cuda:0", name="H100", source="cupti", limits=H100)
    doc = t.to_chrome_trace(str(tmp_path / "run.json"))
    x = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"}
    assert x["gemm"]["args"]["registers per thread"] == 202 and x["gemm"]["args"]["shared memory"] == 49152
    assert "registers per thread" not in x["unknown"]["args"] and "shared memory" not in x["unknown"]["args"]
    (props,) = doc["deviceProperties"]
    limits = {k: v for k, v in KINETO_H100.items() if k not in ("id", "name", "totalGlobalMem", "sharedMemPerBlock")}
    assert {k: props.get(k) for k in limits} == limits  # Kineto's names, which other tools read
    assert (props["maxBlocksPerMultiProcessor"], props["reservedSharedMemPerBlock"]) == (32, 1024)
    back = gw.load_trace(tmp_path / "run.json")
    assert back.devices[0].limits == H100
    for column in ("grid", "block", "registers", "shared_bytes"):
        assert np.array_equal(np.sort(back.table()[column]), np.sort(t.table()[column]))
    assert kernels_by_name(back.statistics())["gemm"]["occupancy_pct"] == 12.5


# --- statistics -------------------------------------------------------------------------------------------------------


def test_statistics_show_each_kernels_most_common_shape_and_its_occupancy():
    records = [kernel("gemm", 0, 10, 256, 202, 49152), kernel("gemm", 20, 10, 256, 202, 49152),
               kernel("gemm", 40, 10, 128, 96, 0, grid=(7, 3, 1)),  # a third launch of another shape
               kernel("copy_kernel", 60, 5, 512, 32, 2064),
               {"kind": "kernel", "stream": 0, "start_ns": 80 * US, "end_ns": 90 * US, "name": "cpu_loop"}]  # fmt: skip
    table = table_from_records(records)
    rows = kernels_by_name(statistics(table, limits={0: H100}))
    gemm, copy, loop = rows["gemm"], rows["copy_kernel"], rows["cpu_loop"]
    assert (gemm["grid"], gemm["block"], gemm["registers"], gemm["shared_bytes"]) == ("128,1,1", "256,1,1", 202, 49152)
    assert gemm["occupancy_pct"] == 12.5 and copy["occupancy_pct"] == 100.0
    assert (loop["grid"], loop["block"], loop["registers"], loop["shared_bytes"]) == ("", "", -1, -1)
    assert np.isnan(loop["occupancy_pct"])
    assert tuple(statistics(table).kernels.columns) == KERNEL_COLUMNS
    assert np.isnan(kernels_by_name(statistics(table))["gemm"]["occupancy_pct"])  # no limits: not known


# --- the advice -------------------------------------------------------------------------------------------------------


def advice_of(records: list[dict], limits: DeviceLimits | None = H100) -> list:
    found = summarize(table_from_records(records), limits={0: limits}).advice
    return [a for a in found if a.code == "low-occupancy"]


def test_low_occupancy_names_registers_when_they_bind():
    (advice,) = advice_of([kernel("gemm", 0, 50, 256, 202, 0), kernel("axpy", 50, 50, 256, 16, 0)])
    assert advice.device == 0 and advice.severity == "warning"
    assert advice.message.startswith("gemm (50 % of device time) fills at most 12.5 % of an SM's warp slots")
    assert "at 202 registers per thread 1 block of 256 threads fits on an SM, so registers bind" in advice.message


def test_low_occupancy_names_shared_memory_when_it_binds():
    (advice,) = advice_of([kernel("tiled", 0, 50, 128, 32, 100_000)])  # 2 blocks of 4 warps: 12.5 %
    assert "with 97.7 KiB of shared memory per block (and the driver's 1.0 KiB reserve) 2 blocks of 128" in (
        advice.message
    )
    assert "so shared memory binds" in advice.message


def test_low_occupancy_is_silent_without_limits_above_25_percent_or_at_10_percent_of_device_time():
    gemm = kernel("gemm", 0, 10, 256, 202, 0)
    assert advice_of([gemm], limits=None) == []
    assert advice_of([kernel("fine", 0, 10, 256, 64, 0)]) == []  # 4 blocks of 8 warps: 50 %
    assert advice_of([kernel("quarter", 0, 10, 128, 32, 49152)]) == []  # exactly 25 %: not below
    assert advice_of([gemm, kernel("axpy", 10, 90, 256, 16, 0)]) == []  # 10 % of device time: not more
    assert advice_of([{**gemm, "registers": -1}]) == []  # registers not known (OpenCL, WebGPU, the CPU)


# --- our own kernels, every backend -----------------------------------------------------------------------------------


@gw.kernel(block=64)
def tile_copy(i: gw.index, out: gw.f32[:], x: gw.f32[:], n: gw.i32):
    """Each block stages its 64 values in shared memory (256 B) before writing them back."""
    tile = gw.shared(64, gw.f32)
    lid = gw.local_id(0)
    tile[lid] = x[i] if i < n else 0.0
    gw.barrier()
    if i < n:
        out[i] = tile[lid]


def test_a_driver_that_says_less_shared_memory_than_the_kernel_declares_is_not_believed(monkeypatch):
    dev = open_device("opencl")
    x, out = dev.alloc(64), dev.alloc(64)
    monkeypatch.setattr(type(dev.backend_device), "kernel_resources", lambda self, kernel: (-1, 0))  # as PoCL 5.0
    with gw.trace() as t:
        tile_copy.launch(64, out, x, 64)
        dev.synchronize()
    assert t.table()["shared_bytes"].tolist() == [256]


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_our_kernels_report_the_block_they_ran_with_and_the_shared_memory_they_declare(backend):
    dev = open_device(backend)
    x, out = dev.alloc(256), dev.alloc(256)
    x.copy_from_host(np.arange(256, dtype=np.float32))
    scale = gw.elementwise("float32 x, float32 y", "y = 2*x", name="double_it")
    raw = dev.compile(
        "__kernel void fill(__global float* y) { y[get_global_id(0)] = 1.0f; }"
        if backend == "opencl"
        else lambda y, grid, block: None,
        "fill",
    )
    grid, block = (4,), (32,)
    with gw.trace() as t:
        for _ in range(3):  # the second launch of the same objects prepares it, the third repeats it
            x.copy_from_host(np.arange(256, dtype=np.float32))  # a copy among them: no launch shape
            tile_copy.launch(256, out, x, 256)
            scale(x, out)
            raw(grid, block, [out])
        with gw.trace() as both:  # two traces at once: each hears of the launch after it
            raw(grid, block, [out])
        dev.synchronize()
    table = t.table()
    by_name: dict[str, set] = {}
    for name, b, shared, regs in zip(table["name"], table["block"], table["shared_bytes"], table["registers"]):
        by_name.setdefault(str(name), set()).add((unpack_dim3(b), int(shared), int(regs)))
    assert by_name["tile_copy"] == {((64, 1, 1), 256, -1)}  # no registers: only CUDA says
    copies = table["kind"] == KIND_CODE["h2d"]
    assert copies.sum() == 3 and (table["block"][copies] == 0).all() and (table["shared_bytes"][copies] == -1).all()
    assert by_name["double_it"] == {((256, 1, 1) if backend == "opencl" else (1, 1, 1), 0, -1)}
    assert by_name["fill"] == {((32, 1, 1), 0 if backend == "opencl" else -1, -1)}  # OpenCL: its local memory
    fills = table["name"] == "fill"
    assert fills.sum() == 4 and (table["grid"][fills] == pack_dim3(4)).all()
    assert both.table()["block"].tolist() == [pack_dim3(32)]
    stats = kernels_by_name(t.statistics())
    assert stats["tile_copy"]["block"] == "64,1,1" and np.isnan(stats["tile_copy"]["occupancy_pct"])
    assert "low-occupancy" not in [a.code for a in t.summary().advice]


@pytest.mark.parametrize("collide", [False, True])
def test_each_kernels_most_common_shape_is_found_whichever_way_it_is_grouped(monkeypatch, collide):
    from collections import Counter

    from gpuworkbench.trace import kernel_shapes

    if collide:  # every combination mixes to one value: the exact sort must find the same
        monkeypatch.setattr(kernel_shapes, "_FACTORS", (np.uint64(0),) * 5)
    rng = np.random.default_rng(7)
    n = 2_000
    records = [kernel(f"k{rng.integers(5)}", i, 1, int(rng.choice([64, 128, 256])), int(rng.choice([16, 32])), 0,
                      grid=(int(rng.integers(1, 4)), 1, 1)) for i in range(n)]  # fmt: skip
    got = kernels_by_name(statistics(table_from_records(records)))
    for name in {r["name"] for r in records}:
        mine = [r for r in records if r["name"] == name]
        shapes = Counter((r["grid"], r["block"], r["registers"]) for r in mine)
        top = max(shapes.values())
        expected = next(s for s in ((r["grid"], r["block"], r["registers"]) for r in mine) if shapes[s] == top)
        row = got[name]
        assert (row["grid"], row["block"], row["registers"]) == (
            ",".join(map(str, expected[0])), ",".join(map(str, expected[1])), expected[2]
        )  # fmt: skip
