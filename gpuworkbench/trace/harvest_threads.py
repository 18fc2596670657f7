"""Reusable daemon threads for traces' harvest loops: starting an OS thread cost a fresh trace 0.3–0.4 ms of its
start on an H200 host (benchmarks/bench_trace_start.py), where handing a loop to an idle thread costs a queue put.

``run(fn, name)`` returns a handle with a Thread's ``join(timeout)`` and ``is_alive()``, true while ``fn`` runs.
A thread that finds no work for ``IDLE_S`` ends; at most ``MAX_IDLE`` wait at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_S = 60.0
MAX_IDLE = 4


class Run:
    """One run of a loop on a harvest thread."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class _Worker:
    def __init__(self, pool: HarvestThreads) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Run, str]] = queue.SimpleQueue()
        self._pool = pool
        self.thread = threading.Thread(target=self._loop, name="gpuworkbench-trace", daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                fn, run, name = self.jobs.get(timeout=IDLE_S)
            except queue.Empty:
                if self._pool._retire(self):
                    return
                continue
            self.thread.name = name
            try:
                fn()
            finally:
                self.thread.name = "gpuworkbench-trace (idle)"
                done = run._done
                # the loop is a trace's bound method: held while this thread idles, it kept the trace alive, to be
                # freed here when the next trace's loop arrived, beside that trace's first ops; dropped before a
                # ``join`` returns
                fn = run = None  # type: ignore[assignment]
                done.set()
            if not self._pool._rest(self):
                return


class HarvestThreads:
    """The pool: idle workers wait for a loop to run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def run(self, fn: Callable[[], Any], name: str) -> Run:
        handle = Run()
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(self)
            worker.jobs.put((fn, handle, name))
            worker.thread.start()
        else:
            worker.jobs.put((fn, handle, name))
        return handle

    def warm(self) -> None:
        """Start one idle thread now if none waits (``%load_ext``: the first trace then starts none)."""
        with self._lock:
            if self._idle:
                return
            worker = _Worker(self)
            self._idle.append(worker)
        worker.thread.start()

    def _rest(self, worker: _Worker) -> bool:
        """Back to the idle list after a run; False (the thread ends) when enough wait already."""
        with self._lock:
            if len(self._idle) >= MAX_IDLE:
                return False
            self._idle.append(worker)
            return True

    def _retire(self, worker: _Worker) -> bool:
        """After IDLE_S without work: True (the thread ends) if it is still idle, so no job can reach it."""
        with self._lock:
            if worker in self._idle and worker.jobs.empty():
                self._idle.remove(worker)
                return True
            return False


THREADS = HarvestThreads()
