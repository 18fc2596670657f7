"""The client side of a cluster trace: start a trace in every Dask worker, align their clocks, merge their spans.

``ClusterTrace`` is a ``Trace`` whose spans come from the workers: on ``stop`` it gathers each worker's spans and
tasks (``client.run``), maps their times onto the client's clock by the offsets measured with direct round trips,
and rebuilds its table, one host device per worker (its task and thread rows) with the worker's devices after it.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..trace.columns import Columns, DeviceClock
from ..trace.counters import hold_samples
from ..trace.export import HOST_PID, chrome_trace
from ..trace.recorder import Trace
from ..trace.spans import COLUMNS, KIND_CODE, MEMORY_COLUMNS, thread_stream
from ..trace.statistics import Statistics, trace_statistics
from ._plugin import CLOCK_HANDLER, TracePlugin, clock_minus_monotonic, collect
from .counters import merge_counters, worker_part
from .summary import TASK_COLUMNS, ClusterSummary, summarize_cluster

_RANGE = KIND_CODE["range"]


def _empty(schema: Mapping[str, Any], n: int = 0) -> dict[str, np.ndarray]:
    return {c: np.zeros(n, dtype=dt) for c, dt in schema.items()}


def _concat(blocks: list[dict[str, np.ndarray]], schema: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if not blocks:
        return _empty(schema)
    return {c: np.concatenate([np.asarray(b[c], dtype=dt) for b in blocks]) for c, dt in schema.items()}


def _worker_addresses(client: Any) -> dict[str, dict]:
    """The scheduler's workers now: address -> its info (host, pid, name)."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed before the n_workers argument
        info = client.scheduler_info()
    return dict(info.get("workers", {}))


