"""A CUDA device's limits on resident work (``DeviceLimits``): what theoretical occupancy (``occupancy.py``) is
computed from, kept with each of a trace's devices (``DeviceClock.limits``; None where unknown: the CPU, OpenCL,
WebGPU, ROCm, a loaded profile without them).

They are read from a device's properties, spelled as ``cudaDeviceProp`` (CuPy's ``getDeviceProperties``: ``major``,
``multiProcessorCount``, ``maxThreadsPerMultiProcessor`` ...) or as Kineto writes them in a profile's
``deviceProperties`` (``computeMajor``, ``numSms``, ``maxThreadsPerMultiprocessor`` ...). Kineto leaves out the
resident blocks per SM and the shared memory the driver reserves per block: those follow from the compute capability
(CUDA C++ Programming Guide, "Compute Capabilities"). An export writes Kineto's names and those two beside them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Resident blocks per SM by compute capability, where the device does not say (the guide's table; 32 otherwise).
BLOCKS_PER_SM: dict[tuple[int, int], int] = {(7, 5): 16, (8, 6): 16, (8, 7): 16, (8, 9): 24}
#: Shared memory the driver reserves per block from compute capability 8.0 on (the guide: 1 KB).
RESERVED_SHARED = 1024

# Field -> the property names it is read from, cudaDeviceProp's first, then Kineto's.
_NAMES: dict[str, tuple[str, ...]] = {
    "major": ("major", "computeMajor"),
    "minor": ("minor", "computeMinor"),
    "sms": ("multiProcessorCount", "numSms"),
    "warp_size": ("warpSize",),
    "threads_per_block": ("maxThreadsPerBlock",),
    "threads_per_sm": ("maxThreadsPerMultiProcessor", "maxThreadsPerMultiprocessor"),
    "blocks_per_sm": ("maxBlocksPerMultiProcessor", "maxBlocksPerMultiprocessor"),
    "registers_per_sm": ("regsPerMultiprocessor",),
    "registers_per_block": ("regsPerBlock",),
    "shared_per_sm": ("sharedMemPerMultiprocessor",),
    "shared_per_block": ("sharedMemPerBlockOptin",),
    "reserved_shared": ("reservedSharedMemPerBlock",),
}
#: The names an export writes (Kineto's, and cudaDeviceProp's for the two Kineto leaves out).
_EXPORTED = {field: names[-1] for field, names in _NAMES.items()} | {
    "blocks_per_sm": "maxBlocksPerMultiProcessor",
    "reserved_shared": "reservedSharedMemPerBlock",
}
#: torch.cuda.get_device_properties' attribute of each field (the last two torch does not give).
_TORCH = {
    "major": "major",
    "minor": "minor",
    "sms": "multi_processor_count",
    "warp_size": "warp_size",
    "threads_per_block": "max_threads_per_block",
    "threads_per_sm": "max_threads_per_multi_processor",
    "registers_per_sm": "regs_per_multiprocessor",
    "registers_per_block": "regs_per_block",
    "shared_per_sm": "shared_memory_per_multiprocessor",
    "shared_per_block": "shared_memory_per_block_optin",
}


@dataclass(frozen=True)
class DeviceLimits:
    """What bounds the work resident on one SM of a CUDA device, and the allocation units of its registers and
    shared memory (shared bytes per block: the opt-in maximum, without the driver's reserve)."""

    major: int
    minor: int
    sms: int
    warp_size: int
    threads_per_block: int
    threads_per_sm: int
    blocks_per_sm: int
    registers_per_sm: int
    registers_per_block: int
    shared_per_sm: int
    shared_per_block: int
    reserved_shared: int

    @property
    def warps_per_sm(self) -> int:
        """Resident warps an SM holds at most (theoretical occupancy's denominator)."""
        return self.threads_per_sm // self.warp_size

    @property
    def register_unit(self) -> int:
        """Registers are allocated per warp in units of this many."""
        return 256

    @property
    def register_partitions(self) -> int:
        """Sub-partitions of an SM, each with its share of the registers (2 on GP100, 4 on the others)."""
        return 2 if (self.major, self.minor) == (6, 0) else 4

    @property
    def shared_unit(self) -> int:
        """Shared memory is allocated per block in units of this many bytes."""
        return 128 if self.major >= 8 or self.major < 3 else 256

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> DeviceLimits | None:
        """The limits in ``props`` (cudaDeviceProp's or Kineto's names); None where a needed one is missing or not a
        positive int (a ROCm device, a profile that lists only names)."""
        values: dict[str, int] = {}
        for field, names in _NAMES.items():
            value = next((props[n] for n in names if n in props), None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                values[field] = value
        if "major" not in values or "minor" not in values:
            return None
        cc = (values["major"], values["minor"])
        values.setdefault("sms", 0)
        values.setdefault("threads_per_block", 1024)
        values.setdefault("registers_per_block", 65536)  # every compute capability CUDA 12 runs
        values.setdefault("blocks_per_sm", BLOCKS_PER_SM.get(cc, 32))
        values.setdefault("reserved_shared", RESERVED_SHARED if cc[0] >= 8 else 0)
        if "shared_per_block" not in values and isinstance(props.get("sharedMemPerBlock"), int):
            values["shared_per_block"] = props["sharedMemPerBlock"]
        needed = ("warp_size", "threads_per_sm", "registers_per_sm", "registers_per_block", "shared_per_sm")
        if any(values.get(field, 0) <= 0 for field in (*needed, "shared_per_block", "blocks_per_sm")):
            return None
        return cls(**values)

    def properties(self) -> dict[str, int]:
        """The limits as device properties, by Kineto's names (and cudaDeviceProp's for the two it leaves out)."""
        return {name: getattr(self, field) for field, name in _EXPORTED.items()}


def limits_of(devices: Mapping[int, Any]) -> dict[int, DeviceLimits | None]:
    """Each device's limits (``devices``: a trace's ``DeviceClock`` per number)."""
    return {number: getattr(clock, "limits", None) for number, clock in devices.items()}


def cuda_limits(ordinal: int) -> DeviceLimits | None:
    """The limits of CUDA device ``ordinal``, asked of CuPy or PyTorch where one is loaded (no new CUDA context is
    made for it); None under ROCm or where neither answers. An answer is kept: a device's limits do not change, and
    every traced cell's first record of another library asks (0.1 ms each on an H200)."""
    found = _CUDA_LIMITS.get(ordinal)
    if found is None:
        found = _ask_cuda_limits(ordinal)
        if found is not None:
            _CUDA_LIMITS[ordinal] = found
    return found


_CUDA_LIMITS: dict[int, DeviceLimits] = {}


def _ask_cuda_limits(ordinal: int) -> DeviceLimits | None:
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            if not getattr(cupy.cuda.runtime, "is_hip", False):
                return DeviceLimits.from_properties(cupy.cuda.runtime.getDeviceProperties(ordinal))
        except Exception:  # noqa: BLE001 - no limits is an answer: occupancy is then unknown
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if getattr(torch.version, "hip", None) is None:
                p = torch.cuda.get_device_properties(ordinal)
                props = {_NAMES[f][0]: getattr(p, a) for f, a in _TORCH.items() if isinstance(getattr(p, a, None), int)}
                return DeviceLimits.from_properties({"warpSize": 32, **props})
        except Exception:  # noqa: BLE001
            pass
    return None
