"""Which activity kinds a source turns on, and the API filter that keeps API-call records to calls that enqueue work.

A source reads these at each start (``kinds.API_CARRIER_KINDS`` and the others may be changed between traces, as
benchmarks do). The filter is process state: CUPTI keeps it until it is finalized.
"""

from __future__ import annotations

import os
from typing import Any

#: Activity kinds enabled by :meth:`CuptiSource.start`, by their ``cupti.ActivityKind`` names.
ACTIVITY_KINDS: tuple[str, ...] = ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "EXTERNAL_CORRELATION")
#: ... and where this CUPTI has them: device allocations and frees of every library (CUPTI_ACTIVITY_KIND_MEMORY2),
#: and NVTX ranges (MARKER; NVTX reaches CUPTI only where ``NVTX_INJECTION64_PATH`` named libcupti before the
#: process's first NVTX call: set by the user, never by us). ``GPUWB_CUPTI_OPTIONAL=`` (empty) turns both off.
OPTIONAL_KINDS: tuple[str, ...] = tuple(
    k for k in os.environ.get("GPUWB_CUPTI_OPTIONAL", "MEMORY2,MARKER").split(",") if k
)
#: API record kinds enabled as carriers: CUPTI emits EXTERNAL_CORRELATION records only for API calls it records, and
#: a trace places each call (its thread and start) in the window in which it enqueued one of its ops.
API_CARRIER_KINDS: tuple[str, ...] = ("DRIVER", "RUNTIME")
#: Restrict the carriers to the API calls that enqueue device work (names by prefix), to keep buffers small.
API_FILTER = True
#: The calls that enqueue device work, by name prefix, per API.
API_PREFIXES: dict[str, tuple[str, ...]] = {
    "driver": ("cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"),
    "runtime": ("cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch"),
}
_NOT_CALLS = ("INVALID", "SIZE", "FORCE_INT")


def enqueues_work(name: str, domain: str) -> bool:
    """Whether the API call named ``name`` (a ``driver`` or ``runtime`` callback id's name) enqueues device work."""
    return name.startswith(API_PREFIXES[domain]) and "HostFunc" not in name


class ApiFilter:
    """Whether CUPTI records only the API calls that enqueue device work (``on``). Setting it is one CUPTI call per
    API (~1.5 ms of a trace's start and as much of its stop, measured on an H200), so it is set once and stays set
    while no kind of ours is on (it filters only the API records, which nobody else takes then); a hand-over clears
    it before torch.profiler takes CUPTI, and a finalize forgets it."""

    def __init__(self) -> None:
        self.on = False

    def apply(self, cupti: Any, on: bool) -> bool:
        """Record only the device-work API calls (``on``) or every call again; False if this CUPTI cannot."""
        if on == self.on:
            return True
        try:
            for domain, enum_cls, set_api in (
                ("driver", cupti.driver_api_trace_cbid, cupti.activity_enable_driver_api),
                ("runtime", cupti.runtime_api_trace_cbid, cupti.activity_enable_runtime_api),
            ):
                for member in enum_cls:
                    name = member.name
                    if name in _NOT_CALLS:
                        continue
                    keep = not on or enqueues_work(name, domain)
                    set_api(int(member), int(keep))
        except Exception:  # noqa: BLE001  (an older CUPTI without per-API switches: records every call)
            return False
        self.on = on
        return True


def work_table(cupti: Any) -> bytes:
    """This CUPTI's driver callback ids as a table: 1 where a call enqueues device work (``ExitDetach.watch``)."""
    members = [m for m in cupti.driver_api_trace_cbid if m.name not in _NOT_CALLS]
    table = bytearray(max((int(m) for m in members), default=0) + 1)
    for m in members:
        if enqueues_work(m.name, "driver"):
            table[int(m)] = 1
    return bytes(table)
