"""Copies between pageable host memory and a device, staged through pinned chunks that several threads fill or empty.

The driver's own pageable copy goes through one thread and a small bounce buffer (CuPy's ``ndarray.set`` 8.6 GB/s
from pageable memory on an H200 host, against 55 GB/s pinned). Here each chunk is one task of a thread pool
(``np.copyto`` releases the GIL), so that several chunks are copied on the host at once while earlier ones travel
over PCIe: the calling thread only orders the DMA of each chunk as its task ends, and waits for a pinned slot's
previous DMA before a task reuses it.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

CHUNK = 4 << 20
#: Host copies in flight at once: half the cores this process may use, 2 to 8 (one thread cannot fill PCIe from
#: pageable memory; eight copy faster than an H200's link takes them).
THREADS = max(2, min(8, len(os.sched_getaffinity(0)) // 2 if hasattr(os, "sched_getaffinity") else 4))
SLOTS = THREADS + 2  # two more than in flight: a slot's DMA has as a rule ended when a task needs it again

Copy = Callable[[int, int, int, Any], Any]  # (dst, src, nbytes, stream): an async memcpy enqueued on stream


class Stager:
    """The pinned slots and threads of one device, made on first use; one staged copy at a time (``lock``)."""

    def __init__(self, alloc_pinned: Callable[[int], Any], new_event: Callable[[], Any]) -> None:
        self._alloc_pinned, self._new_event = alloc_pinned, new_event
        self.lock = threading.Lock()
        self._slots: list[np.ndarray] = []
        self._events: list[Any] = []  # per slot: the event recorded after its last DMA (None: never used)
        self._pool: ThreadPoolExecutor | None = None

    def _ready(self) -> ThreadPoolExecutor:
        if self._pool is None:
            for _ in range(SLOTS):
                self._slots.append(np.frombuffer(self._alloc_pinned(CHUNK), dtype=np.uint8, count=CHUNK))
                self._events.append(None)
            self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="gpuworkbench-stage")
        return self._pool

    def _dma(self, i: int, copy: Copy, dst: int, src: int, n: int, stream: Any) -> None:
        """Enqueue one chunk's DMA on ``stream`` and mark slot ``i`` busy until it ends."""
        copy(dst, src, n, stream)
        event = self._events[i] or self._new_event()
        event.record(stream)
        self._events[i] = event

    def _free(self, i: int) -> np.ndarray:
        """Slot ``i``, once its last DMA has ended."""
        event = self._events[i]
        if event is not None:
            event.synchronize()
        return self._slots[i]

    def h2d(self, copy: Copy, dst_ptr: int, src: np.ndarray, stream: Any) -> None:
        """Returns once every chunk is staged (as the driver's pageable copy does); the DMAs run on ``stream``."""
        flat = src.reshape(-1).view(np.uint8)
        total = flat.nbytes
        with self.lock:
            pool = self._ready()
            chunks = iter(enumerate(range(0, total, CHUNK)))
            pending: deque[tuple[Future, int, int, int]] = deque()

            def fill() -> None:
                nxt = next(chunks, None)
                if nxt is not None:
                    k, pos = nxt
                    i, n = k % SLOTS, min(CHUNK, total - pos)
                    slot = self._free(i)
                    pending.append((pool.submit(np.copyto, slot[:n], flat[pos : pos + n]), i, pos, n))

            for _ in range(THREADS):
                fill()
            while pending:
                task, i, pos, n = pending.popleft()
                task.result()
                self._dma(i, copy, dst_ptr + pos, self._slots[i].ctypes.data, n, stream)
                fill()

    def d2h(self, copy: Copy, dst: np.ndarray, src_ptr: int, stream: Any) -> None:
        """Blocks until the data is in ``dst`` (pageable memory cannot be written by the device directly)."""
        flat = dst.reshape(-1).view(np.uint8)
        total = flat.nbytes
        with self.lock:
            pool = self._ready()
            dmas: deque[tuple[int, int, int]] = deque()  # (slot, pos, n) whose DMA is enqueued
            tasks: dict[int, Future] = {}  # slot -> its copy out, still running
            for k, pos in enumerate(range(0, total, CHUNK)):
                i, n = k % SLOTS, min(CHUNK, total - pos)
                if len(dmas) == SLOTS - THREADS:  # keep THREADS slots for the host copies: hand the oldest to one
                    self._empty(pool, flat, tasks, *dmas.popleft())
                if i in tasks:
                    tasks.pop(i).result()  # this slot's copy out has ended: its bytes are in ``dst``
                self._dma(i, copy, self._slots[i].ctypes.data, src_ptr + pos, n, stream)
                dmas.append((i, pos, n))
            while dmas:
                self._empty(pool, flat, tasks, *dmas.popleft())
            for task in tasks.values():
                task.result()

    def _empty(
        self, pool: ThreadPoolExecutor, flat: np.ndarray, tasks: dict[int, Future], i: int, pos: int, n: int
    ) -> None:
        """Hand slot ``i`` to a thread that copies it out, once its DMA has ended."""
        slot = self._free(i)
        tasks[i] = pool.submit(np.copyto, flat[pos : pos + n], slot[:n])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
