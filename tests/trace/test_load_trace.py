"""Tests of trace/kineto.py (``gw.load_trace``): PyTorch profiler (Kineto) files, our own exports read back exactly,
HolisticTraceAnalysis agreeing with our idle %, errors naming the file, and ``%gpu load``."""

from __future__ import annotations

import gzip
import json
import math
import os
import re

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.notebook import history
from gpuworkbench.trace import kineto_helper, kineto_read
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import COLUMNS, KIND_CODE, pack_dim3, thread_stream

BASE_NS = 1_700_000_000_000_000_000  # Kineto's baseTimeNanoseconds: ts are µs after it
PID, MAIN, BACKWARD = 4242, 4242, 4250  # the host process and its two threads
LAUNCH = {"kernel": "cudaLaunchKernel", "h2d": "cudaMemcpyAsync", "d2h": "cudaMemcpyAsync", "memset": "cudaMemsetAsync"}

#: What the PyTorch-layout file below holds on the device: (kind, stream, start µs, duration µs, name, bytes, thread).
#: Two kernel streams (7 and 13), a pinned and a pageable H2D copy, a pinned D2H copy, a memset; gaps between them.
DEVICE_WORK = [
    ("h2d", 7, 100.0, 40.0, "Memcpy HtoD (Pinned -> Device)", 4 << 20, MAIN),
    ("kernel", 7, 150.5, 30.25, "void at::native::vectorized_elementwise_kernel<4, float>", 0, MAIN),
    ("kernel", 13, 160.0, 50.0, "ampere_sgemm_128x64_nn", 0, BACKWARD),
    ("h2d", 13, 230.0, 80.0, "Memcpy HtoD (Pageable -> Device)", 8 << 20, MAIN),
    ("memset", 7, 240.0, 2.5, "Memset (Device)", 1 << 20, MAIN),
    ("kernel", 7, 320.125, 20.0, "void at::native::reduce_kernel<512, 1>", 0, MAIN),
    ("d2h", 7, 400.0, 30.0, "Memcpy DtoH (Device -> Pinned)", 4 << 20, MAIN),
]


def kineto_doc() -> dict:
    """A trace in the layout PyTorch's profiler writes (see libkineto's output_json.cpp): metadata events, cpu_op
    ranges holding cuda_runtime launches, device work with args.device / args.stream / args.correlation, ac2g flows
    from each launch to its work, a synchronize call with no device work, python_function events, deviceProperties."""
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": 0, "args": {"name": "python3"}},
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": MAIN,
         "args": {"name": "thread 4242 (python3)"}},
        {"name": "process_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {"name": "process_labels", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"labels": "NVIDIA H100"}},
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": 13, "args": {"name": "stream 13"}},
        {"ph": "X", "cat": "python_function", "name": "train.py(12): step", "pid": PID, "tid": MAIN, "ts": 10.0,
         "dur": 500.0, "args": {"Python id": 1}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": PID, "tid": MAIN, "ts": 20.0,
         "dur": 480.0, "args": {"External id": 1}},
    ]  # fmt: skip
    for i, (kind, stream, ts, dur, name, nbytes, thread) in enumerate(DEVICE_WORK):
        correlation, external = 100 + i, 10 + i
        launch_ts = 30.0 + 9 * i + (5 if thread == BACKWARD else 0)
        events.append(
            {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": PID, "tid": thread, "ts": launch_ts - 2.0,
             "dur": 7.0, "args": {"External id": external, "Record function id": 0, "Ev Idx": i}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": LAUNCH[kind], "pid": PID, "tid": thread, "ts": launch_ts,
             "dur": 3.5, "args": {"External id": external, "cbid": 211, "correlation": correlation}}
        )  # fmt: skip
        args = {"External id": external, "device": 0, "context": 1, "stream": stream, "correlation": correlation}
        if kind == "kernel":
            category = "kernel"
            args |= {"queued": 0, "registers per thread": 32, "grid": [64 + i, 2, 1], "block": [256, 1, 1]}
        else:
            category = "gpu_memset" if kind == "memset" else "gpu_memcpy"
            args |= {"bytes": nbytes, "memory bandwidth (GB/s)": round(nbytes / (dur * 1000), 3)}
        events.append(
            {"ph": "X", "cat": category, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}
        )
        events.append({"ph": "s", "id": correlation, "pid": PID, "tid": thread, "ts": launch_ts, "cat": "ac2g",
                       "name": "ac2g"})  # fmt: skip
        events.append({"ph": "f", "id": correlation, "pid": 0, "tid": stream, "ts": ts, "cat": "ac2g", "name": "ac2g",
                       "bp": "e"})  # fmt: skip
    events.append(
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": PID, "tid": MAIN, "ts": 450.0,
         "dur": 40.0, "args": {"cbid": 165, "correlation": 200}}
    )  # fmt: skip
    events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 600.0})
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_029_158_912, "computeMajor": 9,
             "computeMinor": 0, "numSms": 132, "warpSize": 32},
            {"id": 1, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_029_158_912, "computeMajor": 9,
             "computeMinor": 0, "numSms": 132, "warpSize": 32},
        ],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": events,
        "traceName": "rank-0.json",
    }  # fmt: skip


