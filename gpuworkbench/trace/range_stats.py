"""Host ranges and the device work enqueued inside them: ``statistics().ranges``, as ``nsys stats``' NVTX summary.

A range is a ``range`` span on a host row (a negative stream): ``gw.range``, another library's NVTX range, a Kineto
file's ``cpu_op``, a Dask task. Device work (kernels, copies, memsets) is *under* a range when the host enqueued it
inside the range's host interval (both ends included) on the range's thread. An op's thread is the row of the ``api``
span that shares its ``corr`` in its process; an op without one (the workbench's own ops, timed by events) is under
every range of its process whose interval holds its enqueue time. Its enqueue time is ``enqueue_ns``, else the start
of its api call; an op with neither is under no range. Nested ranges each count the op; a name nested in itself counts
it once. ``processes`` maps device numbers to the process that drives them (a Dask trace's workers); without it every
device belongs to one process.

Per range name (without the ", seq = N, op_id = M" that PyTorch's ``emit_nvtx`` appends to each instance, so that a
name's instances are one row): ``count`` (instances), host time (``host_total_ns``, ``host_median_ns``: the ranges'
own durations), and the device work under them: ``ops``, ``kernels``, ``copies`` (h2d, d2h, d2d) and ``device_ns``,
the union of their device intervals on each device (as the kernel table's busy time: never a sum across streams),
added over the devices.

Vectorised: each range joins a group of its thread and one of its process (only groups that some op looks in); the
boundaries of a group's ranges cut its time into segments, each range lists the segments it covers, and each op finds
its segment with one ``searchsorted``. The cost is a few sorts of the spans plus one row per (op, enclosing range).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .codes import factorize
from .spans import HOST_KINDS, KIND_CODE, KINDS

#: Columns of ``statistics().ranges``, in order.
RANGE_COLUMNS = ("name", "count", "host_total_ns", "host_median_ns", "device_ns", "ops", "kernels", "copies")

_RANGE, _API, _KERNEL = KIND_CODE["range"], KIND_CODE["api"], KIND_CODE["kernel"]
_WORK = np.array([k not in HOST_KINDS for k in KINDS])
_COPY = np.array([k in ("h2d", "d2h", "d2d") for k in KINDS])
_MIN, _MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
#: Where emit_nvtx's per-instance suffix begins.
_EMIT_NVTX = re.compile(r", (?:seq|op_id) = \d")
#: Groups' times are laid side by side below this; past it (traces of days in many groups) times are ranked first.
_LIMIT = 1 << 62


def plain_range_name(name: str) -> str:
    """A range's name without what ``torch.autograd.profiler.emit_nvtx`` appends to each instance (", seq = 4, op_id =
    17, sizes = [...]"), so that a name's instances are one row: "forward, op_id = 7" is "forward"."""
    return _EMIT_NVTX.split(name, 1)[0]


def empty_ranges() -> dict[str, np.ndarray]:
    """The ranges table with no rows (a trace without host ranges)."""
    dtypes = {"name": object, "host_median_ns": np.float64}
    return {c: np.zeros(0, dtypes.get(c, np.int64)) for c in RANGE_COLUMNS}


