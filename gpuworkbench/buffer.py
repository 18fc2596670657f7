"""Buffer: a typed array in device memory, with blocking and stream-ordered copies."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dispatch, listeners
from ._format import binary_bytes
from ._memory import as_dtype
from .backends.base import BufferArg, PinnedArray
from .errors import BufferClosed, InvalidArgument
from .op_names import PEER_ROUTES, peer_copy_name
from .streams import KEEP_LARGE, PRUNE_MASK, Event, Stream

if TYPE_CHECKING:
    from .device import Device


class Buffer:
    """``n`` elements of one dtype on one device. Free it with ``free()`` or a ``with`` block (or let GC do it).

    ``shape`` says how the elements are read as an array (``(n,)`` unless allocated with a shape or given one); it
    changes no byte: ``copy_to_host()`` returns that shape, and kernel libraries read it (``gw.library``)."""

    frees = 0  # buffers freed in this process, any device: a change invalidates Kernel's prepared launches
    on_free: list[Callable[[], None]] = []  # called after every free (kernels drop the launches they prepared)

    def __init__(self, device: Device, n: int, dtype: np.dtype, handle: Any) -> None:
        self.device, self.length, self.dtype, self.handle = device, n, dtype, handle
        self._shape: tuple[int, ...] = (n,)
        # stream id -> completion of the last op on that stream using this buffer; a peer copy's stream on another
        # device is keyed ("peer", id(device), stream id)
        self.inflight: dict[Any, Any] = {}
        self._freed = False
        self._lock = threading.Lock()

    @classmethod
    def allocate(cls, device: Device, n: int | Sequence[int], dtype: Any = "float32") -> Buffer:
        """Allocate ``n`` elements of ``dtype`` on ``device`` (uninitialised); ``n`` may be a shape, ``(rows, cols)``.
        Raises OutOfMemory when it won't fit."""
        ledger = device.ledger
        ledger.check_open()
        shape = _shape(n) if isinstance(n, (tuple, list)) else None
        if shape is not None:
            n = int(np.prod(shape, dtype=np.int64))
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InvalidArgument(f"buffer length must be a non-negative int, got {n!r}")
        dt = as_dtype(dtype)
        nbytes = int(n) * dt.itemsize
        start = time.perf_counter_ns()
        handle = device.backend_device.alloc(nbytes)
        buf = cls(device, int(n), dt, handle)
        if shape is not None:
            buf._shape = shape
        ledger.allocated(buf, nbytes, start, handle)
        return buf

    # ------------------------------------------------------------------ facts
    def __len__(self) -> int:
        return self.length

    @property
    def len(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int, ...]:
        """How the elements read as an array; set it to any shape holding ``len(buf)`` elements."""
        return self._shape

    @shape.setter
    def shape(self, shape: int | Sequence[int]) -> None:
        dims = _shape(shape if isinstance(shape, (tuple, list)) else (shape,))
        if int(np.prod(dims, dtype=np.int64)) != self.length:
            raise InvalidArgument(f"shape {dims} does not hold the {self.length} elements of {self.describe()}")
        self._shape = dims

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size_bytes(self) -> int:
        return self.length * self.dtype.itemsize

    @property
    def closed(self) -> bool:
        return self._freed

    def check(self) -> Any:
        if self._freed:
            raise BufferClosed(f"{self.describe()} was freed; allocate a new buffer")
        if self.device.closed:
            raise BufferClosed(f"{self.describe()} belongs to closed device {self.device.spec}")
        return self.handle

    def describe(self) -> str:
        return f"buffer of {self.length} {self.dtype} on {self.device.spec}"

    #: This buffer as its backend's launch takes it (``kernel_arg``), made at the first launch (``arg()``) and dropped
    #: when the buffer is freed; the launch path reads it directly.
    karg: Any = None

    def arg(self) -> Any:
        """The buffer as a kernel argument, made once (handle, dtype and length never change while it lives);
        BufferClosed once it is freed or its device closed."""
        if self._freed or self.device.closed:
            self.check()
        arg = self.karg
        if arg is None:
            arg = self.karg = self.device.backend_device.kernel_arg(BufferArg(self.check(), self.dtype, self.length))
        return arg

    def touch(self, stream_id: Any, completion: Any) -> None:
        # Streams are in order: the last op on a stream stands for every earlier one there. O(1) on the launch path.
        self.inflight[stream_id] = completion

    def order_after_inflight(self, stream: Stream) -> None:
        """Make ``stream`` wait (device-side) for every unfinished op on this buffer from other streams; ``stream`` may
        be another device's (a peer copy), whose backend then waits for this device's completions."""
        same = stream.device is self.device
        with self._lock:
            pending = [c for sid, c in list(self.inflight.items()) if not (same and sid == stream.id) and not c.done()]
        for c in pending:
            stream.device.backend_device.wait_event(stream.raw, c)

    # ------------------------------------------------------------------ checks
    def _check_host(self, host: Any, *, writable: bool, asynchronous: bool) -> np.ndarray:
        if not isinstance(host, np.ndarray):
            raise InvalidArgument(f"host data must be a NumPy array, not {type(host).__name__}")
        dtype = host.dtype
        if dtype is not self.dtype and dtype != self.dtype:  # ``is``: NumPy's built-in dtypes are one object each
            raise InvalidArgument(
                f"{self.describe()} holds {self.dtype}, host array is {host.dtype}; convert with .astype({self.dtype})"
            )
        if host.size != self.length:
            raise InvalidArgument(f"{self.describe()} holds {self.length} {self.dtype}, host array has {host.size}")
        flags = host.flags  # a new object per read
        if writable and not flags.writeable:
            raise InvalidArgument("the destination host array is read-only")
        if not flags.c_contiguous:
            if asynchronous or writable:
                raise InvalidArgument(
                    "async copies and copies into a host array need a C-contiguous array; use np.ascontiguousarray"
                )
            host = np.ascontiguousarray(host)
        return host

    def _stream(self, stream: Stream | None) -> Stream:
        if stream is None:
            return self.device.default_stream
        if not isinstance(stream, Stream):
            raise InvalidArgument(f"stream must be a gpuworkbench Stream, not {type(stream).__name__}")
        if stream.device is not self.device:
            raise InvalidArgument(f"stream {stream.label!r} is on {stream.device.spec}, buffer on {self.device.spec}")
        return stream

    def _pinned_flag(self, host: np.ndarray) -> int:
        if not self.device.caps.pinned_memory:
            return -1
        return int(self.device.backend_device.is_pinned(host))

    # ------------------------------------------------------------------ copies
    def copy_from_host_async(self, host: np.ndarray, stream: Stream, name: str | None = None) -> Event:
        """Enqueue host → device on ``stream``; ``host`` is kept alive until done. Returns at once for pinned
        memory; pageable memory is staged by the backend and the call returns once it is staged."""
        return self._host_copy_async("h2d", host, stream, name)

    def copy_to_host_async(self, host: np.ndarray, stream: Stream, name: str | None = None) -> Event:
        """Enqueue device → host into ``host`` on ``stream``; read ``host`` only after the Event is done."""
        return self._host_copy_async("d2h", host, stream, name)

    def _host_copy_async(self, kind: str, host: np.ndarray, stream: Stream, name: str | None) -> Event:
        # The launch path of small copies: every check stays; the span's name and the pinned flag are worked out
        # only when a trace or a capture will read them.
        if self._freed or self.device.closed:
            self.check()  # raises BufferClosed
        handle = self.handle
        # _check_host's common case, inlined: an array of this dtype and length, C-contiguous (writable for d2h)
        flags = host.flags if type(host) is PinnedArray or type(host) is np.ndarray else None
        if not (
            flags is not None
            and host.dtype is self.dtype
            and host.size == self.length
            and flags.c_contiguous
            and (kind == "h2d" or flags.writeable)
        ):
            host = self._check_host(host, writable=kind == "d2h", asynchronous=True)
        if stream is None or type(stream) is not Stream or stream.device is not self.device:
            stream = self._stream(stream)
        if stream.closed:
            stream.check_open()
        backend = self.device.backend_device
        if stream.capturing is None and not listeners.RECORDING:  # _dispatch.enqueue_call's quiet branch, inlined
            if kind == "h2d":
                completion = backend.copy_h2d(handle, 0, host, stream.raw, False)
            else:
                completion = backend.copy_d2h(host, handle, 0, stream.raw, False)
            stream.inflight.append((completion, host))  # Stream.track, inlined: ``host`` kept alive until done
            stream.appended += 1
            appended = stream.appended
            if appended & 63 == 0 and (appended & PRUNE_MASK == 0 or host.nbytes >= KEEP_LARGE):
                stream.prune_now()
        else:
            if kind == "h2d":
                fn, args = backend.copy_h2d, (handle, 0, host, stream.raw)
            else:
                fn, args = backend.copy_d2h, (host, handle, 0, stream.raw)
            nbytes = self.size_bytes
            name = name or _copy_name(kind, nbytes)
            completion = _dispatch.enqueue_call(stream, kind, nbytes, name, self._pinned_flag(host), fn, args, host)
        self.inflight[stream.id] = completion  # _touch, inlined
        return Event(completion, stream, host)

    def copy_from_host(self, host: np.ndarray) -> None:
        """Copy ``host`` into the buffer. Blocks until done (after the buffer's earlier ops on any stream)."""
        self.check()
        host = self._check_host(host, writable=False, asynchronous=False)
        stream = self.device.default_stream
        self.order_after_inflight(stream)
        self.copy_from_host_async(host, stream).wait()

    def copy_to_host(self, out: np.ndarray | None = None) -> np.ndarray:
        """Return the buffer's contents as a new host array of its ``shape`` (or in ``out``). Blocks until done."""
        self.check()
        host = np.empty(self.length, dtype=self.dtype) if out is None else out
        host = self._check_host(host, writable=True, asynchronous=False)
        stream = self.device.default_stream
        self.order_after_inflight(stream)
        self.copy_to_host_async(host, stream).wait()
        return host.reshape(self._shape) if out is None else host

    def copy_from(self, other: Buffer, stream: Stream | None = None, name: str | None = None) -> Event:
        """Device → device copy of ``other`` into this buffer, enqueued on ``stream`` (this buffer's device; its default
        stream if None); returns an Event. Non-blocking.

        On one device it is a byte copy (equal sizes in bytes). ``other`` may be on another device of the same backend
        (a peer copy: same dtype and length): CUDA copies peer to peer where the driver allows it, else through host
        memory, as OpenCL always does. With no ``stream`` the copy waits for unfinished work on both buffers."""
        dst, src = self.check(), other.check()
        if other.device is not self.device:
            return self._copy_peer(other, dst, src, stream, name)
        if other.size_bytes != self.size_bytes:
            raise InvalidArgument(f"{self.describe()} cannot take {other.describe()}: sizes differ")
        s = self._stream(stream)
        if stream is None:
            self.order_after_inflight(s)
            other.order_after_inflight(s)
        if other is self:  # nothing to move (and OpenCL refuses overlapping copies): just mark the point in the stream
            return s.record()
        backend, nbytes = self.device.backend_device, self.size_bytes
        call = partial(backend.copy_d2d, dst, 0, src, 0, nbytes, s.raw)
        event = self._enqueue(s, "d2d", name or f"d2d {binary_bytes(nbytes)}", call)
        other.touch(event.stream.id, event.completion)
        return event

    def _copy_peer(self, other: Buffer, dst: Any, src: Any, stream: Stream | None, name: str | None) -> Event:
        """``copy_from`` across two devices of one backend: a ``d2d`` span on this device's stream whose name ends in
        ``[SRC → DST, ROUTE]`` (``op_names.peer_copy_name``), so the analysis can tell peer copies and their path."""
        if other.device.backend_kind is not self.device.backend_kind:
            raise InvalidArgument(
                f"copy_from needs both buffers on one device, or on two devices of one backend: {self.describe()} "
                f"cannot take {other.describe()}; copy through the host (copy_to_host, then copy_from_host)"
            )
        if other.dtype != self.dtype or other.length != self.length:
            raise InvalidArgument(
                f"{self.describe()} cannot take {other.describe()}: a copy between devices needs the same dtype and "
                "length"
            )
        s = self._stream(stream)
        backend, source = self.device.backend_device, other.device.backend_device
        route = backend.peer_route(source)
        if stream is None:
            self.order_after_inflight(s)
            other.order_after_inflight(s)
        nbytes = self.size_bytes
        path = PEER_ROUTES[0] if route.direct else PEER_ROUTES[2] if route.possible else PEER_ROUTES[1]
        label = peer_copy_name(name or f"p2p {binary_bytes(nbytes)}", other.device.spec, self.device.spec, path)
        event = self._enqueue(s, "d2d", label, partial(backend.copy_peer, dst, source, src, nbytes, s.raw))
        other.touch(("peer", id(self.device), event.stream.id), event.completion)
        return event

    def fill_bytes(self, byte: int = 0, stream: Stream | None = None, name: str | None = None) -> Event:
        """Set every byte to ``byte`` (a memset) on ``stream``. Non-blocking."""
        handle = self.check()
        if not isinstance(byte, (int, np.integer)) or not 0 <= byte <= 255:
            raise InvalidArgument(f"fill_bytes takes a byte value 0..255, got {byte!r}")
        s = self._stream(stream)
        backend, nbytes = self.device.backend_device, self.size_bytes
        call = partial(backend.fill, handle, nbytes, byte, s.raw)
        return self._enqueue(s, "memset", name or f"memset {binary_bytes(nbytes)}", call)

    def _enqueue(self, s: Stream, kind: str, name: str, call: Callable[[bool], Any]) -> Event:
        """Enqueue on ``s`` one op of ``kind`` over this buffer's bytes (``call(timed)``), this buffer in use until it
        is done."""
        event = s.enqueue(kind, self.size_bytes, name, -1, call)
        self.touch(event.stream.id, event.completion)
        return event

    # ------------------------------------------------------------------ lifetime
    def free(self) -> None:
        """Release the memory after every op that uses it has finished (blocks for those ops only). Idempotent."""
        if self._freed or self.device.closed:
            return
        with self._lock:
            pending, self.inflight = self.inflight, {}
        for c in pending.values():
            c.wait()
        start = time.perf_counter_ns()
        self.device.backend_device.free(self.handle)
        self._freed, self.handle, self.karg = True, None, None
        self.device.prune_streams(pending)  # their queues keep done ops' arguments, which may view this memory
        Buffer.frees += 1  # after _freed: Kernel's prepared launches are checked against it
        for hook in Buffer.on_free:
            hook()
        self.device.ledger.freed(self.size_bytes, start)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def __del__(self) -> None:
        if sys.is_finalizing():  # the process ends: its memory goes with it, and the streams that would finish this
            return  # buffer's ops may be gone already (waiting on them hung the exit)
        try:
            if not getattr(self, "_freed", True):
                self.free()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    @property
    def __cuda_array_interface__(self) -> dict:
        """Zero-copy view for CuPy, PyTorch and Numba (CUDA and ROCm buffers only)."""
        if not self.device.caps.device_pointers:  # checked first so that hasattr() is False even once freed
            raise AttributeError(f"{self.device.backend_kind.value} buffers have no device pointer")
        handle = self.check()
        return {
            "shape": self._shape,
            "typestr": self.dtype.str,
            "data": (int(self.device.backend_device.device_pointer(handle)), False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __repr__(self) -> str:
        state = "freed" if self._freed else binary_bytes(self.size_bytes)
        count = self.length if len(self._shape) == 1 else " × ".join(map(str, self._shape))
        return f"<Buffer {count} × {self.dtype} on {self.device.spec} ({state})>"


@lru_cache(maxsize=256)
def _copy_name(kind: str, nbytes: int) -> str:
    """A copy's default span name ("h2d 4.0 KiB"), made once per kind and size rather than per copy."""
    return f"{kind} {binary_bytes(nbytes)}"


def _shape(dims: Sequence[Any]) -> tuple[int, ...]:
    """``dims`` as a shape of non-negative ints (InvalidArgument otherwise)."""
    if not dims or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise InvalidArgument(f"a buffer shape is one or more non-negative ints, got {tuple(dims)!r}")
    return tuple(int(d) for d in dims)
