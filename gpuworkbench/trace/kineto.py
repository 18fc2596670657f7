"""Read traces made elsewhere: Chrome-trace / Kineto JSON from PyTorch's profiler (CUDA or ROCm) and our own exports.

``load_trace(path)`` turns such a file into a finished ``Trace``, so that every analysis and picture works on it (DESIGN
§5). Device work (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``) becomes device spans on (``args.device``,
``args.stream``) rows, with kind, bytes, pinned or pageable host memory (from CUPTI's copy names), grid, block,
registers per thread, shared memory and ``corr`` = ``args.correlation``; ``deviceProperties`` give each CUDA device's
limits (``DeviceLimits``: its kernels' theoretical occupancy). Host work becomes host thread rows (``thread_stream(i)``,
one per (pid, tid), labelled by ``thread_name`` metadata): ``cuda_runtime`` / ``cuda_driver`` calls as ``api`` spans
linked to the device spans with the same correlation (whose enqueue time is then the call's start), ``cpu_op`` and
``user_annotation`` as ``range`` spans; ``gpu_user_annotation`` becomes a ``range`` on its device stream. A file
written by ``Trace.to_chrome_trace`` (it has a ``gpuworkbench`` block) is read back exactly as it was exported, its
memory rows and counter samples included. Counter events (``C``) of other tools become ``counters()`` too, a track
per event name and series (``kineto_events.counter_columns`` says how).
PyTorch's ``[memory]`` events (``profile_memory=True``) on a GPU become the memory table's ``other_bytes`` (its
allocator's total allocated); those on the CPU are left out (the memory table is per device). A trace with no device
work and no device properties (a CPU-only profile) gets one clock, ``host:0``, for its host rows.
A trace recorded with ``with_stack=True`` has ``python_function`` events: each runtime call, and the device work it
enqueued, is charged to the user line on its Python stack (``loc``, ``trace.locations``; rules in
``kineto_stacks.py``), so that ``statistics().lines`` works on it.

The file is decoded piece by piece into typed events and each group's fields into NumPy columns (``kineto_read.py``,
``kineto_types.py``, ``kineto_decode.py``: no dict per event, no whole document held); every step after that works
on columns (``kineto_events.py``), and the trace's table is filled with one ``extend_columns`` (``Trace.finished``).
Device work with a negative ``dur`` is refused, naming the event.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .columns import DeviceClock
from .counters import hold_samples
from .device_limits import DeviceLimits
from .export import HOST_PID, STREAM_OFFSET
from .kineto_decode import EventGroups, Group
from .kineto_events import (
    Block,
    NameCodes,
    collector_paused,
    concat_blocks,
    counter_columns,
    device_kinds,
    distinct,
    distinct_values,
    first_rows,
    int_column,
    int_or,
    link_column,
    ns_column,
    pick,
    row_label,
    span_block,
    time_columns,
)
from .kineto_read import read_events
from .kineto_stacks import Frames, stack_locations
from .kineto_types import MISSING
from .lines import Location
from .recorder import Trace
from .spans import KIND_CODE, thread_stream

#: PyTorch's ``args["Device Type"]`` of a GPU's memory events (c10::DeviceType::CUDA; ROCm builds write it too).
_CUDA_DEVICE_TYPE = 1
_NO_DEVICES = np.zeros(0, np.int64)
_RANGE = KIND_CODE["range"]


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """A finished Trace read from a Chrome-trace / Kineto JSON file (``.json`` or gzip-compressed, whatever its
    name): a PyTorch profiler trace, or our own export, which comes back exactly as it was.

    Raises ``InvalidArgument`` naming the file and what is wrong with it (missing, not JSON, not gzip, a truncated
    gzip, no ``traceEvents`` list, an event without ``ts``, device work with a negative ``dur``)."""
    where = os.fspath(path)
    if not where:
        raise InvalidArgument("cannot load trace: the path is empty")
    with collector_paused():
        meta, groups = read_events(where)
        own = meta.get("gpuworkbench")
        reader = _OwnExport(where, meta, own) if isinstance(own, dict) else _Kineto(where, meta)
        return reader.read(groups)


def _given(values: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """An int arg where the event has it, else ``fallback``."""
    return np.where(values == MISSING, fallback, values)


def _pairs(device: np.ndarray, stream: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (device, stream) pairs, in order."""
    keys = distinct_values((device.astype(np.int64) << 32) | (stream.astype(np.int64) & 0xFFFFFFFF))
    return sorted(zip((keys >> 32).tolist(), (keys & 0xFFFFFFFF).astype(np.uint32).astype(np.int32).tolist()))


