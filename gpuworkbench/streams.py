"""Streams, events, stream pools and fixed-depth stream sets.

Every stream is non-blocking: it never waits for another stream unless told to with ``wait_event``. Methods say
whether they block the host.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Any

from . import _dispatch
from .errors import GpuError, InvalidArgument

if TYPE_CHECKING:
    from .device import Device

#: A stream's queue of ops in flight is pruned when its op count is a multiple of PRUNE_MASK + 1. A prune asks the
#: newest op's completion, and on CUDA that records and queries an event, which slows the launches around it: pruned
#: every 64 ops, the backend's prepared launch ran 0.5–1.7 µs a launch slower with the stream's tracking than without
#: (H200, benchmarks/probes/stream_prune.py). The queue holds each op's completion and what it keeps alive (a kernel's
#: converted arguments): 1 024 of them are a few hundred kilobytes.
PRUNE_MASK = 1023
#: Async copies keep their host array alive until done: a queue holding arrays of KEEP_LARGE bytes or more is pruned
#: every 64 ops, so that a loop over fresh large arrays does not keep a thousand of them.
KEEP_LARGE = 1 << 18


class Event:
    """The completion of one enqueued op (or a marker). ``done`` never blocks; ``wait()`` and ``await`` do."""

    __slots__ = ("completion", "stream", "_keep")

    def __init__(self, completion: Any, stream: Stream, keep: Any = None) -> None:
        self.completion, self.stream, self._keep = completion, stream, keep

    @property
    def done(self) -> bool:
        """True once the op has finished. Non-blocking."""
        finished = self.completion.done()
        if finished:
            self._raise_if_failed()
        return finished

    def wait(self, timeout_s: float | None = None) -> None:
        """Block the host until the op has finished (raises GpuError if the op failed)."""
        if timeout_s is None:
            self.completion.wait()
        else:
            _wait_with_timeout(self.completion, timeout_s)
        self._keep = None
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        error = getattr(self.completion, "error", None)
        if error is not None:
            self.stream.forget(self.completion)  # reported here: the stream's synchronize() need not repeat it
            raise GpuError(f"an op on stream {self.stream.label!r} failed: {error!r}") from error

    def __await__(self):  # noqa: ANN204 - generator protocol
        """Await completion from asyncio without blocking the event loop (polls every 0.2 ms, backing off to 5 ms)."""
        delay = 0.0002
        while not self.completion.done():
            yield from asyncio.sleep(delay).__await__()
            delay = min(delay * 2, 0.005)
        self._keep = None
        self._raise_if_failed()

    def __repr__(self) -> str:
        return f"<Event on {self.stream.label!r} {'done' if self.completion.done() else 'pending'}>"


def _wait_with_timeout(completion: Any, timeout_s: float) -> None:
    finished = threading.Event()
    threading.Thread(target=lambda: (completion.wait(), finished.set()), daemon=True).start()
    if not finished.wait(timeout_s):
        raise TimeoutError(f"op not finished after {timeout_s} s")


class Stream:
    """An in-order queue of device work. Create with ``device.create_stream(label)``."""

    def __init__(self, device: Device, label: str, stream_id: int) -> None:
        self.device, self.label, self.id = device, label, stream_id
        self.raw = device.backend_device.create_stream()
        self.inflight: deque[tuple[Any, Any]] = deque()
        self.appended = 0
        self._lock = threading.Lock()
        self.closed = False
        self.capturing: Any = None  # the Graph recording this stream's ops instead of running them (graphs.py)
        self.persistent: Any = None  # the PersistentKernel looping on this stream until stopped (persistent/)

    def track(self, completion: Any, keep: Any) -> None:
        # No lock on the launch path: deque.append is atomic, and everything else that changes the deque holds the
        # lock and removes only items it has looked at, from the left (or in place), never one appended meanwhile.
        self.inflight.append((completion, keep))
        self.appended += 1
        n = self.appended
        if n & 63 == 0 and (n & PRUNE_MASK == 0 or getattr(keep, "nbytes", 0) >= KEEP_LARGE):  # now and then
            self.prune_now()

    def prune_now(self) -> None:
        with self._lock:
            self._prune()

    def prune_if_free(self, finished: Any = None) -> None:
        """Prune unless someone holds the queue's lock now (a buffer freed by its finaliser, while this thread prunes,
        must not wait for itself). ``finished``: a completion the caller waited for; where it is the newest op's, every
        op is done, with no query."""
        if self._lock.acquire(blocking=False):
            try:
                self._prune(finished)
            finally:
                self._lock.release()

    def forget(self, completion: Any) -> None:
        with self._lock:
            for item in [item for item in self.inflight if item[0] is completion]:
                self.inflight.remove(item)

    def _prune(self, finished: Any = None) -> list[tuple[Any, Any]]:
        """Remove finished ops from the left and return them (the caller holds the lock)."""
        q = self.inflight
        n = len(q)
        if n and (q[n - 1][0] is finished or q[n - 1][0].done()):  # in order: the newest done means all are
            return [q.popleft() for _ in range(n)]
        done = []
        while q and q[0][0].done():
            done.append(q.popleft())
        return done

    @property
    def pending(self) -> int:
        """Ops enqueued on this stream that have not finished yet. Non-blocking."""
        with self._lock:
            self._prune()
            return len(self.inflight)

    def record(self) -> Event:
        """Enqueue a marker; the returned Event is done when all earlier work on this stream is. Non-blocking."""
        self.check_open()
        completion = self.device.backend_device.record(self.raw)
        self.inflight.append((completion, None))
        return Event(completion, self)

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for ``event`` on the device. The host does not block."""
        self.check_open()
        if not isinstance(event, Event):
            raise InvalidArgument(f"wait_event takes an Event, not {type(event).__name__}")
        if event.stream.device is not self.device:
            raise InvalidArgument(
                f"event from {event.stream.device.spec} cannot be waited on by a stream of {self.device.spec}"
            )
        if not event.completion.done():
            self.device.backend_device.wait_event(self.raw, event.completion)

    def synchronize(self) -> None:
        """Block the host until all work on this stream has finished (raises if any of it failed)."""
        self.check_open()
        if self.persistent is not None:
            raise InvalidArgument(
                f"stream {self.label!r} runs a persistent kernel until its stop(); synchronizing it would wait forever"
            )
        self.device.backend_device.synchronize_stream(self.raw)
        with self._lock:
            items = self._prune()  # all of them, but for ops another thread enqueued meanwhile
        for completion, _ in items:
            error = getattr(completion, "error", None)
            if error is not None:
                raise GpuError(f"an op on stream {self.label!r} failed: {error!r}") from error

    def capture(self, name: str | None = None) -> Any:
        """``with stream.capture() as g:`` records the ops enqueued on this stream in the block into Graph ``g``
        without running them; ``g.launch()`` replays them (see graphs.py). Nothing blocks."""
        from .graphs import capture

        return capture(self, name)

    def check_open(self) -> None:
        if self.closed:
            raise InvalidArgument(f"stream {self.label!r} is closed")

    def enqueue(
        self, kind: str, nbytes: int, name: str, pinned: int, call: Any, keep: Any = None, many: bool = False
    ) -> Event:
        self.check_open()
        completion = _dispatch.enqueue(self, kind, nbytes, name, pinned, call, keep, many)
        return Event(completion, self, keep)

    def close(self) -> None:
        """Wait for the stream's work, then release it (raising, once released, if an unreported op failed)."""
        if not self.closed:
            try:
                self.synchronize()  # raises for a failed op nobody waited on, after releasing the stream
            finally:
                self.device.backend_device.destroy_stream(self.raw)
                self.closed = True
                self.device.forget_stream(self)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.synchronize()

    def __repr__(self) -> str:
        return f"<Stream {self.id} {self.label!r} on {self.device.spec}, {self.pending} pending>"


