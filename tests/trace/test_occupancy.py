"""Tests of trace/occupancy.py and trace/device_limits.py: theoretical occupancy computed by hand as CUDA's occupancy
calculator does, for an H100 / H200 (compute capability 9.0) and devices whose limits differ; limits read from
cudaDeviceProp's and Kineto's property names."""

from __future__ import annotations

import numpy as np
import pytest

from gpuworkbench.trace.device_limits import DeviceLimits, limits_of
from gpuworkbench.trace.occupancy import LIMITERS, block_threads, occupancy, table_occupancy
from gpuworkbench.trace.spans import pack_dim3, table_from_records

#: An H100 / H200 as CuPy's getDeviceProperties names its limits.
HOPPER_PROPS = {
    "major": 9,
    "minor": 0,
    "multiProcessorCount": 132,
    "warpSize": 32,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiProcessor": 2048,
    "maxBlocksPerMultiProcessor": 32,
    "regsPerMultiprocessor": 65536,
    "regsPerBlock": 65536,
    "sharedMemPerMultiprocessor": 233472,
    "sharedMemPerBlockOptin": 232448,
    "reservedSharedMemPerBlock": 1024,
}
HOPPER = DeviceLimits.from_properties(HOPPER_PROPS)


def one(threads: int, registers: int, shared: int, limits: DeviceLimits = HOPPER) -> tuple[float, int, str]:
    """(occupancy %, resident blocks per SM, what binds) of one launch."""
    occ = occupancy(np.array([threads]), np.array([registers]), np.array([shared]), limits)
    return float(occ.pct[0]), int(occ.blocks[0]), LIMITERS[int(occ.limiter[0])]


def test_hopper_limits_are_read_from_cudas_property_names():
    assert HOPPER is not None
    assert (HOPPER.sms, HOPPER.warps_per_sm, HOPPER.blocks_per_sm) == (132, 64, 32)
    assert (HOPPER.registers_per_sm, HOPPER.shared_per_sm, HOPPER.shared_per_block) == (65536, 233472, 232448)
    assert (HOPPER.reserved_shared, HOPPER.shared_unit, HOPPER.register_unit) == (1024, 128, 256)


def test_202_registers_at_256_threads_leave_room_for_one_block():
    # 202 × 32 = 6464 registers a warp, rounded up to 6656; a sub-partition's 16384 hold 2 such warps, the SM 8:
    # one block of 8 warps, 8 of 64 = 12.5 %
    assert one(256, 202, 49152) == (12.5, 1, "registers")


def test_32_registers_512_threads_and_2064_bytes_of_shared_memory_fill_the_sm():
    # 4 blocks of 16 warps: the SM's 64 warps (registers allow 4 blocks too: a tie goes to registers); shared
    # memory would allow 233472 // 3200 = 72 (2064 + 1024 reserved, rounded up to 128 B)
    assert one(512, 32, 2064) == (100.0, 4, "registers")
    assert one(512, 16, 2064) == (100.0, 4, "block size")


def test_shared_memory_binds_with_the_reserve_and_the_allocation_unit():
    # 100 000 + 1024 reserved → 101 120 (a multiple of 128): 233472 // 101120 = 2 blocks of 8 warps = 25 %
    assert one(256, 32, 100_000) == (25.0, 2, "shared memory")
    # 48 KiB exactly: 49152 + 1024 = 50176 → 4 blocks of 4 warps = 16 of 64 warps
    assert one(128, 32, 49152) == (25.0, 4, "shared memory")
    # more than a block may opt in to (232448 + the reserve): fits nowhere
    assert one(128, 32, 232449) == (0.0, 0, "shared memory")


def test_small_blocks_hit_the_resident_block_limit():
    # 32 blocks of one warp: 32 of 64 warps; a block of 40 threads takes 2 warps
    assert one(32, 16, 0) == (50.0, 32, "block size")
    assert one(40, 16, 0) == (100.0, 32, "block size")


def test_register_limits_per_block_and_per_thread_fit_nothing():
    assert one(1024, 64, 0)[:2] == (50.0, 1)  # 64 × 32 = 2048 a warp × 32 warps = all 65536: one block
    assert one(1024, 65, 0) == (0.0, 0, "registers")  # 2304 a warp × 32 warps > the 65536 a block may have
    assert one(32, 256, 0) == (0.0, 0, "registers")  # past 255 registers a thread
    assert one(1025, 16, 0) == (0.0, 0, "block size")  # past the threads a block may have