# ---------------------------------------------------------------------------------------------------- readers


class _Kineto:
    """A PyTorch profiler (Kineto) trace, CUDA or ROCm: device rows per (device, stream), host rows per thread."""

    source = "kineto"

    def __init__(self, where: str, meta: Mapping[str, Any]) -> None:
        self.where, self.meta = where, meta
        base = meta.get("baseTimeNanoseconds")
        self.base_ns = base if isinstance(base, int) else 0  # added to every time the file holds

    def read(self, groups: EventGroups) -> Trace:
        device = self._device(groups)
        device_range = self._device_range(groups)
        first = int(device["device"].min()) if device["device"].size else self._first_property_device()
        api = self._host(groups.api, "api", first, groups)
        ranges = self._host(groups.range, "range", first, groups)
        self._link_calls(device, api, first)
        self._host_rows(api, ranges, groups)
        locations = self._locate(groups, device, api)
        table = concat_blocks([device, device_range, api, ranges])
        labels = self._labels(table, groups)
        memory = self._memory(groups)
        clocks = self._clocks(table, groups, memory["device"])
        return self._counters(Trace.finished(table, clocks, labels, memory, locations=locations), groups)

    # -- counters --------------------------------------------------------------------------------------------
    def _counters(self, trace: Trace, groups: EventGroups) -> Trace:
        """The file's counter events as the trace's ``counters()`` (``counter_columns``: how they map), on the
        device their pid names (one of the trace's; else the host), and ``counter_sources`` saying so."""
        if not groups.counters:
            return trace
        devices = {number: clock.key for number, clock in trace.devices.items()}

        def device_of(pid: Any) -> int:
            number = int_or(pid, -1) if pid != HOST_PID else -1
            return number if number in devices else -1

        own = isinstance(self, _OwnExport)
        table = counter_columns(groups.counters, self.where, self.base_ns, device_of, own)
        keys = {devices.get(d, "host") for d in distinct_values(table["device"]).tolist()}
        hold_samples(trace, table, {key: f"read from {self.where}" for key in sorted(keys)})
        return trace

    def _locate(self, groups: EventGroups, device: dict[str, Any], api: dict[str, Any]) -> list[Location]:
        """Each runtime call's user line, from the Python stacks of ``with_stack=True`` (``kineto_stacks.py``); the
        device work it enqueued gets the same. No python_function events: no locations, ``loc`` stays -1."""
        python = groups.python
        if not len(python) or not api.n:
            return []
        start, end = time_columns(python.ts, python.dur, self.where)
        frames = Frames(start, end, python.name, groups.names, groups.threads_of(python))
        starts = api["start_ns"] - self.base_ns
        loc, locations = stack_locations(frames, api["stream"], self._thread_codes, starts)
        if locations:
            api["loc"] = loc
            device["loc"] = pick(loc, self._calls, -1)
        return locations

    # -- memory ----------------------------------------------------------------------------------------------
    def _memory(self, groups: EventGroups) -> dict[str, np.ndarray]:
        """PyTorch's GPU ``[memory]`` events as memory rows: its allocator's total allocated, in time order."""
        g = groups.memory.take(groups.memory.arg("device_type") == _CUDA_DEVICE_TYPE)
        t = ns_column(g.ts, self.where, "ts") + self.base_ns
        order = np.argsort(t, kind="stable")
        n = len(g)
        return {
            "device": g.arg("device_id")[order].astype(np.int16),
            "t_ns": t[order],
            "held_bytes": np.zeros(n, np.int64),
            "used_bytes": np.full(n, -1, np.int64),
            "other_bytes": np.maximum(g.arg("total_allocated"), 0)[order],
        }

    # -- device work -----------------------------------------------------------------------------------------
    def _device_times(self, g: Group, groups: EventGroups) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of device work; a negative ``dur`` (work that ends before it starts) is refused."""
        negative = np.flatnonzero(g.dur < 0)
        if negative.size:
            i = int(negative[0])
            what = f"{groups.cats[g.cat[i]]} {groups.names[g.name[i]]!r:.80}"
            raise InvalidArgument(
                f"cannot load trace {self.where}: traceEvents[{g.index[i]}] ({what}) has a negative dur "
                f"({g.dur[i]:g} µs): device work cannot end before it starts"
            )
        return time_columns(g.ts, g.dur, self.where)

    def _device_streams(self, g: Group, groups: EventGroups) -> np.ndarray:
        """Device work's stream (``args.stream``, else its tid); one below -1 is refused, naming the event (host rows
        are numbered from -2 down, and no profiler numbers a device stream so)."""
        stream = _given(g.arg("stream"), groups.ints_of(g.tid, 0))
        below = np.flatnonzero(stream < -1)
        if below.size:
            i = int(below[0])
            what = f"{groups.cats[g.cat[i]]} {groups.names[g.name[i]]!r:.80}"
            raise InvalidArgument(
                f"cannot load trace {self.where}: traceEvents[{g.index[i]}] ({what}) is on stream {int(stream[i])}: "
                "a device stream is -1 or more"
            )
        return stream

    def _device(self, groups: EventGroups) -> Block:
        g = groups.device
        start, end = self._device_times(g, groups)
        kinds, pinned = device_kinds(groups.cats, groups.names, g.cat, g.name, None)
        device = _given(g.arg("device"), groups.ints_of(g.pid, 0))
        stream = self._device_streams(g, groups)
        corr = self._correlations(g, groups.flow_end, start, groups)
        # each device row once, with the (pid, tid) its thread_name metadata is filed under
        rows, first, _ = distinct((device << 32) ^ (stream & 0xFFFFFFFF), first=True)
        threads = groups.threads_of(g)[first]
        self._row_threads = {
            (int(d), int(s)): groups.thread_key(int(t))
            for d, s, t in zip(device[first].tolist(), stream[first].tolist(), threads.tolist())
        }
        return span_block(
            len(g),
            kind=kinds,
            device=device,
            stream=stream,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            bytes=np.maximum(g.arg("bytes"), 0),
            name=NameCodes(g.name, groups.name_table()),
            pinned=pinned,
            corr=corr,
            grid=g.arg("grid"),
            block=g.arg("block"),
            registers=g.arg("registers"),
            shared_bytes=g.arg("shared"),
        )

    def _device_range(self, groups: EventGroups) -> Block:
        """GPU-side annotations (``gpu_user_annotation``): ``range`` spans on their device stream's row."""
        g = groups.device_range
        start, end = time_columns(g.ts, g.dur, self.where)
        return span_block(
            len(g),
            kind=_RANGE,
            device=_given(g.arg("device"), groups.ints_of(g.pid, 0)),
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            **self._range_columns(g, groups, start),
        )

    def _range_columns(self, g: Group, groups: EventGroups, start: np.ndarray) -> dict[str, Any]:
        """A GPU annotation's stream (``args.stream``, else its tid), enqueue time (its start) and name."""
        return {
            "stream": self._device_streams(g, groups),
            "enqueue_ns": start + self.base_ns,
            "name": NameCodes(g.name, groups.name_table()),
        }

    def _correlations(self, g: Group, flows: Group, start: np.ndarray, groups: EventGroups) -> np.ndarray:
        """``args.correlation``; where it is missing, the id of the ``ac2g`` flow bound to the event's start."""
        corr = g.arg("correlation").copy()
        missing = np.flatnonzero(corr < 0)
        if missing.size and len(flows):
            ts = ns_column(flows.ts, self.where, "ts").tolist()
            keys = zip(flows.pid.tolist(), flows.tid.tolist(), ts)
            at = dict(zip(keys, int_column(flows.id, -1).tolist()))
            pid, tid = g.pid[missing].tolist(), g.tid[missing].tolist()
            for i, p, t, s in zip(missing.tolist(), pid, tid, start[missing].tolist()):
                corr[i] = at.get((p, t, s), -1)
        return corr

    # -- host work -------------------------------------------------------------------------------------------
    def _host(self, g: Group, kind: str, first: int, groups: EventGroups) -> Block:
        start, end = time_columns(g.ts, g.dur, self.where)
        corr = self._correlations(g, groups.flow_start, start, groups) if kind == "api" else -1
        start += self.base_ns
        end += self.base_ns
        block = span_block(
            len(g),
            kind=KIND_CODE[kind],
            device=first,
            stream=0,
            start_ns=start,
            end_ns=end,
            enqueue_ns=start,
            name=NameCodes(g.name, groups.name_table()),
            corr=corr,
        )
        block["_thread"] = groups.threads_of(g)  # replaced by a stream in _host_rows
        return block

    def _link_calls(self, device: Block, api: Block, first: int) -> None:
        """An api call's device is the device of the work it enqueued; that work's enqueue time is the call's start
        (``_calls``: each device row's call, -1 where none has its correlation)."""
        self._calls = first_rows(api["corr"], device["corr"])
        device["enqueue_ns"] = pick(api["start_ns"], self._calls, -1)
        api["device"] = link_column(device["corr"], device["device"], api["corr"], first).astype(np.int16)

    def _host_rows(self, api: Block, ranges: Block, groups: EventGroups) -> None:
        """One host row per (pid, tid), numbered in order of each thread's first event."""
        keys = np.concatenate([api.pop("_thread"), ranges.pop("_thread")])
        threads, seen, inverse = distinct(keys, first=True)
        appearance = np.argsort(seen, kind="stable")  # thread codes in order of first appearance, as before
        index = np.empty(threads.size, np.int64)
        index[appearance] = np.arange(threads.size)
        codes = index[inverse]
        first_seen = np.full(threads.size, np.iinfo(np.int64).max)
        np.minimum.at(first_seen, codes, np.concatenate([api["start_ns"], ranges["start_ns"]]))
        rank = np.empty(threads.size, np.int64)
        rank[np.lexsort((np.arange(threads.size), first_seen))] = np.arange(threads.size)
        streams = thread_stream(rank[codes]) if codes.size else codes
        api["stream"] = streams[: api.n].astype(np.int32)
        ranges["stream"] = streams[api.n :].astype(np.int32)
        ordered = threads[appearance].tolist()
        self._thread_codes = {int(thread_stream(int(rank[code]))): t for code, t in enumerate(ordered)}
        self._threads = {stream: groups.thread_key(t) for stream, t in self._thread_codes.items()}

    def _labels(self, table: dict[str, np.ndarray], groups: EventGroups) -> dict[tuple[int, int], str]:
        """Device rows: their ``thread_name`` ("stream 7") or "stream N"; host rows: their thread's name."""
        names = groups.thread_names
        labels = {row: row_label(names.get(thread)) or f"stream {row[1]}" for row, thread in self._row_threads.items()}
        pids = {key[0] for key in self._threads.values()}
        host = table["stream"] <= -2
        for dev, stream in _pairs(table["device"][host], table["stream"][host]):
            pid, tid = self._threads[stream]
            default = f"host thread {tid}" if len(pids) == 1 else f"host pid {pid} thread {tid}"
            labels[(dev, stream)] = row_label(names.get((pid, tid))) or default
        return labels

    # -- devices ---------------------------------------------------------------------------------------------
    def _properties(self) -> dict[int, dict]:
        props = self.meta.get("deviceProperties")
        out = {}
        if isinstance(props, list):
            for p in props:
                if isinstance(p, dict) and int_or(p.get("id"), -1) >= 0:
                    out[int_or(p.get("id"), -1)] = p
        return out

    def _first_property_device(self) -> int:
        return min(self._properties(), default=0)

    def _clocks(
        self, table: dict[str, np.ndarray], groups: EventGroups, memory_devices: np.ndarray = _NO_DEVICES
    ) -> dict[int, DeviceClock]:
        props = self._properties()
        devices = {*distinct_values(table["device"]).tolist(), *distinct_values(memory_devices).tolist()}
        used = sorted(devices) or sorted(props) or []
        if not props and not (table["stream"] >= 0).any() and not memory_devices.size:  # host work only
            note = f"loaded from {self.where}: no device work in it (a CPU-only profile)"
            return {dev: DeviceClock(key="host:0", name="host", source=self.source, note=note) for dev in used}
        backend = "rocm" if self._rocm(props, table) else "cuda"
        clocks = {}
        for dev in used:
            p = props.get(dev, {})
            name = p.get("name") or groups.process_names.get(dev) or f"GPU {dev}"
            limits = DeviceLimits.from_properties(p) if backend == "cuda" else None
            clocks[dev] = DeviceClock(
                key=f"{backend}:{dev}", name=str(name), source=self.source, note=f"loaded from {self.where}",
                limits=limits,
            )  # fmt: skip
        return clocks

    @staticmethod
    def _rocm(props: Mapping[int, dict], table: Mapping[str, np.ndarray]) -> bool:
        """Whether the trace came from ROCm: AMD device properties, or HIP calls on the host."""
        if any("gcnArchName" in p or "AMD" in str(p.get("name", "")) for p in props.values()):
            return True
        calls = np.flatnonzero(table["kind"] == KIND_CODE["api"])
        return bool(calls.size) and str(table["name"][calls[0]]).startswith("hip")