def range_columns(table: Mapping[str, np.ndarray], processes: Mapping[int, int] | None = None) -> dict[str, Any]:
    """Host ranges grouped by name (``RANGE_COLUMNS``), host time descending; ``processes``: device -> process."""
    kind = np.asarray(table["kind"])
    stream = np.asarray(table["stream"], np.int64)
    ranges = np.flatnonzero((kind == _RANGE) & (stream < 0))
    if not ranges.size:
        return empty_ranges()
    start = np.asarray(table["start_ns"], np.int64)
    end = np.asarray(table["end_ns"], np.int64)
    device = np.asarray(table["device"], np.int64)
    process = _process_codes(device, processes)
    names, code = _name_codes(np.asarray(table["name"], dtype=object)[ranges])
    n = names.size
    ops, when, thread = _enqueued(table, kind, stream, start, process)
    pair_op, name = _under(
        start[ranges], end[ranges], process[ranges], stream[ranges], code, n, when, process[ops], thread
    )
    op = ops[pair_op]
    op_kind = kind[op]
    low = int(device.min())
    devices = int(device.max()) - low + 1
    busy = _busy(name * devices + device[op] - low, start[op], end[op], n * devices).reshape(n, devices).sum(axis=1)
    durations = end[ranges] - start[ranges]
    order = np.lexsort((durations, code))
    ordered = durations[order]
    count = np.bincount(code, minlength=n)
    first = np.cumsum(count) - count
    out: dict[str, Any] = {
        "name": names,
        "count": count.astype(np.int64),
        "host_total_ns": np.add.reduceat(ordered, first),
        "host_median_ns": (ordered[first + (count - 1) // 2] + ordered[first + count // 2]) / 2,
        "device_ns": busy.astype(np.int64),
        "ops": np.bincount(name, minlength=n).astype(np.int64),
        "kernels": np.bincount(name, weights=op_kind == _KERNEL, minlength=n).astype(np.int64),
        "copies": np.bincount(name, weights=_COPY[op_kind], minlength=n).astype(np.int64),
    }
    rank = np.lexsort((np.arange(n), -out["host_total_ns"]))  # names are sorted already: ties by name
    return {column: values[rank] for column, values in out.items()}


def _name_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct plain names (``plain_range_name``) of ``values`` and each value's index among them. A dict
    finds the distinct values (a sort of 10⁵ Python strings took ~5 × longer); only those are cut and sorted."""
    raw_code, raw = factorize(values)
    plain = [plain_range_name(str(v)) for v in raw.tolist()]
    names = sorted(set(plain))
    position = {name: i for i, name in enumerate(names)}
    plain_code = np.array([position[p] for p in plain], np.int64)
    return np.array(names, dtype=object), plain_code[raw_code]


def _process_codes(device: np.ndarray, processes: Mapping[int, int] | None) -> np.ndarray:
    """Each row's process as a code 0, 1 ... (devices ``processes`` does not name share one process)."""
    if not processes or not device.size:
        return np.zeros(device.size, np.int64)
    keys = np.array(sorted(processes), np.int64)
    values = np.array([processes[int(k)] for k in keys], np.int64)
    pos = np.minimum(np.searchsorted(keys, device), keys.size - 1)
    owner = np.where(keys[pos] == device, values[pos], values.min() - 1)
    return np.unique(owner, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _enqueued(
    table: Mapping[str, np.ndarray], kind: np.ndarray, stream: np.ndarray, start: np.ndarray, process: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Device work with a known enqueue time: its rows, that time, and its thread (the stream of the ``api`` span
    sharing its ``corr`` in its process; 0 where unknown)."""
    work = np.flatnonzero(_WORK[kind]) if kind.size else np.zeros(0, np.intp)
    when = np.asarray(table["enqueue_ns"], np.int64)[work]
    thread = np.zeros(work.size, np.int64)
    corr = np.asarray(table["corr"], np.int64) if "corr" in table else np.full(kind.size, -1, np.int64)
    api = np.flatnonzero((kind == _API) & (stream < 0) & (corr >= 0))
    linked = corr[work] >= 0
    if api.size and linked.any():
        calls, mine = corr[api], corr[work]
        width = int(process.max()) + 1
        if max(int(calls.max()), int(mine.max())) >= _LIMIT // width:  # correlation ids too large to pair: rank them
            ranks = np.unique(np.concatenate([calls, mine]), return_inverse=True)[1].reshape(-1)
            calls, mine = ranks[: api.size], ranks[api.size :]
        keys = calls * width + process[api]
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        wanted = mine * width + process[work]
        pos = np.minimum(np.searchsorted(keys, wanted), keys.size - 1)
        hit = linked & (keys[pos] == wanted)
        call = api[order[pos]]
        thread = np.where(hit, stream[call], 0)
        when = np.where((when < 0) & hit, start[call], when)
    known = when >= 0
    return work[known], when[known], thread[known]


def _under(
    r_start: np.ndarray,
    r_end: np.ndarray,
    r_process: np.ndarray,
    r_stream: np.ndarray,
    label: np.ndarray,
    labels: int,
    when: np.ndarray,
    o_process: np.ndarray,
    o_thread: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Every (op, range label) with the op's time in the closed interval of a range of that label in the op's
    thread's group (its process's where the thread is unknown), each pair once: op indices (into ``when``), labels."""
    nothing = np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = int(max(-r_stream.min(), -o_thread.min() if o_thread.size else 0)) + 1
    wanted = o_process * rows - o_thread  # thread 0 (unknown): the process's group
    thread_key, process_key = r_process * rows - r_stream, r_process * rows
    entry_key = np.concatenate([thread_key, process_key])
    entry_range = np.concatenate([np.arange(r_start.size)] * 2)
    used = np.isin(entry_key, wanted)
    entry_key, entry_range = entry_key[used], entry_range[used]
    if not entry_key.size:
        return nothing
    groups, entry_group = np.unique(entry_key, return_inverse=True)
    entry_group = entry_group.reshape(-1)
    pos = np.minimum(np.searchsorted(groups, wanted), groups.size - 1)
    found = np.flatnonzero(groups[pos] == wanted)
    op_group = pos[found]
    s, e, t = r_start[entry_range], r_end[entry_range] + 1, when[found]  # ranges as half-open [start, end + 1)
    blocks = _blocks(entry_group, groups.size, s, e)
    if blocks is None:  # only order matters here: ranks keep it
        ranks = np.unique(np.concatenate([s, e, t]), return_inverse=True)[1].reshape(-1)
        s, e, t = ranks[: s.size], ranks[s.size : 2 * s.size], ranks[2 * s.size :]
        blocks = _blocks(entry_group, groups.size, s, e)
        assert blocks is not None
    low, high, offset = blocks
    lift_s = s - low[entry_group] + offset[entry_group]
    lift_e = e - low[entry_group] + offset[entry_group]
    t = np.clip(t, low[op_group] - 1, high[op_group])  # outside its group's ranges: onto an uncovered edge
    lift_t = t - low[op_group] + offset[op_group]
    bounds = _distinct(np.concatenate([lift_s, lift_e]))
    lo, hi = np.searchsorted(bounds, lift_s), np.searchsorted(bounds, lift_e)
    segment = _ragged(lo, hi - lo)  # segment j is [bounds[j], bounds[j + 1])
    # each label once per segment (a label nested in itself, or open on several threads of the process)
    covering = _distinct(segment * labels + np.repeat(label[entry_range], hi - lo))
    segment, covering = covering // labels, covering % labels
    ptr = np.concatenate([[0], np.cumsum(np.bincount(segment, minlength=bounds.size))])
    op_segment = np.searchsorted(bounds, lift_t, side="right") - 1
    inside = op_segment >= 0
    op_segment, ops = op_segment[inside], found[inside]
    many = ptr[op_segment + 1] - ptr[op_segment]
    return np.repeat(ops, many).astype(np.int64), covering[_ragged(ptr[op_segment], many)].astype(np.int64)


def _blocks(
    group: np.ndarray, n: int, lows: np.ndarray, highs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each group's lowest and highest time and the offset that lays groups side by side: ``t - low + offset`` puts
    group g's times from ``low - 1`` to ``high`` in a block of its own, a gap before the next; None past ``_LIMIT``."""
    low, high = np.full(n, _MAX), np.full(n, _MIN)
    np.minimum.at(low, group, lows)
    np.maximum.at(high, group, highs)
    used = high >= low
    if float(np.sum(high[used].astype(np.float64) - low[used] + 3)) >= _LIMIT:
        return None
    low, high = np.where(used, low, 0), np.where(used, high, 0)
    width = np.where(used, high - low + 3, 0)
    return low, high, np.concatenate([[0], np.cumsum(width)[:-1]]) + 1


def _distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct ``values`` (``np.unique`` by a sort: its hash table is slower on large int arrays)."""
    values = np.sort(values)
    return values[np.append(True, values[1:] != values[:-1])] if values.size else values


def _ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])``, without the loop."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    if not total:
        return np.zeros(0, np.int64)
    shift = np.repeat(np.asarray(starts, np.int64) - (np.cumsum(counts) - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def _busy(group: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """|union of each group's intervals| (ns) for groups 0 .. n − 1 (touching intervals merge)."""
    busy = np.zeros(n, np.int64)
    if not group.size:
        return busy
    values = None
    blocks = _blocks(group, n, start, end)
    if blocks is None:  # merge ranks (same order), measure the merged pieces in ns
        values, ranks = np.unique(np.concatenate([start, end]), return_inverse=True)
        ranks = ranks.reshape(-1)
        start, end = ranks[: start.size], ranks[start.size :]
        blocks = _blocks(group, n, start, end)
        assert blocks is not None
    low, _, offset = blocks
    lift = offset[group] - low[group]
    starts, ends = start + lift, end + lift
    order = np.argsort(starts, kind="stable")
    starts, ends, group, lift = starts[order], ends[order], group[order], lift[order]
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.append(True, starts[1:] > reach[:-1]))
    last = np.append(first[1:] - 1, starts.size - 1)
    if values is None:
        length = reach[last] - starts[first]
    else:
        length = values[reach[last] - lift[first]] - values[starts[first] - lift[first]]
    np.add.at(busy, group[first], length)
    return busy
