"""Figures across a trace's devices: busy time per device, the slowest device and the others' wait for it, peer
copies with their bandwidth; and their advice, ``device-imbalance`` and ``peer-copy-staged``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuworkbench._format import count, decimal_bytes, duration_ns
from gpuworkbench.trace.spans import KIND_CODE, PEER_ROUTES, parse_peer_copy

from .advice import Advice
from .columns import IS_WORK, KERNEL, check_table, check_window
from .intervals import clip, share_pct, total_length

# device-imbalance fires when, among the devices that ran kernels, the busiest was busy at least this many times as
# long as the least busy one, and longer by at least _IMBALANCE_MIN_NS (so that short or near-even traces stay quiet).
_IMBALANCE_RATIO = 1.25
_IMBALANCE_MIN_NS = 1_000_000


@dataclass(frozen=True)
class PeerCopies:
    """The peer copies of one source, destination and route (``trace.spans.PEER_ROUTES``), devices named by spec.

    ``time_ns`` is the union of their spans; ``bandwidth_gbps`` = bytes / ``time_ns`` (bytes per ns = GB/s)."""

    source: str
    destination: str
    route: str
    count: int
    bytes: int
    time_ns: int
    bandwidth_gbps: float | None
    direct_path: bool  # the driver reported a direct path (taken or not)


@dataclass(frozen=True)
class CrossDevice:
    """Figures across the trace's devices over one window W (first op of any device to the last op of any).

    ``busy_ns``: per device |A|, the union of its device work in W; ``busy_pct`` = 100·|A| / |W|. The slowest device
    is the one whose work ends last: ``waited_ns`` says, per device, how long after its own last op it waited for the
    slowest one's (0 for the slowest), what joining the devices' results costs. ``peer_copy_ns`` is the union of every
    peer copy's span. Advice codes: ``device-imbalance``, ``peer-copy-staged``.
    """

    window_start_ns: int
    window_end_ns: int
    window_ns: int
    busy_ns: dict[int, int]
    busy_pct: dict[int, float | None]
    slowest_device: int
    waited_ns: dict[int, int]
    peer_copies: list[PeerCopies]
    peer_copy_ns: int
    advice: list[Advice]

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        return asdict(self)


def cross_device(table: Mapping[str, np.ndarray], window: tuple[int, int] | None = None) -> CrossDevice | None:
    """Busy time per device, the slowest device and the others' wait for it, peer copies with their bandwidth, and the
    advice ``device-imbalance`` and ``peer-copy-staged``; None when fewer than two devices worked and no peer copy ran.

    ``window`` = (start_ns, end_ns) replaces W, as in ``summarize``. Peer copies are the ``d2d`` spans named by
    ``trace.spans.peer_copy_name`` (a table without names has none)."""
    check_table(table)
    window = check_window(window)
    kind = np.asarray(table["kind"])
    work = IS_WORK[kind]
    device = np.asarray(table["device"], dtype=np.int64)
    start = np.asarray(table["start_ns"], dtype=np.int64)
    end = np.asarray(table["end_ns"], dtype=np.int64)
    names = table.get("name")
    peer_rows = []
    if names is not None:
        for i in np.flatnonzero(kind == KIND_CODE["d2d"]).tolist():
            route = parse_peer_copy(str(names[i]))
            if route is not None:
                peer_rows.append((i, route))
    working = [int(d) for d in np.unique(device[work])]
    if len(working) < 2 and not peer_rows:
        return None
    if window is None:
        w0, w1 = (int(start[work].min()), int(end[work].max())) if work.any() else (0, 0)
    else:
        w0, w1 = window
    busy: dict[int, int] = {}
    last_end: dict[int, int] = {}
    for d in working:
        rows = work & (device == d)
        busy[d] = total_length(clip((start[rows], end[rows]), w0, w1))
        last_end[d] = min(int(end[rows].max()), w1)
    slowest = max(working, key=lambda d: (last_end[d], busy[d], -d)) if working else -1
    peer_idx = np.array([i for i, _ in peer_rows], dtype=np.int64)
    return CrossDevice(
        window_start_ns=w0,
        window_end_ns=w1,
        window_ns=w1 - w0,
        busy_ns=busy,
        busy_pct={d: share_pct(b, w1 - w0) for d, b in busy.items()},
        slowest_device=slowest,
        waited_ns={d: last_end[slowest] - last_end[d] for d in working},
        peer_copies=_peer_copies(peer_rows, table, start, end, w0, w1),
        peer_copy_ns=total_length(clip((start[peer_idx], end[peer_idx]), w0, w1)),
        advice=_imbalance(working, busy, kind, device) + _staged(peer_rows, table, device),
    )


def _peer_copies(
    rows: list[tuple[int, tuple[str, str, str]]],
    table: Mapping[str, np.ndarray],
    start: np.ndarray,
    end: np.ndarray,
    w0: int,
    w1: int,
) -> list[PeerCopies]:
    """The peer copies grouped by (source, destination, route), in order of first appearance."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, key in rows:
        groups.setdefault(key, []).append(i)
    nbytes_col = np.asarray(table["bytes"], dtype=np.int64)
    found = []
    for (src, dst, route), idx in groups.items():
        time_ns = total_length(clip((start[idx], end[idx]), w0, w1))
        nbytes = int(nbytes_col[idx].sum())
        found.append(
            PeerCopies(
                source=src,
                destination=dst,
                route=route,
                count=len(idx),
                bytes=nbytes,
                time_ns=time_ns,
                bandwidth_gbps=nbytes / time_ns if time_ns else None,
                direct_path=route != PEER_ROUTES[1],
            )
        )
    return found


