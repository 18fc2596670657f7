"""Submissions to a WebGPU device's one queue and their completions: each op is bracketed by timestamp queries into a
pooled fence, and is done once the buffer-map promises of its read-backs settle (polled, never blocking)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from .adapters import load_wgpu


def _settled(promise: Any) -> bool:
    # wgpu-py's promises have no public non-blocking "settled?"; its poll thread moves _state off "pending".
    return promise._state != "pending"  # other library: wgpu-py's own attribute


def _map_read(buffer: Any) -> Any:
    """Start mapping ``buffer`` for reading; the promise settles once the submission that filled it is done."""
    try:  # wgpu-py's plain READ first submits an empty command buffer (costly); our buffers were just written
        return buffer.map_async("READ_NOSYNC")
    except (ValueError, KeyError, TypeError):  # a wgpu-py without that mode
        return buffer.map_async(load_wgpu().MapMode.READ)


def _timestamp_period(queue: Any) -> float:
    """Nanoseconds per timestamp tick; wgpu-py does not expose it, so ask wgpu-native (1.0 where that fails)."""
    try:
        from wgpu.backends.wgpu_native._api import libf

        return float(libf.wgpuQueueGetTimestampPeriod(queue._internal)) or 1.0  # other library: wgpu-native's handle
    except Exception:  # noqa: BLE001 - another wgpu-py backend or version: WebGPU's own unit is the nanosecond
        return 1.0


class _Fence:
    """Two timestamp queries and a 16-byte read-back; mapping the read-back completes when its submission has."""

    def __init__(self, dev: Any, timestamps: bool) -> None:
        usage = load_wgpu().BufferUsage
        self.queries = dev.create_query_set(type="timestamp", count=2) if timestamps else None
        self.resolved = dev.create_buffer(size=16, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
        self.readback = dev.create_buffer(size=16, usage=usage.MAP_READ | usage.COPY_DST)


class QueueCompletion:
    """One submission: done once its map promises settle; then read-back data and timestamps are collected.
    ``owner`` is the device's ``Submitter`` that made it."""

    def __init__(self, owner: Submitter, stream: QueueStream, fence: _Fence, timed: bool, staging: Any, dst: Any,
                 skip: int) -> None:  # fmt: skip
        self.owner, self._stream, self._fence, self._timed = owner, stream, fence, timed
        self._staging, self._dst, self._skip = staging, dst, skip
        self._promises = [_map_read(b) for b in (fence.readback, staging) if b is not None]
        self._submitted = time.perf_counter_ns()
        self._times: tuple[int, int] | None = None
        self._finished = False
        self.error: BaseException | None = None

    def settled(self) -> bool:
        return all(_settled(p) for p in self._promises)

    def done(self) -> bool:
        if not self._finished and self.settled():
            self._stream.collect(self, block=False)
        return self._finished

    def wait(self) -> None:
        self._stream.collect(self, block=True)

    def times_ns(self) -> tuple[int, int] | None:
        return self._times if self._finished else None

    def _finish(self) -> None:
        """Copy read-back data to the host, read the timestamps, return the fence; called in stream order."""
        fence = self._fence
        try:
            for promise in self._promises:
                promise.sync_wait()  # returns at once when settled
            if self._staging is not None:
                data = np.frombuffer(self._staging.read_mapped(copy=False), np.uint8)
                self._dst.reshape(-1).view(np.uint8)[:] = data[self._skip : self._skip + self._dst.nbytes]
            if self._timed and fence.queries is not None:
                start, end = (int(t) for t in np.frombuffer(fence.readback.read_mapped(), np.uint64))
                self._times = int(start * self.owner.period), int(end * self.owner.period)
            elif self._timed:  # no timestamp-query feature: from submission to first sight of completion, host clock
                self._times = self._submitted, time.perf_counter_ns()
            fence.readback.unmap()
            self.owner.fences.append(fence)
        except Exception as exc:  # noqa: BLE001 - a failed map is the op's failure, reported by the front end
            self.error = exc
        finally:
            if self._staging is not None:
                self._staging.destroy()
            self._finished, self._dst = True, None


class QueueStream:
    """A stream: its submissions to the device's one queue, collected strictly in order.

    Collecting op k also collects every earlier op of the stream (the queue ran them first), so a host array filled
    by an earlier read-back is ready whenever a later op on the stream reports done, as on every other backend."""

    def __init__(self) -> None:
        self.pending: deque[QueueCompletion] = deque()
        self._lock = threading.Lock()

    def collect(self, upto: QueueCompletion | None, block: bool) -> None:
        """Finish ops in order through ``upto`` (all when None); without ``block``, stop at one not yet settled."""
        if not self._lock.acquire(blocking=block):
            return  # another thread is collecting this stream; done() answers "not yet" rather than wait
        try:
            while self.pending and not (upto is not None and upto._finished):
                if not block and not self.pending[0].settled():
                    return
                self.pending[0]._finish()
                self.pending.popleft()
        finally:
            self._lock.release()


class Submitter:
    """One device's submissions to its queue, each bracketed by timestamps (where the adapter has them) and ended by
    a fence read-back; ``lock`` is the device's, which keeps each op's submissions together."""

    def __init__(self, dev: Any, timestamps: bool, in_encoders: bool, lock: threading.Lock) -> None:
        self._dev, self._queue, self._lock = dev, dev.queue, lock
        self._timestamps, self._in_encoders = timestamps, in_encoders
        self.period = _timestamp_period(self._queue)
        self.fences: list[_Fence] = []

    def _stamp(self, encoder: Any, fence: _Fence, index: int) -> None:
        if self._in_encoders:
            from wgpu.backends.wgpu_native.extras import write_timestamp

            write_timestamp(encoder, fence.queries, index)
        else:  # an empty compute pass writes the timestamp instead
            encoder.begin_compute_pass(
                timestamp_writes={"query_set": fence.queries, "beginning_of_pass_write_index": index}
            ).end()

    def submit(
        self, stream: QueueStream, encode: Any, timed: bool, *, kernel: bool = False, before: Any = None,
        staging: Any = None, dst: Any = None, skip: int = 0,
    ) -> QueueCompletion:  # fmt: skip
        """Submit ``encode(encoder, timestamp_writes)`` (after ``before()``, a queue write) bracketed by timestamps."""
        stream.collect(None, block=False)
        stamps = timed and self._timestamps
        with self._lock:
            fence = self.fences.pop() if self.fences else _Fence(self._dev, self._timestamps)
            if stamps and before is not None:  # queue writes run at the start of the next submit: stamp before it
                encoder = self._dev.create_command_encoder()
                self._stamp(encoder, fence, 0)
                self._queue.submit([encoder.finish()])
            if before is not None:
                before()
            encoder = self._dev.create_command_encoder()
            if stamps and before is None and not kernel:
                self._stamp(encoder, fence, 0)
            pass_stamps = {"query_set": fence.queries, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
            encode(encoder, pass_stamps if stamps and kernel else None)
            if stamps and not kernel:
                self._stamp(encoder, fence, 1)
            if stamps:
                encoder.resolve_query_set(fence.queries, 0, 2, fence.resolved, 0)
            encoder.copy_buffer_to_buffer(fence.resolved, 0, fence.readback, 0, 16)
            self._queue.submit([encoder.finish()])
            completion = QueueCompletion(self, stream, fence, timed, staging, dst, skip)
            stream.pending.append(completion)
        return completion
