"""Trace events decoded straight into columns: msgspec Structs that hold only the fields the loader reads (no dict
per event; one Struct type per phase, so that a flow carries no name and a skipped phase nothing), sorted into groups
by phase and category piece by piece (``read_piece``), each group's fields gathered into NumPy columns while the
piece's Structs are let go, and the pieces joined in the file's order (``Collector``, ``EventGroups``).

Names, pids and tids become codes into tables (``EventGroups.names``, ``ids``), so that a string repeated a million
times is held once. A file whose events do not fit these types (a name that is a number, a float where an int
belongs, ``NaN``) is read by ``kineto_read.py``'s slower path, which gives such events these types first
(``typed_events``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, Union

import msgspec
import numpy as np

from ..errors import InvalidArgument
from .kineto_events import int_or
from .spans import pack_dim3

#: An int arg the event does not have (device and stream fall back to its pid and tid).
MISSING = int(np.iinfo(np.int64).min)


class Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the readers use: Kineto's device work and memory events, metadata names, and what our own
    exports add (``op``, ``kind``, ``enqueued (us)``, ``held_bytes``, ``used_bytes``, ``source location``); every
    other key is skipped.
    An int may come as a string (roctracer writes a runtime call's stream as a pointer): ``_ints`` reads it."""

    device: int | str = MISSING
    stream: int | str = MISSING
    correlation: int | str = -1
    bytes: int | str = 0
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    pinned: int | bool = -1
    name: Any = None
    op: Any = None
    kind: Any = None
    enqueued: Any = msgspec.field(default=None, name="enqueued (us)")
    device_type: int | str = msgspec.field(default=-1, name="Device Type")
    device_id: int | str = msgspec.field(default=0, name="Device Id")
    total_allocated: int | str = msgspec.field(default=0, name="Total Allocated")
    held_bytes: int | str = 0
    used_bytes: int | str = -1
    source_location: int | str = msgspec.field(default=-1, name="source location")


NO_ARGS = Args()  # shared by every event without args (frozen: nothing can change it)


_ID = int | float | str | None  # what a pid or tid may be (Kineto writes "" on global events)


class Event(msgspec.Struct, gc=False, tag_field="ph"):
    """A trace event of a phase the loader does not read (its fields are skipped); the phase's letter (``ph``)
    picks the Struct, so that no event carries more than its phase needs."""


class Complete(Event, tag="X"):
    """A complete event: device work, runtime calls, ranges, Python calls."""

    cat: str = ""
    name: str = ""
    pid: _ID = None
    tid: _ID = None
    ts: float = float("nan")  # NaN is no JSON: it says the event has no ts
    dur: float = 0.0
    args: Args = NO_ARGS


class FlowStart(Event, tag="s"):
    """The start of a flow (``ac2g``: from a runtime call to the device work it enqueued)."""

    cat: str = ""
    pid: _ID = None
    tid: _ID = None
    ts: float = float("nan")
    id: int | str | None = None


class FlowEnd(FlowStart, tag="f"):
    """The end of a flow."""


class Instant(Event, tag="i"):
    """An instant event (PyTorch's ``[memory]``)."""

    name: str = ""
    pid: _ID = None
    tid: _ID = None
    ts: float = float("nan")
    args: Args = NO_ARGS


class Metadata(Event, tag="M"):
    """A metadata event (``thread_name``, ``process_name``)."""

    name: str = ""
    pid: _ID = None
    tid: _ID = None
    args: Args = NO_ARGS


