"""Trace events decoded straight into columns: the typed events of a piece (``kineto_types.py``) sorted into groups
by phase and category (``read_piece``), each group's fields gathered into NumPy columns while the piece's Structs are
let go, and the pieces joined in the file's order (``Collector``, ``EventGroups``).

Names, pids and tids become codes into tables (``EventGroups.names``, ``ids``), so that a string repeated a million
times is held once."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, compress
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from ..errors import InvalidArgument
from .kineto_events import int_or
from .kineto_types import (
    KINETO_COMPLETE,
    KINETO_INSTANT,
    KINETO_METADATA,
    NO_ARGS,
    OBJECT_ARGS,
    Complete,
    Counter,
    Event,
    FlowEnd,
    FlowStart,
    Instant,
    Metadata,
    decoder,
    int_arg,
)
from .spans import pack_dim3

#: Event categories (lower case) -> the group they are read into; others (Trace, overhead, ...) are skipped.
_X_GROUPS = {
    "kernel": "device",
    "gpu_memcpy": "device",
    "memcpy": "device",
    "gpu_memset": "device",
    "memset": "device",
    "cuda_runtime": "api",
    "cuda_driver": "api",
    "runtime": "api",
    "cpu_op": "range",
    "operator": "range",
    "user_annotation": "range",
    "gpu_user_annotation": "device_range",
    "python_function": "python",
}
GROUPS = ("", "device", "api", "range", "device_range", "python", "flow_start", "flow_end", "memory")
_CODE = {name: i for i, name in enumerate(GROUPS)}
_X, _S, _F, _I, _M, _C = 1, 2, 3, 4, 5, 6
#: The args each group keeps; ``own`` adds those our own exports write.
_ARGS = {
    "device": ("device", "stream", "correlation", "bytes", "grid", "block", "registers", "shared"),
    "device_range": ("device", "stream"),
    "api": ("correlation",),
    "memory": ("device_type", "device_id", "total_allocated"),
}
_OWN_ARGS = {
    "device": ("pinned", "op", "enqueued", "source_location"),
    "device_range": ("op", "enqueued", "correlation", "source_location"),
    "api": ("kind", "device", "bytes", "op", "enqueued", "source_location"),
    "range": ("correlation", "kind", "device", "bytes", "op", "enqueued", "source_location"),
    "memory": ("held_bytes", "used_bytes"),
}
#: Args with few distinct values (hashable: ints, strings, ``grid`` / ``block`` tuples), gathered together.
_FEW = frozenset(("device", "stream", "grid", "block", "registers", "shared", "device_type", "device_id"))
#: The fields every read complete event has that become codes, gathered together (few distinct combinations).
_HEAD = attrgetter("cat", "name", "pid", "tid")
#: A counter event as read: (index in traceEvents, name, pid, tid, ts in µs, id, args).
CounterEvent = tuple[int, str, Any, Any, float, Any, dict[str, Any]]
_CAT, _NAME, _PID, _TID = attrgetter("cat"), attrgetter("name"), attrgetter("pid"), attrgetter("tid")
_TS, _DUR, _ID_OF, _ARGS_OF = attrgetter("ts"), attrgetter("dur"), attrgetter("id"), attrgetter("args")


def _pick(events: list[Any], rows: np.ndarray) -> list[Any]:
    return list(map(events.__getitem__, rows.tolist()))


def _where(events: list[Any], mask: np.ndarray) -> list[Any]:
    """The events where ``mask`` (bool) is set: ``compress`` over its bytes, faster than ``_pick``."""
    return list(compress(events, mask.tobytes()))


class _Codes(dict):
    """Value -> code, in order of first appearance; ``values[code]`` is the value."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[Any] = []

    def __missing__(self, value: Any) -> int:
        code = self[value] = len(self.values)
        self.values.append(value)
        return code


class _Phases(dict):
    """An event's Struct type -> its phase's code (0: a phase the loader does not read)."""

    def __missing__(self, kind: Any) -> int:
        self[kind] = 0
        return 0


_PHASES = _Phases({Complete: _X, FlowStart: _S, FlowEnd: _F, Instant: _I, Metadata: _M, Counter: _C})
_PHASES.update({KINETO_COMPLETE: _X, KINETO_INSTANT: _I, KINETO_METADATA: _M})


