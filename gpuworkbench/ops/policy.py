"""Where an op runs: a policy picks the stream each op starts on.

``RoundRobin`` and ``LeastPending`` pick among the device's op streams by a ``StreamAssignment``, the rule a
``StreamPool`` hands its streams out by; ``OnStream`` always gives one stream. Any object with ``pick(device)`` will do.
"""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..streams import Stream, StreamAssignment

if TYPE_CHECKING:
    from ..device import Device


class Policy(ABC):
    """Picks the stream each op starts on. Write your own by implementing ``pick``."""

    @abstractmethod
    def pick(self, device: Device) -> Stream:
        """The stream for the next op on ``device``; called while enqueueing, so it must not block."""


_STREAMS: dict[int, tuple[Device, list[Stream]]] = {}
_STREAMS_LOCK = threading.Lock()


def op_streams(device: Device, n: int) -> list[Stream]:
    """The device's first ``n`` op streams ("ops-0", "ops-1", ...), created on first use and shared by all policies.

    Shared so that making policies does not make streams: ``RoundRobin(4)`` and ``LeastPending(4)`` use the same four.
    """
    with _STREAMS_LOCK:
        owner, streams = _STREAMS.get(id(device), (None, []))
        streams = [s for s in streams if not s.closed] if owner is device else []
        while len(streams) < n:
            streams.append(device.create_stream(f"ops-{len(streams)}"))
        _STREAMS[id(device)] = (device, streams)
        return streams[:n]


class Assigned(Policy):
    """The device's op streams ops-0 .. ops-(n-1), one picked per op by ``assignment`` (a ``StreamAssignment``, as a
    ``StreamPool`` takes): ``RoundRobin`` and ``LeastPending`` are this policy with their rule."""

    def __init__(self, n: int, assignment: StreamAssignment) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgument(f"a policy needs at least one stream, got n={n!r}")
        if not isinstance(assignment, StreamAssignment):
            raise InvalidArgument(f"assignment must be a StreamAssignment, not {assignment!r}")
        self.n, self.assignment = n, assignment
        self._turn = itertools.count()

    def pick(self, device: Device) -> Stream:
        streams = op_streams(device, self.n)
        return streams[self.assignment.choose(next(self._turn), lambda: [s.pending for s in streams], self.n)]

    def __repr__(self) -> str:
        return f"Assigned({self.n}, {self.assignment})"


class RoundRobin(Assigned):
    """Streams ops-0 .. ops-(n-1) in turn (``StreamAssignment.ROUND_ROBIN``): independent ops spread evenly. The
    default, with n = 4."""

    def __init__(self, n: int = 4) -> None:
        super().__init__(n, StreamAssignment.ROUND_ROBIN)

    def __repr__(self) -> str:
        return f"RoundRobin({self.n})"


class LeastPending(Assigned):
    """The stream of ops-0 .. ops-(n-1) with the fewest unfinished ops, the lowest index on a tie
    (``StreamAssignment.LEAST_PENDING``)."""

    def __init__(self, n: int = 4) -> None:
        super().__init__(n, StreamAssignment.LEAST_PENDING)

    def __repr__(self) -> str:
        return f"LeastPending({self.n})"


class OnStream(Policy):
    """Always ``stream``: every op runs there, one after another."""

    def __init__(self, stream: Stream) -> None:
        if not isinstance(stream, Stream):
            raise InvalidArgument(f"OnStream takes a gpuworkbench Stream, not {type(stream).__name__}")
        self.stream = stream

    def pick(self, device: Device) -> Stream:
        if self.stream.device is not device:
            raise InvalidArgument(f"OnStream's stream {self.stream.label!r} is on {self.stream.device.spec}, "
                                  f"the op on {device.spec}")  # fmt: skip
        return self.stream

    def __repr__(self) -> str:
        return f"OnStream({self.stream.label!r})"


DEFAULT_POLICY: Policy = RoundRobin(4)


def check_policy(policy: Any) -> Policy:
    """``policy`` if it can pick streams (has ``pick(device)``); InvalidArgument otherwise."""
    if not callable(getattr(policy, "pick", None)):
        raise InvalidArgument(f"a policy needs a pick(device) -> Stream method; {policy!r} has none")
    return policy