#: The Chrome trace format's other phases ("B", "E", "C", "b", "e", "n", "P", "O", ...), every letter and "(", ")":
#: a phase outside them is read by the slower path, which files it under "?".
_OTHER = [
    msgspec.defstruct(f"Phase{ord(c)}", [], bases=(Event,), tag=c)
    for c in "?()ABCDEFGHIJKLNOPQRSTUVWYZabcdeghjklmnopqrtuvwxyz"
]
PHASES = frozenset("Xsfi M".replace(" ", "")) | {cls.__struct_config__.tag for cls in _OTHER}
_ANY = Union[(Complete, FlowStart, FlowEnd, Instant, Metadata, *_OTHER)]  # noqa: UP007 (built from a list)
#: Flows as Structs with no fields: where no event needs a flow to be linked, their fields are not even decoded.
_UNREAD_FLOWS = [msgspec.defstruct(f"Unread{ord(c)}", [], bases=(Event,), tag=c) for c in "sf"]
EVENTS = msgspec.json.Decoder(list[_ANY])
EVENTS_WITHOUT_FLOWS = msgspec.json.Decoder(
    list[Union[(Complete, *_UNREAD_FLOWS, Instant, Metadata, *_OTHER)]]  # noqa: UP007
)

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
_X, _S, _F, _I, _M = 1, 2, 3, 4, 5
#: The args each group keeps; ``own`` adds those our own exports write.
_ARGS = {
    "device": ("device", "stream", "correlation", "bytes", "grid", "block"),
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
_OBJECT_ARGS = frozenset(("grid", "block", "op", "kind", "enqueued", "name"))
_CAT, _NAME, _PID, _TID = attrgetter("cat"), attrgetter("name"), attrgetter("pid"), attrgetter("tid")
_TS, _DUR, _ID_OF, _ARGS_OF = attrgetter("ts"), attrgetter("dur"), attrgetter("id"), attrgetter("args")


def _pick(events: list[Any], rows: np.ndarray) -> list[Any]:
    return list(map(events.__getitem__, rows.tolist()))


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


_PHASES = _Phases({Complete: _X, FlowStart: _S, FlowEnd: _F, Instant: _I, Metadata: _M})


class Group:
    """One group's events as columns: ``index`` (position in traceEvents), ``ts`` / ``dur`` (µs, as in the file),
    ``name`` / ``pid`` / ``tid`` / ``cat`` (codes into ``EventGroups``' tables; device work's pid and tid are -1
    where no reader needs them), ``args`` (one column per kept key: int64 arrays, lists for values of any type)."""

    def __init__(self, columns: dict[str, Any], args: dict[str, Any]) -> None:
        self.index: np.ndarray = columns["index"]
        self.ts: np.ndarray = columns["ts"]
        self.dur: np.ndarray = columns["dur"]
        self.name: np.ndarray = columns["name"]
        self.pid: np.ndarray = columns["pid"]
        self.tid: np.ndarray = columns["tid"]
        self.cat: np.ndarray = columns["cat"]
        self.id: list[Any] = columns["id"]
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
    metadata that names rows."""

    def __init__(self, groups: dict[str, Group], names: list[str], ids: list[Any], cats: list[str]) -> None:
        self.device, self.api, self.range = groups["device"], groups["api"], groups["range"]
        self.device_range, self.python = groups["device_range"], groups["python"]
        self.flow_start, self.flow_end, self.memory = groups["flow_start"], groups["flow_end"], groups["memory"]
        self.names, self.ids, self.cats = names, ids, cats
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self._name_array: np.ndarray | None = None

    def names_of(self, group: Group) -> np.ndarray:
        """The group's names, an object array sharing one str per distinct name."""
        if self._name_array is None:
            self._name_array = np.empty(len(self.names), object)
            self._name_array[:] = self.names
        return self._name_array[group.name]

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
    holds; ``no_ts``: (index, name) of a read event without ``ts``. Pieces pickle, so a helper process can read
    them (``kineto_helper.py``)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.groups: dict[int, dict[str, Any]] = {}
        self.names: list[str] = []
        self.ids: list[Any] = []
        self.cats: list[str] = []
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.process_names: dict[Any, str] = {}
        self.needs_flows = False
        self.no_ts: tuple[int, str] | None = None


def decoder(flows: bool) -> msgspec.json.Decoder:
    """The decoder of a piece of events (flows with no fields where they are not kept)."""
    return EVENTS if flows else EVENTS_WITHOUT_FLOWS


def read_piece(events: list[Event], own: bool, flows: bool) -> Piece:
    """Sort decoded events into groups and gather each group's fields into columns. ``own``: keep the args our own
    exports write too; ``flows``: keep the ``ac2g`` flow events (read only to link device work and runtime calls
    that lack ``args.correlation``; ``Piece.needs_flows`` says whether such an event was seen)."""
    return _PieceReader(own, flows).read(events)


class _PieceReader:
    def __init__(self, own: bool, flows: bool) -> None:
        self.own, self.flows = own, flows
        self.names, self.ids, self.cats = _Codes(), _Codes(), _Codes()

    def read(self, events: list[Event]) -> Piece:
        n = len(events)
        piece = Piece(n)
        phase = np.fromiter(map(_PHASES.__getitem__, map(type, events)), np.int8, n)
        read = (phase == _X) | ((phase == _S) | (phase == _F)) & self.flows  # the events a category sorts
        rows = np.flatnonzero(read)
        cat = np.full(n, -1, np.int64)
        cat[rows] = self._codes(self.cats, _CAT, _pick(events, rows))
        groups = [_CODE[_X_GROUPS.get(c) or _X_GROUPS.get(c.lower(), "")] for c in self.cats.values]
        group = np.zeros(n, np.int8)
        x = phase == _X
        group[x] = np.array(groups, np.int8)[cat[x]] if groups else 0
        if self.flows:
            flow = read & ~x
            flow[flow] = np.array([c == "ac2g" for c in self.cats.values], bool)[cat[flow]]
            group[flow & (phase == _S)] = _CODE["flow_start"]
            group[flow & (phase == _F)] = _CODE["flow_end"]
        for i in np.flatnonzero(phase == _I).tolist():
            if events[i].name == "[memory]":
                group[i] = _CODE["memory"]
        for i in np.flatnonzero(phase == _M).tolist():
            _metadata(events[i], piece)
        counts = np.bincount(group, minlength=len(GROUPS))
        order = np.argsort(group, kind="stable")
        ends = np.cumsum(counts)
        for code in np.flatnonzero(counts[1:]).tolist():
            code += 1
            rows = order[ends[code] - counts[code] : ends[code]]
            piece.groups[code] = self._columns(GROUPS[code], _pick(events, rows), rows, cat[rows], piece)
        piece.names, piece.ids, piece.cats = self.names.values, self.ids.values, self.cats.values
        return piece

    def _columns(self, group: str, events: list[Any], index: np.ndarray, cat: np.ndarray, piece: Piece) -> dict:
        """The columns of one group's events (``Complete`` events; flows and ``[memory]`` have no dur, flows no name
        and no args)."""
        m = len(events)
        ts = np.fromiter(map(_TS, events), np.float64, m)
        missing = np.flatnonzero(np.isnan(ts))  # NaN is no JSON: the default of an event without ts
        if missing.size and (piece.no_ts is None or index[missing[0]] < piece.no_ts[0]):
            piece.no_ts = int(index[missing[0]]), getattr(events[missing[0]], "name", "")
        flow = group.startswith("flow")
        columns: dict[str, Any] = {
            "index": index,
            "ts": ts,
            "dur": np.zeros(m) if flow or group == "memory" else np.fromiter(map(_DUR, events), np.float64, m),
            "name": np.full(m, self.names[""]) if flow else self._codes(self.names, _NAME, events),
            "cat": cat,
            "id": list(map(_ID_OF, events)) if flow else [None] * m,
        }
        keys = _ARGS.get(group, ()) + (_OWN_ARGS.get(group, ()) if self.own else ())
        args = list(map(_ARGS_OF, events)) if keys or (self.own and not flow) else []
        columns["present"] = np.fromiter((a is not NO_ARGS for a in args), bool, m) if self.own and args else None
        for key in keys:
            if key in ("grid", "block"):
                columns["args." + key] = _dim3(args, key, m)
            elif key in _OBJECT_ARGS:
                columns["args." + key] = list(map(attrgetter(key), args))
            else:
                columns["args." + key] = _ints(args, key, m)
        rows = _thread_rows(columns) if group == "device" else None
        for column, field in (("pid", _PID), ("tid", _TID)):
            if rows is None:
                columns[column] = self._codes(self.ids, field, events)
            else:
                columns[column] = np.full(m, -1, np.int64)
                columns[column][rows] = self._codes(self.ids, field, _pick(events, rows))
        if group in ("device", "api") and not piece.needs_flows:
            piece.needs_flows = bool((columns["args.correlation"] < 0).any())
        return columns

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

    @property
    def decoder(self) -> msgspec.json.Decoder:
        return decoder(self.flows)

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
        return out


_EMPTY_COLUMN = {"ts": np.float64, "dur": np.float64, "present": bool}
_LIST_COLUMNS = frozenset(("id", *("args." + k for k in _OBJECT_ARGS if k not in ("grid", "block"))))


def _concat(parts: list[Any], key: str) -> Any:
    if any(p is None for p in parts):
        return None
    if key in _LIST_COLUMNS:
        return [v for part in parts for v in part]
    if not parts:
        return np.zeros(0, _EMPTY_COLUMN.get(key, np.int64))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _thread_rows(columns: dict[str, Any]) -> np.ndarray:
    """The device events whose pid and tid are read: those without ``args.device``, ``args.stream`` or
    ``args.correlation`` (their pid, tid or flow stands in) and the first of each (device, stream) row (its
    ``thread_name`` is filed under them)."""
    device, stream = columns["args.device"], columns["args.stream"]
    need = (device == MISSING) | (stream == MISSING) | (columns["args.correlation"] < 0)
    need[np.unique((device << 32) ^ (stream & 0xFFFFFFFF), return_index=True)[1]] = True
    return np.flatnonzero(need)


def _ints(args: list[Args], key: str, n: int) -> np.ndarray:
    """An int arg of each event as int64. One that is no int (a string, one beyond int64) reads as the readers
    always read it: a numeric string as its number, anything else as 0 for ``device`` and ``stream``, as the arg's
    default for the others; ``Device Type`` only as an int."""
    try:
        return np.fromiter(map(attrgetter(key), args), np.int64, n)
    except (OverflowError, TypeError, ValueError):
        return np.array([_int_arg(key, v) for v in map(attrgetter(key), args)], np.int64)


def _int_arg(key: str, value: Any) -> int:
    default = getattr(NO_ARGS, key)
    if value == default:  # absent (MISSING: device and stream fall back to the pid and tid)
        return default
    if key == "device_type" and type(value) is not int:
        return default
    number = int_or(value, 0 if key in ("device", "stream") else default)
    return number if -(1 << 63) <= number < (1 << 63) else default


def _dim3(args: list[Args], key: str, n: int) -> np.ndarray:
    """``grid`` or ``block`` of each event packed (``pack_dim3``; 0 where absent or x is not positive)."""
    try:
        xyz = np.fromiter(chain.from_iterable(map(attrgetter(key), args)), np.int64, 3 * n).reshape(n, 3)
    except OverflowError:
        xyz = np.array([[v if -(1 << 63) <= v < (1 << 63) else 0 for v in a] for a in map(attrgetter(key), args)])
        xyz = xyz.reshape(n, 3).astype(np.int64)
    return np.where(xyz[:, 0] > 0, pack_dim3(xyz[:, 0], xyz[:, 1], xyz[:, 2]), 0).astype(np.int64)


# ----------------------------------------------------------------------------------------- the slower path


_ARG_KEYS = {Args.__struct_encode_fields__[i]: f for i, f in enumerate(Args.__struct_fields__)}


def typed_events(events: Sequence[Any], first: int, where: str) -> list[Event]:
    """Events of a parsed document (dicts) as ``Event`` Structs, after the checks and with the leniency of the
    readers: a phase that is no Chrome phase is "?" (skipped), a name that is no string becomes one, args that are
    no object are none, an arg that is no int where an int belongs is left out (the reader's default), ``grid`` /
    ``block`` that are no [x, y, z] are left out. ``first``: the index in traceEvents of the first of ``events``."""
    out = []
    for i, e in enumerate(events, first):
        if type(e) is not dict:
            raise InvalidArgument(f"cannot load trace {where}: traceEvents[{i}] is not an object: {e!r:.80}")
        out.append(typed_event(e, i, where))
    return msgspec.convert(out, list[_ANY])


_ID_TYPES = (int, str, float, type(None))


def typed_event(e: dict, i: int, where: str) -> dict:
    """One event dict with the types ``Event`` expects (see ``typed_events``)."""
    pid, tid = e.get("pid"), e.get("tid")
    if type(pid) not in _ID_TYPES or type(tid) not in _ID_TYPES:
        raise InvalidArgument(
            f"cannot load trace {where}: traceEvents[{i}] ({e.get('name')!r:.40}) has a pid or tid that is "
            f"neither a number nor a string: {pid!r:.40}, {tid!r:.40}"
        )
    name = e.get("name")
    out: dict[str, Any] = {
        "ph": e.get("ph") if e.get("ph") in PHASES else "?",
        "cat": e.get("cat") if type(e.get("cat")) is str else "",
        "name": name if type(name) is str else str(name or ""),
        "pid": pid,
        "tid": tid,
    }
    for key in ("ts", "dur"):
        value = e.get(key)
        if value is None:
            continue
        if type(value) not in (int, float, bool):
            raise InvalidArgument(f"cannot load trace {where}: an event's {key} is not a number ({value!r:.40})")
        out[key] = float(value) if math.isfinite(value) else math.inf  # NaN would read as "no ts"
    if type(e.get("id")) in (int, str):
        out["id"] = e["id"]
    args = e.get("args")
    if type(args) is dict:
        out["args"] = _typed_args(args)
    return out


def _typed_args(args: dict) -> dict:
    out = {}
    for key, field in _ARG_KEYS.items():
        if key not in args:
            continue
        value = args[key]
        if field in ("grid", "block"):
            if type(value) is list and len(value) == 3:
                out[key] = [v if -(1 << 63) <= v < (1 << 63) else 0 for v in (int_or(v, 0) for v in value)]
        elif field == "pinned":
            if value is not None:
                out[key] = int(bool(value))
        elif field in _OBJECT_ARGS:
            out[key] = value
        else:
            out[key] = _int_arg(field, value)
    return out