def write(doc: dict, path, compress: bool = False) -> str:
    opener = gzip.open if compress else open
    with opener(path, "wt") as f:
        json.dump(doc, f)
    return str(path)


def ns(us: float) -> int:
    return BASE_NS + round(us * 1000)


def rows(trace: Trace, kind: str) -> dict[str, np.ndarray]:
    table = trace.table()
    mine = table["kind"] == KIND_CODE[kind]
    return {column: values[mine] for column, values in table.items()}


def canonical(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The table's rows in one order that does not depend on the order they were appended in."""
    order = np.lexsort(
        (table["name"].astype(str), table["corr"], table["end_ns"], table["start_ns"], table["stream"],
         table["device"], table["kind"])
    )  # fmt: skip
    return {column: values[order] for column, values in table.items()}


def assert_same_tables(a: Trace, b: Trace) -> None:
    first, second = canonical(a.table()), canonical(b.table())
    assert set(first) == set(second) == set(COLUMNS)
    for column in COLUMNS:
        np.testing.assert_array_equal(first[column], second[column], err_msg=f"column {column!r}")


# ---------------------------------------------------------------------------------------------- PyTorch files


@pytest.mark.parametrize("compress", [False, True], ids=["json", "json.gz"])
def test_a_pytorch_trace_loads_with_kinds_streams_pinned_flags_and_links(tmp_path, compress):
    path = write(kineto_doc(), tmp_path / ("trace.json.gz" if compress else "trace.json"), compress)
    t = gw.load_trace(path)
    assert isinstance(t, Trace) and not t.recording
    table = t.table()
    counts = {k: int((table["kind"] == KIND_CODE[k]).sum()) for k in ("kernel", "h2d", "d2h", "memset", "api", "range")}
    # 7 launches + a synchronize; 7 cpu_ops + the ProfilerStep annotation; python_function skipped
    assert counts == {"kernel": 3, "h2d": 2, "d2h": 1, "memset": 1, "api": 8, "range": 8}
    assert len(t) == len(DEVICE_WORK) + 16

    work = [canonical_row for canonical_row in zip(*(table[c] for c in ("kind", "stream", "start_ns", "name")))]
    device = sorted((int(s), int(start), str(n)) for k, s, start, n in work if k < KIND_CODE["alloc"])
    assert device == sorted((s, ns(ts), name) for _, s, ts, _, name, _, _ in DEVICE_WORK)
    kernels = rows(t, "kernel")
    assert sorted(set(kernels["stream"].tolist())) == [7, 13]
    np.testing.assert_array_equal(kernels["end_ns"] - kernels["start_ns"], [30_250, 50_000, 20_000])
    assert kernels["grid"].tolist() == [pack_dim3(65, 2, 1), pack_dim3(66, 2, 1), pack_dim3(69, 2, 1)]
    assert set(kernels["block"].tolist()) == {pack_dim3(256)}
    assert (kernels["pinned"] == -1).all()

    h2d = rows(t, "h2d")
    assert h2d["pinned"].tolist() == [1, 0] and h2d["bytes"].tolist() == [4 << 20, 8 << 20]
    assert rows(t, "d2h")["pinned"].tolist() == [1]
    assert rows(t, "memset")["bytes"].tolist() == [1 << 20]

    # every device span links to its launch by corr; the launch's start is the span's enqueue time
    api = rows(t, "api")
    launch_of = {int(c): (int(s), int(d), int(st)) for c, s, d, st in zip(api["corr"], api["start_ns"], api["device"],
                                                                          api["stream"])}  # fmt: skip
    device_rows = table["kind"] < KIND_CODE["alloc"]
    for corr, enqueue in zip(table["corr"][device_rows], table["enqueue_ns"][device_rows]):
        assert corr in launch_of and launch_of[int(corr)][0] == enqueue
    assert launch_of[200][1] == 0  # the synchronize links to nothing and sits on the first device
    assert set(api["name"]) == {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaDeviceSynchronize"}

    # one host row per thread, in order of first event, labelled with thread_name where the file has one
    main, backward = thread_stream(0), thread_stream(1)
    assert set(api["stream"].tolist()) == {main, backward}
    backward_calls = api["stream"] == backward
    assert backward_calls.sum() == 1 and launch_of[102][2] == backward
    ranges = rows(t, "range")
    assert set(ranges["stream"].tolist()) == {main, backward} and "ProfilerStep#3" in set(ranges["name"])
    labels = t.stream_labels
    assert labels[(0, main)] == "thread 4242 (python3)" and labels[(0, backward)] == "host thread 4250"
    assert labels[(0, 7)] == "stream 7" and labels[(0, 13)] == "stream 13"

    # the device named from deviceProperties; only the device the trace used is listed
    assert list(t.devices) == [0]
    clock = t.devices[0]
    assert (clock.key, clock.name, clock.source) == ("cuda:0", "NVIDIA H100 80GB HBM3", "kineto")

    summary = t.summary()
    assert summary.op_counts["kernel"] == 3 and summary.window_ns == 330_000  # 100 µs .. 430 µs
    assert "pageable-memory" in {a.code for a in summary.advice}


def test_gzip_is_found_by_its_magic_bytes_not_its_name(tmp_path):
    path = write(kineto_doc(), tmp_path / "trace.json", compress=True)
    assert len(gw.load_trace(path)) == len(DEVICE_WORK) + 16


def test_rocm_traces_read_hip_calls_and_copies_without_pinned_flags(tmp_path):
    """ROCm's Kineto names copies "Memcpy HtoD (Host -> Device)" (no pinned flag) and calls hipLaunchKernel."""
    doc = kineto_doc()
    for e in doc["traceEvents"]:
        if e.get("cat") == "cuda_runtime":
            e["name"] = e["name"].replace("cuda", "hip")
            e["args"]["stream"] = "0x7f3a2c000b00"  # roctracer writes the stream as a pointer string
        if e.get("cat") == "gpu_memcpy":
            e["name"] = e["name"].replace("Pinned", "Host").replace("Pageable", "Host")
    doc["deviceProperties"] = [{"id": 0, "name": "AMD Instinct MI300X", "gcnArchName": "gfx942"}]
    t = gw.load_trace(write(doc, tmp_path / "rocm.json"))
    assert t.devices[0].key == "rocm:0"
    assert rows(t, "h2d")["pinned"].tolist() == [-1, -1]
    assert (rows(t, "kernel")["enqueue_ns"] > 0).all()


def test_device_work_without_args_correlation_is_linked_by_its_ac2g_flow(tmp_path):
    doc = kineto_doc()
    for e in doc["traceEvents"]:
        if e.get("cat") in ("kernel", "cuda_runtime"):
            e["args"].pop("correlation", None)
    t = gw.load_trace(write(doc, tmp_path / "flows.json"))
    kernels = rows(t, "kernel")
    assert kernels["corr"].tolist() == [101, 102, 105]
    assert set(kernels["corr"].tolist()) <= set(rows(t, "api")["corr"].tolist())
    assert (kernels["enqueue_ns"] > 0).all()


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5 on pandas 3
def test_idle_pct_agrees_with_holistic_trace_analysis(tmp_path):
    """HTA's temporal breakdown (idle = first-to-last device event minus their union, over the rank) against our
    ``idle_pct`` (W = first to last op, one device) on the same PyTorch-layout file, within 1 point."""
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    (tmp_path / "traces").mkdir()
    path = write(kineto_doc(), tmp_path / "traces" / "rank-0.json.gz", compress=True)
    breakdown = TraceAnalysis(trace_dir=str(tmp_path / "traces")).get_temporal_breakdown(visualize=False)
    ours = gw.load_trace(path).summary()
    hta_idle = float(breakdown.iloc[0]["idle_time_pctg"])
    assert ours.idle_pct == pytest.approx(hta_idle, abs=1.0)
    assert 10 < ours.idle_pct < 60  # the file has real gaps: the agreement is not two zeros


# ---------------------------------------------------------------------------------------------- our own exports


def test_an_exported_cpu_trace_round_trips_exactly(tmp_path):
    dev = gw.Device(backend="cpu")
    upload, compute = dev.create_stream("upload"), dev.create_stream("compute")
    n = 1 << 14
    host, page = dev.empty_pinned(n, "float32"), np.ones(n, np.float32)
    host[:] = 1
    scale = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
    with gw.trace() as t:
        x, y = dev.alloc(n), dev.alloc(n)
        compute.wait_event(x.copy_from_host_async(host, upload))
        scale(x, y, stream=compute)
        y.copy_to_host_async(page, compute).wait()
        x.fill_bytes(0, upload).wait()
        x.free()
        y.free()
    for name in ("cpu.json", "cpu.json.gz"):
        loaded = gw.load_trace(t.to_chrome_trace(str(tmp_path / name)) and str(tmp_path / name))
        assert_same_tables(t, loaded)
        assert loaded.stream_labels == t.stream_labels
        assert {d: (c.key, c.name) for d, c in loaded.devices.items()} == {
            d: (c.key, c.name) for d, c in t.devices.items()
        }
        assert loaded.devices[0].source == "gpuworkbench export"
        assert loaded.summary().to_dict() == t.summary().to_dict()
        memory, back = t.memory_table(), loaded.memory_table()
        assert memory["t_ns"].size and all(np.array_equal(memory[c], back[c]) for c in memory)


def test_a_from_records_trace_with_host_rows_grid_and_block_round_trips_exactly(tmp_path):
    us = 1000
    records = [
        {"kind": "alloc", "stream": -1, "start_ns": 10 * us, "end_ns": 12 * us, "bytes": 1 << 20, "name": "alloc"},
        {"kind": "range", "stream": "step", "start_ns": 15 * us, "end_ns": 400 * us, "name": "train step"},
        {"kind": "api", "stream": thread_stream(0), "start_ns": 20 * us, "end_ns": 24 * us, "name": "cudaLaunchKernel",
         "corr": 7, "enqueue_ns": 20 * us},
        {"kind": "kernel", "stream": 3, "start_ns": 100 * us, "end_ns": 150 * us + 1, "name": "gemm", "corr": 7,
         "enqueue_ns": 20 * us, "grid": (132, 4, 1), "block": (128, 2, 1)},
        {"kind": "api", "stream": thread_stream(1), "start_ns": 30 * us, "end_ns": 31 * us, "name": "cudaMemcpyAsync",
         "corr": 9},
        {"kind": "h2d", "stream": 4, "start_ns": 120 * us + 7, "end_ns": 180 * us, "bytes": 4096, "pinned": True,
         "corr": 9, "enqueue_ns": 30 * us},
        {"kind": "d2h", "stream": 4, "start_ns": 200 * us, "end_ns": 230 * us, "bytes": 4096, "pinned": False,
         "enqueue_ns": 190 * us, "name": "read back"},
        {"kind": "api", "stream": thread_stream(0), "start_ns": 240 * us, "end_ns": 260 * us,
         "name": "cudaDeviceSynchronize", "corr": 12},
        {"kind": "kernel", "stream": 3, "start_ns": 300 * us, "end_ns": 310 * us, "name": ""},
        {"kind": "memset", "stream": 3, "start_ns": 320 * us, "end_ns": 321 * us, "bytes": 64, "device": 1},
        {"kind": "range", "stream": 3, "start_ns": 99 * us, "end_ns": 311 * us, "name": "gpu region"},
        {"kind": "marker", "stream": -1, "start_ns": 330 * us, "end_ns": 330 * us, "name": "done"},
    ]  # fmt: skip
    t = Trace.from_records(records, device_names={0: "first", 1: "second"})
    t.label_stream(0, thread_stream(0), "host main")
    t.label_stream(0, thread_stream(1), "host loader")
    t.label_stream(0, 3, "compute")
    for name in ("records.json", "records.json.gz"):
        t.to_chrome_trace(str(tmp_path / name))
        loaded = gw.load_trace(tmp_path / name)
        assert_same_tables(t, loaded)
        assert loaded.stream_labels == t.stream_labels
        assert {d: c.name for d, c in loaded.devices.items()} == {0: "first", 1: "second"}
    assert {s.kind for s in loaded.spans} >= {"api", "range", "kernel", "alloc", "marker"}
    gemm = next(s for s in loaded.spans if s.name == "gemm")
    assert (gemm.grid, gemm.block, gemm.corr) == ((132, 4, 1), (128, 2, 1), 7)


def test_export_writes_api_calls_on_their_threads_with_flows_and_correlations(tmp_path):
    us = 1000
    records = [
        {"kind": "api", "stream": thread_stream(1), "start_ns": 20 * us, "end_ns": 24 * us, "name": "cuLaunchKernel",
         "corr": 41},
        {"kind": "kernel", "stream": 2, "start_ns": 30 * us, "end_ns": 50 * us, "name": "k", "corr": 41,
         "enqueue_ns": 20 * us, "grid": (8, 1, 1), "block": (64, 1, 1)},
        {"kind": "kernel", "stream": 2, "start_ns": 60 * us, "end_ns": 70 * us, "name": "k2", "enqueue_ns": 55 * us},
        {"kind": "range", "stream": thread_stream(0), "start_ns": 10 * us, "end_ns": 80 * us, "name": "forward"},
    ]  # fmt: skip
    t = Trace.from_records(records)
    t.label_stream(0, thread_stream(1), "host launcher")
    doc = t.to_chrome_trace()
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    call = next(e for e in x if e["cat"] == "cuda_runtime" and e["name"] == "cuLaunchKernel")
    kernel = next(e for e in x if e["cat"] == "kernel" and e["name"] == "k")
    other = next(e for e in x if e["cat"] == "kernel" and e["name"] == "k2")
    annotation = next(e for e in x if e["cat"] == "user_annotation")
    assert call["args"]["correlation"] == kernel["args"]["correlation"] == 41
    assert other["args"]["correlation"] >= doc["gpuworkbench"]["synthetic_correlation_from"] > 41
    assert kernel["args"]["grid"] == [8, 1, 1] and kernel["args"]["block"] == [64, 1, 1]
    assert "grid" not in other["args"]
    assert (call["tid"], annotation["tid"]) == (3, 2) and call["pid"] == annotation["pid"]
    threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
               and e["pid"] == call["pid"]}  # fmt: skip
    assert threads[3] == "host launcher" and threads[2] == "host thread 0"
    flows = {(e["ph"], e["id"]): e for e in doc["traceEvents"] if e["ph"] in "sf"}
    assert (flows[("s", 41)]["tid"], flows[("s", 41)]["ts"]) == (call["tid"], call["ts"])
    assert (flows[("f", 41)]["pid"], flows[("f", 41)]["ts"]) == (kernel["pid"], kernel["ts"])
    # k2 has no API call in the trace: its enqueue is the workbench's own runtime event, as before
    enqueue = [
        e for e in x if e["cat"] == "cuda_runtime" and e["args"].get("correlation") == other["args"]["correlation"]
    ]
    assert len(enqueue) == 1 and enqueue[0]["tid"] == 1


def test_from_records_names_streams_by_string():
    t = Trace.from_records(
        [
            {"kind": "h2d", "stream": "upload", "start_ns": 0, "end_ns": 10},
            {"kind": "kernel", "stream": "compute", "start_ns": 5, "end_ns": 20},
            {"kind": "kernel", "stream": "compute", "start_ns": 20, "end_ns": 30},
            {"kind": "kernel", "stream": "compute", "device": 1, "start_ns": 0, "end_ns": 30},
            {"kind": "d2h", "stream": 9, "start_ns": 30, "end_ns": 40},
        ]
    )
    assert [s.stream for s in sorted(t.spans, key=lambda s: (s.device, s.start_ns))] == [0, 1, 1, 9, 0]
    assert t.stream_labels == {(0, 0): "upload", (0, 1): "compute", (1, 0): "compute"}


def cpu_profile_doc() -> dict:
    """What ``torch.profiler`` with ``activities=[CPU]`` and ``profile_memory=True`` writes: host events only, no
    deviceProperties, and ``[memory]`` instant events (CPU ones, and here a GPU one too)."""
    events = [
        {"name": "thread_name", "ph": "M", "ts": 0.0, "pid": PID, "tid": MAIN, "args": {"name": "thread 4242 (py)"}},
        {"ph": "X", "cat": "user_annotation", "name": "my_region", "pid": PID, "tid": MAIN, "ts": 10.0, "dur": 90.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": MAIN, "ts": 20.0, "dur": 30.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": PID, "tid": MAIN, "ts": 60.0, "dur": 5.0},
    ]  # fmt: skip
    for i, (device_type, total) in enumerate([(0, 4096), (0, 8192), (0, 4096)]):
        events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": MAIN,
                       "ts": 20.0 + 10 * i, "args": {"Device Type": device_type, "Device Id": -1, "Bytes": 4096,
                                                      "Total Allocated": total, "Total Reserved": 0}})  # fmt: skip
    return {"schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": BASE_NS, "traceEvents": events}