def _imbalance(working: list[int], busy: dict[int, int], kind: np.ndarray, device: np.ndarray) -> list[Advice]:
    """``device-imbalance``: among the devices that ran kernels (two or more), the busiest was busy ≥ 1.25 × as long
    as the least busy one and ≥ 1 ms longer (devices that only received copies are not compared)."""
    ran_kernels = [d for d in working if np.any((kind == KERNEL) & (device == d))]
    if len(ran_kernels) < 2:
        return []
    most = max(ran_kernels, key=lambda d: (busy[d], -d))
    least = min(ran_kernels, key=lambda d: (busy[d], d))
    hi, lo = busy[most], busy[least]
    if hi - lo < _IMBALANCE_MIN_NS or hi < _IMBALANCE_RATIO * lo:
        return []
    mean = sum(busy[d] for d in ran_kernels) / len(ran_kernels)
    ratio = f"{hi / lo:.2f} ×" if lo else "the other idle"
    return [
        Advice(
            "device-imbalance",
            f"device {most} was busy {duration_ns(hi)}, device {least} {duration_ns(lo)} ({ratio}; this advice fires "
            f"from {_IMBALANCE_RATIO} × and 1 ms apart): the devices that ran kernels were unevenly loaded, and "
            f"whatever waits for all of them waits for the busiest. Spread evenly, each would be busy "
            f"{duration_ns(mean)}, {duration_ns(hi - mean)} less than device {most}: give each device work in "
            "proportion to its speed.",
            device=most,
        )
    ]


def _staged(
    rows: list[tuple[int, tuple[str, str, str]]], table: Mapping[str, np.ndarray], device: np.ndarray
) -> list[Advice]:
    """``peer-copy-staged``, once per (source, destination): a peer copy went through host memory although the
    driver reports a direct path between the two devices (its span's route is "staged, direct path unused")."""
    staged: dict[tuple[str, str], list[int]] = {}
    for i, (src, dst, route) in rows:
        if route == PEER_ROUTES[2]:
            staged.setdefault((src, dst), []).append(i)
    nbytes_col = np.asarray(table["bytes"], dtype=np.int64)
    return [
        Advice(
            "peer-copy-staged",
            f"{count(len(idx), 'peer copy', 'peer copies')} ({decimal_bytes(int(nbytes_col[idx].sum()))}) from {src} "
            f"to {dst} went through host memory although the driver reports a direct path between them: peer access "
            "could not be enabled (a GPU reaches at most 8 peers; some virtual machines refuse it). A direct copy "
            "moves the bytes once, device to device, instead of twice through the host.",
            device=int(device[idx[0]]),
        )
        for (src, dst), idx in staged.items()
    ]
