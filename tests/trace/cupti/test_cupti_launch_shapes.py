"""Kernels' launch shapes from CUPTI's kernel records: grid, block, registers per thread and static + dynamic shared
memory decoded into the span columns, for our own ops (the harvester's lean decode) and other libraries' kernels,
from hand-made buffers laid out as cupti.h's CUpti_ActivityKernel (no GPU, no libcupti)."""

from __future__ import annotations

import struct
import time

import numpy as np
from cupti_fakes import fake_cupti_module

from gpuworkbench.trace import cupti
from gpuworkbench.trace.cupti.foreign import ForeignRecords
from gpuworkbench.trace.cupti.layout import layout
from gpuworkbench.trace.cupti.ops import CuptiOps
from gpuworkbench.trace.cupti.walk import RecordWalker
from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.spans import KIND_CODE, pack_dim3, unpack_dim3

THREAD = 0x7F92_2C5C_2140 & 0xFFFF_FFFF  # the launching thread, as CUPTI reports it (low 32 bits)
MEMSET, API, KERNEL = 2, 5, 10  # CUPTI_ACTIVITY_KIND_MEMSET, RUNTIME, CONCURRENT_KERNEL
SIZES = {MEMSET: 64, API: 40, KERNEL: 200, 39: 24}
HOPPER = DeviceLimits(9, 0, 132, 32, 1024, 2048, 32, 65536, 65536, 233472, 232448, 1024)


def kernel_record(
    start: int,
    end: int,
    corr: int,
    grid: tuple[int, int, int] = (1, 1, 1),
    block: tuple[int, int, int] = (1, 1, 1),
    registers: int = 0,
    static: int = 0,
    dynamic: int = 0,
) -> bytes:
    """A CUpti_ActivityKernel record: registers per thread at byte 6, times, device 0, stream 7, grid and block at 52,
    static and dynamic shared memory at 76 and 80, the correlation id at 92 (no name)."""
    rec = bytearray(SIZES[KERNEL])
    struct.pack_into("<IxxH", rec, 0, KERNEL, registers)
    struct.pack_into("<QQ", rec, 16, start, end)
    struct.pack_into("<I", rec, 48, 7)
    struct.pack_into("<6i", rec, 52, *grid, *block)
    struct.pack_into("<ii", rec, 76, static, dynamic)
    struct.pack_into("<I", rec, 92, corr)
    return bytes(rec)


def memset_record(start: int, end: int, corr: int) -> bytes:
    """A CUpti_ActivityMemset record of 4 KiB: times, device 0 at 32, stream 7 at 40, the correlation id at 44."""
    rec = bytearray(SIZES[MEMSET])
    struct.pack_into("<IIQQQ", rec, 0, MEMSET, 0, 4096, start, end)
    struct.pack_into("<IxxxxII", rec, 32, 0, 7, corr)
    return bytes(rec)


def api_record(start: int, corr: int) -> bytes:
    return struct.pack("<IIQQIIII", API, 211, start, start + 500, 4242, THREAD, corr, 0)


def offline_source() -> cupti.CuptiSource:
    """A CuptiSource that decodes hand-made buffers by cupti.h's layouts (see test_cupti_windows.py)."""
    src = cupti.Lifecycle().new_source()
    walker = RecordWalker()
    for kind, size in SIZES.items():
        walker.size_words[kind] = size // 4
    src._raw = walker
    src._setup_tables(fake_cupti_module())
    return src


GEMM = {"grid": (128, 1, 1), "block": (256, 1, 1), "registers": 202, "static": 16_384, "dynamic": 32_768}
SMALL = {"grid": (64, 2, 1), "block": (16, 16, 1), "registers": 32, "static": 2_064, "dynamic": 0}


def test_a_full_flush_decodes_each_kernels_launch_shape_and_none_for_other_records():
    src = offline_source()
    src.ingest(
        kernel_record(1_000, 2_000, 7, **GEMM)
        + memset_record(2_100, 2_200, 8)
        + kernel_record(3_000, 3_100, 9, **SMALL)
    )
    out = src.flush_columns(eager=True, full=True)
    assert out["kind"].tolist() == ["kernel", "memset", "kernel"]
    assert [unpack_dim3(g) for g in out["grid"]] == [(128, 1, 1), None, (64, 2, 1)]
    assert [unpack_dim3(b) for b in out["block"]] == [(256, 1, 1), None, (16, 16, 1)]
    assert out["registers"].tolist() == [202, -1, 32]
    assert out["shared_bytes"].tolist() == [49_152, -1, 2_064]  # static + dynamic


