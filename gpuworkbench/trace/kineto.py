"""Read traces made elsewhere: Chrome-trace / Kineto JSON from PyTorch's profiler (CUDA or ROCm) and our own exports.

``load_trace(path)`` turns such a file into a finished ``Trace``, so that every analysis and picture works on it
(DESIGN §5). Device work (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``) becomes device spans on
(``args.device``, ``args.stream``) rows, with kind, bytes, pinned or pageable host memory (from CUPTI's copy names),
grid, block and ``corr`` = ``args.correlation``. Host work becomes host thread rows (``thread_stream(i)``, one per
(pid, tid), labelled by ``thread_name`` metadata): ``cuda_runtime`` / ``cuda_driver`` calls as ``api`` spans linked
to the device spans with the same correlation (whose enqueue time is then the call's start), ``cpu_op`` and
``user_annotation`` as ``range`` spans; ``gpu_user_annotation`` becomes a ``range`` on its device stream. A file
written by ``Trace.to_chrome_trace`` (it has a ``gpuworkbench`` block) is read back exactly as it was exported, its
memory rows included.
PyTorch's ``[memory]`` events (``profile_memory=True``) on a GPU become the memory table's ``other_bytes`` (its
allocator's total allocated); those on the CPU are left out (the memory table is per device). A trace with no device
work and no device properties (a CPU-only profile) gets one clock, ``host:0``, for its host rows.

Events are sorted into groups in one pass over the parsed JSON; every field after that is a NumPy column, and the
trace's table is filled with one ``extend_columns`` (a 70 000-event trace loads in well under a second).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .export import HOST_PID, STREAM_OFFSET
from .recorder import DeviceClock, Trace
from .spans import COLUMNS, KIND_CODE, pack_dim3, thread_stream

_GZIP_MAGIC = b"\x1f\x8b"
#: Event categories (lower case) -> the group they are read into; others (python_function, Trace, ...) are skipped.
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
}
_EMPTY: dict = {}
#: What an event's pid and tid may be (Chrome traces use numbers or strings; Kineto writes "" on global events).
_ID_TYPES = (int, str, float, type(None))
#: The largest |ts| or |dur| read, in µs: beyond it the time in ns leaves int64.
_US_MAX = 9.2e15
#: PyTorch's ``args["Device Type"]`` of a GPU's memory events (c10::DeviceType::CUDA; ROCm builds write it too).
_CUDA_DEVICE_TYPE = 1
_NO_DEVICES = np.zeros(0, np.int64)
_KERNEL, _MEMSET, _RANGE = KIND_CODE["kernel"], KIND_CODE["memset"], KIND_CODE["range"]


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """A finished Trace read from a Chrome-trace / Kineto JSON file (``.json`` or gzip-compressed, whatever its
    name): a PyTorch profiler trace, or our own export, which comes back exactly as it was.

    Raises ``InvalidArgument`` naming the file and what is wrong with it (missing, not JSON, a truncated gzip, no
    ``traceEvents`` list, an event without ``ts``)."""
    where = os.fspath(path)
    if not where:
        raise InvalidArgument("cannot load trace: the path is empty")
    with _collector_paused():
        doc = _read(where)
        events = doc.get("traceEvents") if isinstance(doc, dict) else doc
        if not isinstance(events, list):
            raise InvalidArgument(
                f"cannot load trace {where}: it has no traceEvents list (not a Chrome / Kineto trace)"
            )
        meta = doc if isinstance(doc, dict) else {}
        own = meta.get("gpuworkbench")
        reader = _OwnExport(where, meta, own) if isinstance(own, dict) else _Kineto(where, meta)
        return reader.read(events)


def _read(where: str) -> Any:
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
def _collector_paused() -> Iterator[None]:
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


class _Groups:
    """The events of each group (lists of the event dicts), and the metadata needed to name rows."""

    def __init__(self) -> None:
        self.device: list[dict] = []
        self.api: list[dict] = []
        self.range: list[dict] = []
        self.device_range: list[dict] = []
        self.flow_start: list[dict] = []
        self.flow_end: list[dict] = []
        self.memory: list[dict] = []  # PyTorch's "[memory]" instant events
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}


def _group(events: list, where: str) -> _Groups:
    """Sort the events into groups in one pass; an event that is not an object or lacks ``ts`` is an error."""
    groups = _Groups()
    lists = {name: getattr(groups, name) for name in ("device", "api", "range", "device_range")}
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


# ---------------------------------------------------------------------------------------------------- columns


def _ns(values: Sequence[Any], where: str, what: str) -> np.ndarray:
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


def _ints(values: Sequence[Any], default: int = -1) -> np.ndarray:
    """Integers as int64 (``default`` for anything that is not one: None, a pointer string, a list)."""
    try:
        return np.fromiter(values, np.int64, count=len(values))
    except (TypeError, ValueError, OverflowError):
        return np.array([_int_or(v, default) for v in values], np.int64)


def _int_or(value: Any, default: int) -> int:
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


def _dim3(values: Sequence[Any]) -> np.ndarray:
    """``args.grid`` / ``args.block`` ([x, y, z] lists) packed with ``pack_dim3``; 0 where absent or malformed."""
    xyz = np.zeros((len(values), 3), np.int64)
    rows = [i for i, v in enumerate(values) if type(v) is list and len(v) == 3]
    if rows:
        try:
            xyz[rows] = np.array([values[i] for i in rows], dtype=np.int64)
        except (TypeError, ValueError):
            for i in rows:
                xyz[i] = [_int_or(v, 0) for v in values[i]]
    packed = pack_dim3(xyz[:, 0], xyz[:, 1], xyz[:, 2])
    return np.where(xyz[:, 0] > 0, packed, 0).astype(np.int64)


def _label(name: str | None) -> str:
    """A thread name as a row label (Kineto writes "stream 7 " with a trailing space)."""
    return name.strip() if isinstance(name, str) else ""


def _args(events: list[dict]) -> list[dict]:
    return [a if type(a := e.get("args")) is dict else _EMPTY for e in events]


def _times(events: list[dict], where: str) -> tuple[np.ndarray, np.ndarray]:
    start = _ns([e["ts"] for e in events], where, "ts")
    end = start + np.maximum(_ns([e.get("dur", 0) for e in events], where, "dur"), 0)
    return start, end


def _names(events: list[dict]) -> list[str]:
    return [n if type(n := e.get("name")) is str else str(n or "") for e in events]


def _device_kinds(events: list[dict], names: list[str], args: list[dict]) -> tuple[np.ndarray, np.ndarray]:
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


def _link(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray, default: Any) -> np.ndarray:
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


def _block(n: int, **columns: Any) -> dict[str, np.ndarray]:
    """A span-column block of ``n`` rows: the columns given, defaults for the rest."""
    defaults = {"enqueue_ns": -1, "bytes": 0, "pinned": -1, "corr": -1, "grid": 0, "block": 0}
    block = {}
    for column, dtype in COLUMNS.items():
        value = columns.get(column, defaults.get(column))
        if dtype is object:
            block[column] = np.array(value, dtype=object) if len(value) == n else np.full(n, value, dtype=object)
        else:
            block[column] = np.broadcast_to(np.asarray(value), (n,)).astype(dtype)
    return block


def _concat(blocks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    blocks = [b for b in blocks if len(b["kind"])]
    if not blocks:
        return _block(0, kind=0, device=0, stream=0, start_ns=0, end_ns=0, name=[])
    table = {c: np.concatenate([b[c] for b in blocks]) for c in COLUMNS}
    order = np.argsort(table["start_ns"], kind="stable")
    return {c: v[order] for c, v in table.items()}


def finished_trace(
    table: Mapping[str, np.ndarray],
    devices: Mapping[int, DeviceClock],
    stream_labels: Mapping[tuple[int, int], str],
    memory: Mapping[str, np.ndarray] | None = None,
) -> Trace:
    """A stopped Trace holding ``table`` (span columns) and ``memory`` (memory columns), each filled with one
    ``extend_columns``: no row by row copy."""
    n = len(table["kind"])
    m = 0 if memory is None else len(memory["t_ns"])
    trace = Trace(capacity=max(n, m, 1_000_000))
    if n:
        trace._spans.extend_columns(table)
    if m:
        trace._memory.extend_columns(memory)
    trace._devices.update(devices)
    trace._stream_labels.update(stream_labels)
    trace._version += 1
    return trace


# ---------------------------------------------------------------------------------------------------- readers


class _Kineto:
    """A PyTorch profiler (Kineto) trace, CUDA or ROCm: device rows per (device, stream), host rows per thread."""

    source = "kineto"

    def __init__(self, where: str, meta: Mapping[str, Any]) -> None:
        self.where, self.meta = where, meta
        base = meta.get("baseTimeNanoseconds")
        self.base_ns = base if isinstance(base, int) else 0

    def read(self, events: list) -> Trace:
        groups = _group(events, self.where)
        device = self._device(groups)
        device_range = self._device_range(groups)
        first = int(device["device"].min()) if device["device"].size else self._first_property_device()
        api = self._host(groups.api, "api", first, groups)
        ranges = self._host(groups.range, "range", first, groups)
        self._link_calls(device, api, first)
        self._host_rows(api, ranges, groups)
        table = _concat([device, device_range, api, ranges])
        labels = self._labels(table, groups)
        memory = self._memory(groups)
        return finished_trace(table, self._clocks(table, groups, memory["device"]), labels, memory)

    # -- memory ----------------------------------------------------------------------------------------------
    def _memory(self, groups: _Groups) -> dict[str, np.ndarray]:
        """PyTorch's GPU ``[memory]`` events as memory rows: its allocator's total allocated, in time order."""
        events = [
            e for e in groups.memory if type(a := e.get("args")) is dict and a.get("Device Type") == _CUDA_DEVICE_TYPE
        ]
        args = _args(events)
        t = _ns([e["ts"] for e in events], self.where, "ts") + self.base_ns
        order = np.argsort(t, kind="stable")
        n = len(events)
        return {
            "device": _ints([a.get("Device Id", 0) for a in args], 0)[order].astype(np.int16),
            "t_ns": t[order],
            "held_bytes": np.zeros(n, np.int64),
            "used_bytes": np.full(n, -1, np.int64),
            "other_bytes": np.maximum(_ints([a.get("Total Allocated", 0) for a in args], 0), 0)[order],
        }

    # -- device work -----------------------------------------------------------------------------------------
    def _device(self, groups: _Groups) -> dict[str, np.ndarray]:
        events = groups.device
        names, args = _names(events), _args(events)
        start, end = _times(events, self.where)
        kinds, pinned = _device_kinds(events, names, args)
        pid = [e.get("pid") for e in events]
        device = _ints([a.get("device", p) for a, p in zip(args, pid)], 0)
        stream = _ints([a.get("stream", e.get("tid")) for a, e in zip(args, events)], 0)
        corr = self._correlations(events, args, groups.flow_end, start)
        # each device row once, with the (pid, tid) its thread_name metadata is filed under
        rows, first = np.unique(np.stack([device, stream]), axis=1, return_index=True) if events else ((), [])
        self._row_threads = {
            (int(d), int(s)): (events[i].get("pid"), events[i].get("tid"))
            for (d, s), i in zip(np.transpose(rows), first)
        }
        return _block(
            len(events),
            kind=kinds,
            device=device,
            stream=stream,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            bytes=np.maximum(_ints([a.get("bytes", 0) for a in args], 0), 0),
            name=names,
            pinned=pinned,
            corr=corr,
            grid=_dim3([a.get("grid") for a in args]),
            block=_dim3([a.get("block") for a in args]),
        )

    def _device_range(self, groups: _Groups) -> dict[str, np.ndarray]:
        """GPU-side annotations (``gpu_user_annotation``): ``range`` spans on their device stream's row."""
        events = groups.device_range
        args = _args(events)
        start, end = _times(events, self.where)
        return _block(
            len(events),
            kind=_RANGE,
            device=_ints([a.get("device", e.get("pid")) for a, e in zip(args, events)], 0),
            stream=_ints([a.get("stream", e.get("tid")) for a, e in zip(args, events)], 0),
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=start + self.base_ns,
            name=_names(events),
        )

    def _correlations(self, events: list[dict], args: list[dict], flows: list[dict], start: np.ndarray) -> np.ndarray:
        """``args.correlation``; where it is missing, the id of the ``ac2g`` flow bound to the event's start."""
        corr = _ints([a.get("correlation", -1) for a in args], -1)
        missing = np.flatnonzero(corr < 0)
        if missing.size and flows:
            at = dict(zip(self._flow_keys(flows), _ints([f.get("id", -1) for f in flows], -1).tolist()))
            for i, t in zip(missing.tolist(), start[missing].tolist()):
                corr[i] = at.get((events[i].get("pid"), events[i].get("tid"), t), -1)
        return corr

    def _flow_keys(self, flows: list[dict]) -> list[tuple[Any, Any, int]]:
        ts = _ns([f["ts"] for f in flows], self.where, "ts").tolist()
        return [(f.get("pid"), f.get("tid"), t) for f, t in zip(flows, ts)]

    # -- host work -------------------------------------------------------------------------------------------
    def _host(self, events: list[dict], kind: str, first: int, groups: _Groups) -> dict[str, np.ndarray]:
        args = _args(events)
        start, end = _times(events, self.where)
        corr = np.full(len(events), -1, np.int64)
        if kind == "api":
            corr = self._correlations(events, args, groups.flow_start, start)
        block = _block(
            len(events),
            kind=KIND_CODE[kind],
            device=first,
            stream=0,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=start + self.base_ns,
            name=_names(events),
            corr=corr,
        )
        block["_thread"] = [(e.get("pid"), e.get("tid")) for e in events]  # replaced by a stream in _host_rows
        return block

    def _link_calls(self, device: dict[str, np.ndarray], api: dict[str, np.ndarray], first: int) -> None:
        """An api call's device is the device of the work it enqueued; that work's enqueue time is the call's start."""
        device["enqueue_ns"] = _link(api["corr"], api["start_ns"], device["corr"], -1)
        api["device"] = _link(device["corr"], device["device"], api["corr"], first).astype(np.int16)

    def _host_rows(self, api: dict[str, Any], ranges: dict[str, Any], groups: _Groups) -> None:
        """One host row per (pid, tid), numbered in order of each thread's first event."""
        keys = api.pop("_thread") + ranges.pop("_thread")
        index: dict[tuple[Any, Any], int] = {}
        codes = np.array([index.setdefault(k, len(index)) for k in keys], np.int64)
        first_seen = np.full(len(index), np.iinfo(np.int64).max)
        np.minimum.at(first_seen, codes, np.concatenate([api["start_ns"], ranges["start_ns"]]))
        rank = np.empty(len(index), np.int64)
        rank[np.lexsort((np.arange(len(index)), first_seen))] = np.arange(len(index))
        streams = thread_stream(rank[codes]) if codes.size else codes
        api["stream"] = streams[: len(api["kind"])].astype(np.int32)
        ranges["stream"] = streams[len(api["kind"]) :].astype(np.int32)
        self._threads = {int(thread_stream(int(rank[code]))): key for key, code in index.items()}

    def _labels(self, table: dict[str, np.ndarray], groups: _Groups) -> dict[tuple[int, int], str]:
        """Device rows: their ``thread_name`` ("stream 7") or "stream N"; host rows: their thread's name."""
        names = groups.thread_names
        labels = {row: _label(names.get(thread)) or f"stream {row[1]}" for row, thread in self._row_threads.items()}
        pids = {key[0] for key in self._threads.values()}
        host = table["stream"] <= -2
        pairs = np.unique(
            np.stack([table["device"][host].astype(np.int64), table["stream"][host].astype(np.int64)]), axis=1
        )
        for dev, stream in pairs.T.tolist():
            pid, tid = self._threads[stream]
            default = f"host thread {tid}" if len(pids) == 1 else f"host pid {pid} thread {tid}"
            labels[(dev, stream)] = _label(names.get((pid, tid))) or default
        return labels

    # -- devices ---------------------------------------------------------------------------------------------
    def _properties(self) -> dict[int, dict]:
        props = self.meta.get("deviceProperties")
        out = {}
        if isinstance(props, list):
            for p in props:
                if isinstance(p, dict) and _int_or(p.get("id"), -1) >= 0:
                    out[_int_or(p.get("id"), -1)] = p
        return out

    def _first_property_device(self) -> int:
        return min(self._properties(), default=0)

    def _clocks(
        self, table: dict[str, np.ndarray], groups: _Groups, memory_devices: np.ndarray = _NO_DEVICES
    ) -> dict[int, DeviceClock]:
        props = self._properties()
        devices = np.concatenate([table["device"].astype(np.int64), memory_devices.astype(np.int64)])
        used = sorted({int(d) for d in np.unique(devices)}) or sorted(props) or []
        if not props and not (table["stream"] >= 0).any() and not memory_devices.size:  # host work only
            note = f"loaded from {self.where}: no device work in it (a CPU-only profile)"
            return {dev: DeviceClock(key="host:0", name="host", source=self.source, note=note) for dev in used}
        backend = "rocm" if self._rocm(props, table) else "cuda"
        clocks = {}
        for dev in used:
            p = props.get(dev, {})
            name = p.get("name") or groups.process_names.get(dev) or f"GPU {dev}"
            clocks[dev] = DeviceClock(
                key=f"{backend}:{dev}", name=str(name), source=self.source, note=f"loaded from {self.where}"
            )
        return clocks

    @staticmethod
    def _rocm(props: Mapping[int, dict], table: Mapping[str, np.ndarray]) -> bool:
        """Whether the trace came from ROCm: AMD device properties, or HIP calls on the host."""
        if any("gcnArchName" in p or "AMD" in str(p.get("name", "")) for p in props.values()):
            return True
        calls = table["name"][table["kind"] == KIND_CODE["api"]]
        return bool(calls.size) and str(calls[0]).startswith("hip")