def test_a_cpu_only_profile_gets_a_host_clock_not_a_gpu_and_round_trips(tmp_path):
    t = gw.load_trace(write(cpu_profile_doc(), tmp_path / "cpu.json"))
    assert {d: (c.key, c.name) for d, c in t.devices.items()} == {0: ("host:0", "host")}
    assert "no device work" in t.devices[0].note
    assert sorted(t.table()["name"].tolist()) == ["aten::mm", "aten::relu", "my_region"]
    assert not t.memory_table()["t_ns"].size  # CPU memory: the memory table is per device
    text = str(t.summary())
    assert "device work" in text and "none in this trace" in text and "range 3" in text and "n/a" not in text
    detail = t.timeline().children[0]
    assert "host:0 = host" in str(detail.title.text)
    assert list(detail.y_range.factors) == ["host:0 · thread 4242 (py)"]  # no overlap-state strip without device work
    again = gw.load_trace(t.to_chrome_trace(str(tmp_path / "again.json")) and str(tmp_path / "again.json"))
    assert_same_tables(t, again)
    assert {d: c.key for d, c in again.devices.items()} == {0: "host:0"}


def test_gpu_memory_events_become_the_memory_tables_other_bytes(tmp_path):
    doc = kineto_doc()
    for ts, total in ((50.0, 1 << 20), (40.0, 3 << 20), (60.0, 2 << 20)):
        doc["traceEvents"].append(
            {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": MAIN, "ts": ts,
             "args": {"Device Type": 1, "Device Id": 1, "Bytes": 1 << 20, "Total Allocated": total}}
        )  # fmt: skip
    doc["traceEvents"].append(
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": PID, "tid": MAIN, "ts": 45.0,
         "args": {"Device Type": 0, "Device Id": -1, "Bytes": 64, "Total Allocated": 64}}
    )  # fmt: skip
    t = gw.load_trace(write(doc, tmp_path / "mem.json"))
    memory = t.memory_table()
    assert memory["device"].tolist() == [1, 1, 1]
    assert memory["t_ns"].tolist() == [ns(40.0), ns(50.0), ns(60.0)]
    assert memory["other_bytes"].tolist() == [3 << 20, 1 << 20, 2 << 20]
    assert t.devices[1].key == "cuda:1"
    back = gw.load_trace(t.to_chrome_trace(str(tmp_path / "again.json.gz")) and str(tmp_path / "again.json.gz"))
    assert all(np.array_equal(memory[c], back.memory_table()[c]) for c in memory)  # our export keeps them