class StreamAssignment(Enum):
    """How a stream is picked from several: in turn, or the one with the least outstanding work. A StreamPool picks
    by it, and so do the ops policies ``RoundRobin`` and ``LeastPending``."""

    ROUND_ROBIN = "round_robin"
    LEAST_PENDING = "least_pending"

    def choose(self, turn: int, loads: Callable[[], list[int]], n: int) -> int:
        """The index of the stream to use of ``n``: ``turn % n`` in turn, else the first with the least of ``loads()``
        (called only then: counting the ops pending asks the backend)."""
        if self is StreamAssignment.ROUND_ROBIN:
            return turn % n
        load = loads()
        return load.index(min(load))


class _StreamGroup:
    """Streams created together and released together (the common part of StreamPool and StreamSet)."""

    streams: list[Stream]
    label: str
    _closed = False

    def synchronize_all(self) -> None:
        """Block the host until every stream of the group is empty."""
        for s in self.streams:
            s.synchronize()

    def close(self) -> None:
        """Wait for the group's work and release its streams; using the group afterwards raises. Idempotent."""
        self._closed = True
        failure: BaseException | None = None
        for s in self.streams:
            try:
                s.close()
            except Exception as exc:  # noqa: BLE001 - release every stream, then report the first failure
                failure = failure or exc
        if failure is not None:
            raise failure

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"{type(self).__name__} {self.label!r} is closed")


