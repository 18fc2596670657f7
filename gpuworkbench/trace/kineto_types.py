"""The msgspec Structs a trace's events are decoded into, and their decoders: only the fields the loader reads (no
dict per event; one Struct type per phase, so that a flow carries no name and a skipped phase nothing; a Kineto
trace's events with ``args`` of only the keys its readers use, our own exports' with ``Args``). A file whose events
do not fit these types (a name that is a number, a float where an int belongs, ``NaN``) is read by
``kineto_read.py``'s slower path, which gives such events these types first (``typed_events``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Union

import msgspec
import numpy as np

from ..errors import InvalidArgument
from .kineto_events import int_or

#: An int arg the event does not have (device and stream fall back to its pid and tid).
MISSING = int(np.iinfo(np.int64).min)


class Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys the readers of our own exports use (the slower path types every event with them): Kineto's
    device work (a kernel's launch shape too) and memory events, metadata names, and what our own exports add (``op``,
    ``kind``, ``enqueued (us)``, ``held_bytes``, ``used_bytes``, ``source location``); every other key is skipped. An
    int may come as a string (roctracer writes a runtime call's stream as a pointer): ``kineto_decode.py`` reads it as
    the readers always have."""

    device: int | str = MISSING
    stream: int | str = MISSING
    correlation: int | str = -1
    bytes: int | str = 0
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    registers: int | str = msgspec.field(default=-1, name="registers per thread")
    shared: int | str = msgspec.field(default=-1, name="shared memory")
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


class Counter(Event, tag="C"):
    """A counter event (``gw.trace(counters=True)``'s samples, Chrome's and Perfetto's counter tracks): each arg a
    series and its value (kept whole: counter events are few, and their keys are the series' names)."""

    name: str = ""
    pid: _ID = None
    tid: _ID = None
    ts: float = float("nan")
    id: int | str | None = None
    args: dict[str, Any] = msgspec.field(default_factory=dict)


#: The Chrome trace format's other phases ("B", "E", "b", "e", "n", "P", "O", ...), every letter and "(", ")": a
#: phase outside them is read by the slower path, which files it under "?".
_OTHER = [
    Counter,
    *(
        msgspec.defstruct(f"Phase{ord(c)}", [], bases=(Event,), tag=c)
        for c in "?()ABDEFGHIJKLNOPQRSTUVWYZabcdeghjklmnopqrtuvwxyz"
    ),
]
PHASES = frozenset("Xsfi M".replace(" ", "")) | {cls.__struct_config__.tag for cls in _OTHER}
_ANY = Union[(Complete, FlowStart, FlowEnd, Instant, Metadata, *_OTHER)]  # noqa: UP007 (built from a list)


class DeviceArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys a Kineto complete event is read for (``Args``' first eight): a Struct of fewer fields makes
    the decode of a Kineto trace about a tenth faster than ``Args`` (keys that match none cost a scan of them all).
    A kernel's "shared memory" is its static and dynamic shared memory per block together."""

    device: int | str = MISSING
    stream: int | str = MISSING
    correlation: int | str = -1
    bytes: int | str = 0
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    registers: int | str = msgspec.field(default=-1, name="registers per thread")
    shared: int | str = msgspec.field(default=-1, name="shared memory")


class MemoryArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys a Kineto ``[memory]`` event is read for."""

    device_type: int | str = msgspec.field(default=-1, name="Device Type")
    device_id: int | str = msgspec.field(default=0, name="Device Id")
    total_allocated: int | str = msgspec.field(default=0, name="Total Allocated")


class NameArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` key a metadata event is read for."""

    name: Any = None


def _kineto(cls: type, args: type) -> type:
    """A Struct with the fields of ``cls``, but ``args`` of type ``args``."""
    fields = [
        (f.encode_name, args, args()) if f.name == "args" else (f.encode_name, f.type, f.default)
        for f in msgspec.structs.fields(cls)
    ]
    return msgspec.defstruct("Kineto" + cls.__name__, fields, bases=(Event,), tag=cls.__struct_config__.tag)


#: Flows as Structs with no fields: where no event needs a flow to be linked, their fields are not even decoded.
_UNREAD_FLOWS = [msgspec.defstruct(f"Unread{ord(c)}", [], bases=(Event,), tag=c) for c in "sf"]
KINETO_COMPLETE, KINETO_INSTANT = _kineto(Complete, DeviceArgs), _kineto(Instant, MemoryArgs)
KINETO_METADATA = _kineto(Metadata, NameArgs)
_KINETO = (KINETO_COMPLETE, KINETO_INSTANT, KINETO_METADATA, *_OTHER)
#: Decoders by (flows, own): our own exports' events are read with ``Args``, a Kineto trace's with the fewer keys
#: its readers use.
_DECODERS = {
    (True, True): msgspec.json.Decoder(list[_ANY]),
    (False, True): msgspec.json.Decoder(list[Union[(Complete, *_UNREAD_FLOWS, Instant, Metadata, *_OTHER)]]),  # noqa: UP007
    (True, False): msgspec.json.Decoder(list[Union[(FlowStart, FlowEnd, *_KINETO)]]),  # noqa: UP007
    (False, False): msgspec.json.Decoder(list[Union[(*_UNREAD_FLOWS, *_KINETO)]]),  # noqa: UP007
}

#: Args whose values are kept as they are (lists of objects; ``grid`` and ``block`` are packed).
OBJECT_ARGS = frozenset(("grid", "block", "op", "kind", "enqueued", "name"))


def decoder(flows: bool, own: bool) -> msgspec.json.Decoder:
    """The decoder of a piece of events (flows with no fields where they are not kept; ``own``: the args our own
    exports write too)."""
    return _DECODERS[flows, own]


def int_arg(key: str, value: Any) -> int:
    """An int arg's value as the readers read it (``kineto_decode._int_values``)."""
    default = getattr(NO_ARGS, key)
    if value == default:  # absent (MISSING: device and stream fall back to the pid and tid)
        return default
    if key == "device_type" and type(value) is not int:
        return default
    number = int_or(value, 0 if key in ("device", "stream") else default)
    return number if -(1 << 63) <= number < (1 << 63) else default


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
        out["args"] = args if out["ph"] == "C" else _typed_args(args)  # a counter's args are its series
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
        elif field in OBJECT_ARGS:
            out[key] = value
        else:
            out[key] = int_arg(field, value)
    return out