class Group:
    """One group's events as columns: ``index`` (position in traceEvents), ``ts`` / ``dur`` (µs, as in the file),
    ``name`` / ``pid`` / ``tid`` / ``cat`` (codes into ``EventGroups``' tables; -1: not read), ``id`` (a list of
    the flows' ids; None in other groups), ``args`` (one column per kept key: int64 arrays, lists for values of any
    type)."""

    def __init__(self, columns: dict[str, Any], args: dict[str, Any]) -> None:
        self.index: np.ndarray = columns["index"]
        self.ts: np.ndarray = columns["ts"]
        self.dur: np.ndarray = columns["dur"]
        self.name: np.ndarray = columns["name"]
        self.pid: np.ndarray = columns["pid"]
        self.tid: np.ndarray = columns["tid"]
        self.cat: np.ndarray = columns["cat"]
        self.id: list[Any] | None = columns["id"]
        self.present: np.ndarray | None = columns["present"]  # whether each event has args (own exports only)
        self.args = args

    def __len__(self) -> int:
        return len(self.index)

    def arg(self, key: str) -> Any:
        return self.args[key]

    def take(self, rows: np.ndarray) -> Group:
        """The group's rows ``rows`` (an index array or a mask)."""
        pick = np.flatnonzero(rows) if rows.dtype == bool else rows
        columns = {k: _take(v, pick) for k, v in vars(self).items() if k != "args"}
        return Group(columns, {k: _take(v, pick) for k, v in self.args.items()})


def _take(values: Any, pick: np.ndarray) -> Any:
    if values is None:
        return None
    return values[pick] if isinstance(values, np.ndarray) else [values[i] for i in pick.tolist()]


class EventGroups:
    """The file's events that the readers use, by group (``device``, ``api``, ``range``, ``device_range``,
    ``python``, ``flow_start``, ``flow_end``, ``memory``: each a ``Group``), the tables their codes index, and the
    metadata that names rows; the counter events as read (``counters``)."""

    def __init__(self, groups: dict[str, Group], names: list[str], ids: list[Any], cats: list[str]) -> None:
        self.device, self.api, self.range = groups["device"], groups["api"], groups["range"]
        self.device_range, self.python = groups["device_range"], groups["python"]
        self.flow_start, self.flow_end, self.memory = groups["flow_start"], groups["flow_end"], groups["memory"]
        self.names, self.ids, self.cats = names, ids, cats
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.counters: list[CounterEvent] = []  # the counter events (``C``, few), in file order
        self._name_array: np.ndarray | None = None

    def names_of(self, group: Group) -> np.ndarray:
        """The group's names, an object array sharing one str per distinct name."""
        return self.name_table()[group.name]

    def name_table(self) -> np.ndarray:
        """``names`` as an object array, which a group's ``name`` codes index."""
        if self._name_array is None:
            self._name_array = np.empty(len(self.names), object)
            self._name_array[:] = self.names
        return self._name_array

    def ids_of(self, codes: np.ndarray) -> list[Any]:
        """The pid or tid values of ``codes``."""
        return [self.ids[c] for c in codes.tolist()]

    def ints_of(self, codes: np.ndarray, default: int) -> np.ndarray:
        """The pid or tid values of ``codes`` as ints (``default`` for a string that is no number, None ..., and
        for code -1: not read)."""
        return np.array([int_or(v, default) for v in self.ids] + [default], np.int64)[codes]

    def threads_of(self, group: Group) -> np.ndarray:
        """A code per (pid, tid) pair: ``pid << 32 | tid`` of their codes (``thread_key`` reads it back)."""
        return (group.pid.astype(np.int64) << 32) | group.tid.astype(np.int64)

    def thread_key(self, code: int) -> tuple[Any, Any]:
        return self.ids[code >> 32], self.ids[code & 0xFFFFFFFF]