def test_our_kernels_take_their_launch_shape_from_their_records_in_the_harvesters_lean_decode():
    src, ops = offline_source(), CuptiOps()
    ops.add(1, 0, 0, KIND_CODE["kernel"], 0, "gemm", -1, 1_000, None, False, 1_400, THREAD)
    ops.add(2, 0, 0, KIND_CODE["memset"], 4096, "memset", -1, 1_500, None, False, 1_900, THREAD)
    ops.add(3, 0, 0, KIND_CODE["kernel"], 0, "small", -1, 2_000, None, False, 2_400, THREAD)
    ops.take_rows(1)
    calls = api_record(1_100, 7) + api_record(1_600, 8) + api_record(2_100, 9)
    work = kernel_record(5_000, 6_000, 7, **GEMM) + memset_record(6_100, 6_200, 8)
    src.ingest(calls + work + kernel_record(7_000, 7_100, 9, **SMALL))
    out = src.flush_columns(eager=True, full=False, resolve=ops.resolve)
    assert out["external_id"].tolist() == [1, 2, 3] and "name" not in out  # lean: no names, kinds or bytes
    ops.add_records(out, 1)
    rows = ops.harvest(1, np.array([0]))
    assert rows["name"].tolist() == ["gemm", "memset", "small"]
    assert rows["grid"].tolist() == [pack_dim3(128), 0, pack_dim3(64, 2)]
    assert rows["block"].tolist() == [pack_dim3(256), 0, pack_dim3(16, 16)]
    assert rows["registers"].tolist() == [202, -1, 32] and rows["shared_bytes"].tolist() == [49_152, -1, 2_064]


def test_other_librarys_kernels_carry_their_launch_shape_into_their_spans():
    src = offline_source()
    src.ingest(kernel_record(1_000, 2_000, 7, **GEMM))
    out = src.flush_columns(eager=True, full=True)
    labels: dict = {}
    fr = ForeignRecords(
        lambda ordinals: np.zeros(ordinals.size, np.int64),
        lambda device, thread: -2,
        lambda device, stream, text: labels.update({(device, stream): text}),
        lambda runtime, cbid: "cudaLaunchKernel",
        lambda pointers: np.full(pointers.size, "gemm_kernel", dtype=object),
    )
    (device,) = fr.spans(out, {}, 0)
    assert device["name"].tolist() == ["gemm_kernel"] and device["kind"].tolist() == [KIND_CODE["kernel"]]
    assert unpack_dim3(device["grid"][0]) == (128, 1, 1) and unpack_dim3(device["block"][0]) == (256, 1, 1)
    assert device["registers"].tolist() == [202] and device["shared_bytes"].tolist() == [49_152]


def test_field_offsets_come_from_cupti_pythons_dtype_where_it_has_one():
    """cupti-python 13's activity_kernel10_dtype (measured on the H200): registers at 6 (uint16), static and dynamic
    shared memory at 76 and 80 (int32); a dtype that moved them wins over cupti.h's offsets, and says so."""
    module = fake_cupti_module()
    fields = {"registers_per_thread": (np.uint16, 6), "static_shared_memory": (np.int32, 76),
              "dynamic_shared_memory": (np.int32, 84), "grid_x": (np.int32, 52)}  # fmt: skip
    module.activity_kernel10_dtype = np.dtype(
        {"names": list(fields), "formats": [f for f, _ in fields.values()],
         "offsets": [o for _, o in fields.values()], "itemsize": 200}
    )  # fmt: skip
    found, sizes, notes = layout(module)
    kernel = found["kernel"]
    assert kernel["registers_per_thread"] == (6, 2) and kernel["static_shared_memory"] == (76, 4)
    assert kernel["dynamic_shared_memory"] == (84, 4) and sizes["kernel"] == 200
    assert "kernel.dynamic_shared_memory at (84, 4) per cupti-python, (80, 4) per cupti.h" in notes
    assert "kernel.block_x: built-in offset (64, 4)" in notes  # a field the dtype lacks keeps cupti.h's


def test_a_cupti_trace_holds_its_kernels_launch_shapes_and_their_occupancy():
    from gpuworkbench.trace.recorder import DeviceClock, Trace

    t = Trace(interval_s=0.005)
    t._cupti = offline_source()
    t._clocks_sampled = True  # the hand-made records are on the host's clock: offsets 0
    t._devices[0] = DeviceClock(key="cuda:0", name="offline H100", source="cupti", limits=HOPPER)
    t._cupti_flags.append(True)
    t.start()
    try:
        base = time.time_ns()
        for op, name, corr, shape in ((1, "gemm", 7, GEMM), (2, "small", 8, SMALL)):
            t0 = base + op * 10_000
            t._cupti_ops.add(op, 0, 0, KIND_CODE["kernel"], 0, name, -1, t0, None, False, t0 + 1_000, THREAD)
            t._cupti.ingest(api_record(t0 + 500, corr) + kernel_record(t0 + 5_000, t0 + 9_000, corr, **shape))
    finally:
        t.stop()
    assert t.wait_pending(5) and t.stats.lost == 0
    table = t.table()
    assert table["name"].tolist() == ["gemm", "small"]
    assert table["registers"].tolist() == [202, 32] and table["shared_bytes"].tolist() == [49_152, 2_064]
    kernels = t.statistics().kernels
    by_name = {row["name"]: row for row in kernels.to_dict("records")}
    assert (by_name["gemm"]["grid"], by_name["gemm"]["block"]) == ("128,1,1", "256,1,1")
    assert by_name["gemm"]["occupancy_pct"] == 12.5 and by_name["small"]["occupancy_pct"] == 100.0
    assert [a.code for a in t.summary().advice].count("low-occupancy") == 1
