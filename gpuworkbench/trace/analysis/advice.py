"""The advice of one device: each code decided by one rule over the device's spans and figures.

Codes: ``pageable-memory``, ``one-stream``, ``host-wait``, ``launch-bound``, ``same-direction-copies``, given the
crossovers ``gw.crossover`` measured ``too-small-for-gpu``, and given the device's limits ``low-occupancy``. The
figures across devices have their own advice (``cross.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpuworkbench._format import binary_bytes, count, decimal_bytes, duration_ns, op_size
from gpuworkbench.trace.device_limits import DeviceLimits
from gpuworkbench.trace.occupancy import BLOCKS, REGISTERS, SHARED, block_threads, occupancy

from .columns import D2H, H2D, IS_K, IS_WORK, KERNEL, DeviceSpans
from .intervals import difference, intersection, share_pct, total_length, union, union_of

if TYPE_CHECKING:
    from .summary import DeviceSummary

# Advice thresholds (see the docstring of ``advise`` for what each one decides).
_HOST_WAIT_SHARE = 0.5  # host-wait time / all gap time on a stream
_HOST_WAIT_MIN_WINDOW_SHARE = 0.1  # host-wait time on a stream / |W|
_LAUNCH_MIN_KERNELS = 20
_LAUNCH_MAX_MEDIAN_NS = 10_000
_LAUNCH_GAP_RATIO = 0.5  # median gap before a kernel / median kernel duration
_SERIAL_UNION_SHARE = 0.9  # |union of one direction| / sum of its durations
_SERIAL_BLOCKED_SHARE = 0.1  # time a ready copy waited on another stream's copy / |union of that direction|
_SERIAL_MAX_HIDDEN_SHARE = 0.5  # |that direction ∩ (K ∪ other direction)| / |that direction|
_SMALL_SHARE = 0.5  # kernels of a library op below its crossover / all its kernels of known size (more than this)
_LOW_OCCUPANCY_PCT = 25.0  # theoretical occupancy below this ...
_LOW_OCCUPANCY_SHARE = 0.1  # ... of a kernel whose spans cover more than this share of |A|


@dataclass(frozen=True)
class Advice:
    """One finding about a trace, named by a stable ``code``, with a message in the user's words.

    Codes: ``pageable-memory``, ``one-stream``, ``host-wait``, ``launch-bound``, ``same-direction-copies``,
    ``too-small-for-gpu``, ``low-occupancy``.
    """

    code: str
    message: str
    severity: str = "warning"  # "warning" (costs time now) or "info" (worth knowing)
    device: int = 0


@dataclass(frozen=True)
class CrossoverPoint:
    """Where a library op starts to beat NumPy on one device, as ``gw.crossover`` measured it.

    Kernel spans named ``kernel`` whose ``bytes`` (what the launch read and wrote) are below ``bytes`` ran at sizes
    where NumPy on the host was faster. ``size`` is the crossover in the op's ``unit`` ("n" for an n × n matmul,
    "elements" otherwise), None when the device never won up to ``largest``; ``with_copies`` likewise, counting the
    host↔device copies.
    """

    op: str
    kernel: str
    bytes: int
    size: int | None
    unit: str
    largest: int
    with_copies: int | None = None


#: Crossover points per device number, each by kernel span name: what ``summarize(crossover=...)`` takes.
Crossovers = Mapping[int, Mapping[str, CrossoverPoint]]


def advise(spans: DeviceSpans, summary: DeviceSummary, kernel_leads: np.ndarray) -> list[Advice]:
    """The advice codes, each decided by one rule.

    - ``pageable-memory``: some H2D or D2H span has ``pinned == 0``.
    - ``one-stream``: the device ran copies (H2D/D2H) and kernels, and every op on one stream.
    - ``host-wait``: on some stream, host-wait gaps are ≥ 50 % of its gap time and ≥ 10 % of |W|.
    - ``launch-bound``: ≥ 20 kernels, median kernel duration < 10 µs, and the median gap before a kernel (on its
      stream, 0 when back to back) ≥ half the median kernel duration.
    - ``same-direction-copies``: for one direction X (H2D or D2H): ≥ 2 streams issue X copies; |X| ≥ 90 % of the sum
      of their durations (they ran one at a time); for ≥ 10 % of |X| a copy was enqueued and its own stream idle, yet
      it waited while another stream's X copy ran (one copy engine per direction); and < 50 % of |X| overlaps kernels
      or the other direction, so the extra streams bought little overlap. A healthy multi-stream pipeline, whose
      copies wait on each other but hide behind kernels, does not fire.
    """
    device = spans.device
    found: list[Advice] = []
    work = IS_WORK[spans.kind]
    is_copy = (spans.kind == H2D) | (spans.kind == D2H)

    pageable = is_copy & (spans.pinned == 0)
    if pageable.any():
        found.append(
            Advice(
                "pageable-memory",
                f"{count(int(pageable.sum()), 'copy', 'copies')} "
                f"({decimal_bytes(int(spans.bytes[pageable].sum()))}) used pageable host memory: such a copy is "
                "staged through a driver buffer and cannot overlap with kernels. Allocate the host array with "
                "dev.empty_pinned(...).",
                device=device,
            )
        )

    streams = np.unique(spans.stream[work])
    if is_copy.any() and IS_K[spans.kind].any() and streams.size == 1:
        found.append(
            Advice(
                "one-stream",
                f"all {int(work.sum())} ops ran on stream {int(streams[0])}, so copies and kernels could not overlap. "
                "Put the copies and kernels of different batches on different streams (dev.stream_pool(n)).",
                device=device,
            )
        )

    waiting = []
    for stream, by_cause in summary.gap_ns.items():
        total = sum(by_cause.values())
        waited = by_cause["host-wait"]
        if total and waited >= _HOST_WAIT_SHARE * total and waited >= _HOST_WAIT_MIN_WINDOW_SHARE * summary.window_ns:
            waiting.append(
                f"stream {stream} for {duration_ns(waited)} ({share_pct(waited, summary.window_ns):.0f} % of W)"
            )
    if waiting:
        found.append(
            Advice(
                "host-wait",
                f"the device waited for the host: {', '.join(waiting)}. Ops were enqueued only after the previous op "
                "had finished, the mark of a blocking call (a synchronous copy_to_host, synchronize, ev.wait()) "
                "between ops. Enqueue the next work before waiting on the last.",
                device=device,
            )
        )

    kernel = spans.kind == KERNEL
    if kernel.sum() >= _LAUNCH_MIN_KERNELS and kernel_leads.size:
        median_ns = float(np.median(spans.end[kernel] - spans.start[kernel]))
        median_gap = float(np.median(kernel_leads))
        if median_ns < _LAUNCH_MAX_MEDIAN_NS and median_gap >= _LAUNCH_GAP_RATIO * median_ns:
            found.append(
                Advice(
                    "launch-bound",
                    f"{int(kernel.sum())} kernels took {duration_ns(median_ns)} each (median) with "
                    f"{duration_ns(median_gap)} gaps between them: launching costs as much as the work. Fuse small "
                    "kernels, give each more work, or replay them as a graph (op.graph_on(stream)).",
                    device=device,
                )
            )

    for code, label in ((H2D, "H2D"), (D2H, "D2H")):
        message = _serialised_copies(spans, code, label)
        if message:
            found.append(Advice("same-direction-copies", message, severity="info", device=device))
    return found


def too_small(
    spans: DeviceSpans, table: Mapping[str, np.ndarray], points: Mapping[str, CrossoverPoint]
) -> list[Advice]:
    """``too-small-for-gpu``, once per library op: of its kernels whose size is known (``bytes`` > 0, spans named as
    a measured crossover's ``kernel``), more than half read and wrote fewer bytes than the op does at its measured
    crossover (at any size measured, where the device never won), so NumPy on the host would have been faster."""
    if "name" not in table:
        return []
    kernel = (spans.kind == KERNEL) & (spans.bytes > 0)
    if not kernel.any():
        return []
    names = np.asarray(table["name"], dtype=object)[spans.index[kernel]]
    nbytes = spans.bytes[kernel]
    found = []
    for name in sorted(points):
        point = points[name]
        mine = names == name
        sized = int(np.count_nonzero(mine))
        if sized == 0:
            continue
        below = int(np.count_nonzero(nbytes[mine] < point.bytes))
        if below <= _SMALL_SHARE * sized:
            continue
        ran = f"{below} of {sized} {point.op} kernels ({name})"
        if point.size is None:
            where = (
                f"{ran} ran at sizes where this device did not beat NumPy on the host in any size measured (up to "
                f"{op_size(point.largest, point.unit)})"
            )
        else:
            where = (
                f"{ran} ran below {op_size(point.size, point.unit)}, the size from which this device beats "
                "NumPy on the host"
            )
            if point.with_copies is not None:
                where += f" ({op_size(point.with_copies, point.unit)} counting the copies)"
        found.append(
            Advice(
                "too-small-for-gpu",
                f"{where}, as gw.crossover measured. At these sizes the launch and the copies cost more than the "
                "work: give each call more work (batch rows or matrices together), or keep such small ops on the host.",
                device=spans.device,
            )
        )
    return found


def low_occupancy(
    spans: DeviceSpans, table: Mapping[str, np.ndarray], limits: DeviceLimits, active_ns: int
) -> list[Advice]:
    """``low-occupancy``, once per kernel name: its launches whose theoretical occupancy (``trace/occupancy.py``) is
    below 25 % cover more than 10 % of the device's active time |A| (``active_ns``); the message says which limit
    binds (registers, shared memory or block size) and what the launch holds. Silent where the kernels' registers
    or shared memory are not known (OpenCL, WebGPU, the CPU, a profile without them)."""
    if active_ns <= 0 or not all(c in table for c in ("name", "block", "registers", "shared_bytes")):
        return []
    kernel = np.flatnonzero(spans.kind == KERNEL)
    rows = spans.index[kernel]
    block = np.asarray(table["block"], np.int64)[rows]
    registers = np.asarray(table["registers"], np.int64)[rows]
    shared = np.asarray(table["shared_bytes"], np.int64)[rows]
    occ = occupancy(block_threads(block), registers, shared, limits)
    low = np.flatnonzero(occ.pct < _LOW_OCCUPANCY_PCT)  # NaN (not known) is never low
    if not low.size:
        return []
    names = np.asarray(table["name"], dtype=object)[rows[low]]
    found = []
    for name in sorted(set(names.tolist())):
        mine = low[names == name]
        busy = total_length(union(spans.start[kernel[mine]], spans.end[kernel[mine]]))
        if busy > _LOW_OCCUPANCY_SHARE * active_ns:
            i = int(mine[0])
            shape = (int(block_threads(block[i])), int(registers[i]), int(shared[i]))
            found.append((busy, name, shape, float(occ.pct[i]), int(occ.blocks[i]), int(occ.limiter[i])))
    found.sort(key=lambda f: -f[0])
    return [
        Advice(
            "low-occupancy",
            _occupancy_message(name, share_pct(busy, active_ns), shape, pct, blocks, limiter, limits),
            device=spans.device,
        )
        for busy, name, shape, pct, blocks, limiter in found
    ]


def _occupancy_message(
    name: str, share: float, shape: tuple[int, int, int], pct: float, blocks: int, limiter: int, limits: DeviceLimits
) -> str:
    """What ``low-occupancy`` says of one kernel: how little of an SM it fills, why, and what to change."""
    threads, registers, shared = shape
    fits = f"{count(blocks, 'block', 'blocks')} of {threads} threads fit{'s' if blocks == 1 else ''} on an SM"
    head = (
        f"{name} ({share:.0f} % of device time) fills at most {pct:.1f} % of an SM's warp slots (its theoretical "
        f"occupancy): "
    )
    if limiter == REGISTERS:
        why = (
            f"at {registers} registers per thread {fits}, so registers bind. Cap them (__launch_bounds__, "
            "-maxrregcount; watch for spills) or keep less live state per thread."
        )
    elif limiter == SHARED:
        why = (
            f"with {binary_bytes(shared)} of shared memory per block (and the driver's "
            f"{binary_bytes(limits.reserved_shared)} reserve) {fits}, so shared memory binds. Use smaller tiles or "
            "fewer stages per block."
        )
    elif limiter == BLOCKS:
        why = (
            f"an SM holds at most {limits.blocks_per_sm} blocks, and blocks of {threads} threads are too small to "
            f"fill its {limits.warps_per_sm} warps, so block size binds. Launch larger blocks."
        )
    else:  # WARPS: the blocks' warps, rounded up, leave the SM's threads unused
        why = f"{fits} of its {limits.threads_per_sm} threads, so block size binds. Try another block size."
    return head + why


def _serialised_copies(spans: DeviceSpans, code: int, label: str) -> str | None:
    """The same-direction-copies message for one direction, or None when the rule (see ``advise``) does not fire."""
    sel = spans.kind == code
    streams = np.unique(spans.stream[sel])
    if streams.size < 2:
        return None
    copies = union(*spans.rows(sel))
    copy_ns = total_length(copies)
    if copy_ns == 0 or copy_ns < _SERIAL_UNION_SHARE * int((spans.end[sel] - spans.start[sel]).sum()):
        return None
    others = union(*spans.rows(IS_K[spans.kind] | (spans.kind == (D2H if code == H2D else H2D))))
    if total_length(intersection(copies, others)) >= _SERIAL_MAX_HIDDEN_SHARE * copy_ns:
        return None
    work = IS_WORK[spans.kind]
    blocked_parts = []
    for stream in streams:
        mine = spans.stream == stream
        ready = sel & mine & (spans.enqueue >= 0) & (spans.enqueue < spans.start)
        waits = union(np.maximum(spans.enqueue[ready], spans.w0), spans.start[ready])
        idle_waits = difference(waits, union(*spans.rows(work & mine)))
        blocked_parts.append(intersection(idle_waits, union(*spans.rows(sel & ~mine))))
    blocked = union_of(*blocked_parts)
    blocked_ns = total_length(blocked)
    if blocked_ns == 0 or blocked_ns < _SERIAL_BLOCKED_SHARE * copy_ns:
        return None
    return (
        f"{label} copies on streams {', '.join(str(int(s)) for s in streams)} ran one at a time: for "
        f"{duration_ns(blocked_ns)} a copy was ready on an idle stream but waited for another stream's {label} copy. "
        f"A device has one copy engine per direction, so splitting a copy over streams does not speed it up; "
        f"overlap {label} with kernels or the other direction instead (a pipeline of batches)."
    )