class ClusterTrace(Trace):
    """A gpuworkbench trace of a Dask cluster: ``with gw.dask.trace(client) as t:``; afterwards a finished ``Trace``.

    While recording, every worker (and each that joins) records its own trace through a ``WorkerPlugin``; on exit
    the spans are gathered and merged onto the client's clock. ``t.workers`` lists each worker (address, host, pid,
    offset_ns = its clock minus the client's, error_ns = half the best round trip, devices); ``t.tasks`` holds its
    tasks (``summary.TASK_COLUMNS``); ``t.gather_s`` how long the gathering took; a worker lost mid-trace is named
    in ``t.stats.warnings``. ``live=True`` gathers every ``interval_s`` while recording (what ``gw.live(client=...)``
    follows). ``others`` is every worker's ``Trace(others=...)``: other libraries' CUDA work (CuPy, PyTorch ...) too,
    or not; None leaves each worker its default (on unless its ``GPUWB_TRACE_OTHERS=0``). Given as True, a worker
    where it could not be had says so in the warnings. ``counters``: every worker samples its host's and devices'
    counters, merged into ``counters()`` under the worker's devices, its host's under its host device
    (``dask/counters.py``).
    """

    def __init__(
        self,
        client: Any,
        *,
        live: bool = False,
        interval_s: float = 0.4,
        clock_samples: int = 25,
        clock_shift_ns: Mapping[Any, int] | None = None,
        capacity: int = 1_000_000,
        others: bool | None = None,
        counters: bool = False,
    ) -> None:
        super().__init__(capacity=capacity, counters=counters)
        self.client = client
        self.live, self.poll_interval_s, self.clock_samples = live, interval_s, clock_samples
        self.plugin_name = f"gpuworkbench-trace-{uuid.uuid4().hex[:10]}"
        self.workers: list[dict[str, Any]] = []
        self.tasks: dict[str, np.ndarray] = _empty(TASK_COLUMNS)
        self.gather_s = 0.0
        self.gathers: list[float] = []  # seconds each gathering from the workers took (live ones, then the last)
        self._shift = dict(clock_shift_ns or {})
        self.worker_others = others  # each worker's Trace(others=...); None: the worker's default
        self._order: list[str] = []  # worker addresses in order of first sight
        self._info: dict[str, dict[str, Any]] = {}
        self._blocks: dict[str, list[dict[str, Any]]] = {}
        self._cursors: dict[str, tuple[int, int]] = {}
        self._clock: dict[str, list[tuple[int, int]]] = {}  # address -> (rtt, offset) of each measurement's best
        self._recording = False
        self._wall_start = 0.0
        self._perf_minus_mono = 0
        self._poll_stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._gathering = threading.Lock()
        self._host_of: dict[str, int] = {}  # worker address -> its host device number (in order of first sight)
        self._worker_devices: dict[int, list[int]] = {}  # worker index -> its device numbers
        self._dev_map: dict[tuple[str, int], int] = {}  # (worker, its device number) -> ours
        self._row_map: dict[tuple[str, Any], int] = {}  # (worker, thread ident) -> host row index
        self._thread_names: dict[str, dict[Any, str]] = {}

    # ------------------------------------------------------------------ lifetime
    @property
    def recording(self) -> bool:
        return self._recording

    def start(self) -> ClusterTrace:
        """Register the worker plugin (a trace starts in every worker) and measure each worker's clock offset."""
        if self._recording:
            return self
        self._perf_minus_mono = clock_minus_monotonic(time.perf_counter_ns)
        self.started_ns = time.perf_counter_ns()
        self._wall_start = time.time()
        plugin = TracePlugin(self.plugin_name, self._shift, self.capacity, self.worker_others, self.counting)
        self.client.register_plugin(plugin, name=self.plugin_name)
        self._recording = True
        workers = _worker_addresses(self.client)
        for address, info in workers.items():
            self._see(address, info)
        self._measure(list(workers))
        for address in self._order:
            self._worker_index(address)
        if self.live:
            self._poller = threading.Thread(target=self._poll, name=f"gpuworkbench-dask-{self.id}", daemon=True)
            self._poller.start()
        return self

    def stop(self) -> None:
        """Stop every worker's trace, gather what is new, merge it, and remove the plugin (cost: ``gather_s``)."""
        if not self._recording:
            return
        began = time.perf_counter()
        self._poll_stop.set()
        if self._poller is not None:
            self._poller.join(30)
        workers = _worker_addresses(self.client)
        for address, info in workers.items():
            self._see(address, info)
        self._measure(list(workers))
        answered = self._gather(stop=True)
        self.stopped_ns = time.perf_counter_ns()
        self._recording = False
        try:
            self.client.unregister_worker_plugin(self.plugin_name)
        except Exception as exc:  # noqa: BLE001 - a worker gone meanwhile must not lose the trace
            self.warn_once(f"removing the worker plugin failed: {exc!r}")
        self._name_lost(answered)
        self._rebuild()
        self.gather_s = time.perf_counter() - began

    def __enter__(self) -> ClusterTrace:
        return self.start()

    # ------------------------------------------------------------------ gathering
    def _see(self, address: str, info: Mapping[str, Any]) -> None:
        if address not in self._info:
            self._order.append(address)
            self._info[address] = {"host": info.get("host", ""), "pid": info.get("pid", -1), "name": info.get("name")}

    def _measure(self, addresses: list[str]) -> None:
        """Each worker's clock offset by direct round trips (client → worker → client): of ``clock_samples`` calls,
        the one with the smallest round trip gives offset = worker time − (send + receive) / 2, within ± RTT / 2."""

        async def probe() -> dict[str, tuple[int, int] | None]:
            out: dict[str, tuple[int, int] | None] = {}
            for address in addresses:
                best = None
                try:
                    rpc = self.client.rpc(address)
                    for _ in range(self.clock_samples):
                        t0 = time.monotonic_ns()
                        there = await getattr(rpc, CLOCK_HANDLER)(name=self.plugin_name)
                        t1 = time.monotonic_ns()
                        if best is None or t1 - t0 < best[0]:
                            best = (t1 - t0, int(there) - (t0 + t1) // 2)
                except Exception:  # noqa: BLE001 - a worker that left: named later, from what it gave
                    best = None
                out[address] = best
            return out

        for address, best in self.client.sync(probe).items():
            if best is not None:
                self._clock.setdefault(address, []).append(best)

    def _gather(self, stop: bool) -> set[str]:
        """Collect what is new from every worker; the addresses that answered."""
        with self._gathering:
            began = time.perf_counter()
            results = self.client.run(collect, self.plugin_name, dict(self._cursors), stop, on_error="return")
            answered = set()
            for address, block in results.items():
                if isinstance(block, BaseException):
                    self.warn_once(f"worker {address}: gathering its trace failed: {block!r}")
                    continue
                if block is None:
                    continue
                answered.add(address)
                self._see(address, {})
                self._info[address].update(host=block["host"], pid=block["pid"], name=block["name"])
                self._cursors[address] = tuple(block["cursor"])
                self._blocks.setdefault(address, []).append(block)
                if not stop:
                    if address not in self._clock:
                        self._measure([address])
                    self._append(address, block)
            self.gathers.append(time.perf_counter() - began)
            return answered

    def _poll(self) -> None:
        """Gather every ``poll_interval_s`` on a fixed cadence (the gathering's own time is inside the period)."""
        due = time.monotonic()
        while True:
            due += self.poll_interval_s
            if self._poll_stop.wait(max(due - time.monotonic(), 0.0)):
                return
            due = max(due, time.monotonic() - self.poll_interval_s)  # after a slow gathering, no burst to catch up
            try:
                self._gather(stop=False)
            except Exception as exc:  # noqa: BLE001 - live updates must not end the trace
                self.warn_once(f"live gathering failed: {exc!r}")

    def _name_lost(self, answered: set[str]) -> None:
        """Warn of every worker seen during the trace that did not hand over its spans at the end."""
        removed: dict[str, bool] = {}
        try:
            for stamp, msg in self.client.get_events("all"):
                if stamp < self._wall_start - 1 or not isinstance(msg, dict):
                    continue
                address = msg.get("worker")
                if msg.get("action") == "add-worker" and address:
                    self._see(address, {})
                elif msg.get("action") == "remove-worker" and address:
                    removed[address] = bool(msg.get("expected"))
        except Exception:  # noqa: BLE001 - events are a help, not a need
            pass
        for address in self._order:
            if address in answered:
                continue
            why = "was retired" if removed.get(address) else "died or lost its connection"
            kept = (
                "its spans up to the last live update are kept" if self._blocks.get(address) else "its spans are lost"
            )
            self.warn_once(f"worker {address} left the cluster mid-trace ({why}): {kept}")
            self._info[address]["lost"] = True

    # ------------------------------------------------------------------ merging
    def _offset(self, address: str) -> tuple[int, int, int, int]:
        """(offset_ns, error_ns, rtt_ns, drift_ns) of a worker: the measurement with the smallest round trip; drift is
        the last measurement's offset minus the first's."""
        samples = self._clock.get(address)
        if not samples:
            return 0, -1, -1, 0
        rtt, offset = min(samples)
        return offset, rtt // 2, rtt, samples[-1][1] - samples[0][1]

    def _worker_index(self, address: str) -> int:
        """The worker's index, making its host device (its task and thread rows) at first sight."""
        if address not in self._host_of:
            self._host_of[address] = len(self._devices)
            self._worker_devices[len(self._host_of) - 1] = []
            self._host_clock(address)
        return list(self._host_of).index(address)

    def _device_of(self, address: str, local: int, block: dict[str, Any]) -> int:
        number = self._dev_map.get((address, local))
        if number is None:
            number = self._dev_map[(address, local)] = len(self._devices)
            for n, key, name, source, offset, error, note in block["devices"]:
                if n == local:
                    self._devices[number] = DeviceClock(
                        key=f"{address} {key}",
                        name=f"{address} {name}",
                        source=source,
                        offset_ns=offset,
                        error_ns=error,
                        note=note,
                    )
            self._worker_devices[self._worker_index(address)].append(number)
        return number

    def _row_of(self, address: str, ident: Any, label: str) -> int:
        """The host row (a negative stream) of one thread of a worker, on its host device."""
        index = self._row_map.get((address, ident))
        if index is None:
            index = self._row_map[(address, ident)] = len(self._row_map)
            self._stream_labels[(self._host_of[address], thread_stream(index))] = label
        return thread_stream(index)

    def _host_clock(self, address: str) -> None:
        """The worker's host device clock: its offset and how well it is known."""
        info = self._info[address]
        offset, error, rtt, drift = self._offset(address)
        self._devices[self._host_of[address]] = DeviceClock(
            key=address,
            name=f"{address} on {info.get('host') or '?'} (pid {info.get('pid')})",
            source="dask",
            offset_ns=offset,
            error_ns=max(error, 0),
            note=f"clock offset {offset} ns ± {error} ns (best round trip {rtt} ns, drift {drift} ns)",
        )

    def _convert(self, address: str, block: dict[str, Any]) -> tuple[dict, dict | None, dict | None]:
        """A gathered block as span, memory and task columns on the client's clock (perf_counter_ns)."""
        w = self._worker_index(address)
        host_dev = self._host_of[address]
        to_client = self._perf_minus_mono - self._offset(address)[0]  # aligned worker ns -> client perf_counter_ns
        names_of = self._thread_names.setdefault(address, {})
        names_of.update(block["thread_names"])
        cols = {c: np.array(v, copy=True) for c, v in block["spans"].items()}
        codes = np.asarray(block["codes"])
        cols["name"] = np.array(block["names"], dtype=object)[codes] if codes.size else np.zeros(0, dtype=object)
        local = {n: self._device_of(address, n, block) for n, *_ in block["devices"]}
        for d, s, label in block["labels"]:
            if s >= -1 and d in local:
                self._stream_labels[(local[d], s)] = label
        cols["device"] = np.array([local.get(int(d), host_dev) for d in cols["device"].tolist()], np.int16)
        threads = cols["stream"] <= -2
        if threads.any():
            streams = cols["stream"][threads].tolist()
            idents = [block["threads"].get(-2 - s, ("unknown", s)) for s in streams]
            cols["stream"][threads] = [self._row_of(address, i, names_of.get(i, "host thread")) for i in idents]
            cols["device"][threads] = host_dev
        for c in ("start_ns", "end_ns"):
            cols[c] = cols[c] + to_client
        cols["enqueue_ns"] = np.where(cols["enqueue_ns"] >= 0, cols["enqueue_ns"] + to_client, -1)
        memory = None
        if "memory" in block and len(block["memory"]["device"]):
            memory = {c: np.array(v, copy=True) for c, v in block["memory"].items()}
            memory["device"] = np.array([local.get(int(d), host_dev) for d in memory["device"].tolist()], np.int16)
            memory["t_ns"] = memory["t_ns"] + to_client
        n = len(block["task_keys"])
        if n == 0:
            return cols, memory, None
        action = np.asarray(block["task_action"])
        streams = [
            self._row_of(address, t, names_of.get(t, f"thread {t:#x}"))
            if a == 0
            else self._row_of(address, "transfers", "incoming transfers")
            for t, a in zip(block["task_thread"].tolist(), action.tolist())
        ]
        start, end = block["task_start"] + to_client, block["task_end"] + to_client
        keys = [str(k) for k in block["task_keys"]]
        tasks = {"worker": np.full(n, w), "key": np.array(keys, dtype=object), "action": action}
        tasks |= {"start_ns": start, "end_ns": end, "stream": np.array(streams, np.int32)}
        names = [k if a == 0 else f"{k} ← {src}" for k, a, src in zip(keys, action.tolist(), block["task_source"])]
        task_spans = {c: np.zeros(n, dtype=dt) for c, dt in COLUMNS.items()} | {
            "kind": np.full(n, _RANGE, np.int8),
            "device": np.full(n, host_dev, np.int16),
            "stream": tasks["stream"],
            "start_ns": start,
            "end_ns": np.maximum(end, start),
            "enqueue_ns": np.full(n, -1, np.int64),
            "name": np.array(names, dtype=object),
            "pinned": np.full(n, -1, np.int8),
            "corr": np.full(n, -1, np.int64),
        }
        return _concat([cols, task_spans], COLUMNS), memory, tasks

    def _append(self, address: str, block: dict[str, Any]) -> None:
        """Add one block's rows to the table as they come (live views read them with ``delta``)."""
        spans, memory, tasks = self._convert(address, block)
        with self._lock:
            self._host_clock(address)
            if len(spans["kind"]):
                self._spans.extend_columns(spans)
            if memory is not None:
                self._memory.extend_columns(memory)
            if tasks is not None:
                self.tasks = _concat([self.tasks, tasks], TASK_COLUMNS)
            self.workers = self._worker_records()
            self._hold_counters()
            self._version += 1

    def _hold_counters(self) -> None:
        """Every worker's counter samples gathered so far, on the client's clock, as the trace's ``counters()``."""
        if self.counting:
            shift = {a: self._perf_minus_mono - self._offset(a)[0] for a in self._order}
            hold_samples(self, *merge_counters(self._blocks, shift, self._dev_map, self._host_of))

    def _worker_records(self) -> list[dict[str, Any]]:
        """``t.workers``: one dict per worker seen, in order of first sight."""
        records = []
        for address in self._order:
            info = self._info[address]
            offset, error, rtt, drift = self._offset(address)
            records.append(
                {
                    "address": address,
                    "host": info.get("host", ""),
                    "pid": info.get("pid", -1),
                    "name": info.get("name"),
                    "offset_ns": offset,
                    "error_ns": error,
                    "rtt_ns": rtt,
                    "drift_ns": drift,
                    "host_device": self._host_of[address],
                    "devices": list(self._worker_devices[self._worker_index(address)]),
                    "lost": bool(info.get("lost")),
                }
            )
        return records

    def _rebuild(self) -> None:
        """The merged table from every block gathered, with the final clock offsets, in start order."""
        spans, memory, tasks = [], [], []
        warnings, ops, dropped, lost = [], 0, 0, 0
        for address in self._order:
            self._worker_index(address)
            for block in self._blocks.get(address, []):
                s, m, t = self._convert(address, block)
                spans.append(s)
                memory += [m] if m is not None else []
                tasks += [t] if t is not None else []
            blocks = self._blocks.get(address, [])
            if blocks:
                last = blocks[-1]
                warnings += [f"worker {address}: {m}" for m in last["warnings"]]
                ops, dropped, lost = ops + last["ops"], dropped + last["dropped"], lost + last["lost"]
            self._host_clock(address)
        table = _concat(spans, COLUMNS)
        order = np.argsort(table["start_ns"], kind="stable")
        capacity = max(len(order), self.capacity)
        merged = Columns(COLUMNS, capacity)
        if len(order):
            merged.extend_columns({c: v[order] for c, v in table.items()})
        mem = _concat(memory, MEMORY_COLUMNS)
        merged_memory = Columns(MEMORY_COLUMNS, capacity)
        if len(mem["device"]):
            order = np.argsort(mem["t_ns"], kind="stable")
            merged_memory.extend_columns({c: v[order] for c, v in mem.items()})
        with self._lock:
            self._spans, self._memory = merged, merged_memory
            self.tasks = _concat(tasks, TASK_COLUMNS)
            self.workers = self._worker_records()
            self._event_ops = ops
            self._stats.dropped, self._stats.lost = dropped, lost
            for message in warnings:
                self.warn_once(message)
            self._hold_counters()
            self._version += 1

    # ------------------------------------------------------------------ reading
    def summary(self, window: tuple[int, int] | None = None) -> ClusterSummary:  # type: ignore[override]
        """Per worker busy / idle, the straggler, device idle between tasks, every device's figures and advice."""
        table = self.table()
        return summarize_cluster(
            table,
            self.tasks,
            [w["address"] for w in self.workers],
            self._worker_devices,
            list(self._host_of.values()),
            window,
        )

    def statistics(self) -> Statistics:
        """``Trace.statistics``, each worker's devices one process: a range holds only its own worker's ops."""
        workers = enumerate(self.workers)
        return trace_statistics(self, {d: w for w, i in workers for d in [i["host_device"], *i["devices"]]})

    def worker_trace(self, worker: int | str) -> Trace:
        """One worker's part as a finished Trace of its own (its devices renumbered from 0, its host rows on its first
        device), on the client's clock: what a per-worker Kineto file holds."""
        index = worker if isinstance(worker, int) else [w["address"] for w in self.workers].index(worker)
        info = self.workers[index]
        table = self.table()
        numbers = info["devices"] or [info["host_device"]]
        renumber = {d: i for i, d in enumerate(numbers)}
        renumber[info["host_device"]] = 0
        rows = np.isin(table["device"], list(renumber))
        part = {c: v[rows] for c, v in table.items()}
        part["device"] = np.array([renumber[int(d)] for d in part["device"].tolist()], np.int16)
        prefix = f"{info['address']} "
        devices = {}
        for d, i in renumber.items():
            clock = self._devices[d]
            if d == info["host_device"] and info["devices"]:
                continue
            devices[i] = DeviceClock(
                key=clock.key.removeprefix(prefix) if d != info["host_device"] else "host:0",
                name=clock.name.removeprefix(prefix),
                source=clock.source,
                offset_ns=clock.offset_ns,
                error_ns=clock.error_ns,
                note=clock.note,
            )
        labels = {(renumber[d], s): label for (d, s), label in self._stream_labels.items() if d in renumber}
        one = Trace.finished(part, devices, labels, started_ns=self.started_ns, stopped_ns=self.stopped_ns)
        if self.counting:
            hold_samples(one, *worker_part(self, renumber, info))
        return one

    def to_chrome_trace(self, path: str | None = None) -> dict:
        """The merged trace as one Chrome-trace JSON (Perfetto): each worker's host rows in a process of their own
        ("worker ADDRESS on HOST"), its devices as processes named by the worker; ``load_trace`` reads it back."""
        doc = chrome_trace(self)
        worker_of = {}
        for w, info in enumerate(self.workers):
            for d in [info["host_device"], *info["devices"]]:
                worker_of[d] = w
        host_threads: dict[int, dict] = {}
        moved: list[dict] = []
        last_pid = HOST_PID
        used: set[tuple[int, int]] = set()
        for event in doc["traceEvents"]:
            if event.get("pid") != HOST_PID:
                moved.append(event)
                continue
            if event["ph"] == "M":
                if event["name"] == "thread_name":
                    host_threads[event["tid"]] = event
                continue
            if event["ph"] == "X":
                w = worker_of.get(int(event.get("args", {}).get("device", -1)), -1)
                last_pid = HOST_PID + 1 + w if w >= 0 else HOST_PID
            event["pid"] = last_pid
            used.add((last_pid, event["tid"]))
            moved.append(event)
        meta = []
        for pid in sorted({p for p, _ in used}):
            w = pid - HOST_PID - 1
            info = self.workers[w] if 0 <= w < len(self.workers) else None
            name = f"worker {info['address']} on {info['host']} (pid {info['pid']})" if info else "host"
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}})
        for pid, tid in sorted(used):
            thread = host_threads.get(tid)
            if thread is not None:
                meta.append({**thread, "pid": pid})
        doc["traceEvents"] = meta + moved
        doc["gpuworkbench"]["workers"] = [{k: v for k, v in w.items()} for w in self.workers]
        if path is not None:
            _write(doc, path)
        return doc

    def export(self, folder: str | Path) -> dict[str, Any]:
        """Write one Kineto-style JSON per worker (``folder/ranks/rank-<i>.json``: ``distributedInfo.rank`` = i, so
        that HolisticTraceAnalysis reads ``folder/ranks`` as a multi-rank run) and the merged Chrome trace
        (``folder/cluster.json``); returns the paths."""
        folder = Path(folder)
        (folder / "ranks").mkdir(parents=True, exist_ok=True)
        ranks = []
        for i, info in enumerate(self.workers):
            doc = chrome_trace(self.worker_trace(i))
            doc["distributedInfo"] = {"backend": "dask", "rank": i, "world_size": len(self.workers)}
            doc["gpuworkbench"]["worker"] = {k: info[k] for k in ("address", "host", "pid", "offset_ns", "error_ns")}
            path = folder / "ranks" / f"rank-{i}.json"
            _write(doc, path)
            ranks.append(path)
        merged = folder / "cluster.json"
        self.to_chrome_trace(str(merged))
        return {"ranks": ranks, "merged": merged}

    def __repr__(self) -> str:
        state = "recording" if self.recording else "stopped"
        return f"<ClusterTrace {self.id}: {len(self._order)} workers, {len(self)} spans, {state}>"


def _write(doc: dict, path: str | Path) -> None:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f)


def trace(client: Any, **options: Any) -> ClusterTrace:
    """A trace of every worker of ``client``'s cluster: ``with gw.dask.trace(client) as t:`` (see ``ClusterTrace``
    for the options: ``live``, ``interval_s``, ``clock_samples``, ``clock_shift_ns``, ``capacity``, ``others``,
    ``counters``)."""
    return ClusterTrace(client, **options)


def live(client: Any, interval_s: float = 0.4, **options: Any) -> Any:
    """A live dashboard (``viz.Live``) following a cluster trace it starts; the trace gathers from the workers every
    ``interval_s`` (2.5 Hz by default); ``.stop()`` ends it and leaves the merged trace in ``.trace``."""
    from ..viz.dashboard import Live

    cluster = ClusterTrace(
        client,
        live=True,
        interval_s=interval_s,
        capacity=options.pop("capacity", 250_000),
        others=options.pop("others", None),
        counters=options.pop("counters", False),
    )
    return Live(cluster.start(), None, owns_trace=True, **options)
