"""Tests of trace/export.py: the Chrome trace's Kineto layout, and HolisticTraceAnalysis reading it as we do."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.trace.analysis import total_length, union
from gpuworkbench.trace.export import HOST_PID, STREAM_OFFSET, chrome_trace
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import KIND_CODE

US = 1_000  # ns

#: One device, three streams: copies overlapping kernels, a pageable copy, a device copy, a memset, gaps, and
#: host-side allocations (outside the busy span on purpose: they are bookkeeping, not device work).
RECORDS = [
    {"kind": "alloc", "stream": -1, "start_ns": 10 * US, "end_ns": 12 * US, "bytes": 1 << 20, "name": "alloc 1 MiB"},
    {"kind": "h2d", "stream": 0, "start_ns": 100 * US, "end_ns": 200 * US, "bytes": 1 << 20, "pinned": True,
     "enqueue_ns": 90 * US, "name": "h2d 1 MiB"},
    {"kind": "kernel", "stream": 1, "start_ns": 150 * US, "end_ns": 300 * US, "name": "saxpy", "enqueue_ns": 95 * US},
    {"kind": "kernel", "stream": 1, "start_ns": 320 * US, "end_ns": 380 * US, "name": "saxpy", "enqueue_ns": 96 * US},
    {"kind": "d2h", "stream": 2, "start_ns": 360 * US, "end_ns": 450 * US, "bytes": 1 << 20, "pinned": False,
     "enqueue_ns": 97 * US},
    {"kind": "d2d", "stream": 1, "start_ns": 500 * US, "end_ns": 510 * US, "bytes": 1 << 20},
    {"kind": "memset", "stream": 0, "start_ns": 600 * US, "end_ns": 620 * US, "bytes": 4096},
    {"kind": "free", "stream": -1, "start_ns": 700 * US, "end_ns": 701 * US, "bytes": 1 << 20, "name": "free 1 MiB"},
]  # fmt: skip


def exported(trace: Trace, tmp_path, name: str = "run.json") -> dict:
    path = tmp_path / name
    returned = chrome_trace(trace, str(path))
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)  # valid JSON
    assert doc == json.loads(json.dumps(returned))
    return doc


def by_phase(doc: dict, phase: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == phase]


def test_metadata_names_every_process_and_thread(tmp_path):
    records = RECORDS + [{**RECORDS[2], "device": 1, "stream": 4}]
    doc = exported(Trace.from_records(records, device_names={0: "first", 1: "second"}), tmp_path)
    meta = by_phase(doc, "M")
    process_names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    slices = by_phase(doc, "X")
    assert {e["pid"] for e in slices} <= set(process_names)
    assert {(e["pid"], e["tid"]) for e in slices} <= set(thread_names)
    assert process_names[0].endswith("first") and process_names[1].endswith("second")
    assert process_names[HOST_PID] == "host"
    # A thread per stream, named with our stream number; tid is Kineto's positive stream number.
    assert thread_names[(0, 0 + STREAM_OFFSET)] == "stream 0"
    assert thread_names[(1, 4 + STREAM_OFFSET)] == "stream 4"
    assert {e["name"] for e in meta} >= {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
    assert doc["distributedInfo"]["rank"] == 0
    assert doc["schemaVersion"] == 1


def test_slices_carry_kineto_categories_names_and_copy_args(tmp_path):
    doc = exported(Trace.from_records(RECORDS), tmp_path)
    device = [e for e in by_phase(doc, "X") if e["pid"] != HOST_PID]
    assert [e["cat"] for e in device] == ["gpu_memcpy", "kernel", "kernel", "gpu_memcpy", "gpu_memcpy", "gpu_memset"]
    assert [e["name"] for e in device] == [
        "Memcpy HtoD (Pinned -> Device)",
        "saxpy",
        "saxpy",
        "Memcpy DtoH (Device -> Pageable)",
        "Memcpy DtoD (Device -> Device)",
        "Memset (Device)",
    ]
    h2d = device[0]
    assert (h2d["ts"], h2d["dur"]) == (90.0, 100.0)  # µs from the first event (the alloc at 10 µs)
    assert h2d["args"]["bytes"] == 1 << 20
    assert h2d["args"]["memory bandwidth (GB/s)"] == pytest.approx((1 << 20) / (100 * US), abs=1e-3)
    assert h2d["args"]["copy kind"] == "HtoD" and h2d["args"]["pinned"] is True
    assert device[3]["args"]["pinned"] is False
    for e in device:
        assert e["tid"] == e["args"]["stream"] > 0
        assert e["pid"] == e["args"]["device"] == 0
        if e["cat"] != "kernel":
            assert e["args"]["bytes"] > 0 and e["args"]["memory bandwidth (GB/s)"] > 0


def test_host_rows_hold_enqueues_linked_to_their_spans_and_allocations(tmp_path):
    doc = exported(Trace.from_records(RECORDS), tmp_path)
    slices = by_phase(doc, "X")
    host = [e for e in slices if e["pid"] == HOST_PID]
    assert [e["name"] for e in host if e["cat"] == "cuda_runtime" and "correlation" not in e["args"]] == [
        "alloc 1 MiB",
        "free 1 MiB",
    ]
    launches = {e["args"]["correlation"]: e for e in host if "correlation" in e["args"]}
    device = {e["args"]["correlation"]: e for e in slices if e["pid"] != HOST_PID}
    assert len(launches) == 4  # the ops with an enqueue time
    for correlation, launch in launches.items():
        assert launch["ts"] <= device[correlation]["ts"]
    flows = defaultdict(dict)
    for e in doc["traceEvents"]:
        if e["ph"] in "sf":
            assert e["cat"] == "ac2g"
            flows[e["id"]][e["ph"]] = e
    assert set(flows) == set(launches)
    for correlation, pair in flows.items():
        assert (pair["s"]["pid"], pair["s"]["ts"]) == (HOST_PID, launches[correlation]["ts"])
        span = device[correlation]
        assert (pair["f"]["pid"], pair["f"]["tid"], pair["f"]["ts"]) == (0, span["tid"], span["ts"])


def test_runtime_events_can_be_left_out_and_gzip_is_written(tmp_path):
    trace = Trace.from_records(RECORDS)
    slim = chrome_trace(trace, runtime_events=False)
    assert not [e for e in slim["traceEvents"] if e["ph"] in "sf"]
    assert all("correlation" not in e["args"] for e in slim["traceEvents"] if e.get("cat") == "cuda_runtime")
    doc = exported(trace, tmp_path, "run.json.gz")
    assert len(by_phase(doc, "X")) == len(RECORDS) + 4


def test_empty_trace_exports(tmp_path):
    doc = exported(Trace.from_records([]), tmp_path)
    assert by_phase(doc, "X") == []


def test_recorded_trace_names_streams_by_label(tmp_path):
    dev = gw.Device("cpu")
    stream = dev.create_stream("upload")
    host = np.ones(1024, np.float32)
    with gw.trace() as t:
        buf = dev.alloc(1024)
        buf.copy_from_host_async(host, stream).wait()
        buf.free()
    doc = exported(t, tmp_path)
    threads = [e["args"]["name"] for e in by_phase(doc, "M") if e["name"] == "thread_name"]
    assert f"stream {stream.id} upload" in threads
    (copy,) = [e for e in by_phase(doc, "X") if e["cat"] == "gpu_memcpy"]
    assert copy["name"].startswith("Memcpy HtoD") and copy["args"]["bytes"] == 4096


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5 on pandas 3
def test_hta_temporal_breakdown_agrees_with_idle_pct(tmp_path):
    """HTA's idle % of our export equals ``summary().idle_pct``.

    HTA (``BreakdownAnalysis.get_temporal_breakdown``) takes every event whose ``args.stream`` is set (kernels, memcpys
    and memsets alike), measures "kernel time" from the first start to the last end of them over the whole rank, and
    idle = that span minus the union of the events. That is our idle % = (|W| − |K ∪ C|) / |W| with W = [first op
    start, last op end] for a single-device trace (HTA would merge all devices of a rank into one; we summarise each
    device), and host events (alloc/free, enqueues) count in neither. HTA rounds fractional-µs timestamps inward, so
    the trace is built on whole µs; HTA reports percentages rounded to 0.01.
    """
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    trace = Trace.from_records(RECORDS)
    (tmp_path / "traces").mkdir()
    chrome_trace(trace, str(tmp_path / "traces" / "rank0.json"))
    breakdown = TraceAnalysis(trace_dir=str(tmp_path / "traces")).get_temporal_breakdown(visualize=False)
    ours = trace.summary()
    row = breakdown.iloc[0]
    assert row["kernel_time(us)"] * US == ours.window_ns
    assert row["idle_time(us)"] * US == ours.states["idle"]
    assert row["idle_time_pctg"] == pytest.approx(ours.idle_pct, abs=0.01)
    # HTA's "compute" is the union of events not named Memcpy*/Memset*: our kernels only, which the names decide.
    table = trace.table()
    kernels = table["kind"] == KIND_CODE["kernel"]
    assert row["compute_time(us)"] * US == total_length(union(table["start_ns"][kernels], table["end_ns"][kernels]))