class _OwnExport(_Kineto):
    """A file ``Trace.to_chrome_trace`` wrote: read back exactly (its ``gpuworkbench`` block says how)."""

    source = "gpuworkbench export"

    def __init__(self, where: str, meta: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        super().__init__(where, meta)
        self.origin = _int_or(own.get("origin_host_ns"), 0)
        self.offset = _int_or(own.get("stream_offset"), STREAM_OFFSET)
        self.synthetic = _int_or(own.get("synthetic_correlation_from"), 1)
        self.own = own

    def read(self, events: list) -> Trace:
        groups = _group(events, self.where)
        blocks = [self._device(groups), self._device_range(groups), self._host(groups)]
        table = _concat(blocks)
        memory = self._own_memory(groups)
        trace = finished_trace(table, self._clocks(table, groups), self._labels(table, groups), memory)
        trace._stats.dropped = _int_or(self.own.get("dropped"), 0)
        trace._stats.lost = _int_or(self.own.get("lost"), 0)
        return trace

    def _time(self, values: list, what: str) -> np.ndarray:
        return _ns(values, self.where, what) + self.origin

    def _own_memory(self, groups: _Groups) -> dict[str, np.ndarray]:
        """Every ``[memory]`` event the export wrote, in its order, with our own columns."""
        events = groups.memory
        args = _args(events)
        return {
            "device": _ints([a.get("Device Id", 0) for a in args], 0).astype(np.int16),
            "t_ns": self._time([e["ts"] for e in events], "ts"),
            "held_bytes": _ints([a.get("held_bytes", 0) for a in args], 0),
            "used_bytes": _ints([a.get("used_bytes", -1) for a in args], -1),
            "other_bytes": _ints([a.get("Total Allocated", 0) for a in args], 0),
        }

    def _enqueue(self, args: list[dict]) -> np.ndarray:
        values = [a.get("enqueued (us)") for a in args]
        known = np.array([v is not None for v in values], bool)
        out = np.full(len(values), -1, np.int64)
        if known.any():
            out[known] = self._time([v for v in values if v is not None], "enqueued (us)")
        return out

    def _device(self, groups: _Groups) -> dict[str, np.ndarray]:
        events = groups.device
        names, args = _names(events), _args(events)
        start, end = _times(events, self.where)
        kinds, pinned = _device_kinds(events, names, args)
        corr = _ints([a.get("correlation", -1) for a in args], -1)
        return _block(
            len(events),
            kind=kinds,
            device=_ints([a.get("device", e.get("pid")) for a, e in zip(args, events)], 0),
            stream=_ints([a.get("stream", e.get("tid")) for a, e in zip(args, events)], 0) - self.offset,
            start_ns=start + self.origin,
            end_ns=end + self.origin,
            enqueue_ns=self._enqueue(args),
            bytes=_ints([a.get("bytes", 0) for a in args], 0),
            name=[str(a.get("op", n)) for a, n in zip(args, names)],
            pinned=pinned,
            corr=np.where(corr < self.synthetic, corr, -1),
            grid=_dim3([a.get("grid") for a in args]),
            block=_dim3([a.get("block") for a in args]),
        )

    def _device_range(self, groups: _Groups) -> dict[str, np.ndarray]:
        events = groups.device_range
        args = _args(events)
        start, end = _times(events, self.where)
        return _block(
            len(events),
            kind=_RANGE,
            device=_ints([a.get("device", e.get("pid")) for a, e in zip(args, events)], 0),
            stream=_ints([e.get("tid") for e in events], 0) - self.offset,
            start_ns=start + self.origin,
            end_ns=end + self.origin,
            enqueue_ns=self._enqueue(args),
            name=[str(a.get("op", n)) for a, n in zip(args, _names(events))],
            corr=_ints([a.get("correlation", -1) for a in args], -1),
        )

    def _host(self, groups: _Groups) -> dict[str, np.ndarray]:
        """Host rows: tid t is stream -t; ``args.kind`` says which kind (enqueue markers are not spans)."""
        events = [
            e for e in groups.api + groups.range if type(a := e.get("args")) is dict and a.get("kind") != "enqueue"
        ]
        args = _args(events)
        start, end = _times(events, self.where)
        kinds = [KIND_CODE.get(a.get("kind"), KIND_CODE["api"]) for a in args]
        return _block(
            len(events),
            kind=np.array(kinds, np.int8),
            device=_ints([a.get("device", 0) for a in args], 0),
            stream=-_ints([e.get("tid") for e in events], 1),
            start_ns=start + self.origin,
            end_ns=end + self.origin,
            enqueue_ns=self._enqueue(args),
            bytes=_ints([a.get("bytes", 0) for a in args], 0),
            name=[str(a.get("op", n)) for a, n in zip(args, _names(events))],
            corr=_ints([a.get("correlation", -1) for a in args], -1),
        )

    def _labels(self, table: dict[str, np.ndarray], groups: _Groups) -> dict[tuple[int, int], str]:
        """The export's own list of stream labels; else the labels its thread names carry."""
        listed = self.own.get("stream_labels")
        if isinstance(listed, list):
            if not all(type(x) is list and len(x) == 3 and type(x[0]) is int and type(x[1]) is int for x in listed):
                raise InvalidArgument(
                    f"cannot load trace {self.where}: its gpuworkbench block's stream_labels are not "
                    "[device, stream, label] triples"
                )
            return {(d, s): str(label) for d, s, label in listed}
        labels = {}
        for (pid, tid), name in groups.thread_names.items():
            if pid == HOST_PID or not isinstance(tid, int):
                continue
            stream = tid - self.offset
            prefix = f"stream {stream}"
            if name.startswith(prefix) and name[len(prefix) :].strip():
                labels[(int(pid), stream)] = name[len(prefix) :].strip()
        return labels

    def _clocks(self, table: dict[str, np.ndarray], groups: _Groups) -> dict[int, DeviceClock]:
        clocks = {}
        for dev, p in sorted(self._properties().items()):
            recorded = p.get("timestamps", "")
            clocks[dev] = DeviceClock(
                key=str(p.get("key") or f"device:{dev}"),
                name=str(p.get("name", f"device {dev}")),
                source=self.source,
                error_ns=_int_or(p.get("alignment_error_ns"), 0),
                note=f"loaded from {self.where}" + (f"; timestamps were {recorded}" if recorded else ""),
            )
        for dev in np.unique(table["device"]).tolist():
            clocks.setdefault(int(dev), DeviceClock(key=f"device:{dev}", name=f"device {dev}", source=self.source))
        return clocks
