"""Lazy device ops: describe uploads, kernels and downloads now; run them later on streams a policy picks.

``op = gw.ops.upload(host).then(f).then(gw.ops.download())`` enqueues nothing. ``op.sync()`` runs it and blocks until
its result is ready, ``await op`` does the same without blocking the event loop, ``op.sync_on(stream)`` runs all of it
on one stream. ``then`` chains dependent work on one stream; ``zip`` puts independent ops on different streams and
joins them with events; ``map`` transforms a result on the host; ``shared`` makes an op that runs once for all its
consumers. Buffers an op allocates for itself are freed once it has finished; the buffers it returns are the caller's.
"""

from __future__ import annotations

import asyncio
import builtins
import itertools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .buffer import Buffer
from .errors import InvalidArgument
from .kernels import ElementwiseKernel, Kernel
from .streams import Event, Stream

if TYPE_CHECKING:
    from .device import Device
    from .graphs import Graph


class _Prev:
    """The placeholder for the value of the step before (a Buffer or a host array)."""

    def __repr__(self) -> str:
        return "gw.ops.PREV"


#: Stands for the previous step's value in an op's arguments: ``then(gw.ops.kernel(k, grid, block, PREV, x))``.
PREV: Any = _Prev()


# ---------------------------------------------------------------------------------------------------------- policies
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


def _check_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"a policy needs at least one stream, got n={n!r}")
    return n


class RoundRobin(Policy):
    """Streams ops-0 .. ops-(n-1) in turn: independent ops spread evenly. The default, with n = 4."""

    def __init__(self, n: int = 4) -> None:
        self.n = _check_count(n)
        self._turn = itertools.count()

    def pick(self, device: Device) -> Stream:
        return op_streams(device, self.n)[next(self._turn) % self.n]

    def __repr__(self) -> str:
        return f"RoundRobin({self.n})"


class LeastPending(Policy):
    """The stream of ops-0 .. ops-(n-1) with the fewest unfinished ops (the lowest index on a tie)."""

    def __init__(self, n: int = 4) -> None:
        self.n = _check_count(n)

    def pick(self, device: Device) -> Stream:
        streams = op_streams(device, self.n)
        loads = [s.pending for s in streams]
        return streams[loads.index(min(loads))]

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


# ---------------------------------------------------------------------------------------------------------- running
class _Out(NamedTuple):
    """What a step produced: its value, the stream it is ordered on, and the events after which host data is ready."""

    value: Any
    stream: Stream
    ready: tuple[Event, ...] = ()


class _Run:
    """One execution of an op tree: its device and policy, the streams it used and the buffers it allocated."""

    def __init__(self, device: Device, policy: Policy, graph: Graph | None = None) -> None:
        self.device, self.policy, self.graph = device, policy, graph
        self.temps: list[Buffer] = []
        self.protected: set[int] = set()  # ids of temps a shared op keeps
        self.streams: dict[int, Stream] = {}
        self.shared: dict[int, _Out] = {}  # shared ops inside a graph capture: once per capture, owned by the graph

    def pick(self) -> Stream:
        if self.graph is not None:  # a capture records one stream
            return self.use(self.graph.stream)
        stream = self.policy.pick(self.device)
        if not isinstance(stream, Stream) or stream.device is not self.device:
            raise InvalidArgument(f"policy {self.policy!r} returned {stream!r}, not a stream of {self.device.spec}")
        return self.use(stream)

    def use(self, stream: Stream) -> Stream:
        if stream.id not in self.streams:
            self.streams[stream.id] = stream
        return stream

    def follow(self, stream: Stream, prev: _Out | None) -> None:
        """Order ``stream`` after the work that produced ``prev`` (a device-side event wait; nothing blocks)."""
        if prev is not None and prev.stream is not stream:
            stream.wait_event(prev.stream.record())

    def alloc(self, n: int, dtype: Any) -> Buffer:
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
        keep = {id(b) for b in _buffers(result)} | self.protected
        temps, self.temps = self.temps, []
        for buf in temps:
            if id(buf) not in keep:
                buf.free()


