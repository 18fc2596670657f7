"""The lazy op and its combinators: ``then``, ``zip``, ``map``, ``on`` and ``shared`` build a tree that runs later.

An op describes device work; ``sync()``, ``sync_on(stream)``, ``await op`` and ``graph_on(stream)`` run it (or capture
it) by walking the tree's steps, each enqueued on the stream the run's policy picks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator, Iterable
from typing import Any

import numpy as np

from ..buffer import Buffer
from ..device import Device
from ..errors import InvalidArgument
from ..graphs import Graph
from ..kernels import ElementwiseKernel, Kernel
from ..streams import Event, Stream
from .policy import DEFAULT_POLICY, OnStream, Policy, check_policy
from .run import Out, Run, buffers_in, check_buffer, drive, drive_async


class Running:
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
        return _On(self, OnStream(where) if isinstance(where, Stream) else check_policy(where))

    # ------------------------------------------------------------------ running
    def sync(self, policy: Policy | None = None) -> Any:
        """Run the op and return its result: a Buffer, a host array, a tuple for ``zip``, or what ``map`` made.

        Blocks the host until all of the op's work has finished, then frees the buffers it allocated for itself.
        """
        policy = DEFAULT_POLICY if policy is None else check_policy(policy)
        run = Run(self._device(policy), policy)
        out: Out | None = None
        try:
            out = drive(self._root(run))
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
        run = Run(self._device(policy), policy)
        out: Out | None = None
        try:
            out = await drive_async(self._root(run))
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
        if not isinstance(stream, Stream):
            raise InvalidArgument(f"graph_on takes a gpuworkbench Stream, not {type(stream).__name__}")
        device = self._device(OnStream(stream))
        if device is not stream.device:
            raise InvalidArgument(f"the op runs on {device.spec}, stream {stream.label!r} is on {stream.device.spec}")
        graph = Graph(stream, name or self.name)
        run = Run(device, OnStream(stream), graph)
        try:
            with graph.capturing():
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
        graph.own(out.value, run.temps)
        return graph

    # ------------------------------------------------------------------ for the node types
    def _root(self, run: Run) -> Generator[Any, None, Out]:
        if self.needs_input:
            raise InvalidArgument(f"{self.name!r} takes the value of a step before it; use it in .then(...)")
        return self._steps(run, None, None)

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        """Enqueue the op (on ``stream``, or a stream the policy picks) after ``prev``; yields what to wait for."""
        raise NotImplementedError

    def _children(self) -> tuple[Op, ...]:
        return ()

    def _bound_devices(self) -> Iterable[Device]:
        for child in self._children():
            yield from child._bound_devices()

    def host_inputs(self) -> list[np.ndarray]:
        """The host arrays this op uploads, in the order a run enqueues them (what ``Graph.update(op)`` copies)."""
        return self._sources(set())

    def _sources(self, seen: set[int]) -> list[np.ndarray]:
        """``host_inputs``, each shared op's counted once (``seen`` holds their ids)."""
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
        return Device()

    def __repr__(self) -> str:
        return f"<Op {self.name!r}>"


class _Then(Op):
    def __init__(self, first: Op, step: Op) -> None:
        super().__init__(f"{first.name} → {step.name}")
        self.first, self.step = first, step
        self.needs_input = first.needs_input

    def _children(self) -> tuple[Op, ...]:
        return (self.first, self.step)

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        out = yield from self.first._steps(run, stream, prev)
        return (yield from self.step._steps(run, out.stream, out))


class Zip(Op):
    def __init__(self, ops: tuple[Op, ...], name: str | None) -> None:
        super().__init__(name or f"zip({', '.join(op.name for op in ops)})")
        self.ops = ops
        self.needs_input = any(op.needs_input for op in ops)

    def _children(self) -> tuple[Op, ...]:
        return self.ops

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        outs = []
        for i, op in enumerate(self.ops):
            outs.append((yield from op._steps(run, stream if i == 0 else None, prev)))
        joined = outs[0].stream
        for out in outs[1:]:
            run.follow(joined, out)
        ready = tuple(event for out in outs for event in out.ready)
        return Out(tuple(out.value for out in outs), joined, ready)


class _Map(Op):
    def __init__(self, op: Op, fn: Callable[[Any], Any], name: str) -> None:
        super().__init__(f"{op.name} → {name}")
        self.op, self.fn = op, fn
        self.needs_input = op.needs_input

    def _children(self) -> tuple[Op, ...]:
        return (self.op,)

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        out = yield from self.op._steps(run, stream, prev)
        if run.graph is not None:
            raise InvalidArgument(f"map {self.name!r} runs on the host and cannot be part of a graph")
        yield out.stream.record()  # the host reads device results only after the work that made them
        yield from out.ready
        return Out(self.fn(out.value), out.stream)


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

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
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

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        s = run.use(stream) if stream is not None else run.pick()
        run.follow(s, prev)
        yield from prev.ready
        return Out(self.fn(prev.value, s), s)


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

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        s = run.use(stream) if stream is not None else run.pick()
        run.follow(s, prev)
        yield from prev.ready
        x = check_buffer(prev.value, f"then({self.f.name})")
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
        return Out(outputs[0] if len(outputs) == 1 else tuple(outputs), s)


class SharedOp(Op):
    """An op run at most once: every consumer (in one run or in later ones, awaiting or not) gets the same result.

    The result's buffers belong to the SharedOp until ``release()`` (or until it is garbage-collected).
    """

    def __init__(self, op: Op) -> None:
        super().__init__(op.name)
        self.op = op
        self.needs_input = op.needs_input
        self._lock = threading.Lock()
        self._state: Running | tuple[Out, Event] | None = None
        self._owned: list[Buffer] = []
        self.runs = 0  # how many times the op really ran

    def _children(self) -> tuple[Op, ...]:
        return (self.op,)

    def _sources(self, seen: set[int]) -> list[np.ndarray]:
        if id(self) in seen:  # runs once: its uploads count once
            return []
        seen.add(id(self))
        return self.op._sources(seen)

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
        if run.graph is not None:  # a graph owns what it replays: the op runs once per capture
            if id(self) not in run.shared:
                run.shared[id(self)] = yield from self.op._steps(run, stream, prev)
            return run.shared[id(self)]
        while True:
            with self._lock:
                state = self._state
                if state is None:
                    running = self._state = Running()
                    break
            if isinstance(state, Running):
                yield state  # another consumer is running it: wait for its result
                continue
            out, done = state
            s = run.use(stream) if stream is not None else run.pick()  # each consumer continues on its own stream
            if s is not out.stream:
                s.wait_event(done)
            return Out(out.value, s, out.ready)
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
        owned = [b for b in buffers_in(out.value) if id(b) in mine]
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