# ---------------------------------------------------------------------------------------------- how files are read


def same_trace(a: Trace, b: Trace) -> None:
    """The same table row for row (in order), the same labels, clocks, memory and locations."""
    first, second = a.table(), b.table()
    for column in COLUMNS:
        np.testing.assert_array_equal(first[column], second[column], err_msg=f"column {column!r}")
    assert a.stream_labels == b.stream_labels
    assert {d: (c.key, c.name) for d, c in a.devices.items()} == {d: (c.key, c.name) for d, c in b.devices.items()}
    assert all(np.array_equal(a.memory_table()[c], b.memory_table()[c]) for c in a.memory_table())
    assert a.locations == b.locations


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 256 bytes: a small file is cut into many pieces, as a large one is."""
    monkeypatch.setattr(kineto_read, "BLOCK", 256)


@pytest.mark.parametrize("compress", [False, True], ids=["json", "json.gz"])
def test_a_file_cut_into_many_pieces_reads_as_one(tmp_path, monkeypatch, compress):
    doc = kineto_doc()
    path = write(doc, tmp_path / ("t.json.gz" if compress else "t.json"), compress)
    whole = gw.load_trace(path)
    monkeypatch.setattr(kineto_read, "BLOCK", 256)
    pieces = gw.load_trace(path)
    same_trace(whole, pieces)
    kernels = rows(pieces, "kernel")
    assert kernels["name"].tolist() == [w[4] for w in DEVICE_WORK if w[0] == "kernel"]
    assert (kernels["enqueue_ns"] > 0).all()  # linked to their launches across pieces


@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":"), (",\n  ", ": ")], ids=["spaced", "compact", "lines"])
def test_a_plain_file_is_cut_in_place_of_its_mapping(tmp_path, monkeypatch, separators):
    """A plain file is read through a copy-on-write mapping (no reading thread): each piece's "[" and "]" are written
    over the separators around it, which in a compact file ("},{") is one byte for two pieces; the file is left as
    it was."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(kineto_doc(), separators=separators))
    before = path.read_bytes()
    whole = gw.load_trace(path)

    def no_thread(where):
        raise AssertionError("a plain file was read by the reading thread")

    monkeypatch.setattr(kineto_read, "_Blocks", no_thread)
    monkeypatch.setattr(kineto_read, "BLOCK", 256)
    same_trace(whole, gw.load_trace(path))
    assert path.read_bytes() == before


