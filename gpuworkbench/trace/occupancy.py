"""Theoretical occupancy of kernel launches, as CUDA's occupancy calculator (``cuda_occupancy.h``) computes it: the
warps of the blocks that fit on one SM at once over the most warps an SM holds, and the limit that binds.

A launch's block size, registers per thread and shared memory per block (static + dynamic) against its device's
``DeviceLimits`` bound the resident blocks four ways; the fewest win:

- warps: ``warps_per_sm // ceil(threads / warp_size)`` (0 past the threads a block may have);
- blocks: the device's resident blocks per SM;
- registers: allocated per warp in units of 256, ``ceil(registers * warp_size / 256) * 256`` a warp, in each of the
  SM's 4 sub-partitions (``registers_per_sm / 4`` each); a block past ``registers_per_block`` (counted with its warps
  rounded up to the sub-partitions, as the hardware checks) or 255 registers a thread fits nowhere;
- shared memory: static + dynamic + the driver's reserve per block (1 KiB from sm_80 on), rounded up to 128 B
  (256 B before sm_80), into ``shared_per_sm``; past ``shared_per_block`` + the reserve, nowhere.

It is the occupancy the launch allows, not what it achieved (a grid of fewer blocks than SMs, a tail, or stalls lower
that). Everything is vectorised over the spans of a table: no Python per span.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .device_limits import DeviceLimits
from .spans import KIND_CODE

#: Limiter codes (``Occupancy.limiter``) -> what binds, in the user's words; 0: not known.
LIMITERS: tuple[str, ...] = ("", "registers", "shared memory", "block size", "block size")
REGISTERS, SHARED, WARPS, BLOCKS = 1, 2, 3, 4
#: Registers a thread may have at most.
MAX_REGISTERS = 255
_KERNEL = KIND_CODE["kernel"]
_NONE = np.iinfo(np.int64).max  # a limit that does not bind


@dataclass(frozen=True)
class Occupancy:
    """Per launch: ``pct`` (theoretical occupancy, 0-100; NaN where not known), ``blocks`` (resident blocks per SM;
    -1 where not known), ``warps`` (warps per block) and ``limiter`` (a code of ``LIMITERS``; ties go to registers,
    then shared memory, then block size)."""

    pct: np.ndarray
    blocks: np.ndarray
    warps: np.ndarray
    limiter: np.ndarray


def _round_up(value: np.ndarray, unit: int) -> np.ndarray:
    return -(-value // unit) * unit


def occupancy(threads: np.ndarray, registers: np.ndarray, shared: np.ndarray, limits: DeviceLimits) -> Occupancy:
    """The theoretical occupancy of launches of ``threads`` per block, ``registers`` per thread and ``shared``
    bytes (static + dynamic) per block on a device of ``limits``; unknown where a value is negative or threads 0."""
    threads = np.asarray(threads, np.int64)
    registers = np.asarray(registers, np.int64)
    shared = np.asarray(shared, np.int64)
    known = (threads > 0) & (registers >= 0) & (shared >= 0)
    warps = -(-np.maximum(threads, 1) // limits.warp_size)
    by_warps = np.where(threads <= limits.threads_per_block, limits.warps_per_sm // warps, 0)
    by_blocks = np.full(threads.shape, limits.blocks_per_sm, np.int64)

    per_warp = _round_up(np.maximum(registers, 0) * limits.warp_size, limits.register_unit)
    parts = limits.register_partitions
    checked = per_warp * _round_up(warps, parts)  # the hardware's check counts warps in every sub-partition
    fits = (checked <= limits.registers_per_block) & (per_warp * warps <= limits.registers_per_block)
    fits &= registers <= MAX_REGISTERS
    per_part = (limits.registers_per_sm // parts) // np.maximum(per_warp, 1)
    by_registers = np.where(per_warp > 0, per_part * parts // warps, _NONE)
    by_registers = np.where(fits, by_registers, 0)

    held = _round_up(np.maximum(shared, 0) + limits.reserved_shared, limits.shared_unit)
    by_shared = np.where(held > 0, limits.shared_per_sm // np.maximum(held, 1), _NONE)
    by_shared = np.where(held > limits.shared_per_block + limits.reserved_shared, 0, by_shared)

    bounds = np.stack([by_registers, by_shared, by_warps, by_blocks])  # in LIMITERS' order: ties go to the first
    which = np.argmin(bounds, axis=0)
    blocks = np.take_along_axis(bounds, which[None], axis=0)[0]
    pct = np.where(known, 100.0 * blocks * warps / limits.warps_per_sm, np.nan)
    return Occupancy(
        pct=pct,
        blocks=np.where(known, blocks, -1),
        warps=warps,
        limiter=np.where(known, which + 1, 0).astype(np.int8),
    )


def table_occupancy(table: Mapping[str, np.ndarray], limits: Mapping[int, DeviceLimits | None]) -> Occupancy:
    """``occupancy`` of every row of a span table: its kernels whose block, registers and shared bytes are known, on
    the devices whose ``limits`` are (NaN, -1 and 0 for the other rows)."""
    n = len(table["kind"])
    pct, blocks = np.full(n, np.nan), np.full(n, -1, np.int64)
    warps, limiter = np.zeros(n, np.int64), np.zeros(n, np.int8)
    out = Occupancy(pct, blocks, warps, limiter)
    if "registers" not in table or "shared_bytes" not in table or not any(limits.values()):
        return out
    kernel = np.asarray(table["kind"]) == _KERNEL
    device = np.asarray(table["device"], np.int64)
    for number, device_limits in limits.items():
        rows = np.flatnonzero(kernel & (device == number))
        if device_limits is None or not rows.size:
            continue
        mine = occupancy(
            block_threads(np.asarray(table["block"], np.int64)[rows]),
            np.asarray(table["registers"], np.int64)[rows],
            np.asarray(table["shared_bytes"], np.int64)[rows],
            device_limits,
        )
        pct[rows], blocks[rows], warps[rows], limiter[rows] = mine.pct, mine.blocks, mine.warps, mine.limiter
    return out


def block_threads(block: np.ndarray) -> np.ndarray:
    """Threads per block of packed ``block`` values (``spans.pack_dim3``; 0 where unknown)."""
    block = np.asarray(block, np.int64)
    threads = (block & 0xFFFFFFFF) * ((block >> 32) & 0xFFFF) * ((block >> 48) & 0xFFFF)
    return np.where(block > 0, threads, 0)
