"""Span columns from trace events: times in ns, ints read leniently, grid and block packed, device work's kinds from
its categories and names, links by correlation, span blocks joined into one table, and counter events as counter
samples, for the readers of ``kineto.py`` (the events themselves are gathered by ``kineto_decode.py``).
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .spans import COLUMNS, DEFAULTS, KIND_CODE, pack_dim3

#: The largest |ts| or |dur| read, in µs: beyond it the time in ns leaves int64.
_US_MAX = 9.2e15
_KERNEL, _MEMSET = KIND_CODE["kernel"], KIND_CODE["memset"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector paused: a load makes a container or more per event while a chunk of them is alive, and
    collections that triggered took 1.9 of 2.2 s of a 70 000-event PyTorch trace's load on the 2-core development
    machine when each event was a dict."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def device_kinds(
    cats: Sequence[str], names: Sequence[str], cat: np.ndarray, name: np.ndarray, pinned: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Kind codes and pinned flags of device events (``cat`` and ``name``: codes into ``cats`` and ``names``), from
    their categories and CUPTI / roctracer names, each distinct pair classified once.

    Copies are named "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)" ...; ``pinned`` (0 or more:
    ``args.pinned`` of our exports; None where not read) wins over the name where given (-1: not given)."""
    if not cat.size:
        return np.zeros(0, np.int8), np.zeros(0, np.int8)
    pairs, inverse = np.unique(cat.astype(np.int64) * (len(names) + 1) + name, return_inverse=True)
    found = [_classify(cats[c].lower(), names[n]) for c, n in zip(*np.divmod(pairs, len(names) + 1))]
    kinds = np.array([k for k, _ in found], np.int8)[inverse.reshape(-1)]
    by_name = np.array([p for _, p in found], np.int8)[inverse.reshape(-1)]
    return kinds, by_name if pinned is None else np.where(pinned >= 0, pinned != 0, by_name).astype(np.int8)


def time_columns(ts: np.ndarray, dur: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ns, as in the file) of complete events; a negative ``dur`` counts as 0."""
    start = ns_column(ts, where, "ts")
    return start, start + np.maximum(ns_column(dur, where, "dur"), 0)


def ns_column(values: Sequence[Any] | np.ndarray, where: str, what: str) -> np.ndarray:
    """Microsecond values (as JSON gives them) as int64 ns, exact to the ns for anything a float64 holds exactly."""
    try:
        us = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgument(f"cannot load trace {where}: an event's {what} is not a number") from None
    if not np.isfinite(us).all():
        raise InvalidArgument(f"cannot load trace {where}: an event's {what} is not a finite number")
    if us.size and np.abs(us).max() > _US_MAX:
        raise InvalidArgument(f"cannot load trace {where}: an event's {what} is out of range ({np.abs(us).max():g} µs)")
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def int_column(values: Sequence[Any], default: int = -1) -> np.ndarray:
    """Integers as int64 (``default`` for anything that is not one: None, a pointer string, a list)."""
    try:
        return np.fromiter(values, np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return np.array([int_or(v, default) for v in values], np.int64)


def int_or(value: Any, default: int) -> int:
    """``value`` as an int where it is one (a bool, an integral float, a numeric string), else ``default``."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def dim3_column(values: Sequence[Any]) -> np.ndarray:
    """``args.grid`` / ``args.block`` ([x, y, z] lists) packed with ``pack_dim3``; 0 where absent or malformed."""
    xyz = np.zeros((len(values), 3), np.int64)
    rows = [i for i, v in enumerate(values) if type(v) is list and len(v) == 3]
    if rows:
        try:
            xyz[rows] = np.array([values[i] for i in rows], dtype=np.int64)
        except (TypeError, ValueError):
            for i in rows:
                xyz[i] = [int_or(v, 0) for v in values[i]]
    packed = pack_dim3(xyz[:, 0], xyz[:, 1], xyz[:, 2])
    return np.where(xyz[:, 0] > 0, packed, 0).astype(np.int64)


def row_label(name: str | None) -> str:
    """A thread name as a row label (Kineto writes "stream 7 " with a trailing space)."""
    return name.strip() if isinstance(name, str) else ""