@pytest.mark.parametrize("kind", ["fork", "spawn"])
def test_a_helper_process_reads_pieces_to_the_same_trace(tmp_path, monkeypatch, small_blocks, kind):
    """A forked helper (a script) and a spawned one (a notebook kernel, a process with CUDA) read pieces of the
    file, and the trace is the one read without them."""
    path = write(kineto_doc(), tmp_path / "t.json")
    alone = gw.load_trace(path)
    started, received = [], []
    real_init, real_receive = kineto_helper.Helper.__init__, kineto_helper.Helper.receive

    def counted(self, how):
        real_init(self, how)
        started.append((how, self.pid))

    def receive(self):
        piece = real_receive(self)
        received.append(piece)
        return piece

    monkeypatch.setattr(kineto_read, "helper_kind", lambda where: kind)
    monkeypatch.setattr(kineto_helper.Helper, "__init__", counted)
    monkeypatch.setattr(kineto_helper.Helper, "receive", receive)
    helped = gw.load_trace(path)
    assert [how for how, _ in started] == [kind], "the load started no helper"
    assert received, "the helper read no piece"
    same_trace(alone, helped)
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(started[0][1], os.WNOHANG)


def test_a_lost_helper_costs_a_second_read_not_the_load(tmp_path, monkeypatch, small_blocks):
    path = write(kineto_doc(), tmp_path / "t.json")
    alone = gw.load_trace(path)

    def lost(self):
        raise kineto_helper.HelperLost("gone")

    monkeypatch.setattr(kineto_read, "helper_kind", lambda where: "fork")
    monkeypatch.setattr(kineto_helper.Helper, "receive", lost)
    same_trace(alone, gw.load_trace(path))


