"""Span columns from trace events: times in ns, ints read leniently, grid and block packed, device work's kinds from
its categories and names, links by correlation, span blocks joined into one table, and counter events as counter
samples, for the readers of ``kineto.py`` (the events themselves are gathered by ``kineto_decode.py``).

A load's last steps run after its pieces are read, on one core, so they avoid sorts where counting does (``distinct``,
``first_rows``: streams, threads, names and correlations span small ranges) and write each table column once, in
start order, into the array the trace keeps (``concat_blocks``, ``columns.Handover``).
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import InvalidArgument
from .columns import Handover
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
    pairs, inverse = distinct(cat.astype(np.int64) * (len(names) + 1) + name)
    found = [_classify(cats[c].lower(), names[n]) for c, n in zip(*np.divmod(pairs, len(names) + 1))]
    kinds = np.array([k for k, _ in found], np.int8)[inverse]
    by_name = np.array([p for _, p in found], np.int8)[inverse]
    return kinds, by_name if pinned is None else np.where(pinned >= 0, pinned != 0, by_name).astype(np.int8)


def time_columns(ts: np.ndarray, dur: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ns, as in the file) of complete events; a negative ``dur`` counts as 0."""
    start = ns_column(ts, where, "ts")
    end = ns_column(dur, where, "dur")
    np.maximum(end, 0, out=end)
    end += start
    return start, end


def ns_column(values: Sequence[Any] | np.ndarray, where: str, what: str) -> np.ndarray:
    """Microsecond values (as JSON gives them) as int64 ns, exact to the ns for anything a float64 holds exactly."""
    try:
        us = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgument(f"cannot load trace {where}: an event's {what} is not a number") from None
    if us.size and not max(us.max(), -us.min()) <= _US_MAX:  # NaN fails the test too
        if not np.isfinite(us).all():
            raise InvalidArgument(f"cannot load trace {where}: an event's {what} is not a finite number")
        raise InvalidArgument(f"cannot load trace {where}: an event's {what} is out of range ({np.abs(us).max():g} µs)")
    whole = np.floor(us)
    fraction = np.subtract(us, whole)  # in place from here on: a column of a large file is 10^6 values
    fraction *= 1000
    np.rint(fraction, out=fraction)
    ns = whole.astype(np.int64)
    ns *= 1000
    ns += fraction.astype(np.int64)
    return ns


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


def distinct(values: np.ndarray, first: bool = False) -> tuple[np.ndarray, ...]:
    """``np.unique(values, return_inverse=True)`` of an integer array (``return_index=True`` too where ``first``):
    the sorted distinct values, where each first occurs, and each value's index among them. Where the values span a
    small range, or are int64 keys whose high and low 32 bits each do (``pid << 32 | tid``), they are counted in a
    table over it, without a sort: a load's streams, threads and names are few among 10^5 or more events."""
    values = np.asarray(values)
    coded = _counted(values, True)
    if coded is None:
        found, index, inverse = np.unique(values, return_index=True, return_inverse=True)
        return (found, index, inverse.reshape(-1)) if first else (found, inverse.reshape(-1))
    found, inverse = coded
    if not first:
        return found, inverse
    index = np.full(found.size, values.size, np.intp)
    np.minimum.at(index, inverse, np.arange(values.size))
    return found, index, inverse


