"""The worker side of a cluster trace: a ``distributed.WorkerPlugin`` that records a gpuworkbench trace in its worker.

``setup`` (run on every worker when the plugin is registered, and on each worker that joins later) starts a
``Trace`` in the worker's process and adds the ``gpuworkbench_clock`` handler, which the client calls directly to
estimate the worker's clock offset. ``transition`` keeps each task's compute and transfer intervals (the worker's
``TaskState.startstops``) with the thread that ran it. ``collect`` hands over what is new since a cursor as columns
(NumPy arrays and a list of names: cheap to pickle), with every time on the worker's alignment clock:
``time.monotonic_ns`` (system-wide on Linux) plus the injected shift, a test hook that makes the worker's clock look
off as on another host. ``others`` is the worker's ``Trace(others=...)``: True also records other libraries' CUDA
work (CuPy, PyTorch ...) through CUPTI from the trace's start, if a CUDA library is loaded in the worker by then
(``dask_cuda``'s workers load ``cuda.core`` as they start); None leaves the worker's default (on unless its
``GPUWB_TRACE_OTHERS=0``). ``counters``: the worker's trace samples its host's and devices' counters, handed over
with the spans (``dask/counters.py``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from distributed import WorkerPlugin

from ..trace.recorder import Trace
from .counters import worker_counters

#: The worker handler the client calls for clock samples (one per worker, shared by every session).
CLOCK_HANDLER = "gpuworkbench_clock"
_ACTIONS = {"compute": 0, "transfer": 1}


def clock_minus_monotonic(clock: Any) -> int:
    """``clock() - time.monotonic_ns()`` read back to back, from the tightest of three brackets."""
    best = None
    for _ in range(3):
        m0 = time.monotonic_ns()
        c = clock()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, c - (m0 + m1) // 2)
    return best[1]


def _clock_handler(worker: Any) -> Any:
    def gpuworkbench_clock(name: str = "") -> int:
        """The worker's alignment clock now (monotonic ns plus the session's injected shift)."""
        plugin = worker.plugins.get(name)
        return time.monotonic_ns() + (plugin.shift_ns if isinstance(plugin, TracePlugin) else 0)

    return gpuworkbench_clock


class TracePlugin(WorkerPlugin):
    """Records a gpuworkbench trace in every worker of a cluster, and the worker's tasks, until torn down.

    ``clock_shift_ns`` maps worker addresses or names to a shift added to every time the worker reports (a test hook:
    the client must measure it back as that worker's clock offset); ``others`` and ``counters`` are passed to each
    worker's ``Trace``."""

    def __init__(
        self,
        name: str,
        clock_shift_ns: Mapping[Any, int] | None = None,
        capacity: int = 1_000_000,
        others: bool | None = None,
        counters: bool = False,
    ) -> None:
        self.name = name
        self.clock_shift_ns = dict(clock_shift_ns or {})
        self.capacity = capacity
        self.others = others
        self.counters = counters
        self.shift_ns = 0
        self.worker: Any = None
        self.trace: Trace | None = None
        self.tasks: list[tuple] = []  # (key, action, start_s, stop_s, thread ident, source)
        self._delay: dict[Any, float] = {}  # key -> the worker's scheduler_delay when it began executing

    def __getstate__(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "clock_shift_ns": self.clock_shift_ns,
            "capacity": self.capacity,
            "others": self.others,
            "counters": self.counters,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(
            state["name"], state["clock_shift_ns"], state["capacity"], state.get("others"), state.get("counters", False)
        )

    def setup(self, worker: Any) -> None:
        self.worker = worker
        shift = self.clock_shift_ns
        self.shift_ns = int(shift.get(worker.address, shift.get(worker.name, shift.get(str(worker.name), 0))))
        worker.handlers[CLOCK_HANDLER] = _clock_handler(worker)
        self.trace = Trace(capacity=self.capacity, others=self.others, counters=self.counters).start()

    def teardown(self, worker: Any) -> None:
        if self.trace is not None:
            self.trace.stop()

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """Keep a task's startstops when it finishes executing (times as the worker took them: Dask adds its
        estimate of the scheduler's clock offset, which is taken off again here)."""
        if finish in ("executing", "long-running") and start not in ("executing", "long-running"):
            self._delay[key] = float(getattr(self.worker, "scheduler_delay", 0.0))
            return
        if start not in ("executing", "long-running") or finish not in ("memory", "error"):
            return
        delay = self._delay.pop(key, float(getattr(self.worker, "scheduler_delay", 0.0)))
        ts = self.worker.state.tasks.get(key)
        if ts is None:
            return
        thread = int(self.worker.threads.get(key, 0) or 0)
        for ss in ts.startstops:
            action = _ACTIONS.get(ss.get("action"))
            if action is not None:
                self.tasks.append((key, action, ss["start"] - delay, ss["stop"] - delay, thread, ss.get("source", "")))

    def collect(self, cursor: tuple[int, ...], stop: bool) -> dict[str, Any]:
        """What is new since ``cursor`` (spans, tasks, counter samples), times on the alignment clock; ``stop`` ends
        the trace first and waits (≤ 10 s) for the spans of ops still running."""
        trace = self.trace
        assert trace is not None
        if stop:
            trace.stop()
            trace.wait_pending(10.0)
            if self.others:  # asked for by name (it is every trace's default): say where it could not be had
                _note_others(trace)
        spans, span_cursor = trace.delta(cursor[0])
        tasks = self.tasks[cursor[1] :]
        task_cursor = cursor[1] + len(tasks)
        shift = self.shift_ns
        perf = clock_minus_monotonic(time.perf_counter_ns) - shift  # perf - aligned
        wall = clock_minus_monotonic(time.time_ns) - shift  # wall - aligned
        names, codes = np.unique(np.asarray(spans["name"], dtype=object).astype(str), return_inverse=True)
        columns = {c: v for c, v in spans.items() if c != "name"}
        for column in ("start_ns", "end_ns"):
            columns[column] = columns[column] - perf
        known = columns["enqueue_ns"] >= 0
        columns["enqueue_ns"] = np.where(known, columns["enqueue_ns"] - perf, -1)
        threads = trace.host_threads  # thread ident (32 bits) -> the trace's host row index
        idents = {int(t[4]) & 0xFFFFFFFF for t in tasks} | set(threads)
        named = {(t.ident or 0) & 0xFFFFFFFF: t.name for t in threading.enumerate()}
        out: dict[str, Any] = {
            "address": self.worker.address,
            "name": str(self.worker.name),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "cursor": (span_cursor, task_cursor, 0),
            "spans": columns,
            "names": names.tolist(),
            "codes": codes.astype(np.int32),
            "devices": [
                (n, c.key, c.name, c.source, c.offset_ns, c.error_ns, c.note) for n, c in trace.devices.items()
            ],
            "labels": [(d, s, label) for (d, s), label in trace.stream_labels.items()],
            "threads": {index: ident for ident, index in threads.items()},
            "thread_names": {ident: named.get(ident, f"thread {ident:#x}") for ident in idents},
            "task_keys": [t[0] for t in tasks],
            "task_action": np.array([t[1] for t in tasks], np.int8),
            "task_start": np.array([round(t[2] * 1e9) - wall for t in tasks], np.int64),
            "task_end": np.array([round(t[3] * 1e9) - wall for t in tasks], np.int64),
            "task_thread": np.array([t[4] & 0xFFFFFFFF for t in tasks], np.int64),
            "task_source": [t[5] for t in tasks],
            "warnings": list(trace.stats.warnings),
            "dropped": trace.stats.dropped,
            "lost": trace.stats.lost,
            "ops": trace.stats.ops,
        }
        if self.counters:
            out |= worker_counters(trace, cursor[2] if len(cursor) > 2 else 0, perf)
            out["cursor"] = (span_cursor, task_cursor, out["counter_cursor"])
        if stop:
            memory = trace.memory_table()
            memory["t_ns"] = memory["t_ns"] - perf
            out["memory"] = memory
        return out


def _note_others(trace: Trace) -> None:
    """Say so in the worker's warnings when ``others`` was asked for but no other library's work could be seen: CUPTI
    starts with the trace only if a CUDA library was loaded by then (else at the workbench's own first CUDA op)."""
    cupti = trace.cupti_info
    if not trace.others or cupti["taken"]:  # a CUPTI handed to another client says so itself
        return
    if not cupti["tried"]:
        trace.warn_once(
            "others=True, but no CUDA library (cupy, torch, cuda.core ...) was loaded in this worker when its trace "
            "started and it opened no workbench CUDA device: other libraries' CUDA work was not recorded (import the "
            "library in every worker first, e.g. client.run(importlib.import_module, 'cupy'))"
        )
    elif not cupti["running"]:
        reason = cupti["reason"] or "unknown reason"
        trace.warn_once(
            f"others=True, but CUPTI did not start in this worker ({reason}): other libraries' CUDA work "
            "was not recorded"
        )


async def collect(name: str, cursors: Mapping[str, tuple[int, int]], stop: bool, dask_worker: Any = None) -> Any:
    """``client.run`` target: the session's new spans and tasks on this worker (None where it has no such session).
    The work runs in a thread: waiting for the last spans must not hold the worker's event loop."""
    plugin = dask_worker.plugins.get(name)
    if not isinstance(plugin, TracePlugin) or plugin.trace is None:
        return None
    cursor = tuple(cursors.get(dask_worker.address, (0, 0)))
    return await asyncio.get_running_loop().run_in_executor(None, plugin.collect, cursor, stop)