class StreamPool(_StreamGroup):
    """A fixed set of streams handed out by a rule; ``acquire()`` is a guard whose lease ends on exit."""

    def __init__(
        self,
        device: Device,
        size: int,
        assignment: StreamAssignment = StreamAssignment.ROUND_ROBIN,
        label: str = "pool",
    ) -> None:
        if not isinstance(size, int) or size < 1:
            raise InvalidArgument(f"a stream pool needs at least one stream, got size={size!r}")
        if not isinstance(assignment, StreamAssignment):
            raise InvalidArgument(f"assignment must be a StreamAssignment, not {assignment!r}")
        self.device, self.assignment, self.label = device, assignment, label
        self.streams = [device.create_stream(f"{label}-{i}") for i in range(size)]
        self._leases = [0] * size
        self._next = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.streams)

    def load(self) -> list[int]:
        """Per stream: leases held now plus ops not yet finished (what LEAST_PENDING minimises)."""
        return [lease + s.pending for lease, s in zip(self._leases, self.streams)]

    def _pick(self) -> int:
        turn = self._next
        self._next = (turn + 1) % len(self.streams)
        return self.assignment.choose(turn, self.load, len(self.streams))

    def next(self) -> Stream:
        """The next stream by the pool's rule, without a lease."""
        self.check_open()
        with self._lock:
            return self.streams[self._pick()]

    @contextmanager
    def acquire(self) -> Iterator[Stream]:
        """Lease a stream by the pool's rule for the ``with`` block; its lease count drops on exit."""
        self.check_open()
        with self._lock:
            i = self._pick()
            self._leases[i] += 1
        try:
            yield self.streams[i]
        finally:
            with self._lock:
                self._leases[i] -= 1


class StreamSet(_StreamGroup):
    """``depth`` streams addressed by index modulo depth: ``get(i)`` is stream ``i % depth``."""

    def __init__(self, device: Device, depth: int, label: str = "set") -> None:
        if not isinstance(depth, int) or depth < 1:
            raise InvalidArgument(f"a stream set needs depth >= 1, got {depth!r}")
        self.device, self.depth, self.label = device, depth, label
        self.streams = [device.create_stream(f"{label}-{i}") for i in range(depth)]

    def get(self, i: int) -> Stream:
        """Stream ``i % depth``."""
        self.check_open()
        return self.streams[i % self.depth]

    def __len__(self) -> int:
        return self.depth

    def __iter__(self) -> Iterator[Stream]:
        return iter(self.streams)
