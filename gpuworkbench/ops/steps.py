"""The ops that enqueue one thing each (upload, download, fill, copy, a kernel launch, an elementwise kernel) and
``zip``, which joins independent ops: the functions of ``gw.ops`` that build an op.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Generator, Iterable
from typing import Any

import numpy as np

from ..buffer import Buffer
from ..device import Device
from ..errors import InvalidArgument
from ..kernels import ElementwiseKernel, Kernel
from ..streams import Event, Stream
from .op import Op, Zip
from .run import Out, Run, check_buffer, check_host


class _Prev:
    """The placeholder for the value of the step before (a Buffer or a host array)."""

    def __repr__(self) -> str:
        return "gw.ops.PREV"


#: Stands for the previous step's value in an op's arguments: ``then(gw.ops.kernel(k, grid, block, PREV, x))``.
PREV: Any = _Prev()


_Action = Callable[[Run, Stream, tuple, "str | None"], tuple[Any, tuple[Event, ...]]]


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

    def _steps(self, run: Run, stream: Stream | None, prev: Out | None) -> Generator[Any, None, Out]:
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
                    a.order_after_inflight(s)
        value, ready = self._action(run, s, args, self._span_name)
        return Out(value, s, ready)


def _upload(run: Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    host = check_host(args[0], "upload")
    if run.graph is not None:  # replays read a graph-owned (page-locked) copy that update() refills
        staged = run.device.empty_pinned(host.size, host.dtype)
        np.copyto(staged, host)
        host = staged
    buf = run.alloc(host.size, host.dtype)
    buf.copy_from_host_async(host, s, name=name)
    return buf, ()


def _download(run: Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    buf, out = check_buffer(args[0], "download"), args[1]
    host = run.host_array(len(buf), buf.dtype) if out is None else out
    event = buf.copy_to_host_async(host, s, name=name)
    return host, (event,)


def _fill(run: Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    buf, value = check_buffer(args[0], "fill"), args[1]
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


def _copy(run: Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    dst, src = check_buffer(args[0], "copy's destination"), check_buffer(args[1], "copy's source")
    dst.copy_from(src, s, name=name)
    return dst, ()


def _launch(run: Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
    kernel, grid, block, result, *kernel_args = args
    kernel(grid, block, kernel_args, stream=s, name=name)
    return _pick_result(kernel_args, result), ()


def _apply(run: Run, s: Stream, args: tuple, name: str | None) -> tuple[Any, tuple[Event, ...]]:
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
        check_host(host, "upload")
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
    return Zip(ops, name)
