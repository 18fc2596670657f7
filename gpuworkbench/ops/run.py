"""One execution of an op tree: the streams it uses, the buffers it allocates, and the loop that drives its steps.

An op's steps are a generator that yields what the host must wait for (an Event, or a shared op another consumer is
running); ``drive`` blocks on each, ``drive_async`` awaits each.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..buffer import Buffer
from ..errors import InvalidArgument
from ..streams import Event, Stream
from .policy import Policy

if TYPE_CHECKING:
    from ..device import Device
    from ..graphs import Graph


class Out(NamedTuple):
    """What a step produced: its value, the stream it is ordered on, and the events after which host data is ready."""

    value: Any
    stream: Stream
    ready: tuple[Event, ...] = ()


class Run:
    """One execution of an op tree: its device and policy, the streams it used and the buffers it allocated."""

    def __init__(self, device: Device, policy: Policy, graph: Graph | None = None) -> None:
        self.device, self.policy, self.graph = device, policy, graph
        self.temps: list[Buffer] = []
        self.protected: set[int] = set()  # ids of temps a shared op keeps
        self.streams: dict[int, Stream] = {}
        self.shared: dict[int, Out] = {}  # shared ops inside a graph capture: once per capture, owned by the graph

    def pick(self) -> Stream:
        """The stream for the next step: the capture's stream while capturing a graph, else the policy's pick."""
        if self.graph is not None:  # a capture records one stream
            return self.use(self.graph.stream)
        stream = self.policy.pick(self.device)
        if not isinstance(stream, Stream) or stream.device is not self.device:
            raise InvalidArgument(f"policy {self.policy!r} returned {stream!r}, not a stream of {self.device.spec}")
        return self.use(stream)

    def use(self, stream: Stream) -> Stream:
        """Note ``stream`` as one the run enqueued on (the run ends once all of them are done)."""
        if stream.id not in self.streams:
            self.streams[stream.id] = stream
        return stream

    def follow(self, stream: Stream, prev: Out | None) -> None:
        """Order ``stream`` after the work that produced ``prev`` (a device-side event wait; nothing blocks)."""
        if prev is not None and prev.stream is not stream:
            stream.wait_event(prev.stream.record())

    def alloc(self, n: int, dtype: Any) -> Buffer:
        """A buffer of the run's own, freed when the run ends unless it is part of the result."""
        buf = Buffer.allocate(self.device, n, dtype)
        self.temps.append(buf)
        return buf

    def host_array(self, n: int, dtype: Any) -> np.ndarray:
        """A host array to download into: page-locked where the backend has it, so the copy is truly asynchronous."""
        if self.device.caps.pinned_memory:
            return self.device.empty_pinned(n, dtype)
        return np.empty(n, dtype)

    def release(self, result: Any) -> None:
        """Free every buffer this run allocated except those in ``result`` and those shared ops keep (blocks only
        for ops still using them)."""
        keep = {id(b) for b in buffers_in(result)} | self.protected
        temps, self.temps = self.temps, []
        for buf in temps:
            if id(buf) not in keep:
                buf.free()


def buffers_in(value: Any) -> Iterator[Buffer]:
    """Every Buffer inside ``value`` (tuples, lists and dicts are searched)."""
    if isinstance(value, Buffer):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from buffers_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from buffers_in(v)


def drive(steps: Generator[Any, None, Out]) -> Out:
    """Run a step generator, blocking the host on each thing it waits for."""
    try:
        waiting = next(steps)
        while True:
            waiting.wait()
            waiting = steps.send(None)
    except StopIteration as stop:
        return stop.value


async def drive_async(steps: Generator[Any, None, Out]) -> Out:
    """Run a step generator, awaiting (not blocking on) each thing it waits for."""
    try:
        waiting = next(steps)
        while True:
            await waiting
            waiting = steps.send(None)
    except StopIteration as stop:
        return stop.value


def check_host(value: Any, what: str) -> np.ndarray:
    """``value`` as a flat contiguous NumPy array; InvalidArgument naming ``what`` if it is not an array."""
    if not isinstance(value, np.ndarray):
        raise InvalidArgument(f"{what} takes a NumPy array, not {type(value).__name__}")
    return np.ascontiguousarray(value).reshape(-1)


def check_buffer(value: Any, what: str) -> Buffer:
    """``value`` if it is a Buffer; InvalidArgument naming ``what`` otherwise."""
    if not isinstance(value, Buffer):
        raise InvalidArgument(f"{what} needs a Buffer, got {type(value).__name__}; upload host data first")
    return value