def test_a_helper_that_cannot_start_leaves_the_load_alone(tmp_path, monkeypatch, small_blocks):
    """No interpreter to spawn (an embedded Python): the file is read without a helper, to the same trace."""
    import sys

    path = write(kineto_doc(), tmp_path / "t.json")
    alone = gw.load_trace(path)
    monkeypatch.setattr(kineto_read, "helper_kind", lambda where: "spawn")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    same_trace(alone, gw.load_trace(path))


@pytest.mark.parametrize(
    "change",
    [
        # NaN is no JSON (Python writes it): the whole document is parsed by json
        lambda doc: doc["traceEvents"].append({"ph": "X", "cat": "Trace", "name": "x", "ts": 1.0, "dur": math.nan}),
        # a number as a string where an int belongs, a name that is a number
        lambda doc: doc["traceEvents"].append({"ph": "X", "cat": "overhead", "name": 7, "ts": 1.0, "dur": 1.5}),
        # "}, {" inside a string: a cut lands in it, and that piece does not decode
        lambda doc: doc["traceEvents"].append({"ph": "X", "cat": "Trace", "name": "a}, {" * 80, "ts": 1.0}),
        # a phase no Chrome trace has
        lambda doc: doc["traceEvents"].append({"ph": "@", "name": "odd", "ts": 1.0}),
    ],
    ids=["nan", "name-a-number", "cut-in-a-string", "unknown-phase"],
)
def test_files_the_fast_path_cannot_read_load_the_same_by_the_slower_one(tmp_path, small_blocks, change):
    clean = gw.load_trace(write(kineto_doc(), tmp_path / "clean.json"))
    doc = kineto_doc()
    change(doc)
    same_trace(clean, gw.load_trace(write(doc, tmp_path / "odd.json")))


def test_string_ints_read_as_before(tmp_path):
    """A numeric string reads as its number (a stream "13"); roctracer's pointer strings are no stream (0)."""
    doc = kineto_doc()
    device = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    device[0]["args"]["stream"] = str(device[0]["args"]["stream"])
    device[1]["args"]["stream"] = "0x7f3a2c000b00"
    kernels = rows(gw.load_trace(write(doc, tmp_path / "t.json")), "kernel")
    assert kernels["stream"].tolist() == [7, 0, 7]


