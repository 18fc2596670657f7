"""Other libraries' CUDA work as spans (``others=True``), from hand-made CUPTI columns: runs without a GPU.

On a GPU, tests/trace/test_cuda_any_code.py checks the same end to end with CuPy and PyTorch."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.errors import InvalidArgument
from gpuworkbench.ranges import NVTX_DOMAIN
from gpuworkbench.trace import cupti
from gpuworkbench.trace.cupti.binding import other_client, read_c_string
from gpuworkbench.trace.cupti.clock import TickClock
from gpuworkbench.trace.cupti.decode import kernel_name
from gpuworkbench.trace.cupti.foreign import FOREIGN_STREAM_BASE, ForeignRecords, demangle, library_of
from gpuworkbench.trace.recorder import Trace
from gpuworkbench.trace.spans import KIND_CODE, pack_dim3, unpack_dim3

NAMES = {0: "", 11: "_Z6scale2Pfi", 12: "void at::native::vectorized_elementwise_kernel<4>(int)"}
OFFSET = 1_000  # CUPTI clock minus host clock


class Rows:
    """What a Trace gives ForeignRecords: device numbers, host thread rows and stream labels, recorded for checks."""

    def __init__(self) -> None:
        self.labels: dict[tuple[int, int], str] = {}
        self.threads: dict[int, int] = {}

    def device_of(self, ordinals: np.ndarray) -> np.ndarray:
        return np.asarray(ordinals, np.int64) + 10  # CUDA ordinal n is trace device 10 + n

    def thread_row(self, device: int, thread: int) -> int:
        return -2 - self.threads.setdefault(thread, len(self.threads))

    def label(self, device: int, stream: int, text: str) -> None:
        self.labels[(device, stream)] = text


def foreign() -> tuple[ForeignRecords, Rows]:
    rows = Rows()
    names_of = np.vectorize(lambda p: NAMES[int(p)], otypes=[object])

    def api_name(runtime: int, cbid: int) -> str:
        return ("cudaLaunchKernel" if runtime else "cuLaunchKernel") if cbid == 1 else "cudaMemcpyAsync"

    return ForeignRecords(rows.device_of, rows.thread_row, rows.label, api_name, names_of), rows


def records(**columns) -> dict[str, np.ndarray]:
    n = len(columns["start"])
    base = {
        "kind": np.full(n, "kernel", dtype=object),
        "bytes": np.zeros(n, np.int64),
        "name": np.zeros(n, np.int64),
        "pinned": np.full(n, -1, np.int64),
        "stream_id": np.full(n, 7, np.int64),
        "device_id": np.zeros(n, np.int64),
        "correlation_id": np.arange(n, dtype=np.int64) + 100,
        "runtime_correlation_id": np.zeros(n, np.int64),
        "grid": np.zeros(n, np.int64),
        "block": np.zeros(n, np.int64),
        "registers": np.full(n, -1, np.int64),
        "shared_bytes": np.full(n, -1, np.int64),
        "external_id": np.full(n, -1, np.int64),
    }
    base.update({k: np.asarray(v) for k, v in columns.items()})
    base["end"] = np.asarray(columns["end"], np.int64)
    base["start"] = np.asarray(columns["start"], np.int64)
    return base


def calls(corr, start, thread=77, cbid=1, runtime=1) -> dict[str, np.ndarray]:
    n = len(corr)
    return {
        "thread": np.full(n, thread, np.int64),
        "start": np.asarray(start, np.int64),
        "end": np.asarray(start, np.int64) + 300,
        "correlation_id": np.asarray(corr, np.int64),
        "cbid": np.full(n, cbid, np.int64),
        "runtime": np.full(n, runtime, np.int64),
    }


def test_other_librarys_kernels_become_spans_linked_to_the_calls_that_launched_them():
    fr, rows = foreign()
    recs = records(
        start=[5_000, 6_000],
        end=[5_500, 6_400],
        name=[11, 12],
        stream_id=[9, 7],
        correlation_id=[100, 101],
        grid=pack_dim3([4, 8], [1, 2], [1, 1]),
        block=pack_dim3([128, 256]),
        registers=[40, 202],
        shared_bytes=[0, 49_152],
    )
    blocks = fr.spans(recs, {"api": calls([100, 101], [4_000, 4_500])}, OFFSET)
    device, api = blocks
    assert device["kind"].tolist() == [KIND_CODE["kernel"]] * 2
    assert device["device"].tolist() == [10, 10]
    assert device["stream"].tolist() == [FOREIGN_STREAM_BASE + 9, FOREIGN_STREAM_BASE + 7]
    assert device["name"].tolist() == ["scale2(float*, int)", NAMES[12]]  # demangled; a readable one kept
    assert device["start_ns"].tolist() == [4_000, 5_000] and device["end_ns"].tolist() == [4_500, 5_400]
    assert device["enqueue_ns"].tolist() == [3_000, 3_500]  # the launching call's start, on the host clock
    assert device["corr"].tolist() == [100, 101]
    assert [unpack_dim3(g) for g in device["grid"]] == [(4, 1, 1), (8, 2, 1)]
    assert unpack_dim3(device["block"][1]) == (256, 1, 1)
    assert device["registers"].tolist() == [40, 202] and device["shared_bytes"].tolist() == [0, 49_152]
    assert api["kind"].tolist() == [KIND_CODE["api"]] * 2 and api["corr"].tolist() == [100, 101]
    assert api["name"].tolist() == ["cudaLaunchKernel"] * 2 and api["stream"].tolist() == [-2, -2]
    assert api["start_ns"].tolist() == [3_000, 3_500] and api["end_ns"].tolist() == [3_300, 3_800]
    assert rows.labels[(10, FOREIGN_STREAM_BASE + 7)] == "torch stream 7"
    assert rows.labels[(10, FOREIGN_STREAM_BASE + 9)] == "CUDA stream 9"


def test_a_call_waits_for_its_copy_record_and_pinned_and_pageable_copies_keep_their_kind():
    fr, _ = foreign()
    assert fr.spans(None, {"api": calls([200, 201], [1_000, 2_000], cbid=2)}, OFFSET) == []
    recs = records(
        start=[3_000, 4_000],
        end=[3_900, 4_800],
        kind=np.array(["h2d", "d2h"], dtype=object),
        bytes=[1 << 20, 1 << 20],
        pinned=[0, 1],
        correlation_id=[0, 0],
        runtime_correlation_id=[200, 201],  # a runtime memcpy: CUPTI ties the record to the runtime call
    )
    device, api = fr.spans(recs, {}, OFFSET)
    assert device["kind"].tolist() == [KIND_CODE["h2d"], KIND_CODE["d2h"]]
    assert device["pinned"].tolist() == [0, 1] and device["bytes"].tolist() == [1 << 20] * 2
    assert device["corr"].tolist() == [200, 201] and api["name"].tolist() == ["cudaMemcpyAsync"] * 2


def test_unlinked_device_work_still_shows_without_an_enqueue_time():
    fr, _ = foreign()
    (device,) = fr.spans(records(start=[10], end=[20], name=[11]), {}, 0)
    assert device["enqueue_ns"].tolist() == [-1] and device["corr"].tolist() == [-1]


def test_other_libraries_allocations_are_counted_and_the_workbenchs_own_are_not():
    fr, _ = foreign()
    fr.own_addresses.add(0xAAA0)
    mem = {
        "memory_operation_type": np.array([1, 1, 2, 1, 1]),  # alloc, alloc, free, alloc (ours), alloc (pinned host)
        "memory_kind": np.array([3, 3, 3, 3, 2]),
        "correlation_id": np.arange(5),
        "address": np.array([0x1000, 0x2000, 0x1000, 0xAAA0, 0x3000]),
        "bytes": np.array([64 << 20, 1 << 20, 64 << 20, 8 << 20, 4 << 20]),
        "timestamp": np.array([100, 200, 300, 250, 260]),
        "device_id": np.zeros(5, np.int64),
        "stream_id": np.zeros(5, np.int64),
    }
    (block,) = fr.spans(None, {"memory": mem}, 0)
    assert block["kind"].tolist() == [KIND_CODE["alloc"], KIND_CODE["alloc"], KIND_CODE["free"]]
    assert block["bytes"].tolist() == [64 << 20, 1 << 20, 64 << 20] and block["stream"].tolist() == [-1] * 3
    assert block["name"].tolist()[0] == "cudaMalloc 64.0 MiB"
    assert fr.other_bytes == {10: 1 << 20}


def test_nvtx_ranges_pair_across_harvests_and_the_workbenchs_own_domain_is_skipped():
    fr, rows = foreign()

    def marks(flags, ids, stamps, names, domains):
        n = len(flags)
        return {
            "flags": np.array(flags),
            "timestamp": np.array(stamps),
            "id": np.array(ids),
            "thread_id": np.full(n, 55),
            "name": np.array(names, dtype=object),
            "domain": np.array(domains, dtype=object),
        }

    first = marks([2, 2, 1], [1, 2, 3], [100, 110, 120], ["matmul", "step", "here"], ["", NVTX_DOMAIN, ""])
    (block,) = fr.spans(None, {"marker": first}, 0)
    assert block["kind"].tolist() == [KIND_CODE["marker"]] and block["name"].tolist() == ["here"]
    second = marks([4, 4], [1, 2], [400, 410], ["", ""], ["", NVTX_DOMAIN])
    (block,) = fr.spans(None, {"marker": second}, 0)
    assert block["kind"].tolist() == [KIND_CODE["range"]] and block["name"].tolist() == ["matmul"]
    assert (block["start_ns"].tolist(), block["end_ns"].tolist()) == ([100], [400])
    assert block["stream"].tolist() == [-2] and rows.threads == {55: 0}


def test_demangling_and_library_names():
    assert demangle("_Z6scale2Pfi") == "scale2(float*, int)"
    assert demangle("cupy_multiply__float32") == "cupy_multiply__float32"
    assert demangle("_Znot a symbol") == "_Znot a symbol"
    assert library_of("void at::native::foo()") == "torch" and library_of("cupy_add") == "cupy"
    assert library_of("sgemm_128x64") == ""


def test_kernel_names_are_read_without_touching_unmapped_memory():
    text = ctypes.create_string_buffer(b"my_kernel(float*)")
    assert read_c_string(ctypes.addressof(text)) == "my_kernel(float*)"
    assert read_c_string(4096) == ""  # the first page is never mapped: no crash, no name
    assert kernel_name(0) == ""


def test_dim3_packing_round_trips():
    assert unpack_dim3(pack_dim3(2_147_483_647, 65_535, 64)) == (2_147_483_647, 65_535, 64)
    assert unpack_dim3(0) is None


def test_other_libraries_are_captured_unless_turned_off(monkeypatch):
    monkeypatch.delenv("GPUWB_TRACE_OTHERS", raising=False)
    assert Trace().others is True and Trace(others=False).others is False
    monkeypatch.setenv("GPUWB_TRACE_OTHERS", "0")
    assert Trace().others is False and gw.trace(others=True).others is True


def test_another_cupti_client_is_recognised(monkeypatch):
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    enabled = [True]
    autograd = types.SimpleNamespace(_profiler_enabled=lambda: enabled[0])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=types.SimpleNamespace(_autograd=autograd)))
    assert "torch.profiler" in other_client()
    enabled[0] = False
    assert other_client() == ""
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    assert "Nsight" in other_client()


def test_torch_profiler_start_hands_cupti_over_first(monkeypatch):
    for name, value in (("ticks", False), ("ref", None), ("per_ns", 1.0)):
        monkeypatch.setattr(cupti.LIFECYCLE.clock, name, value)  # the hook marks CUPTI's clock as possibly changed
    from gpuworkbench.trace import recorder_cupti

    seen = []
    module = types.SimpleNamespace(_prepare_profiler=lambda *a: seen.append(("torch", a)))
    monkeypatch.setitem(sys.modules, "torch.autograd.profiler", module)
    recorder_cupti.hook_torch_profiler()
    recorder_cupti.hook_torch_profiler()  # once only
    owner = types.SimpleNamespace(_yield_cupti=lambda reason: seen.append(("trace", reason)))
    monkeypatch.setattr(recorder_cupti.OWNER, "trace", owner)
    module._prepare_profiler("config", {"CUDA"})
    assert [who for who, _ in seen] == ["trace", "torch"] and "torch.profiler" in seen[0][1]
    assert seen[1][1] == ("config", {"CUDA"})
    assert cupti.timestamps_are_ticks()  # CUPTI's timestamps are calibrated against the host clock from now on


def test_gw_range_marks_host_time_on_the_threads_row():
    dev = gw.Device(backend="cpu")
    with gw.trace() as t:
        with gw.range("step"):
            with dev.alloc(1000, "float32") as buf:
                buf.copy_from_host(np.ones(1000, np.float32))
    ranges = [s for s in t.spans if s.kind == "range"]
    assert [s.name for s in ranges] == ["step"] and ranges[0].stream == -2
    h2d = next(s for s in t.spans if s.kind == "h2d")
    assert ranges[0].start_ns <= h2d.enqueue_ns and h2d.end_ns <= ranges[0].end_ns
    assert t.stream_labels[(0, -2)].startswith("host ")
    with pytest.raises(InvalidArgument, match="non-empty name"):
        with gw.range(""):
            pass


def test_work_launched_after_the_trace_stopped_is_not_kept():
    """CUPTI runs on after a trace stops (until its own ops are in): work launched then is not the trace's; where no
    launching call is known, the device start decides."""
    fr, _ = foreign()
    recs = records(
        start=[5_000, 6_000, 9_000, 3_500, 8_000],
        end=[5_500, 6_400, 9_100, 3_600, 8_100],
        correlation_id=[100, 101, 102, 103, 104],
    )
    blocks = fr.spans(recs, {"api": calls([100, 101, 102], [1_500, 4_500, 8_000])}, OFFSET)
    t = Trace()
    t.started_ns, t.stopped_ns = 2_000, 6_000
    device, api = (t._in_window(b) for b in blocks)
    assert device["corr"].tolist() == [100, 101, -1]  # launched at 500 and 3 500 (host clock); 103 started at 2 500
    assert api["corr"].tolist() == [100, 101]
    t.stopped_ns = 0  # still recording: no end to the window
    assert t._in_window(blocks[1])["corr"].tolist() == [100, 101, 102]


def test_tick_timestamps_after_another_profiler_are_mapped_back_to_nanoseconds():
    """After torch.profiler, CUPTI's timestamps can be CPU ticks (Kineto's timestamp callback stays registered): they
    are mapped back to ns by a line through a reference sample and the latest one; 0 (no timestamp) stays 0."""
    clock = TickClock()
    assert clock.to_ns(5_000) == 5_000  # nanoseconds already: untouched
    clock.may_change()
    rate, ref_ticks, ref_ns = 2.1, 300_000_000_000, 1_000_000_000
    clock.calibrate(ref_ticks, ref_ns)
    clock.calibrate(ref_ticks + int(rate * 50_000_000), ref_ns + 50_000_000)  # 50 ms later
    assert clock.per_ns == pytest.approx(rate)
    ticks = np.array([ref_ticks + int(rate * 10_000), ref_ticks + int(rate * 30_000_000), 0], np.int64)
    ns = clock.to_ns(ticks)
    assert ns.tolist() == [ref_ticks + 10_000, ref_ticks + 30_000_000, 0]
    assert np.diff(ns[:2]).item() == 29_990_000  # durations in ns again
    clock.may_change()  # a new profiler session: calibration starts over
    clock.calibrate(7, 1)
    clock.calibrate(7 + 2_000_000, 1 + 2_000_000)  # a clock in ns: rate 1
    assert clock.to_ns(123_456) == 123_456


def test_the_api_filter_is_set_once_and_cleared_for_another_tool():
    """Setting CUPTI's per-API switches is one call per API (~1.5 ms a trace start): set once, kept while no kind of
    ours is on, cleared when torch.profiler takes CUPTI (it then records every call again)."""
    import enum

    calls: list[tuple[str, int, int]] = []
    driver = enum.IntEnum("driver", {"INVALID": 0, "cuLaunchKernel": 1, "cuCtxGetCurrent": 2})
    runtime = enum.IntEnum("runtime", {"INVALID": 0, "cudaLaunchKernel_v7000": 1, "cudaGetDevice_v3020": 2})
    fake = types.SimpleNamespace(
        driver_api_trace_cbid=driver,
        runtime_api_trace_cbid=runtime,
        activity_enable_driver_api=lambda cbid, on: calls.append(("driver", cbid, on)),
        activity_enable_runtime_api=lambda cbid, on: calls.append(("runtime", cbid, on)),
    )
    life = cupti.Lifecycle()
    source = life.new_source()
    source._cupti = fake
    assert source._filter_api(True)
    assert sorted(calls) == [("driver", 1, 1), ("driver", 2, 0), ("runtime", 1, 1), ("runtime", 2, 0)]
    calls.clear()
    source.disable_all()
    assert source._filter_api(True) and calls == []  # the next trace's start: nothing to set
    assert source._filter_api(False) and sorted(calls) == [
        ("driver", 1, 1),
        ("driver", 2, 1),
        ("runtime", 1, 1),
        ("runtime", 2, 1),
    ]
    assert not life.api_filter.on