def test_unknown_registers_or_shared_memory_or_block_give_nan():
    occ = occupancy(np.array([256, 256, 0]), np.array([-1, 32, 32]), np.array([0, -1, 0]), HOPPER)
    assert np.isnan(occ.pct).all() and occ.blocks.tolist() == [-1, -1, -1] and occ.limiter.tolist() == [0, 0, 0]


def test_other_compute_capabilities_take_their_own_limits():
    # an RTX 3090 (8.6): 1536 threads and 16 blocks an SM, 100 KiB of shared memory
    ampere = DeviceLimits.from_properties(
        {**HOPPER_PROPS, "minor": 6, "maxThreadsPerMultiProcessor": 1536, "maxBlocksPerMultiProcessor": 16,
         "sharedMemPerMultiprocessor": 102400, "sharedMemPerBlockOptin": 101376}
    )  # fmt: skip
    assert ampere.warps_per_sm == 48
    assert one(32, 16, 0, ampere) == pytest.approx((100 * 16 / 48, 16, "block size"))
    # a V100 (7.0): shared memory in 256 B units, nothing reserved
    volta = DeviceLimits.from_properties(
        {**HOPPER_PROPS, "major": 7, "maxThreadsPerMultiProcessor": 2048, "reservedSharedMemPerBlock": 0,
         "sharedMemPerMultiprocessor": 98304, "sharedMemPerBlockOptin": 98304}
    )  # fmt: skip
    assert volta.shared_unit == 256
    # 19 584 B is 153 units of 128 (5 blocks would fit) but takes 77 units of 256 = 19 712: 98304 // 19712 = 4 blocks
    assert one(128, 32, 19_584, volta) == (25.0, 4, "shared memory")


def test_kinetos_device_properties_give_the_limits_it_leaves_out_by_compute_capability():
    kineto = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_029_158_912, "computeMajor": 9,
              "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
              "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
              "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
              "sharedMemPerMultiprocessor": 233472}  # fmt: skip
    assert DeviceLimits.from_properties(kineto) == HOPPER
    ada = DeviceLimits.from_properties({**kineto, "computeMajor": 8, "computeMinor": 9})
    assert (ada.blocks_per_sm, ada.reserved_shared) == (24, 1024)
    turing = DeviceLimits.from_properties({**kineto, "computeMajor": 7, "computeMinor": 5})
    assert (turing.blocks_per_sm, turing.reserved_shared) == (16, 0)


def test_properties_written_by_an_export_read_back_the_same():
    assert DeviceLimits.from_properties(HOPPER.properties()) == HOPPER
    assert set(HOPPER.properties()) >= {"computeMajor", "numSms", "maxBlocksPerMultiProcessor"}


@pytest.mark.parametrize(
    "props",
    [
        {},  # a name only
        {"id": 0, "name": "AMD Instinct MI300X", "gcnArchName": "gfx942", "maxSharedMemoryPerMultiProcessor": 65536},
        {**HOPPER_PROPS, "regsPerMultiprocessor": 0},
        {**HOPPER_PROPS, "warpSize": "32"},
        {k: v for k, v in HOPPER_PROPS.items() if k != "sharedMemPerMultiprocessor"},
    ],
)
def test_limits_that_are_missing_or_not_positive_ints_are_none(props):
    assert DeviceLimits.from_properties(props) is None


def test_a_tables_kernels_get_their_devices_occupancy_and_the_rest_nan():
    table = table_from_records(
        [
            {"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 10, "device": 0, "block": (256, 1, 1),
             "registers": 202, "shared_bytes": 49152},
            {"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 10, "device": 1, "block": (16, 16, 2),
             "registers": 32, "shared_bytes": 0},
            {"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 10, "device": 2, "block": (256, 1, 1),
             "registers": 32, "shared_bytes": 0},
            {"kind": "h2d", "stream": 0, "start_ns": 0, "end_ns": 10, "device": 0, "bytes": 64},
            {"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 10, "device": 0, "block": (64, 1, 1)},
        ]
    )  # fmt: skip
    occ = table_occupancy(table, {0: HOPPER, 1: HOPPER, 2: None})
    assert occ.pct[:2].tolist() == [12.5, 100.0] and np.isnan(occ.pct[2:]).all()
    assert [LIMITERS[c] for c in occ.limiter] == ["registers", "registers", "", "", ""]
    assert block_threads(np.array([pack_dim3(16, 16, 2), 0])).tolist() == [512, 0]


def test_a_traces_devices_limits_are_read_off_their_clocks():
    from gpuworkbench.trace.columns import DeviceClock

    clocks = {0: DeviceClock("cuda:0", "H100", "cupti", limits=HOPPER), 1: DeviceClock("cpu:0", "cpu", "events")}
    assert limits_of(clocks) == {0: HOPPER, 1: None}
