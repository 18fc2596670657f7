"""Graphs: work captured once on one stream, replayed with one call, with new inputs copied in between replays.

``with stream.capture() as g:`` records the ops enqueued on ``stream`` inside the block without running them (as
``op.graph_on(stream)`` does for a lazy op); ``g.launch()`` replays them. Every backend first records the backend
calls. On CUDA (``Caps.graphs == "native"``) those calls are then re-issued under stream capture into a real CUDA graph,
so that the driver captures enqueues only (no allocation, compile, query or timing event), and a replay is one
``cudaGraphLaunch``. Elsewhere (``"recorded"``) the graph re-issues the calls at each launch: the same results at the
usual cost per op. Buffers and host arrays used in a capture must outlive the graph: replays use those same ones.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dispatch
from .errors import GpuError, InvalidArgument
from .streams import Event, Stream

if TYPE_CHECKING:
    from .buffer import Buffer

_IDS = itertools.count(1)


class _Captured:
    """The completion of an op recorded into a graph: done once the graph's latest launch is (at once before any).

    Buffers keep it as their last op on the capture stream, so later work on them waits for the replays."""

    __slots__ = ("graph",)
    error = None

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def done(self) -> bool:
        last = self.graph._last
        return last is None or last.completion.done()

    def wait(self) -> None:
        last = self.graph._last
        if last is not None:
            last.completion.wait()

    def times_ns(self) -> tuple[int, int] | None:
        return None


class Graph:
    """Work captured on one stream, replayed by ``launch()``. Make one with ``stream.capture()`` or ``op.graph_on``.

    ``inputs`` are the host arrays the captured uploads read (``update`` refills them), ``outputs`` the host arrays the
    captured downloads write, ``output`` the captured op's result (for ``graph_on``).
    """

    def __init__(self, stream: Stream, name: str | None = None) -> None:
        if not isinstance(stream, Stream):
            raise InvalidArgument(f"a graph is captured on a gpuworkbench Stream, not {type(stream).__name__}")
        self.stream, self.device = stream, stream.device
        self.name = name or f"graph-{next(_IDS)}"
        self.kind = "native" if self.device.caps.graphs == "native" else "recorded"
        self.inputs: list[np.ndarray] = []
        self.outputs: list[np.ndarray] = []
        self.output: Any = None
        self.ops = 0  # ops captured
        self.launches = 0
        self._calls: list[tuple[str, int, str, int, Any, Any]] = []  # what _dispatch.enqueue was given, in order
        self._keep: list[Any] = []  # native: host arrays and kernel arguments the driver's graph points into
        self._native: Any = None
        self._kinds: set[str] = set()
        self._nbytes = 0
        self._owned: list[Buffer] = []
        self._last: Event | None = None
        self._done = _Captured(self)
        self._state = "new"
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ capture
    @contextmanager
    def capturing(self) -> Iterator[Graph]:
        """Divert the ops enqueued on the stream in the ``with`` block into this graph; none of them runs.

        A native graph is captured by the driver on exit, by re-issuing the recorded enqueue calls and nothing else:
        allocations, compiles and driver queries all happened before, outside the stream capture."""
        stream = self.stream
        stream.check_open()
        if self._state != "new":
            raise InvalidArgument(f"graph {self.name!r} was captured already; capture a new one")
        if stream.capturing is not None:
            raise InvalidArgument(f"stream {stream.label!r} is capturing graph {stream.capturing.name!r} already")
        stream.capturing = self
        self._state = "capturing"
        try:
            yield self
        finally:
            stream.capturing = None
            self._state = "failed"
        if self.kind == "native":
            self._native = self._capture_native()
            self._keep, self._calls = [keep for *_, keep in self._calls], []  # the driver's graph points into these
        self._state = "ready"

    def _capture_native(self) -> Any:
        backend, raw = self.device.backend_device, self.stream.raw
        backend.begin_capture(raw)
        try:
            for *_, call, _ in self._calls:
                call(False)  # untimed: the backend records no events while the stream captures
        except BaseException as exc:
            try:
                backend.end_capture(raw)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise GpuError(f"CUDA stream capture of graph {self.name!r} failed while enqueueing: {exc}") from exc
        try:
            return backend.end_capture(raw)
        except Exception as exc:  # noqa: BLE001 - the driver's reason, in the user's terms
            raise GpuError(f"CUDA stream capture of graph {self.name!r} failed: {exc}") from exc

    def add(self, stream: Stream, kind: str, nbytes: int, name: str, pinned: int, call: Any, keep: Any) -> Any:
        """Take one op enqueued on the capturing stream (called by ``_dispatch.enqueue``) instead of running it."""
        if self.kind == "native" and kind in ("h2d", "d2h") and pinned == 0:
            raise InvalidArgument(
                f"a CUDA graph copies page-locked host memory only; this {kind} copy uses a pageable array: "
                "allocate it with device.empty_pinned"
            )
        self._calls.append((kind, nbytes, name, pinned, call, keep))
        if kind == "h2d":
            self.inputs.append(keep)
        elif kind == "d2h":
            self.outputs.append(keep)
        self._kinds.add(kind)
        self._nbytes += nbytes
        self.ops += 1
        return self._done

    def own(self, output: Any, buffers: list[Buffer]) -> None:
        """Keep the captured op's result and free ``buffers`` (what it allocated) when the graph is closed."""
        self.output = output
        self._owned.extend(buffers)

    # ------------------------------------------------------------------ replay
    def launch(self, stream: Stream | None = None) -> Event:
        """Replay the captured work on ``stream`` (default: the capture stream), after the work already there.

        Non-blocking; returns an Event done when the replay is. Native graphs are one driver call and one trace span
        (``graph NAME``); recorded ones re-issue each op, traced as ``NAME/op``."""
        self._check_ready()
        s = self.stream if stream is None else stream
        if not isinstance(s, Stream) or s.device is not self.device:
            raise InvalidArgument(f"graph {self.name!r} launches on a stream of {self.device.spec}, got {s!r}")
        with self._lock:
            if self.kind == "native":
                backend, native = self.device.backend_device, self._native
                event = s.enqueue(
                    self._span_kind(),
                    self._nbytes,
                    f"graph {self.name}",
                    -1,
                    lambda timed: backend.launch_graph(native, s.raw, timed),
                    keep=self,
                    many=True,
                )
            else:
                event = self._replay(s)
            self._last = event
            self.launches += 1
        return event

    def _replay(self, stream: Stream) -> Event:
        home = self.stream  # the recorded calls enqueue on the stream they were captured on
        if stream is not home:
            home.wait_event(stream.record())
        completion = None
        for kind, nbytes, name, pinned, call, keep in self._calls:
            completion = _dispatch.enqueue(home, kind, nbytes, f"{self.name}/{name}", pinned, call, keep)
        event = home.record() if completion is None else Event(completion, home)
        if stream is not home:
            stream.wait_event(event)  # later work on ``stream`` follows the replay
        return event  # the home stream's: waiting on it also completes its downloads' host side (WebGPU)

    def _span_kind(self) -> str:
        return next(iter(self._kinds)) if len(self._kinds) == 1 else "kernel"

    def sync(self, stream: Stream | None = None) -> Any:
        """Launch, block until the replay has finished, and return a copy of ``output`` (host arrays copied, since
        the next launch overwrites them)."""
        self.launch(stream).wait()
        return _snapshot(self.output)

    def update(self, *new: Any) -> None:
        """Copy new host data into ``inputs`` (in capture order; None keeps one) for the next launch.

        ``update(op)`` takes the arrays ``op`` uploads, for an op built like the captured one. Blocks until the last
        launch has finished, since its uploads read these arrays."""
        self._check_ready()
        inputs_of = getattr(new[0], "host_inputs", None) if len(new) == 1 else None  # an op (gw.ops.Op)
        arrays = inputs_of() if callable(inputs_of) else list(new)
        if len(arrays) != len(self.inputs):
            raise InvalidArgument(f"graph {self.name!r} has {len(self.inputs)} inputs, update got {len(arrays)}")
        pairs = []
        for i, (dst, src) in enumerate(zip(self.inputs, arrays)):
            if src is None:
                continue
            src = np.asarray(src)
            if src.dtype != dst.dtype or src.size != dst.size:
                raise InvalidArgument(
                    f"graph {self.name!r} input {i} holds {dst.size} {dst.dtype}, update gave {src.size} {src.dtype}"
                )
            pairs.append((dst, src))
        if self._last is not None:
            self._last.wait()
        for dst, src in pairs:
            np.copyto(dst.reshape(-1), src.reshape(-1))

    def _check_ready(self) -> None:
        if self._state != "ready":
            why = {"new": "has not been captured", "capturing": "is still capturing", "closed": "is closed"}
            raise InvalidArgument(f"graph {self.name!r} {why.get(self._state, 'failed to capture')}")

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Wait for the last launch, then free what the graph owns (the buffers its op allocated). Idempotent."""
        if self._state == "closed":
            return
        if self._last is not None:
            self._last.wait()
        owned, self._owned = self._owned, []
        for buf in owned:
            buf.free()
        self._native, self._calls, self._keep, self._state = None, [], [], "closed"

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Graph {self.name!r} {self.kind}, {self.ops} ops, {self.launches} launches, {self._state}>"


def _snapshot(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return np.array(value)
    if isinstance(value, tuple):
        return tuple(_snapshot(v) for v in value)
    return value


@contextmanager
def capture(stream: Stream, name: str | None = None) -> Iterator[Graph]:
    """``with capture(stream) as g:`` (or ``stream.capture()``): record the block's ops on ``stream`` into ``g``."""
    graph = Graph(stream, name)
    with graph.capturing():
        yield graph


__all__ = ["Graph", "capture"]