def test_a_bare_array_of_events_and_keys_after_them_load(tmp_path, small_blocks):
    doc = kineto_doc()
    bare = gw.load_trace(write(doc["traceEvents"], tmp_path / "bare.json"))
    assert len(rows(bare, "kernel")["kind"]) == 3
    moved = {k: v for k, v in doc.items() if k != "traceEvents"}
    after = gw.load_trace(write({"traceEvents": doc["traceEvents"], **moved}, tmp_path / "after.json"))
    same_trace(gw.load_trace(write(doc, tmp_path / "t.json")), after)
    assert after.devices[0].name == "NVIDIA H100 80GB HBM3"  # deviceProperties, read after the events


def test_our_export_with_its_block_after_the_events_reads_back_exactly(tmp_path, small_blocks):
    """The block that says "our export" comes after the events: the file is read again as one."""
    doc = gw.load_trace(write(kineto_doc(), tmp_path / "t.json")).to_chrome_trace()
    in_place = gw.load_trace(write(doc, tmp_path / "export.json"))
    own = doc.pop("gpuworkbench")
    moved = gw.load_trace(write({**doc, "gpuworkbench": own}, tmp_path / "moved.json"))
    same_trace(in_place, moved)
    assert moved.stream_labels == {(d, s): label for d, s, label in own["stream_labels"]}