def distinct_values(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer array (``distinct``'s first result, without the rest)."""
    values = np.asarray(values)
    coded = _counted(values, False)
    return np.unique(values, return_index=True)[0] if coded is None else coded[0]


def _counted(values: np.ndarray, inverse: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``distinct`` by counting (``_dense``, ``_dense_pairs``); None where the values are not in such ranges."""
    coded = _dense(values, inverse)
    if coded is None and values.dtype == np.int64 and values.size:
        coded = _dense_pairs(values, inverse)
    return coded


def _dense(values: np.ndarray, inverse: bool = True) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``distinct`` by a table over the values' range; None where it is empty or wider than a few times their count."""
    if not values.size:
        return None
    low, high = int(values.min()), int(values.max())
    if high - low > 2 * values.size + 1024:
        return None
    shifted = np.subtract(values, low, dtype=np.intp)
    present = np.bincount(shifted, minlength=high - low + 1) > 0
    found = (np.flatnonzero(present) + low).astype(values.dtype)
    return found, (np.cumsum(present) - 1)[shifted] if inverse else None


def _dense_pairs(keys: np.ndarray, inverse: bool) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``distinct`` of int64 keys by their high and low 32 bits, each in a small range (None where not): ordered by
    (high, low), which is the keys' order."""
    high, low = _dense(keys >> 32), _dense(keys & 0xFFFFFFFF)
    if high is None or low is None:
        return None
    pairs = _dense(high[1] * low[0].size + low[1], inverse)  # type: ignore[operator]
    if pairs is None:
        return None
    code = pairs[0]
    return (high[0][code // low[0].size] << 32) | low[0][code % low[0].size], pairs[1]


def first_rows(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted``, the first row whose key equals it (-1: none; a key or wanted value below 0 matches
    nothing). Keys in a small range are looked up in a table over it, others found by a sort."""
    out = np.full(wanted.size, -1, np.intp)
    rows = np.flatnonzero(keys >= 0)
    if not rows.size or not wanted.size:
        return out
    valid = keys[rows]
    low, high = int(valid.min()), int(valid.max())
    if high - low <= 2 * (rows.size + wanted.size) + 1024:
        first = np.full(high - low + 1, keys.size, np.intp)  # keys.size: no such key
        np.minimum.at(first, valid - low, rows)
        inside = np.flatnonzero((wanted >= low) & (wanted <= high))
        found = first[wanted[inside] - low]
        out[inside] = np.where(found < keys.size, found, -1)
        return out
    order = np.argsort(valid, kind="stable")
    sorted_keys = valid[order]
    pos = np.minimum(np.searchsorted(sorted_keys, wanted), sorted_keys.size - 1)
    hit = (sorted_keys[pos] == wanted) & (wanted >= 0)
    out[hit] = rows[order[pos[hit]]]
    return out


def pick(values: np.ndarray, rows: np.ndarray, default: Any) -> np.ndarray:
    """``values[rows]``, ``default`` where a row is -1 (``first_rows``: none)."""
    out = np.full(rows.size, default, dtype=values.dtype)
    found = rows >= 0
    out[found] = values[rows[found]]
    return out


def link_column(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray, default: Any) -> np.ndarray:
    """``values`` of the rows whose ``keys`` equal each of ``wanted`` (the first such row), else ``default``."""
    return pick(values, first_rows(keys, wanted), default)


class NameCodes(NamedTuple):
    """A string column of a span block given as codes into ``table`` (an object array): the codes are put in start
    order and looked up once, not a million references moved at each step."""

    codes: np.ndarray
    table: np.ndarray


class Block(dict):
    """A span block of ``n`` rows: the columns given (arrays of the column's dtype, one value for every row, or a
    ``NameCodes`` name); the others hold their defaults (``concat_blocks`` fills them)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n


def span_block(n: int, **columns: Any) -> Block:
    """A span-column block of ``n`` rows: the columns given, defaults for the rest."""
    block = Block(n)
    for column, value in columns.items():
        dtype = COLUMNS.get(column)
        if dtype is None or isinstance(value, NameCodes):
            block[column] = value
        elif dtype is object:
            block[column] = np.array(value, dtype=object) if len(value) == n else np.full(n, value, dtype=object)
        elif np.ndim(value):
            block[column] = np.asarray(value).astype(dtype, copy=False)
        else:
            block[column] = np.asarray(value).astype(dtype)  # one value for every row, cast as the column would
    return block


def concat_blocks(blocks: list[Block]) -> Handover:
    """The span blocks as one table, in start order (a stable sort of their starts): each column written once, each
    block's rows straight to their places, and handed over to the trace's storage (``Handover``: no copy there)."""
    blocks = [b for b in blocks if b.n]
    if not blocks:
        return Handover({c: np.zeros(0, dtype) for c, dtype in COLUMNS.items()})
    start = np.concatenate([b["start_ns"] for b in blocks])
    order = np.argsort(start, kind="stable")
    place = np.empty(start.size, np.intp)
    place[order] = np.arange(start.size)
    bounds = np.cumsum([0] + [b.n for b in blocks]).tolist()
    rows = [place[a:z] for a, z in zip(bounds[:-1], bounds[1:])]
    table = Handover(start_ns=start[order])
    for column, dtype in COLUMNS.items():
        if column == "start_ns":
            continue
        given = [b.get(column, DEFAULTS.get(column, 0)) for b in blocks]
        coded = [v for v in given if isinstance(v, NameCodes)]
        if coded and len(coded) == len(given) and all(v.table is coded[0].table for v in coded):
            codes = np.empty(start.size, np.intp)
            for at, value in zip(rows, coded):
                codes[at] = value.codes
            table[column] = coded[0].table[codes]
            continue
        fill = next((v for v in given if not isinstance(v, NameCodes) and not np.ndim(v)), None)
        out = np.empty(start.size, dtype) if fill is None else np.full(start.size, fill, dtype)
        for at, value in zip(rows, given):
            if value is not fill:  # the blocks that hold one value for every row: written by the fill
                out[at] = value.table[value.codes] if isinstance(value, NameCodes) else value
        table[column] = out
    return table


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