def _buffers(value: Any) -> Iterator[Buffer]:
    """Every Buffer inside ``value`` (tuples, lists and dicts are searched)."""
    if isinstance(value, Buffer):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _buffers(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _buffers(v)


def _drive(steps: Generator[Any, None, _Out]) -> _Out:
    """Run a step generator, blocking the host on each thing it waits for."""
    try:
        waiting = next(steps)
        while True:
            waiting.wait()
            waiting = steps.send(None)
    except StopIteration as stop:
        return stop.value


async def _drive_async(steps: Generator[Any, None, _Out]) -> _Out:
    """Run a step generator, awaiting (not blocking on) each thing it waits for."""
    try:
        waiting = next(steps)
        while True:
            await waiting
            waiting = steps.send(None)
    except StopIteration as stop:
        return stop.value


class _Running:
    """A shared op being run by another consumer right now: wait for it, blocking or awaiting."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def set(self) -> None:
        self._done.set()

    def wait(self) -> None:
        self._done.wait()

    def __await__(self):  # noqa: ANN204 - generator protocol
        while not self._done.is_set():
            yield from asyncio.sleep(0.0005).__await__()


# ---------------------------------------------------------------------------------------------------------- Op
class Op:
    """Device work described, not run: ``sync()``, ``sync_on(stream)`` or ``await`` runs it and gives its result.

    Build ops with the functions of ``gw.ops`` (upload, download, kernel, elementwise, fill, copy, zip) and combine them
    with ``then``, ``map``, ``shared`` and ``on``. An op can run many times; each run allocates afresh.
    """

    needs_input = False  # True for steps that take the value before them (download(), kernel(..., PREV, ...))

    def __init__(self, name: str) -> None:
        self.name = name

    # ------------------------------------------------------------------ composition (nothing runs)
    def then(self, step: Any, *args: Any, name: str | None = None) -> Op:
        """Run ``step`` after this op on the same stream, on this op's result.

        ``step`` is an Op (a step such as ``download()`` receives the result, any other op just runs after), an
        ElementwiseKernel (its first input gets the result, ``args`` the other inputs, each output a new buffer of
        the result's length), or a callable ``(value, stream) -> value`` that enqueues work on ``stream``.
        """
        return _Then(self, _as_step(step, args, name))

    def map(self, fn: Callable[[Any], Any], name: str | None = None) -> Op:
        """Apply ``fn`` to the result on the host, once the work before it has finished (the host waits for it)."""
        if not callable(fn):
            raise InvalidArgument(f"map takes a callable, not {type(fn).__name__}")
        return _Map(self, fn, name or getattr(fn, "__name__", "map"))

    def shared(self) -> SharedOp:
        """This op, run at most once however many consumers run or await it; they all get the same result."""
        return SharedOp(self)

    def on(self, where: Policy | Stream) -> Op:
        """This op with its streams picked by ``where`` (a Policy, or a Stream for ``OnStream``)."""
        return _On(self, OnStream(where) if isinstance(where, Stream) else _check_policy(where))

    # ------------------------------------------------------------------ running
    def sync(self, policy: Policy | None = None) -> Any:
        """Run the op and return its result: a Buffer, a host array, a tuple for ``zip``, or what ``map`` made.

        Blocks the host until all of the op's work has finished, then frees the buffers it allocated for itself.
        """
        policy = DEFAULT_POLICY if policy is None else _check_policy(policy)
        run = _Run(self._device(policy), policy)
        out: _Out | None = None
        try:
            out = _drive(self._root(run))
            for event in [s.record() for s in run.streams.values()]:
                event.wait()
            for event in out.ready:
                event.wait()
        finally:
            run.release(None if out is None else out.value)
        return out.value

    def sync_on(self, stream: Stream) -> Any:
        """Run the whole op on ``stream`` (zip branches too) and return its result. Blocks until it has finished."""
        return self.sync(OnStream(stream))

    async def _sync_async(self, policy: Policy) -> Any:
        run = _Run(self._device(policy), policy)
        out: _Out | None = None
        try:
            out = await _drive_async(self._root(run))
            for event in [s.record() for s in run.streams.values()]:
                await event
            for event in out.ready:
                await event
        finally:
            run.release(None if out is None else out.value)
        return out.value

    def __await__(self):  # noqa: ANN204 - awaitable protocol
        """``await op``: run it without blocking the event loop (completion is polled) and give its result."""
        return self._sync_async(DEFAULT_POLICY).__await__()

    def graph_on(self, stream: Stream, name: str | None = None) -> Graph:
        """Capture this op on ``stream`` as a Graph (nothing runs); ``g.launch()`` replays it.

        The graph owns the buffers and host arrays the op allocates (freed by ``g.close()``); uploads read from
        graph-owned host arrays that ``g.update(...)`` refills. Ops that wait on the host (``map``) cannot be captured.
        """
        from .graphs import Graph

        if not isinstance(stream, Stream):
            raise InvalidArgument(f"graph_on takes a gpuworkbench Stream, not {type(stream).__name__}")
        device = self._device(OnStream(stream))
        if device is not stream.device:
            raise InvalidArgument(f"the op runs on {device.spec}, stream {stream.label!r} is on {stream.device.spec}")
        graph = Graph(stream, name or self.name)
        run = _Run(device, OnStream(stream), graph)
        try:
            with graph._capturing():
                steps = self._root(run)
                try:
                    next(steps)
                except StopIteration as stop:
                    out = stop.value
                else:
                    raise InvalidArgument(
                        f"op {self.name!r} waits on the host (a map, or a downloaded array fed back into device work); "
                        "a graph holds device work only: capture the device part and map g.sync()'s result"
                    )
        except BaseException:
            run.release(None)  # after the capture has ended: freeing memory synchronizes
            raise
        graph._own(out.value, run.temps)
        return graph

    # ------------------------------------------------------------------ for the node types
    def _root(self, run: _Run) -> Generator[Any, None, _Out]:
        if self.needs_input:
            raise InvalidArgument(f"{self.name!r} takes the value of a step before it; use it in .then(...)")
        return self._steps(run, None, None)

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        """Enqueue the op (on ``stream``, or a stream the policy picks) after ``prev``; yields what to wait for."""
        raise NotImplementedError

    def _children(self) -> tuple[Op, ...]:
        return ()

    def _bound_devices(self) -> Iterable[Device]:
        for child in self._children():
            yield from child._bound_devices()

    def _sources(self, seen: set[int]) -> list[np.ndarray]:
        """The host arrays this op uploads, in the order a run enqueues them (what ``Graph.update(op)`` copies)."""
        return [a for child in self._children() for a in child._sources(seen)]

    def _device(self, policy: Policy) -> Device:
        found: list[Device] = []
        for dev in self._bound_devices():
            if not any(dev is d for d in found):
                found.append(dev)
        if len(found) > 1:
            raise InvalidArgument(f"op {self.name!r} mixes devices {', '.join(d.spec for d in found)}")
        if found:
            return found[0]
        if isinstance(policy, OnStream):
            return policy.stream.device
        from .device import Device

        return Device()

    def __repr__(self) -> str:
        return f"<Op {self.name!r}>"


def _check_policy(policy: Any) -> Policy:
    if not callable(getattr(policy, "pick", None)):
        raise InvalidArgument(f"a policy needs a pick(device) -> Stream method; {policy!r} has none")
    return policy


# ---------------------------------------------------------------------------------------------------------- leaves
_Action = Callable[["_Run", Stream, tuple, "str | None"], tuple[Any, tuple[Event, ...]]]


class _Leaf(Op):
    """One enqueue: ``action(run, stream, args, span_name) -> (value, ready events)``, PREV replaced by the input."""

    def __init__(self, label: str, action: _Action, args: tuple, name: str | None, device: Device | None) -> None:
        super().__init__(name or label)
        self._action, self._args, self._span_name, self._bound = action, args, name, device
        self.needs_input = any(a is PREV for a in args)

    def _bound_devices(self) -> Iterable[Device]:
        if self._bound is not None:
            yield self._bound
        for a in self._args:
            if isinstance(a, Buffer):
                yield a.device
            elif isinstance(a, Kernel):
                yield a.device

    def _sources(self, seen: set[int]) -> list[np.ndarray]:
        if self._action is _upload and self._args[0] is not PREV:
            return [self._args[0]]
        return []

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        if self.needs_input and prev is None:
            raise InvalidArgument(f"{self.name!r} takes the value of a step before it; use it in .then(...)")
        s = run.use(stream) if stream is not None else run.pick()
        run.follow(s, prev)
        args = self._args
        if self.needs_input:
            yield from prev.ready  # a host value is read by the host (or a staged copy) as this op is enqueued
            args = tuple(prev.value if a is PREV else a for a in args)
        if run.graph is None:
            for a in self._args:  # the caller's buffers may still be in use on streams of its own
                if isinstance(a, Buffer):
                    a._order_after_inflight(s)
        value, ready = self._action(run, s, args, self._span_name)
        return _Out(value, s, ready)


def _host(value: Any, what: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise InvalidArgument(f"{what} takes a NumPy array, not {type(value).__name__}")
    return np.ascontiguousarray(value).reshape(-1)


def _buffer(value: Any, what: str) -> Buffer:
    if not isinstance(value, Buffer):
        raise InvalidArgument(f"{what} needs a Buffer, got {type(value).__name__}; upload host data first")
    return value


def _upload(run: _Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    host = _host(args[0], "upload")
    if run.graph is not None:  # replays read a graph-owned (page-locked) copy that update() refills
        staged = run.device.empty_pinned(host.size, host.dtype)
        np.copyto(staged, host)
        host = staged
    buf = run.alloc(host.size, host.dtype)
    buf.copy_from_host_async(host, s, name=name)
    return buf, ()


def _download(run: _Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    buf, out = _buffer(args[0], "download"), args[1]
    host = run.host_array(len(buf), buf.dtype) if out is None else out
    event = buf.copy_to_host_async(host, s, name=name)
    return host, (event,)


def _fill(run: _Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    buf, value = _buffer(args[0], "fill"), args[1]
    pattern = np.asarray(value, dtype=buf.dtype).reshape(1).view(np.uint8)
    if (pattern == pattern[0]).all():  # every byte alike (0, or a one-byte type): a memset does it
        buf.fill_bytes(int(pattern[0]), s, name=name)
    else:
        _fill_kernel(buf.dtype)(buf, buf.dtype.type(value), stream=s, name=name or "fill")
    return buf, ()


_FILL_KERNELS: dict[str, ElementwiseKernel] = {}


def _fill_kernel(dtype: np.dtype) -> ElementwiseKernel:
    kernel = _FILL_KERNELS.get(dtype.name)
    if kernel is None:
        kernel = _FILL_KERNELS[dtype.name] = ElementwiseKernel(f"{dtype.name} y, {dtype.name} v", "y = v", "fill")
    return kernel


def _copy(run: _Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    dst, src = _buffer(args[0], "copy's destination"), _buffer(args[1], "copy's source")
    dst.copy_from(src, s, name=name)
    return dst, ()


def _launch(run: _Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    kernel, grid, block, result, *kernel_args = args
    kernel(grid, block, kernel_args, stream=s, name=name)
    return _pick_result(kernel_args, result), ()


def _apply(run: _Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    f, *fargs = args
    f(*fargs, stream=s, name=name)
    outputs = [a for (pname, _), a in builtins.zip(f.params, fargs) if pname in f.outputs]
    return (outputs[0] if len(outputs) == 1 else tuple(outputs)), ()


def _pick_result(args: list, result: int | None) -> Any:
    if result is not None:
        return args[result]
    return next((a for a in args if isinstance(a, Buffer)), None)


def upload(host: Any = PREV, *, device: Device | None = None, name: str | None = None) -> Op:
    """An op that copies ``host`` (a NumPy array, read when the op runs) into a new device buffer: its result.

    Without ``host`` it is a step uploading the host array before it. Binds to ``device``, else to ``gw.Device()``.
    """
    if host is not PREV:
        _host(host, "upload")
    return _Leaf("upload", _upload, (host,), name, device)


def download(buf: Any = PREV, *, out: np.ndarray | None = None, name: str | None = None) -> Op:
    """An op that copies ``buf`` (default: the Buffer before it) to the host; its result is the (flat) host array.

    ``out`` receives the data if given; otherwise a new array, page-locked where the backend has such memory."""
    if out is not None and not isinstance(out, np.ndarray):
        raise InvalidArgument(f"download's out must be a NumPy array, not {type(out).__name__}")
    return _Leaf("download", _download, (buf, out), name, None)


def fill(buf: Any = PREV, value: Any = 0, *, name: str | None = None) -> Op:
    """An op that sets every element of ``buf`` (default: the Buffer before it) to ``value``; its result is ``buf``."""
    return _Leaf("fill", _fill, (buf, value), name, None)


def copy(dst: Buffer, src: Any = PREV, *, name: str | None = None) -> Op:
    """An op that copies ``src`` (default: the Buffer before it) into ``dst`` on the device; its result is ``dst``."""
    return _Leaf("copy", _copy, (dst, src), name, None)


def kernel(k: Kernel, grid: Any, block: Any, *args: Any, result: int | None = None, name: str | None = None) -> Op:
    """An op launching ``k(grid, block, args)``; PREV among ``args`` takes the value before it.

    Its result is ``args[result]``, else the first Buffer argument (kernels conventionally write their first one).
    """
    if not isinstance(k, Kernel):
        raise InvalidArgument(f"ops.kernel takes a Kernel from device.compile, not {type(k).__name__}")
    return _Leaf(k.name, _launch, (k, grid, block, result, *args), name, None)


def elementwise(f: ElementwiseKernel, *args: Any, name: str | None = None) -> Op:
    """An op running ``f(*args)``; PREV among ``args`` takes the value before it. Its result is ``f``'s output."""
    if not isinstance(f, ElementwiseKernel):
        raise InvalidArgument(f"ops.elementwise takes gw.elementwise(...), not {type(f).__name__}")
    return _Leaf(f.name, _apply, (f, *args), name, None)


def zip(*ops: Op, name: str | None = None) -> Op:  # noqa: A001 - gw.ops.zip is the documented name
    """Run independent ops on different streams (as the policy picks them) and join them: the result is a tuple.

    Later steps run on the first op's stream, after every op of the zip (device-side event waits)."""
    if not ops:
        raise InvalidArgument("zip needs at least one op")
    for op in ops:
        if not isinstance(op, Op):
            raise InvalidArgument(f"zip takes ops, not {type(op).__name__}")
    return _Zip(ops, name)


# ---------------------------------------------------------------------------------------------------------- combinators
class _Then(Op):
    def __init__(self, first: Op, step: Op) -> None:
        super().__init__(f"{first.name} → {step.name}")
        self.first, self.step = first, step
        self.needs_input = first.needs_input

    def _children(self) -> tuple[Op, ...]:
        return (self.first, self.step)

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        out = yield from self.first._steps(run, stream, prev)
        return (yield from self.step._steps(run, out.stream, out))


class _Zip(Op):
    def __init__(self, ops: tuple[Op, ...], name: str | None) -> None:
        super().__init__(name or f"zip({', '.join(op.name for op in ops)})")
        self.ops = ops
        self.needs_input = any(op.needs_input for op in ops)

    def _children(self) -> tuple[Op, ...]:
        return self.ops

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        outs = []
        for i, op in enumerate(self.ops):
            outs.append((yield from op._steps(run, stream if i == 0 else None, prev)))
        joined = outs[0].stream
        for out in outs[1:]:
            run.follow(joined, out)
        ready = tuple(event for out in outs for event in out.ready)
        return _Out(tuple(out.value for out in outs), joined, ready)


class _Map(Op):
    def __init__(self, op: Op, fn: Callable[[Any], Any], name: str) -> None:
        super().__init__(f"{op.name} → {name}")
        self.op, self.fn = op, fn
        self.needs_input = op.needs_input

    def _children(self) -> tuple[Op, ...]:
        return (self.op,)

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        out = yield from self.op._steps(run, stream, prev)
        if run.graph is not None:
            raise InvalidArgument(f"map {self.name!r} runs on the host and cannot be part of a graph")
        yield out.stream.record()  # the host reads device results only after the work that made them
        yield from out.ready
        return _Out(self.fn(out.value), out.stream)


class _On(Op):
    def __init__(self, op: Op, policy: Policy) -> None:
        super().__init__(op.name)
        self.op, self.policy = op, policy
        self.needs_input = op.needs_input

    def _children(self) -> tuple[Op, ...]:
        return (self.op,)

    def _bound_devices(self) -> Iterable[Device]:
        yield from self.op._bound_devices()
        if isinstance(self.policy, OnStream):
            yield self.policy.stream.device

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        saved, run.policy = run.policy, self.policy
        try:
            return (yield from self.op._steps(run, None, prev))  # None: the first step picks by the new policy
        finally:
            run.policy = saved


class _Call(Op):
    """A callable step ``fn(value, stream) -> value``."""

    needs_input = True

    def __init__(self, fn: Callable[[Any, Stream], Any], name: str | None) -> None:
        super().__init__(name or getattr(fn, "__name__", "step"))
        self.fn = fn

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        s = run.use(stream) if stream is not None else run.pick()
        run.follow(s, prev)
        yield from prev.ready
        return _Out(self.fn(prev.value, s), s)


class _ElementwiseStep(Op):
    """``then(f, *args)``: the first input of ``f`` takes the value before, outputs get new buffers of its length."""

    needs_input = True

    def __init__(self, f: ElementwiseKernel, args: tuple, name: str | None) -> None:
        super().__init__(name or f.name)
        self.f, self.args, self._span_name = f, args, name
        inputs = [p for p, _ in f.params if p not in f.outputs]
        wanted = max(len(inputs) - 1, 0)
        if len(args) != wanted:
            raise InvalidArgument(
                f"then({f.name}) feeds the value before into {(inputs or f.outputs)[0]!r} and takes {wanted} more "
                f"argument(s) for {inputs[1:]}, got {len(args)}"
            )

    def _bound_devices(self) -> Iterable[Device]:
        for a in self.args:
            if isinstance(a, Buffer):
                yield a.device

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        s = run.use(stream) if stream is not None else run.pick()
        run.follow(s, prev)
        yield from prev.ready
        x = _buffer(prev.value, f"then({self.f.name})")
        f = self.f
        in_place = all(p in f.outputs for p, _ in f.params)  # "y = y + 1": the value before is updated in place
        extra = iter(self.args)
        args: list[Any] = []
        outputs: list[Buffer] = []
        fed = False
        for pname, dtype in f.params:
            if not fed and (in_place or pname not in f.outputs):
                args.append(x)
                fed = True
                if in_place:
                    outputs.append(x)
            elif pname in f.outputs:
                outputs.append(run.alloc(len(x), dtype))
                args.append(outputs[-1])
            else:
                args.append(next(extra))
        f(*args, stream=s, name=self._span_name)
        return _Out(outputs[0] if len(outputs) == 1 else tuple(outputs), s)


class SharedOp(Op):
    """An op run at most once: every consumer (in one run or in later ones, awaiting or not) gets the same result.

    The result's buffers belong to the SharedOp until ``release()`` (or until it is garbage-collected).
    """

    def __init__(self, op: Op) -> None:
        super().__init__(op.name)
        self.op = op
        self.needs_input = op.needs_input
        self._lock = threading.Lock()
        self._state: _Running | tuple[_Out, Event] | None = None
        self._owned: list[Buffer] = []
        self.runs = 0  # how many times the op really ran

    def _children(self) -> tuple[Op, ...]:
        return (self.op,)

    def _sources(self, seen: set[int]) -> list[np.ndarray]:
        if id(self) in seen:  # runs once: its uploads count once
            return []
        seen.add(id(self))
        return self.op._sources(seen)

    def _steps(self, run: _Run, stream: Stream | None, prev: _Out | None) -> Generator[Any, None, _Out]:
        if run.graph is not None:  # a graph owns what it replays: the op runs once per capture
            if id(self) not in run.shared:
                run.shared[id(self)] = yield from self.op._steps(run, stream, prev)
            return run.shared[id(self)]
        while True:
            with self._lock:
                state = self._state
                if state is None:
                    running = self._state = _Running()
                    break
            if isinstance(state, _Running):
                yield state  # another consumer is running it: wait for its result
                continue
            out, done = state
            s = run.use(stream) if stream is not None else run.pick()  # each consumer continues on its own stream
            if s is not out.stream:
                s.wait_event(done)
            return _Out(out.value, s, out.ready)
        first = len(run.temps)
        try:
            out = yield from self.op._steps(run, stream, prev)
            done = out.stream.record()
        except BaseException:
            with self._lock:
                self._state = None
            running.set()
            raise
        mine = {id(b) for b in run.temps[first:]}
        owned = [b for b in _buffers(out.value) if id(b) in mine]
        run.protected |= {id(b) for b in owned}
        with self._lock:
            self._state, self._owned = (out, done), owned
            self.runs += 1
        running.set()
        return out

    def release(self) -> None:
        """Free the buffers the result holds and forget it; the next consumer runs the op again. Blocks until the
        ops using those buffers have finished."""
        with self._lock:
            owned, self._owned, self._state = self._owned, [], None
        for buf in owned:
            buf.free()


def _as_step(step: Any, args: tuple, name: str | None) -> Op:
    if isinstance(step, Op):
        if args or name is not None:
            raise InvalidArgument("then(op) takes no extra arguments or name: give them where the op is built")
        return step
    if isinstance(step, ElementwiseKernel):
        return _ElementwiseStep(step, args, name)
    if isinstance(step, Kernel):
        raise InvalidArgument(
            f"then({step.name}) needs a grid and block: use then(gw.ops.kernel(k, grid, block, gw.ops.PREV, ...))"
        )
    if callable(step):
        if args:
            raise InvalidArgument("then(callable) takes no extra arguments: the callable gets (value, stream)")
        return _Call(step, name)
    raise InvalidArgument(f"then takes an Op, an elementwise kernel or a callable (value, stream), not {step!r}")


__all__ = [
    "DEFAULT_POLICY",
    "PREV",
    "LeastPending",
    "OnStream",
    "Op",
    "Policy",
    "RoundRobin",
    "SharedOp",
    "copy",
    "download",
    "elementwise",
    "fill",
    "kernel",
    "op_streams",
    "upload",
    "zip",
]