def test_gzip_members_one_after_another_are_one_file(tmp_path):
    text = json.dumps(kineto_doc()).encode()
    path = tmp_path / "members.json.gz"
    path.write_bytes(gzip.compress(text[:1000]) + gzip.compress(text[1000:]) + b"\0" * 8)
    assert len(gw.load_trace(path)) == len(DEVICE_WORK) + 16
    path.write_bytes(gzip.compress(text) + b"not gzip")
    with pytest.raises(gw.InvalidArgument, match="corrupt gzip"):
        gw.load_trace(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is plain text, not gzip", "not gzip (its first bytes, 74 68 69 73, are not gzip's magic 1f 8b)"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1.', "not gzip (its first bytes, 7b 22 74 72, are not"),
        (b"\x28\xb5\x2f\xfd" + bytes(40), "zstd-compressed data, not gzip nor JSON"),
        (b"PK\x03\x04" + bytes(40), "a zip archive, not gzip nor JSON"),
    ],
    ids=["text", "truncated-json", "zstd", "zip"],
)
def test_a_file_named_gz_that_is_not_gzip_is_named_for_what_it_is(tmp_path, content, message):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(content)
    with pytest.raises(gw.InvalidArgument) as caught:
        gw.load_trace(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
    assert "truncated gzip" not in str(caught.value)


@pytest.mark.parametrize("category", ["kernel", "gpu_memcpy"])
def test_device_work_with_a_negative_dur_is_refused_naming_it(tmp_path, small_blocks, category):
    doc = kineto_doc()
    at, event = next((i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == category)
    event["dur"] = -2.5
    with pytest.raises(gw.InvalidArgument) as caught:
        gw.load_trace(write(doc, tmp_path / "t.json"))
    text = str(caught.value)
    assert f"traceEvents[{at}] ({category} {event['name']!r})" in text and "negative dur (-2.5 µs)" in text


@pytest.mark.parametrize("category", ["kernel", "gpu_user_annotation"])
def test_device_work_on_a_stream_below_minus_one_is_refused_naming_it(tmp_path, small_blocks, category):
    """Host rows are numbered from -2 down: device work numbered so would take one's place."""
    doc = kineto_doc()
    found = [(i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == category]
    if not found:  # a GPU annotation on the first kernel's device, over its time
        kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
        doc["traceEvents"].append({**kernel, "cat": category, "name": "annotated", "args": {"device": 0}})
        found = [(len(doc["traceEvents"]) - 1, doc["traceEvents"][-1])]
    at, event = found[0]
    event.setdefault("args", {})["stream"] = -5
    with pytest.raises(gw.InvalidArgument) as caught:
        gw.load_trace(write(doc, tmp_path / "t.json"))
    text = str(caught.value)
    assert f"traceEvents[{at}] ({category} {event['name']!r})" in text and "is on stream -5" in text


def test_a_host_range_with_a_negative_dur_still_counts_as_empty(tmp_path):
    doc = kineto_doc()
    next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")["dur"] = -1.0
    ranges = rows(gw.load_trace(write(doc, tmp_path / "t.json")), "range")
    assert (ranges["end_ns"] >= ranges["start_ns"]).all() and (ranges["end_ns"] == ranges["start_ns"]).sum() == 1


def test_an_event_without_ts_is_named_by_its_place_in_the_file(tmp_path, small_blocks):
    doc = kineto_doc()
    at = max(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    del doc["traceEvents"][at]["ts"]
    with pytest.raises(gw.InvalidArgument, match=re.escape(f"traceEvents[{at}] ('void at::native::reduce_kernel")):
        gw.load_trace(write(doc, tmp_path / "t.json"))


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"this is not json", "not JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1.0, "dur"', "truncated JSON"),
        (gzip.compress(json.dumps(kineto_doc()).encode())[:200], "truncated gzip"),
        (b'{"schemaVersion": 1}', "no traceEvents list"),
        (b'{"traceEvents": {"ph": "X"}}', "no traceEvents list"),
        (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}', "has no ts"),
        (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1}]}', "not a number"),
        (b'{"traceEvents": [3]}', "is not an object"),
        (b"", "the file is empty"),
        (b"  \n ", "the file is empty"),
        (b'{"traceEvents": [{"ph": "X", "name": "aten::m', "truncated JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1.', "truncated JSON"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1.0}, ', "truncated JSON"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1e300, "dur": 1}]}', "out of range"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "pid": [1], "tid": 1}]}', "neither a number"),
        (b'{"traceEvents": [], "gpuworkbench": {"stream_labels": [[0]]}}', "stream_labels"),
        (b'{"traceEvents": [], "gpuworkbench": {"locations": [["a.py", "3"]]}}', "locations are not"),
    ],
    ids=[
        "not-json",
        "truncated-json",
        "truncated-gzip",
        "no-events",
        "events-not-a-list",
        "no-ts",
        "bad-ts",
        "int",
        "empty",
        "blank",
        "cut-in-a-string",
        "cut-in-a-number",
        "cut-between-events",
        "ts-out-of-range",
        "pid-a-list",
        "bad-own-labels",
        "bad-own-locations",
    ],
)
def test_malformed_files_raise_invalid_argument_naming_the_file(tmp_path, content, message):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(gw.InvalidArgument) as caught:
        gw.load_trace(path)
    assert str(path) in str(caught.value) and message in str(caught.value)
    assert isinstance(caught.value, gw.GpuError)


def test_a_missing_file_raises_invalid_argument_naming_it(tmp_path):
    path = tmp_path / "nowhere" / "trace.json"
    with pytest.raises(gw.InvalidArgument, match="no such file") as caught:
        gw.load_trace(path)
    assert str(path) in str(caught.value)


# ---------------------------------------------------------------------------------------------- %gpu load


def test_gpu_load_shows_stores_and_records_the_trace(shell, capsys, tmp_path):
    path = write(kineto_doc(), tmp_path / "rank-0.json.gz", compress=True)
    shell.run_line_magic("gpu", f"load {path} -o pt")
    out = capsys.readouterr().out
    assert f"loaded {path}" in out and "NVIDIA H100" in out
    assert "idle %" in out and "(from ops)" in out  # the summary, as %%gpu shows it outside a notebook
    trace = shell.user_ns["pt"]
    assert isinstance(trace, Trace) and len(trace) == len(DEVICE_WORK) + 16
    record = history.history[-1]
    assert record.trace is trace and record.name == "pt" and record.source == path
    assert record.idle_pct == pytest.approx(trace.summary().idle_pct)
    assert record.window_ns == (ns(100.0), ns(430.0))

    from gpuworkbench.notebook import comm

    entry = comm.trace_entry(record)
    assert entry["id"] == trace.id and entry["spans"] == len(trace) and entry["name"] == "pt"
    shell.run_line_magic("gpu", f"load {path}")
    assert comm.trace_entry(history.history[-1])["name"] == "rank-0.json.gz"  # the panel names it by its file


@pytest.mark.parametrize(
    ("line", "message"),
    [("load", "give one trace file"), ("load a.json b.json", "give one trace file"), ("load a.json -o 1x", "-o takes")],
)
def test_gpu_load_bad_arguments_print_usage(shell, capsys, line, message):
    shell.run_line_magic("gpu", line)
    err = capsys.readouterr().err
    assert message in err and "usage: %gpu load" in err
    assert not history.history


def test_gpu_load_of_a_broken_file_prints_one_line(shell, capsys, tmp_path):
    path = tmp_path / "cut.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}')[:10])
    shell.run_line_magic("gpu", f"load {path}")
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert str(path) in captured.err and "truncated gzip" in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and not history.history


def test_a_helper_is_forked_only_without_other_threads_or_cuda(tmp_path, monkeypatch):
    import sys
    import threading

    from gpuworkbench.trace import kineto_helper

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(kineto_helper.SPAWN_MIN_BYTES + 1)  # sparse: its size is what counts
    middling = tmp_path / "middling.json"
    with open(middling, "wb") as f:
        f.truncate(kineto_helper.MIN_BYTES + 1)
    small = tmp_path / "small.json"
    small.write_bytes(b"[]")
    if sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("a helper needs Linux and two cores")
    for name in kineto_helper.CUDA_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    if threading.active_count() > 1:
        pytest.skip("another thread runs in this test process")
    assert kineto_helper.helper_kind(str(small)) is None  # too small to be worth a helper
    assert kineto_helper.helper_kind(str(big)) == "fork"
    monkeypatch.setitem(sys.modules, "cupy", object())
    assert kineto_helper.helper_kind(str(big)) == "spawn"  # a CUDA library is loaded: no fork
    assert kineto_helper.helper_kind(str(middling)) is None  # too small to pay for a Python's start
    monkeypatch.delitem(sys.modules, "cupy")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert kineto_helper.helper_kind(str(big)) == "spawn"  # another thread runs: no fork
    finally:
        stop.set()
        other.join()