class _OwnExport(_Kineto):
    """A file ``Trace.to_chrome_trace`` wrote: read back exactly (its ``gpuworkbench`` block says how)."""

    source = "gpuworkbench export"

    def __init__(self, where: str, meta: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        super().__init__(where, meta)
        self.base_ns = int_or(own.get("origin_host_ns"), 0)
        self.offset = int_or(own.get("stream_offset"), STREAM_OFFSET)
        self.synthetic = int_or(own.get("synthetic_correlation_from"), 1)
        self.own = own

    def read(self, groups: EventGroups) -> Trace:
        self.locations = self._locations()
        blocks = [self._device(groups), self._device_range(groups)]
        blocks += [self._host(g, groups) for g in (groups.api, groups.range)]
        table = concat_blocks(blocks)
        memory = self._own_memory(groups)
        trace = Trace.finished(
            table,
            self._clocks(table, groups),
            self._labels(table, groups),
            memory,
            dropped=int_or(self.own.get("dropped"), 0),
            lost=int_or(self.own.get("lost"), 0),
            locations=self.locations,
        )
        return self._counters(trace, groups)

    def _locations(self) -> list[Location]:
        """The source lines the export's spans index (``args["source location"]``): each a Location's fields with
        the line's text last, which here cannot be looked up."""
        listed = self.own.get("locations", [])
        if not isinstance(listed, list) or not all(
            type(x) is list and len(x) == 7 and type(x[1]) is int and type(x[4]) is int for x in listed
        ):
            raise InvalidArgument(
                f"cannot load trace {self.where}: its gpuworkbench block's locations are not "
                "[file, line, function, site file, site line, site function, text] lists"
            )
        return [
            Location(str(f), line, str(fn), str(sf), sl, str(sfn), str(text))
            for f, line, fn, sf, sl, sfn, text in listed
        ]

    def _loc(self, g: Group) -> np.ndarray:
        """Each span's index into the export's locations (-1: none, or one out of their range)."""
        loc = g.arg("source_location")
        return np.where((loc >= 0) & (loc < len(self.locations)), loc, -1)

    def _time(self, values: Any, what: str) -> np.ndarray:
        return ns_column(values, self.where, what) + self.base_ns

    def _own_memory(self, groups: EventGroups) -> dict[str, np.ndarray]:
        """Every ``[memory]`` event the export wrote, in its order, with our own columns."""
        g = groups.memory
        return {
            "device": g.arg("device_id").astype(np.int16),
            "t_ns": self._time(g.ts, "ts"),
            "held_bytes": g.arg("held_bytes"),
            "used_bytes": g.arg("used_bytes"),
            "other_bytes": g.arg("total_allocated"),
        }

    def _enqueue(self, values: list[Any]) -> np.ndarray:
        known = np.array([v is not None for v in values], bool)
        out = np.full(len(values), -1, np.int64)
        if known.any():
            out[known] = self._time([v for v in values if v is not None], "enqueued (us)")
        return out

    @staticmethod
    def _names(g: Group, groups: EventGroups) -> list[Any]:
        """``args.op`` (the span's own name) where the event has it, else the event's name."""
        names = groups.names_of(g)
        return [n if op is None else str(op) for op, n in zip(g.arg("op"), names.tolist())]

    def _device(self, groups: EventGroups) -> Block:
        g = groups.device
        start, end = self._device_times(g, groups)
        kinds, pinned = device_kinds(groups.cats, groups.names, g.cat, g.name, g.arg("pinned"))
        corr = g.arg("correlation")
        return span_block(
            len(g),
            kind=kinds,
            device=_given(g.arg("device"), groups.ints_of(g.pid, 0)),
            stream=_given(g.arg("stream"), groups.ints_of(g.tid, 0)) - self.offset,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=self._enqueue(g.arg("enqueued")),
            bytes=g.arg("bytes"),
            name=self._names(g, groups),
            pinned=pinned,
            corr=np.where(corr < self.synthetic, corr, -1),
            grid=g.arg("grid"),
            block=g.arg("block"),
            loc=self._loc(g),
            registers=g.arg("registers"),
            shared_bytes=g.arg("shared"),
        )

    def _range_columns(self, g: Group, groups: EventGroups, start: np.ndarray) -> dict[str, Any]:
        """As exported: the row is the tid less the stream offset; enqueue time, op name and correlation in args."""
        return {
            "stream": groups.ints_of(g.tid, 0) - self.offset,
            "enqueue_ns": self._enqueue(g.arg("enqueued")),
            "name": self._names(g, groups),
            "corr": g.arg("correlation"),
            "loc": self._loc(g),
        }

    def _host(self, g: Group, groups: EventGroups) -> Block:  # type: ignore[override]
        """Host rows: tid t is stream -t; ``args.kind`` says which kind (enqueue markers are not spans)."""
        kinds = g.arg("kind")
        g = g.take(g.present & np.array([k != "enqueue" for k in kinds], bool))
        start, end = time_columns(g.ts, g.dur, self.where)
        codes = [KIND_CODE.get(k, KIND_CODE["api"]) if isinstance(k, str) else KIND_CODE["api"] for k in g.arg("kind")]
        return span_block(
            len(g),
            kind=np.array(codes, np.int8),
            device=_given(g.arg("device"), np.zeros(len(g), np.int64)),
            stream=-groups.ints_of(g.tid, 1),
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=self._enqueue(g.arg("enqueued")),
            bytes=g.arg("bytes"),
            name=self._names(g, groups),
            corr=g.arg("correlation"),
            loc=self._loc(g),
        )

    def _labels(self, table: dict[str, np.ndarray], groups: EventGroups) -> dict[tuple[int, int], str]:
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

    def _clocks(self, table: dict[str, np.ndarray], groups: EventGroups) -> dict[int, DeviceClock]:
        clocks = {}
        for dev, p in sorted(self._properties().items()):
            recorded = p.get("timestamps", "")
            clocks[dev] = DeviceClock(
                key=str(p.get("key") or f"device:{dev}"),
                name=str(p.get("name", f"device {dev}")),
                source=self.source,
                error_ns=int_or(p.get("alignment_error_ns"), 0),
                note=f"loaded from {self.where}" + (f"; timestamps were {recorded}" if recorded else ""),
                limits=DeviceLimits.from_properties(p),
            )
        for dev in distinct_values(table["device"]).tolist():
            clocks.setdefault(int(dev), DeviceClock(key=f"device:{dev}", name=f"device {dev}", source=self.source))
        return clocks