class Piece:
    """One piece of traceEvents read into columns (``read_piece``): per group code, its columns with codes into the
    piece's own tables (``names``, ``ids``, ``cats``) and indices from the piece's first event; the metadata it
    holds; its counter events (``counters``, indices from the piece's first event); ``no_ts``: (index, name) of a
    read event without ``ts``. Pieces pickle, so a helper process can read
    them (``kineto_helper.py``)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.groups: dict[int, dict[str, Any]] = {}
        self.names: list[str] = []
        self.ids: list[Any] = []
        self.cats: list[str] = []
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.process_names: dict[Any, str] = {}
        self.counters: list[CounterEvent] = []
        self.needs_flows = False
        self.no_ts: tuple[int, str] | None = None


def read_piece(events: list[Event], own: bool, flows: bool) -> Piece:
    """Sort decoded events into groups and gather each group's fields into columns. ``own``: keep the args our own
    exports write too; ``flows``: keep the ``ac2g`` flow events (read only to link device work and runtime calls
    that lack ``args.correlation``; ``Piece.needs_flows`` says whether such an event was seen)."""
    return _PieceReader(own, flows).read(events)


class _PieceReader:
    """Reads one piece. The fields every complete event has (ts, dur, name, pid, tid) are gathered over all of the
    piece's read complete events in file order, one pass per field, and split into groups with NumPy: a pass over a
    group's events alone jumps through memory (device work is one event in six) and took twice as long per event on
    the 2-core development machine. Only the args a group keeps are gathered per group."""

    def __init__(self, own: bool, flows: bool) -> None:
        self.own, self.flows = own, flows
        self.names, self.ids, self.cats = _Codes(), _Codes(), _Codes()

    def read(self, events: list[Event]) -> Piece:
        n = len(events)
        piece = Piece(n)
        phase = np.frombuffer(bytes(map(_PHASES.__getitem__, map(type, events))), np.int8)
        self._complete(events, phase == _X, piece)
        if self.flows:
            rows = np.flatnonzero((phase == _S) | (phase == _F))
            self._flows(events, rows, phase[rows] == _S, piece)
        memory = [i for i in np.flatnonzero(phase == _I).tolist() if events[i].name == "[memory]"]
        if memory:
            rows = np.array(memory, np.int64)
            cat = np.full(rows.size, -1, np.int64)  # an instant event has no category read
            piece.groups[_CODE["memory"]] = self._columns("memory", _pick(events, rows), rows, cat, piece)
        for i in np.flatnonzero(phase == _M).tolist():
            _metadata(events[i], piece)
        counters = np.flatnonzero(phase == _C)
        if counters.size:
            found = _pick(events, counters)
            self._check_ts(np.array([e.ts for e in found], np.float64), counters, found, piece)
            piece.counters = [(i, e.name, e.pid, e.tid, e.ts, e.id, e.args) for i, e in zip(counters.tolist(), found)]
        piece.names, piece.ids, piece.cats = self.names.values, self.ids.values, self.cats.values
        return piece

    def _complete(self, events: list[Event], complete: np.ndarray, piece: Piece) -> None:
        """The complete events (``complete``: a mask) of the groups a category names, as columns per group."""
        xs, rows = _where(events, complete), np.flatnonzero(complete)
        heads = _Codes()  # (cat, name, pid, tid) -> code: one dict lookup per event for the four
        head = np.fromiter(map(heads.__getitem__, map(_HEAD, xs)), np.int64, len(xs))
        tables = (self.cats, self.names, self.ids, self.ids)
        coded = np.array([[t[v] for t, v in zip(tables, h)] for h in heads.values], np.int64).reshape(-1, 4)
        groups = np.array([_CODE[_X_GROUPS.get(c) or _X_GROUPS.get(c.lower(), "")] for c in self.cats.values], np.int8)
        group = groups[coded[head, 0]] if head.size else np.zeros(0, np.int8)
        kept = group != 0
        if not kept.all():  # categories no reader reads (Trace, overhead ...)
            xs, rows, head, group = _where(xs, kept), rows[kept], head[kept], group[kept]
        m = len(xs)
        if not m:
            return
        ts = np.fromiter(map(_TS, xs), np.float64, m)
        self._check_ts(ts, rows, xs, piece)
        common = {"index": rows, "ts": ts, "dur": np.fromiter(map(_DUR, xs), np.float64, m)}
        for j, key in enumerate(("cat", "name", "pid", "tid")):
            common[key] = coded[:, j][head]
        counts = np.bincount(group, minlength=len(GROUPS))
        codes = np.flatnonzero(counts).tolist()
        every = list(map(_ARGS_OF, xs)) if any(self._keeps_args(GROUPS[code]) for code in codes) else []
        if every and not self.own and {_CODE["device"], _CODE["api"]} <= set(codes):
            common["args.correlation"] = _ints(every, "correlation")  # both read it: one pass in file order
        for code in codes:
            name, whole = GROUPS[code], counts[code] == m
            mine = group == code
            columns = {k: v if whole else v[mine] for k, v in common.items() if self._keeps(name, k)}
            rest = self.own or any("args." + key not in columns for key in self._keys(name))
            args = (every if whole else _where(every, mine)) if rest else []
            columns["id"] = None  # only flows' ids are read
            self._args(name, args, columns, piece)
            piece.groups[code] = columns

    def _flows(self, events: list[Event], rows: np.ndarray, start: np.ndarray, piece: Piece) -> None:
        """The ``ac2g`` flow events as two groups (``rows``: the flow events of any category; ``start``: which of
        them start a flow)."""
        flows = _pick(events, rows)
        cat = self._codes(self.cats, _CAT, flows)
        ac2g = np.array([c == "ac2g" for c in self.cats.values], bool)[cat] if cat.size else np.zeros(0, bool)
        for group, mine in (("flow_start", ac2g & start), ("flow_end", ac2g & ~start)):
            sel = np.flatnonzero(mine)
            if sel.size:
                piece.groups[_CODE[group]] = self._columns(group, _pick(flows, sel), rows[sel], cat[sel], piece)

    def _columns(self, group: str, events: list[Any], index: np.ndarray, cat: np.ndarray, piece: Piece) -> dict:
        """The columns of flows (no dur, no name, no args) or ``[memory]`` events (no dur)."""
        m = len(events)
        ts = np.fromiter(map(_TS, events), np.float64, m)
        self._check_ts(ts, index, events, piece)
        flow = group.startswith("flow")
        columns: dict[str, Any] = {
            "index": index,
            "ts": ts,
            "dur": np.zeros(m),
            "name": np.full(m, self.names[""]) if flow else self._codes(self.names, _NAME, events),
            "pid": self._codes(self.ids, _PID, events),
            "tid": self._codes(self.ids, _TID, events),
            "cat": cat,
            "id": list(map(_ID_OF, events)) if flow else None,
        }
        if flow:
            columns["present"] = None
        else:
            self._args(group, list(map(_ARGS_OF, events)) if self._keeps_args(group) else [], columns, piece)
        return columns

    def _keeps_args(self, group: str) -> bool:
        return self.own or group in _ARGS

    def _keys(self, group: str) -> tuple[str, ...]:
        """The args ``group`` keeps."""
        return _ARGS.get(group, ()) + (_OWN_ARGS.get(group, ()) if self.own else ())

    def _keeps(self, group: str, column: str) -> bool:
        return not column.startswith("args.") or column[5:] in self._keys(group)

    def _args(self, group: str, args: list[Any], columns: dict[str, Any], piece: Piece) -> None:
        """The args ``group`` keeps (``_ARGS``, ``_OWN_ARGS``) as columns ``args.KEY`` (those ``columns`` lacks),
        and ``present`` (``args``: the group's events' args, where it needs them)."""
        m = len(columns["index"])
        keys = [key for key in self._keys(group) if "args." + key not in columns]
        columns["present"] = np.fromiter((a is not NO_ARGS for a in args), bool, m) if self.own else None
        few = [key for key in keys if key in _FEW]
        if few:  # one dict lookup per event for all of them, each distinct combination converted once
            combos = _Codes()
            code = np.fromiter(map(combos.__getitem__, map(attrgetter(*few), args)), np.int64, m)
            combined = combos.values if len(few) > 1 else [(v,) for v in combos.values]
            for key, values in zip(few, zip(*combined)):
                table = _dim3(list(values)) if key in ("grid", "block") else _int_values(values, key)
                columns["args." + key] = table[code]
        for key in keys:
            if key in OBJECT_ARGS and key not in _FEW:
                columns["args." + key] = list(map(attrgetter(key), args))
            elif key not in _FEW:
                columns["args." + key] = _ints(args, key)
        if group in ("device", "api") and not piece.needs_flows:
            piece.needs_flows = bool((columns["args.correlation"] < 0).any())

    @staticmethod
    def _check_ts(ts: np.ndarray, index: np.ndarray, events: list[Any], piece: Piece) -> None:
        """Note the first read event without ``ts`` (NaN, no JSON, is the default)."""
        missing = np.flatnonzero(np.isnan(ts))
        if missing.size and (piece.no_ts is None or index[missing[0]] < piece.no_ts[0]):
            piece.no_ts = int(index[missing[0]]), getattr(events[missing[0]], "name", "")

    @staticmethod
    def _codes(table: _Codes, field: attrgetter, events: list[Any]) -> np.ndarray:
        return np.fromiter(map(table.__getitem__, map(field, events)), np.int64, len(events))


def _metadata(e: Any, piece: Piece) -> None:
    name = e.args.name
    if isinstance(name, str):
        if e.name == "thread_name":
            piece.thread_names[(e.pid, e.tid)] = name
        elif e.name == "process_name":
            piece.process_names[e.pid] = name


class Collector:
    """Gathers pieces, in the file's order, into ``EventGroups``: ``add(piece)`` per piece (its codes become codes
    into tables of the whole file, its indices positions in traceEvents), ``groups()`` at the end. A read event
    without ``ts`` is an error naming it. ``own`` and ``flows``: what the pieces keep (``read_piece``)."""

    def __init__(self, where: str, own: bool = False, flows: bool = True) -> None:
        self.where, self.own, self.flows = where, own, flows
        self.needs_flows = False
        self.count = 0  # events added so far
        self._names, self._ids, self._cats = _Codes(), _Codes(), _Codes()
        self._parts: dict[int, list[dict[str, Any]]] = {code: [] for code in range(1, len(GROUPS))}
        self._process_names: dict[Any, str] = {}
        self._thread_names: dict[tuple[Any, Any], str] = {}
        self._counters: list[CounterEvent] = []

    @property
    def decoder(self) -> msgspec.json.Decoder:
        return decoder(self.flows, self.own)

    def read(self, events: list[Event]) -> None:
        """Read and add one piece of decoded events."""
        self.add(read_piece(events, self.own, self.flows))

    def add(self, piece: Piece) -> None:
        first = self.count
        if piece.no_ts is not None:
            what = f"traceEvents[{first + piece.no_ts[0]}] ({piece.no_ts[1]!r})"
            raise InvalidArgument(f"cannot load trace {self.where}: {what} has no ts")
        names, ids, cats = (
            np.array([table[v] for v in values] + [-1], np.int64)  # -1 (not read) stays -1
            for table, values in ((self._names, piece.names), (self._ids, piece.ids), (self._cats, piece.cats))
        )
        for code, columns in piece.groups.items():
            columns["index"] = columns["index"] + first
            columns["name"], columns["cat"] = names[columns["name"]], cats[columns["cat"]]
            columns["pid"], columns["tid"] = ids[columns["pid"]], ids[columns["tid"]]
            self._parts[code].append(columns)
        self._thread_names.update(piece.thread_names)
        self._process_names.update(piece.process_names)
        self._counters += [(first + i, *rest) for i, *rest in piece.counters]
        self.needs_flows = self.needs_flows or piece.needs_flows
        self.count += piece.count

    def groups(self) -> EventGroups:
        built = {}
        for code, parts in self._parts.items():
            name = GROUPS[code]
            keys = ["index", "ts", "dur", "name", "pid", "tid", "cat", "id", "present"]
            keys += ["args." + k for k in _ARGS.get(name, ()) + (_OWN_ARGS.get(name, ()) if self.own else ())]
            columns = {key: _concat([p[key] for p in parts], key) for key in keys}
            args = {k.removeprefix("args."): v for k, v in columns.items() if k.startswith("args.")}
            built[name] = Group({k: v for k, v in columns.items() if not k.startswith("args.")}, args)
        out = EventGroups(built, self._names.values, self._ids.values, self._cats.values)
        out.process_names, out.thread_names = self._process_names, self._thread_names
        out.counters = self._counters
        return out


_EMPTY_COLUMN = {"ts": np.float64, "dur": np.float64, "present": bool}
_LIST_COLUMNS = frozenset(("id", *("args." + k for k in OBJECT_ARGS if k not in ("grid", "block"))))


def _concat(parts: list[Any], key: str) -> Any:
    if any(p is None for p in parts):
        return None
    if key in _LIST_COLUMNS:
        return list(chain.from_iterable(parts))
    if not parts:
        return np.zeros(0, _EMPTY_COLUMN.get(key, np.int64))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _ints(args: list[Any], key: str) -> np.ndarray:
    """An int arg of each event as int64 (``_int_values``)."""
    try:
        return np.fromiter(map(attrgetter(key), args), np.int64, len(args))
    except (OverflowError, TypeError, ValueError):
        return _int_values(list(map(attrgetter(key), args)), key)


def _int_values(values: Sequence[Any], key: str) -> np.ndarray:
    """An int arg's values as int64. One that is no int (a string, one beyond int64) reads as the readers always
    read it: a numeric string as its number, anything else as 0 for ``device`` and ``stream``, as the arg's default
    for the others; ``Device Type`` only as an int."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (OverflowError, TypeError, ValueError):
        return np.array([int_arg(key, v) for v in values], np.int64)


def _dim3(values: list[tuple[int, int, int]]) -> np.ndarray:
    """``grid`` or ``block`` values packed (``pack_dim3``; 0 where absent or x is not positive)."""
    n = len(values)
    try:
        xyz = np.fromiter(chain.from_iterable(values), np.int64, 3 * n).reshape(n, 3)
    except OverflowError:
        xyz = np.array([[v if -(1 << 63) <= v < (1 << 63) else 0 for v in a] for a in values])
        xyz = xyz.reshape(n, 3).astype(np.int64)
    return np.where(xyz[:, 0] > 0, pack_dim3(xyz[:, 0], xyz[:, 1], xyz[:, 2]), 0).astype(np.int64)
