"""Counter tracks of a cluster trace (``gw.dask.trace(client, counters=True)``): each worker's samples, merged.

Every worker's trace samples its own host (CPU and memory, and the worker process's share) and devices
(``trace/counters.py``). ``worker_counters`` hands over a worker's samples new since a cursor, their times on the
worker's alignment clock as its spans' are; ``merge_counters`` moves them onto the client's clock by the worker's
measured offset and under the merged trace's devices: a worker's device as its spans are mapped, its host's counters
under the worker's host device (the one holding its task and thread rows). Not under the host (-1): the counter
tracks and the export tell lines apart by device, so under -1 every worker's "host CPU" would be one line jumping
between workers; under its host device each worker's line is labelled with its address, host and pid, and the
export puts it in that device's process. ``counter_sources`` prefixes each worker's keys with its address, as the
merged devices' keys are: "ADDRESS host", "ADDRESS cpu:0". NumPy alone, as the workers' summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..trace.counter_sources import HOST
from ..trace.counters import COLUMNS, empty_counters_table


def worker_counters(trace: Any, cursor: int, perf_ns: int) -> dict[str, Any]:
    """A worker trace's samples from row ``cursor`` on (``counters``; times minus ``perf_ns``, the worker's
    perf_counter minus its alignment clock), the next cursor and the trace's ``counter_sources``."""
    table = trace.counters()
    rows = {column: values[cursor:] for column, values in table.items()}
    rows["time_ns"] = rows["time_ns"] - perf_ns
    return {"counters": rows, "counter_cursor": cursor + len(rows["time_ns"]), "counter_sources": trace.counter_sources}


def merge_counters(
    blocks: Mapping[str, list[dict[str, Any]]],
    to_client_ns: Mapping[str, int],
    devices: Mapping[tuple[str, int], int],
    host_devices: Mapping[str, int],
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every worker's samples (``blocks``: address -> its gathered blocks) in time order, on the client's clock
    (``to_client_ns``: added to a worker's aligned times) and under the merged devices (``devices``: (address, its
    device) -> ours; the host's under ``host_devices[address]``), and every worker's sources by prefixed key."""
    parts, sources = [], {}
    for address, gathered in blocks.items():
        host = host_devices.get(address)
        for block in gathered:
            if "counters" not in block or host is None:
                continue
            rows = {column: np.asarray(values) for column, values in block["counters"].items()}
            local = rows["device"].astype(np.int64).tolist()
            mapped = [host if d == HOST else devices.get((address, d), host) for d in local]
            rows["device"] = np.array(mapped, np.int16)
            rows["time_ns"] = rows["time_ns"].astype(np.int64) + to_client_ns.get(address, 0)
            parts.append(rows)
            sources |= {f"{address} {key}": says for key, says in block["counter_sources"].items()}
    if not parts:
        return empty_counters_table(), sources
    table = {column: np.concatenate([p[column] for p in parts]).astype(dtype) for column, dtype in COLUMNS.items()}
    order = np.argsort(table["time_ns"], kind="stable")
    return {column: values[order] for column, values in table.items()}, sources


def worker_part(
    merged: Any, renumber: Mapping[int, int], worker: Mapping[str, Any]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One worker's samples of a merged trace as its own trace holds them (``ClusterTrace.worker_trace``; ``worker``:
    its entry in ``workers``): its devices renumbered, its host device's back on the host (-1), its sources' keys
    without the address."""
    counters, host_device, address = merged.counters(), worker["host_device"], worker["address"]
    device = np.asarray(counters["device"]).astype(np.int64)
    rows = np.flatnonzero(np.isin(device, list(renumber)))
    part = {column: np.asarray(values)[rows] for column, values in counters.items()}
    part["device"] = np.array([HOST if d == host_device else renumber[d] for d in device[rows].tolist()], np.int16)
    prefix = f"{address} "
    mine = {key.removeprefix(prefix): says for key, says in merged.counter_sources.items() if key.startswith(prefix)}
    return part, mine
