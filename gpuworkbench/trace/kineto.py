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
A trace recorded with ``with_stack=True`` has ``python_function`` events: each runtime call, and the device work it
enqueued, is charged to the user line on its Python stack (``loc``, ``trace.locations``; rules in
``kineto_stacks.py``), so that ``statistics().lines`` works on it.

Events are sorted into groups in one pass over the parsed JSON and every field after that is a NumPy column
(``kineto_events.py``); the trace's table is filled with one ``extend_columns`` (``Trace.finished``), so that a
70 000-event trace loads in well under a second.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .columns import DeviceClock
from .export import HOST_PID, STREAM_OFFSET
from .kineto_events import (
    EventGroups,
    collector_paused,
    concat_blocks,
    device_kinds,
    dim3_column,
    event_args,
    event_names,
    event_times,
    group_events,
    int_column,
    int_or,
    link_column,
    ns_column,
    read_document,
    row_label,
    span_block,
)
from .kineto_stacks import stack_locations
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

    Raises ``InvalidArgument`` naming the file and what is wrong with it (missing, not JSON, a truncated gzip, no
    ``traceEvents`` list, an event without ``ts``)."""
    where = os.fspath(path)
    if not where:
        raise InvalidArgument("cannot load trace: the path is empty")
    with collector_paused():
        doc = read_document(where)
        events = doc.get("traceEvents") if isinstance(doc, dict) else doc
        if not isinstance(events, list):
            raise InvalidArgument(
                f"cannot load trace {where}: it has no traceEvents list (not a Chrome / Kineto trace)"
            )
        meta = doc if isinstance(doc, dict) else {}
        own = meta.get("gpuworkbench")
        reader = _OwnExport(where, meta, own) if isinstance(own, dict) else _Kineto(where, meta)
        return reader.read(events)


# ---------------------------------------------------------------------------------------------------- readers


class _Kineto:
    """A PyTorch profiler (Kineto) trace, CUDA or ROCm: device rows per (device, stream), host rows per thread."""

    source = "kineto"

    def __init__(self, where: str, meta: Mapping[str, Any]) -> None:
        self.where, self.meta = where, meta
        base = meta.get("baseTimeNanoseconds")
        self.base_ns = base if isinstance(base, int) else 0  # added to every time the file holds

    def read(self, events: list) -> Trace:
        groups = group_events(events, self.where)
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
        return Trace.finished(table, clocks, labels, memory, locations=locations)

    def _locate(self, groups: EventGroups, device: dict[str, Any], api: dict[str, Any]) -> list[Location]:
        """Each runtime call's user line, from the Python stacks of ``with_stack=True`` (``kineto_stacks.py``); the
        device work it enqueued gets the same. No python_function events: no locations, ``loc`` stays -1."""
        starts = api["start_ns"] - self.base_ns
        loc, locations = stack_locations(groups.python, api["stream"], self._threads, starts, self.where)
        if locations:
            api["loc"] = loc
            device["loc"] = link_column(api["corr"], loc, device["corr"], -1)
        return locations

    # -- memory ----------------------------------------------------------------------------------------------
    def _memory(self, groups: EventGroups) -> dict[str, np.ndarray]:
        """PyTorch's GPU ``[memory]`` events as memory rows: its allocator's total allocated, in time order."""
        events = [
            e for e in groups.memory if type(a := e.get("args")) is dict and a.get("Device Type") == _CUDA_DEVICE_TYPE
        ]
        args = event_args(events)
        t = ns_column([e["ts"] for e in events], self.where, "ts") + self.base_ns
        order = np.argsort(t, kind="stable")
        n = len(events)
        return {
            "device": int_column([a.get("Device Id", 0) for a in args], 0)[order].astype(np.int16),
            "t_ns": t[order],
            "held_bytes": np.zeros(n, np.int64),
            "used_bytes": np.full(n, -1, np.int64),
            "other_bytes": np.maximum(int_column([a.get("Total Allocated", 0) for a in args], 0), 0)[order],
        }

    # -- device work -----------------------------------------------------------------------------------------
    def _device(self, groups: EventGroups) -> dict[str, np.ndarray]:
        events = groups.device
        names, args = event_names(events), event_args(events)
        start, end = event_times(events, self.where)
        kinds, pinned = device_kinds(events, names, args)
        pid = [e.get("pid") for e in events]
        device = int_column([a.get("device", p) for a, p in zip(args, pid)], 0)
        stream = int_column([a.get("stream", e.get("tid")) for a, e in zip(args, events)], 0)
        corr = self._correlations(events, args, groups.flow_end, start)
        # each device row once, with the (pid, tid) its thread_name metadata is filed under
        rows, first = np.unique(np.stack([device, stream]), axis=1, return_index=True) if events else ((), [])
        self._row_threads = {
            (int(d), int(s)): (events[i].get("pid"), events[i].get("tid"))
            for (d, s), i in zip(np.transpose(rows), first)
        }
        return span_block(
            len(events),
            kind=kinds,
            device=device,
            stream=stream,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            bytes=np.maximum(int_column([a.get("bytes", 0) for a in args], 0), 0),
            name=names,
            pinned=pinned,
            corr=corr,
            grid=dim3_column([a.get("grid") for a in args]),
            block=dim3_column([a.get("block") for a in args]),
        )

    def _device_range(self, groups: EventGroups) -> dict[str, np.ndarray]:
        """GPU-side annotations (``gpu_user_annotation``): ``range`` spans on their device stream's row."""
        events = groups.device_range
        args = event_args(events)
        start, end = event_times(events, self.where)
        return span_block(
            len(events),
            kind=_RANGE,
            device=int_column([a.get("device", e.get("pid")) for a, e in zip(args, events)], 0),
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            **self._range_columns(events, args, start),
        )

    def _range_columns(self, events: list[dict], args: list[dict], start: np.ndarray) -> dict[str, Any]:
        """A GPU annotation's stream (``args.stream``, else its tid), enqueue time (its start) and name."""
        return {
            "stream": int_column([a.get("stream", e.get("tid")) for a, e in zip(args, events)], 0),
            "enqueue_ns": start + self.base_ns,
            "name": event_names(events),
        }

    def _correlations(self, events: list[dict], args: list[dict], flows: list[dict], start: np.ndarray) -> np.ndarray:
        """``args.correlation``; where it is missing, the id of the ``ac2g`` flow bound to the event's start."""
        corr = int_column([a.get("correlation", -1) for a in args], -1)
        missing = np.flatnonzero(corr < 0)
        if missing.size and flows:
            at = dict(zip(self._flow_keys(flows), int_column([f.get("id", -1) for f in flows], -1).tolist()))
            for i, t in zip(missing.tolist(), start[missing].tolist()):
                corr[i] = at.get((events[i].get("pid"), events[i].get("tid"), t), -1)
        return corr

    def _flow_keys(self, flows: list[dict]) -> list[tuple[Any, Any, int]]:
        ts = ns_column([f["ts"] for f in flows], self.where, "ts").tolist()
        return [(f.get("pid"), f.get("tid"), t) for f, t in zip(flows, ts)]

    # -- host work -------------------------------------------------------------------------------------------
    def _host(self, events: list[dict], kind: str, first: int, groups: EventGroups) -> dict[str, np.ndarray]:
        args = event_args(events)
        start, end = event_times(events, self.where)
        corr = np.full(len(events), -1, np.int64)
        if kind == "api":
            corr = self._correlations(events, args, groups.flow_start, start)
        block = span_block(
            len(events),
            kind=KIND_CODE[kind],
            device=first,
            stream=0,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=start + self.base_ns,
            name=event_names(events),
            corr=corr,
        )
        block["_thread"] = [(e.get("pid"), e.get("tid")) for e in events]  # replaced by a stream in _host_rows
        return block

    def _link_calls(self, device: dict[str, np.ndarray], api: dict[str, np.ndarray], first: int) -> None:
        """An api call's device is the device of the work it enqueued; that work's enqueue time is the call's start."""
        device["enqueue_ns"] = link_column(api["corr"], api["start_ns"], device["corr"], -1)
        api["device"] = link_column(device["corr"], device["device"], api["corr"], first).astype(np.int16)

    def _host_rows(self, api: dict[str, Any], ranges: dict[str, Any], groups: EventGroups) -> None:
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

    def _labels(self, table: dict[str, np.ndarray], groups: EventGroups) -> dict[tuple[int, int], str]:
        """Device rows: their ``thread_name`` ("stream 7") or "stream N"; host rows: their thread's name."""
        names = groups.thread_names
        labels = {row: row_label(names.get(thread)) or f"stream {row[1]}" for row, thread in self._row_threads.items()}
        pids = {key[0] for key in self._threads.values()}
        host = table["stream"] <= -2
        pairs = np.unique(
            np.stack([table["device"][host].astype(np.int64), table["stream"][host].astype(np.int64)]), axis=1
        )
        for dev, stream in pairs.T.tolist():
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
        self.base_ns = int_or(own.get("origin_host_ns"), 0)
        self.offset = int_or(own.get("stream_offset"), STREAM_OFFSET)
        self.synthetic = int_or(own.get("synthetic_correlation_from"), 1)
        self.own = own

    def read(self, events: list) -> Trace:
        groups = group_events(events, self.where)
        blocks = [self._device(groups), self._device_range(groups), self._host(groups)]
        table = concat_blocks(blocks)
        memory = self._own_memory(groups)
        return Trace.finished(
            table,
            self._clocks(table, groups),
            self._labels(table, groups),
            memory,
            dropped=int_or(self.own.get("dropped"), 0),
            lost=int_or(self.own.get("lost"), 0),
        )

    def _time(self, values: list, what: str) -> np.ndarray:
        return ns_column(values, self.where, what) + self.base_ns

    def _own_memory(self, groups: EventGroups) -> dict[str, np.ndarray]:
        """Every ``[memory]`` event the export wrote, in its order, with our own columns."""
        events = groups.memory
        args = event_args(events)
        return {
            "device": int_column([a.get("Device Id", 0) for a in args], 0).astype(np.int16),
            "t_ns": self._time([e["ts"] for e in events], "ts"),
            "held_bytes": int_column([a.get("held_bytes", 0) for a in args], 0),
            "used_bytes": int_column([a.get("used_bytes", -1) for a in args], -1),
            "other_bytes": int_column([a.get("Total Allocated", 0) for a in args], 0),
        }

    def _enqueue(self, args: list[dict]) -> np.ndarray:
        values = [a.get("enqueued (us)") for a in args]
        known = np.array([v is not None for v in values], bool)
        out = np.full(len(values), -1, np.int64)
        if known.any():
            out[known] = self._time([v for v in values if v is not None], "enqueued (us)")
        return out

    def _device(self, groups: EventGroups) -> dict[str, np.ndarray]:
        events = groups.device
        names, args = event_names(events), event_args(events)
        start, end = event_times(events, self.where)
        kinds, pinned = device_kinds(events, names, args)
        corr = int_column([a.get("correlation", -1) for a in args], -1)
        return span_block(
            len(events),
            kind=kinds,
            device=int_column([a.get("device", e.get("pid")) for a, e in zip(args, events)], 0),
            stream=int_column([a.get("stream", e.get("tid")) for a, e in zip(args, events)], 0) - self.offset,
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=self._enqueue(args),
            bytes=int_column([a.get("bytes", 0) for a in args], 0),
            name=[str(a.get("op", n)) for a, n in zip(args, names)],
            pinned=pinned,
            corr=np.where(corr < self.synthetic, corr, -1),
            grid=dim3_column([a.get("grid") for a in args]),
            block=dim3_column([a.get("block") for a in args]),
        )

    def _range_columns(self, events: list[dict], args: list[dict], start: np.ndarray) -> dict[str, Any]:
        """As exported: the row is the tid less the stream offset; enqueue time, op name and correlation in args."""
        return {
            "stream": int_column([e.get("tid") for e in events], 0) - self.offset,
            "enqueue_ns": self._enqueue(args),
            "name": [str(a.get("op", n)) for a, n in zip(args, event_names(events))],
            "corr": int_column([a.get("correlation", -1) for a in args], -1),
        }

    def _host(self, groups: EventGroups) -> dict[str, np.ndarray]:
        """Host rows: tid t is stream -t; ``args.kind`` says which kind (enqueue markers are not spans)."""
        events = [
            e for e in groups.api + groups.range if type(a := e.get("args")) is dict and a.get("kind") != "enqueue"
        ]
        args = event_args(events)
        start, end = event_times(events, self.where)
        kinds = [KIND_CODE.get(a.get("kind"), KIND_CODE["api"]) for a in args]
        return span_block(
            len(events),
            kind=np.array(kinds, np.int8),
            device=int_column([a.get("device", 0) for a in args], 0),
            stream=-int_column([e.get("tid") for e in events], 1),
            start_ns=start + self.base_ns,
            end_ns=end + self.base_ns,
            enqueue_ns=self._enqueue(args),
            bytes=int_column([a.get("bytes", 0) for a in args], 0),
            name=[str(a.get("op", n)) for a, n in zip(args, event_names(events))],
            corr=int_column([a.get("correlation", -1) for a in args], -1),
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
            )
        for dev in np.unique(table["device"]).tolist():
            clocks.setdefault(int(dev), DeviceClock(key=f"device:{dev}", name=f"device {dev}", source=self.source))
        return clocks
