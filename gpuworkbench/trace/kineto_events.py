"""Chrome-trace / Kineto JSON into NumPy span columns: the file read (gzip or not), its events sorted into groups
in one pass, and each group's fields turned into columns, for the readers of ``kineto.py``.

Every field after the grouping is a NumPy column, so a 70 000-event trace loads in well under a second.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .spans import COLUMNS, DEFAULTS, KIND_CODE, pack_dim3

_GZIP_MAGIC = b"\x1f\x8b"
#: Event categories (lower case) -> the group they are read into; others (Trace, overhead, ...) are skipped.
_GROUPS = {
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
_EMPTY: dict = {}
#: What an event's pid and tid may be (Chrome traces use numbers or strings; Kineto writes "" on global events).
_ID_TYPES = (int, str, float, type(None))
#: The largest |ts| or |dur| read, in µs: beyond it the time in ns leaves int64.
_US_MAX = 9.2e15
_KERNEL, _MEMSET = KIND_CODE["kernel"], KIND_CODE["memset"]


def read_document(where: str) -> Any:
    """The file's JSON document, gunzipped first when it starts with gzip's magic bytes."""
    try:
        with open(where, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InvalidArgument(f"cannot load trace {where}: no such file") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot load trace {where}: {exc.strerror or exc}") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise InvalidArgument(f"cannot load trace {where}: truncated gzip (the file ends mid-stream)") from None
        except (OSError, zlib.error) as exc:
            raise InvalidArgument(f"cannot load trace {where}: corrupt gzip ({exc})") from None
    if not raw or raw.isspace():  # no stripped copy of a large file on the way to the parse
        raise InvalidArgument(f"cannot load trace {where}: the file is empty")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        if isinstance(exc, json.JSONDecodeError) and _cut_short(raw.strip(), exc):
            what = f"truncated JSON (it ends at byte {len(raw)} inside a value)"
        else:
            what = f"not JSON ({exc})"
        raise InvalidArgument(f"cannot load trace {where}: {what}") from None


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector paused: the parse and the read make a container or two per event while every event is
    alive, and the collections that triggered took 1.9 of 2.2 s of a 70 000-event PyTorch trace's load on the 2-core
    development machine (``json.loads`` 1.25–1.28 s against 0.38–0.41 s, a list of (pid, tid) pairs 0.87 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cut_short(text: bytes, exc: json.JSONDecodeError) -> bool:
    """Whether a document that failed to parse is a prefix of one: it ends inside a string, fails at its last bytes,
    or opens an object or array that it never closes (a whole trace ends with ``}`` or ``]``)."""
    if exc.msg.startswith("Unterminated string") or exc.pos >= len(text):
        return True
    return text[:1] in (b"{", b"[") and text[-1:] not in (b"}", b"]")


class EventGroups:
    """The events of each group (lists of the event dicts), and the metadata needed to name rows."""

    def __init__(self) -> None:
        self.device: list[dict] = []
        self.api: list[dict] = []
        self.range: list[dict] = []
        self.device_range: list[dict] = []
        self.python: list[dict] = []  # torch.profiler(with_stack=True)'s Python calls (kineto_stacks.py)
        self.flow_start: list[dict] = []
        self.flow_end: list[dict] = []
        self.memory: list[dict] = []  # PyTorch's "[memory]" instant events
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}


def group_events(events: list, where: str) -> EventGroups:
    """Sort the events into groups in one pass; an event that is not an object or lacks ``ts`` is an error."""
    groups = EventGroups()
    lists = {name: getattr(groups, name) for name in ("device", "api", "range", "device_range", "python")}
    lookup = _GROUPS.get
    for i, e in enumerate(events):
        if type(e) is not dict:
            raise InvalidArgument(f"cannot load trace {where}: traceEvents[{i}] is not an object: {e!r:.80}")
        if type(e.get("pid")) not in _ID_TYPES or type(e.get("tid")) not in _ID_TYPES:
            raise InvalidArgument(
                f"cannot load trace {where}: traceEvents[{i}] ({e.get('name')!r:.40}) has a pid or tid that is "
                f"neither a number nor a string: {e.get('pid')!r:.40}, {e.get('tid')!r:.40}"
            )
        ph = e.get("ph")
        if ph == "M":
            args = e.get("args")
            if type(args) is dict and isinstance(args.get("name"), str):
                if e.get("name") == "thread_name":
                    groups.thread_names[(e.get("pid"), e.get("tid"))] = args["name"]
                elif e.get("name") == "process_name":
                    groups.process_names[e.get("pid")] = args["name"]
            continue
        if "ts" not in e:
            raise InvalidArgument(f"cannot load trace {where}: traceEvents[{i}] ({e.get('name')!r}) has no ts")
        if ph == "X":
            cat = e.get("cat")
            target = lookup(cat) if type(cat) is str else None
            if target is None and type(cat) is str:
                target = lookup(cat.lower())
            if target is not None:
                lists[target].append(e)
        elif (ph == "s" or ph == "f") and e.get("cat") == "ac2g":
            (groups.flow_start if ph == "s" else groups.flow_end).append(e)
        elif ph == "i" and e.get("name") == "[memory]":
            groups.memory.append(e)
    return groups


def ns_column(values: Sequence[Any], where: str, what: str) -> np.ndarray:
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


def event_args(events: list[dict]) -> list[dict]:
    """Each event's ``args`` object (an empty dict where it has none)."""
    return [a if type(a := e.get("args")) is dict else _EMPTY for e in events]


def event_times(events: list[dict], where: str) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ns, as in the file) of complete events; a negative ``dur`` counts as 0."""
    start = ns_column([e["ts"] for e in events], where, "ts")
    end = start + np.maximum(ns_column([e.get("dur", 0) for e in events], where, "dur"), 0)
    return start, end


def event_names(events: list[dict]) -> list[str]:
    """Each event's name as a string ("" where it has none)."""
    return [n if type(n := e.get("name")) is str else str(n or "") for e in events]


def device_kinds(events: list[dict], names: list[str], args: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Kind codes and pinned flags of device events, from their categories and CUPTI / roctracer names.

    Copies are named "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)" ...; ``args.pinned`` (our
    exports) wins over the name where present."""
    cache: dict[tuple[Any, str], tuple[int, int]] = {}
    kinds, pinned = [], []
    for e, name, a in zip(events, names, args):
        key = (e.get("cat"), name)
        found = cache.get(key)
        if found is None:
            found = cache[key] = _classify(str(key[0]).lower(), name)
        kinds.append(found[0])
        flag = a.get("pinned")
        pinned.append(found[1] if flag is None else int(bool(flag)))
    return np.array(kinds, np.int8), np.array(pinned, np.int8)


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