def _classify(cat: str, name: str) -> tuple[int, int]:
    if cat in ("kernel",):
        return _KERNEL, -1
    if "memset" in cat:
        return _MEMSET, -1
    if "HtoD" in name or "HostToDevice" in name:
        kind = "h2d"
    elif "DtoH" in name or "DeviceToHost" in name:
        kind = "d2h"
    else:
        kind = "d2d"
    host = -1
    if kind != "d2d":
        host = 1 if "Pinned" in name else 0 if "Pageable" in name else -1
    return KIND_CODE[kind], host


def link_column(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray, default: Any) -> np.ndarray:
    """``values`` of the rows whose ``keys`` equal each of ``wanted`` (the first such row), else ``default``."""
    out = np.full(wanted.size, default, dtype=values.dtype)
    valid = keys >= 0
    if not valid.any() or not wanted.size:
        return out
    order = np.argsort(keys[valid], kind="stable")
    sorted_keys, sorted_values = keys[valid][order], values[valid][order]
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), sorted_keys.size - 1)
    hit = (sorted_keys[pos] == wanted) & (wanted >= 0)
    out[hit] = sorted_values[pos[hit]]
    return out


def span_block(n: int, **columns: Any) -> dict[str, np.ndarray]:
    """A span-column block of ``n`` rows: the columns given, defaults for the rest."""
    block = {}
    for column, dtype in COLUMNS.items():
        value = columns.get(column, DEFAULTS.get(column, 0))
        if dtype is object:
            block[column] = np.array(value, dtype=object) if len(value) == n else np.full(n, value, dtype=object)
        else:
            block[column] = np.broadcast_to(np.asarray(value), (n,)).astype(dtype)
    return block


def concat_blocks(blocks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The span blocks as one table, in start order."""
    blocks = [b for b in blocks if len(b["kind"])]
    if not blocks:
        return span_block(0, kind=0, device=0, stream=0, start_ns=0, end_ns=0, name=[])
    table = {c: np.concatenate([b[c] for b in blocks]) for c in COLUMNS}
    order = np.argsort(table["start_ns"], kind="stable")
    return {c: v[order] for c, v in table.items()}


def counter_columns(
    events: Sequence[tuple], where: str, base_ns: int, device_of: Callable[[Any], int], own: bool
) -> dict[str, np.ndarray]:
    """Counter events (``C``; ``kineto_decode.CounterEvent`` tuples) as ``Trace.counters()``'s columns: a sample per
    event and series (arg). Our own export's (``own``) come back as exported: the event's name is the counter's, its
    arg's key the unit, in file order. Another tool's event is a counter track per series, named as Perfetto names
    it: the event's name, " id: ID" where the event has an ``id``, then " " and the series' key; unit "", in time
    order. ``device_of(pid)``: the device number of an event's pid (-1: the host). A value that is no finite number
    (nor a string of one) is skipped, as Perfetto skips it; an event without a finite ``ts`` is refused, naming it."""
    times, devices, names, units, values = [], [], [], [], []
    for index, name, pid, _tid, ts, id_, args in events:
        if not math.isfinite(ts):
            raise InvalidArgument(f"cannot load trace {where}: traceEvents[{index}] ({name!r:.80}) has no finite ts")
        device = device_of(pid)
        for series, value in args.items():
            number = _number(value)
            if number is None:
                continue
            times.append(ts)
            devices.append(device)
            values.append(number)
            if own:
                names.append(name)
                units.append(series)
            else:
                names.append(f"{name}{'' if id_ is None else f' id: {id_}'} {series}")
                units.append("")
    table = {
        "time_ns": ns_column(np.array(times, np.float64), where, "ts") + base_ns,
        "device": np.array(devices, np.int16),
        "name": np.array(names, object),
        "unit": np.array(units, object),
        "value": np.array(values, np.float64),
    }
    if not own:
        order = np.argsort(table["time_ns"], kind="stable")
        table = {column: values[order] for column, values in table.items()}
    return table


def _number(value: Any) -> float | None:
    """A counter value as a float: a number (not a bool) or a numeric string, finite; else None."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    elif type(value) not in (int, float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
