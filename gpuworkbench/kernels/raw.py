"""``Kernel``: a compiled kernel on one device, and its launch path (checks, enqueue, prepared repeats).

The launch path is tuned (docs/architecture.md, "The launch path"): every check stays, in as few Python steps as the
common case allows, and a launch made twice in a row with the same objects is prepared once and then repeated (the
last repeat recognised by identity, ``_hot``). Where launches are not repeats (a loop index passed each time), those
with the same grid, block, stream and buffers and scalars of the same types are checked once and then only have their
scalars packed (``_shaped``; the last shape recognised by identity, ``_near``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _dispatch, listeners
from ..buffer import Buffer
from ..errors import InvalidArgument
from ..streams import PRUNE_MASK, Event, Stream

_REPEATS = 16  # prepared launches kept per Kernel
_MISSES, _SKIP = 16, 256  # after 16 launches in a row that were not repeats, 256 launches look for none
_IMMUTABLE_DIMS = (int, tuple)
_IMMUTABLE_SCALARS = (int, float, np.number, np.bool_)
_PREPARING: weakref.WeakSet = weakref.WeakSet()  # kernels holding prepared launches


def _drop_prepared() -> None:
    """A buffer was freed: prepared launches may name it (on the CPU they hold a view of its memory), so drop all."""
    if not _PREPARING:  # a loop that allocates and frees: nothing prepared since the last free
        return
    for kernel in list(_PREPARING):
        _PREPARING.discard(kernel)  # before its entries go: one prepared meanwhile adds the kernel again
        kernel._repeats.clear()
        kernel._shapes.clear()
        kernel._hot = kernel._near = None


Buffer.on_free.append(_drop_prepared)

if TYPE_CHECKING:
    from ..device import Device


def launch_dims(value: Any, what: str) -> tuple[int, ...]:
    """A grid or block (``what``) as 1 to 3 positive ints, from an int or a sequence; InvalidArgument otherwise."""
    if type(value) is int and value > 0:  # the common case, kept cheap: this is on every launch
        return (value,)
    dims = (value,) if isinstance(value, (int, np.integer)) or not hasattr(value, "__iter__") else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims
    ):
        raise InvalidArgument(f"{what} must be 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims)


def _scalar(value: Any, position: int) -> Any:
    """Kernel scalars: NumPy scalars pass as they are; Python int → int32 (int64 if needed), float → float32."""
    if isinstance(value, np.generic):
        return value
    if isinstance(value, bool):
        return np.int32(value)
    if isinstance(value, int):
        return np.int32(value) if -(2**31) <= value < 2**31 else np.int64(value)
    if isinstance(value, float):
        return np.float32(value)
    raise InvalidArgument(f"kernel argument {position} is a {type(value).__name__}; pass a Buffer or a number")


class Kernel:
    """A compiled kernel on one device. Call ``k(grid, block, args, stream=s)``: grid in blocks, block in threads."""

    def __init__(self, device: Device, raw: Any, name: str, source: Any) -> None:
        self.device, self._raw, self.name, self.source = device, raw, name, source
        backend = device.backend_device
        self._backend_launch = backend.launch
        self._prepare, self._launch_prepared = backend.prepare_launch, backend.launch_prepared
        self._prepare_varying, self._launch_varying = backend.prepare_varying, backend.launch_varying
        self._repeats: dict[tuple, tuple] = {}  # see _repeat
        self._shapes: dict[tuple, tuple] = {}  # see _shaped
        self._last: tuple | None = None  # the last launch's key, objects and Buffer.frees
        self._last_frees = -1  # Buffer.frees at the last launch that took the full path
        self._hot: tuple | None = None  # the last repeat found: (grid, block, stream, ids, entry); see __call__
        self._near: tuple | None = None  # the last shape found: (grid, block, stream, types, ids, key, entry)
        self._misses = 0  # launches in a row that were not repeats
        self._skip = 0  # launches still to make without a key, after _MISSES misses
        #: Shared bytes per block its source declares (``@gw.kernel``'s shared arrays), -1 where not known: what a
        #: trace reports where the backend does not say (``resources``).
        self.declared_shared = -1
        self._resources: tuple[int, int] | None = None

    def resources(self) -> tuple[int, int]:
        """(registers per thread, shared bytes per block) its launches use, -1 where not known: what the backend says
        of the compiled kernel (``BackendDevice.kernel_resources``), but never less than the shared bytes its source
        declares (PoCL 5.0 answers 0 for a kernel's ``__local`` arrays). Asked at its first traced launch, then kept:
        a trace reports them with each launch's grid and block."""
        found = self._resources
        if found is None:
            registers, shared = self.device.backend_device.kernel_resources(self._raw)
            found = self._resources = (registers, max(shared, self.declared_shared))
        return found

    def __call__(
        self,
        grid: Any,
        block: Any,
        args: Sequence[Any],
        stream: Stream | None = None,
        name: str | None = None,
        nbytes: int = 0,
    ) -> Event:
        """Enqueue the kernel on ``stream`` (the device's default stream if None). Non-blocking; returns an Event.

        ``nbytes``: the bytes the kernel reads and writes, where the caller knows them; traces keep it in the span's
        ``bytes`` (``gw.library`` sets it, so that the analysis can tell the problem size)."""
        # This is the launch path: every check stays, in as few Python steps as the common case allows; a repeat
        # of an earlier launch (the same grid, block, stream and argument objects) skips them (see _repeat).
        key = shape = hit = None
        kind = type(args)
        # the last repeat found, kept with its grid, block and stream objects and its arguments' ids: while launches
        # repeat it, no key is built or looked up (objects compared by identity, arguments by id as in the key)
        hot = self._hot if kind is tuple or kind is list else None
        if hot is not None and grid is hot[0] and block is hot[1] and stream is hot[2]:
            ids = hot[3]
            n = len(args)
            if n == 1:
                same = id(args[0]) == ids[0]
            elif n == 2:
                same = id(args[0]) == ids[0] and id(args[1]) == ids[1]
            else:
                same = tuple(map(id, args)) == ids
            if same:
                hit = hot[4]
        if hit is not None or (kind is not tuple and kind is not list):
            pass  # the last repeat again; or no sequence of arguments, which the checks below refuse
        elif self._skip:  # launches lately were not repeats (a scalar that changes every time): no key for a while
            self._skip -= 1
        else:
            n = len(args)  # one and two arguments spelled out: a third of the key's cost
            if n == 1:
                key = (id(grid), id(block), id(stream), id(args[0]))
            elif n == 2:
                key = (id(grid), id(block), id(stream), id(args[0]), id(args[1]))
            else:
                key = (id(grid), id(block), id(stream), *map(id, args))
            hit = self._repeats.get(key)
            if hit is not None:
                self._misses = 0
                self._hot = (grid, block, stream, key[3:], hit)
            else:
                self._misses += 1
                if self._misses >= _MISSES:
                    self._misses, self._skip = 0, _SKIP
        if hit is not None and hit[0] == Buffer.frees:
            s = hit[1]
            if s.capturing is None and not s.closed:
                values = hit[3]
                traces = listeners.RECORDING
                if traces:  # a trace records it (and says whether to time it)
                    name = name or self.name
                    launched = (*hit[7], *self.resources())
                    if len(traces) == 1:  # _dispatch.enqueue's one-trace branch, inlined
                        completion = traces[0].record_op(s, "kernel", nbytes, name, -1, hit[6], values, False, launched)
                    else:
                        completion = _dispatch.enqueue(s, "kernel", nbytes, name, -1, hit[6], values, launch=launched)
                else:
                    completion = self._launch_prepared(hit[2], s.raw)
                    s.inflight.append((completion, values))  # Stream.track, inlined
                    s.appended += 1
                    if s.appended & PRUNE_MASK == 0:
                        s.prune_now()
                sid = s.id
                for i in hit[4]:
                    args[i].inflight[sid] = completion  # Buffer.touch, inlined
                return Event(completion, s, values)
        if kind is tuple or kind is list:  # not a repeat: look for a launch of its shape (kept while _skip, below)
            hit = None
            near = self._near  # the last shape found: its arguments' types, then its Buffers' ids, as its key holds
            if near is not None and grid is near[0] and block is near[1] and stream is near[2]:
                if tuple(map(type, args)) == near[3]:
                    for i, want in near[4]:
                        if id(args[i]) != want:
                            break
                    else:
                        shape, hit = near[5], near[6]
            if hit is None:
                shape = (id(grid), id(block), id(stream), *[id(a) if type(a) is Buffer else type(a) for a in args])
                hit = self._shapes.get(shape)
                if hit is not None:
                    types = tuple(map(type, args))
                    ids = tuple((i, id(args[i])) for i in hit[7])
                    self._near = (grid, block, stream, types, ids, shape, hit)
            if hit is not None and hit[0] == Buffer.frees:
                s = hit[1]
                if s.capturing is None and not s.closed:
                    values = hit[3].copy()
                    for i, t in hit[4]:
                        v = args[i]
                        if type(v) is not t:  # a Python number: as the first launch of this shape converted it
                            v = _scalar(v, i)
                            if type(v) is not t:
                                break  # an int past int32's range: the full path below
                        values[i] = v
                    else:
                        if listeners.RECORDING:  # a trace records it (and says whether to time it)
                            run = (self._raw, hit[5], hit[6], values, s.raw)
                            name = name or self.name
                            launched = (hit[5], hit[6], *self.resources())
                            launch = self._backend_launch
                            completion = _dispatch.enqueue_call(
                                s, "kernel", nbytes, name, -1, launch, run, values, launched
                            )
                        else:
                            completion = self._launch_varying(hit[2], s.raw, values)
                            s.inflight.append((completion, values))  # Stream.track, inlined
                            s.appended += 1
                            if s.appended & PRUNE_MASK == 0:
                                s.prune_now()
                        sid = s.id
                        for i in hit[7]:
                            args[i].inflight[sid] = completion  # Buffer.touch, inlined
                        return Event(completion, s, values)
        grid_t = (grid,) if type(grid) is int and grid > 0 else launch_dims(grid, "grid")
        block_t = (block,) if type(block) is int and block > 0 else launch_dims(block, "block")
        if not isinstance(args, (tuple, list)):
            raise InvalidArgument("kernel args must be a tuple or list")
        device = self.device
        if stream is None:
            stream = device.default_stream
        elif not isinstance(stream, Stream):
            raise InvalidArgument(f"stream must be a gpuworkbench Stream, not {type(stream).__name__}")
        if stream.device is not device:
            raise InvalidArgument(f"stream {stream.label!r} is on {stream.device.spec}, kernel on {device.spec}")
        frees = Buffer.frees  # before the checks: a buffer freed after them makes what is prepared below stale
        values: list[Any] = []
        buffers: list[Buffer] = []
        scalars: list[Any] = []  # the scalar arguments as given: a repeat's key holds their ids
        usable = not device.closed  # else Buffer.arg raises BufferClosed
        for a in args:
            if isinstance(a, Buffer):
                if a.device is not device:
                    raise InvalidArgument(
                        f"kernel argument {len(values)} is a buffer on {a.device.spec}, not {device.spec}"
                    )
                arg = a.karg if usable else None  # made at its first launch, dropped when it is freed
                values.append(a.arg() if arg is None else arg)
                buffers.append(a)
            else:
                values.append(a if isinstance(a, np.generic) else _scalar(a, len(values)))
                scalars.append(a)
        # the enqueue, written out here: one Python frame fewer on every launch
        if stream.closed:
            stream.check_open()
        repeatable = key is not None and stream.capturing is None
        if stream.capturing is None and not listeners.RECORDING:  # _dispatch.enqueue_call's quiet branch, inlined
            completion = self._backend_launch(self._raw, grid_t, block_t, values, stream.raw, False)
            stream.track(completion, values)
        else:
            launch_args = (self._raw, grid_t, block_t, values, stream.raw)
            name = name or self.name
            launched = (grid_t, block_t, *self.resources()) if stream.capturing is None else None
            completion = _dispatch.enqueue_call(
                stream, "kernel", nbytes, name, -1, self._backend_launch, launch_args, values, launched
            )
        sid = stream.id
        for b in buffers:
            b.inflight[sid] = completion  # Buffer.touch, inlined
        if shape is not None and self._skip and usable and stream.capturing is None and self._last_frees == frees:
            self._shaped(shape, (grid, block), args, grid_t, block_t, values, stream, frees)  # no free since the last
        self._last_frees = frees  # one: a free between would drop the shape (and the new buffer may have a freed id)
        if repeatable and usable:
            last = self._last
            if last is not None and last[0] == key and last[2] == frees:
                self._repeat(key, last[1], args, grid_t, block_t, values, stream, frees)
            else:  # its objects kept: a scalar made per call must not lend its id to the next call's; a free between
                # two calls with equal keys (a new buffer where the freed one was) would drop what they prepare
                self._last = (key, (grid, block, scalars), frees)
        return Event(completion, stream, values)

    def _run_prepared(self, prepared: Any, grid: tuple, block: tuple, values: list, stream: Any, timed: bool) -> Any:
        """A repeat inside a trace: the prepared launch where the trace times it by CUPTI (untimed), else the
        backend's launch with the converted arguments and its events."""
        if timed:
            return self._backend_launch(self._raw, grid, block, values, stream, True)
        return self._launch_prepared(prepared, stream)

    def _repeat(
        self,
        key: tuple,
        keep: tuple,
        args: Sequence[Any],
        grid: tuple,
        block: tuple,
        values: list,
        stream: Stream,
        frees: int,
    ) -> None:
        """Prepare (through the backend) a launch made twice in a row, for ``__call__`` to repeat: untraced through the
        prepared launch, traced through the backend's launch with the arguments converted here.

        ``key`` holds the ids of the grid, block, stream and argument objects of the call. An entry keeps each of
        them alive but the Buffers (``keep``; the stream is the device's), so no other object can take one of those
        ids. A Buffer is not kept, which would keep its memory: an entry is valid while ``Buffer.frees`` is what it was
        before the call's checks (``frees``), since a Buffer dies only through ``free`` (its finaliser calls it), which
        counts; every free also drops the entries (``_drop_prepared``). Scalars and tuples are immutable, so equal ids
        mean equal arguments; a list of dims or a structured scalar is not prepared."""
        grid_arg, block_arg, scalars = keep
        if not (type(grid_arg) in _IMMUTABLE_DIMS and type(block_arg) in _IMMUTABLE_DIMS):
            return  # a list of dims may change in place under the same id
        if not all(isinstance(a, _IMMUTABLE_SCALARS) for a in scalars):
            return
        repeats = self._repeats
        if len(repeats) >= _REPEATS:
            repeats.clear()
        positions = tuple(i for i, a in enumerate(args) if isinstance(a, Buffer))
        prepared = self._prepare(self._raw, grid, block, values)
        traced = partial(self._run_prepared, prepared, grid, block, values, stream.raw)  # call(timed), for a trace
        repeats[key] = (frees, stream, prepared, values, positions, keep, traced, (grid, block))
        _PREPARING.add(self)

    def _shaped(
        self,
        shape: tuple,
        keep: tuple,
        args: Sequence[Any],
        grid: tuple,
        block: tuple,
        values: list,
        stream: Stream,
        frees: int,
    ) -> None:
        """Keep a launch that was not a repeat for later ones of its shape (the same grid, block, stream and Buffer
        objects, scalars of the same types): the backend's slots for its argument types (``prepare_varying``), the
        converted arguments with the Buffers' filled in, and where the scalars go. ``keep`` holds the grid and block
        objects, whose ids are in ``shape``; Buffers are valid while ``Buffer.frees`` is ``frees`` (see ``_repeat``)."""
        if not (type(keep[0]) in _IMMUTABLE_DIMS and type(keep[1]) in _IMMUTABLE_DIMS):
            return
        if not all(type(a) is Buffer or isinstance(a, _IMMUTABLE_SCALARS) for a in args):
            return  # a Buffer subclass, a structured scalar: the full path each time
        varying = self._prepare_varying(self._raw, grid, block, [type(v) for v in values])
        if varying is None:
            return
        shapes = self._shapes
        if len(shapes) >= _REPEATS:
            shapes.clear()
        scalars = tuple((i, type(values[i])) for i, a in enumerate(args) if type(a) is not Buffer)
        buffers = tuple(i for i, a in enumerate(args) if type(a) is Buffer)
        shapes[shape] = (frees, stream, varying, list(values), scalars, grid, block, buffers, keep)
        _PREPARING.add(self)

    def __repr__(self) -> str:
        return f"<Kernel {self.name!r} on {self.device.spec}>"
