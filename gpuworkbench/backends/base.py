"""The small protocol every backend implements: probe devices, open one, and enqueue work on its streams.

A backend knows nothing of tracing or pictures. Every enqueue returns a ``Completion`` that can be polled without
blocking; when asked (``timed=True``) it also yields the op's start and end on the device's own clock.
"""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from ..errors import InvalidArgument

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Caps:
    """What a backend can do; the front end raises a clear error (or emulates, saying so) where it cannot.
    A backend names what it has beyond the defaults, which are what a backend without the feature gets."""

    concurrent_streams: bool  # independent streams really run at the same time
    pinned_memory: bool = False  # page-locked host arrays exist and make async copies truly asynchronous
    memory_free_known: bool = False  # memory_info()'s free figure is the device's own (else: total minus ours)
    graphs: str = "recorded"  # "native" (captured by the driver), "recorded" (graphs.py replays the calls), "none"
    timestamps: str  # where span times come from: "events", "profiling", "timestamp-query", "perf_counter"
    kernel_language: str  # what Device.compile takes: "cuda", "opencl", "wgsl" or "python"
    device_pointers: bool = False  # buffers expose __cuda_array_interface__


@dataclass(frozen=True)
class DeviceInfo:
    """One device as a backend reports it."""

    backend: str
    index: int
    name: str
    is_gpu: bool
    total_memory: int
    detail: str = ""


class BufferArg(NamedTuple):
    """A device buffer passed to a kernel: the backend's handle with its element type and length."""

    handle: Any
    dtype: np.dtype
    length: int


class KernelLimits(NamedTuple):
    """How large a block (workgroup) a device runs: threads in all, threads along x, y, z, shared bytes per block."""

    threads: int
    dims: tuple[int, int, int]
    shared_bytes: int


#: A kernel launch's grid or block: 1 to 3 sizes, x first.
Dims = tuple[int, ...]

#: What every CUDA GPU offers (static shared memory: 48 KiB); the CPU backend keeps to it so that kernels written and
#: tried there also run on GPUs.
PORTABLE_LIMITS = KernelLimits(1024, (1024, 1024, 64), 48 << 10)


class PeerRoute(NamedTuple):
    """How a copy from another device of the same backend reaches a device (``BackendDevice.peer_route``)."""

    direct: bool  # the copy goes device to device, not through host memory
    possible: bool  # the driver reports a direct path between the two devices (used or not)


class ClockSample(NamedTuple):
    """One reading of the device clock and the host clock (``time.perf_counter_ns``) at the same moment."""

    device_ns: int
    host_ns: int
    error_ns: int


class Completion(Protocol):
    """The handle of one enqueued op."""

    def done(self) -> bool:
        """True once the op has finished; never blocks."""
        ...

    def wait(self) -> None:
        """Block the calling thread until the op has finished."""
        ...

    def times_ns(self) -> tuple[int, int] | None:
        """Start and end on the device clock once done (None when the op was not timed)."""
        ...


class DoneCompletion:
    """A completion for work that finished on the host before the call returned (zero-byte copies)."""

    def __init__(self, t_ns: int | None = None) -> None:
        self._t = t_ns

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def times_ns(self) -> tuple[int, int] | None:
        return None if self._t is None else (self._t, self._t)


DONE = DoneCompletion()


class StreamMarks:
    """Completions made on demand for one stream (CUDA's untimed ops): an op takes a number, not an event.

    The first time one of them is asked about (done, wait, a wait from another stream), one marker is recorded on the
    stream and stands for it and every op numbered up to when it was recorded: exact when asked right after the op,
    later (never earlier) when asked after more work was enqueued. Most ops are never asked about, so most launches
    record nothing. ``record`` enqueues an eager marker on the stream and returns its completion."""

    __slots__ = ("_record", "numbers", "issued", "mark", "mark_upto", "frozen", "closed", "lock")

    def __init__(self, record: Callable[[], Completion]) -> None:
        self._record = record
        self.numbers = itertools.count(1)  # ops' numbers, in order: next() takes one (CUDA's launch path does, inline)
        self.issued = 0  # a number some enqueued op took; every smaller number was taken (so enqueued) before it
        self.mark: Completion | None = None
        self.mark_upto = 0  # the marker covers every op numbered up to this
        self.frozen = False  # no marker may be recorded now (stream capture): the last one covers every op
        self.closed = False  # the stream was synchronized and released: every op is done
        self.lock = threading.Lock()

    def enqueued(self) -> LazyCompletion:
        """Call after enqueuing an op on the stream: its completion, a marker recorded only when asked for."""
        number = next(self.numbers)
        self.issued = number
        return LazyCompletion(self, number)

    def cover(self, number: int) -> Completion:
        """A completion done only once op ``number`` is: the newest marker if it covers it, else a new marker."""
        with self.lock:
            mark = self.mark
            if mark is not None and (self.mark_upto >= number or self.frozen):
                return mark
            if self.closed:
                return DONE
            upto = self.issued  # read before recording: every op numbered up to it was enqueued before the marker
            mark = self.mark = self._record()
            self.mark_upto = upto
            return mark

    def freeze(self) -> None:
        """Record a marker covering every op so far, then record none until ``thaw`` (a stream capture begins)."""
        self.cover(self.issued)
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False


class LazyCompletion:
    """The completion of an op on a ``StreamMarks`` stream: resolved to a marker on first use, then kept."""

    __slots__ = ("_marks", "_number", "_real")

    def __init__(self, marks: StreamMarks, number: int) -> None:
        self._marks, self._number, self._real = marks, number, None

    def resolve(self) -> Completion:
        """The marker standing for this op (recorded now if none covers it yet)."""
        real = self._real
        if real is None:
            real = self._real = self._marks.cover(self._number)
        return real

    def done(self) -> bool:
        return self.resolve().done()

    def wait(self) -> None:
        self.resolve().wait()

    def times_ns(self) -> tuple[int, int] | None:
        return None  # never timed: timed ops record their own events


class PinnedArray(np.ndarray):
    """A NumPy array over page-locked host memory; ``pinned_owner`` keeps the backend's allocation alive."""

    pinned_owner: Any = None
    address = 0  # its data pointer once asked (``host_address``); a view starts again at 0

    def __array_finalize__(self, obj: Any) -> None:
        self.pinned_owner = getattr(obj, "pinned_owner", None)


def host_address(array: np.ndarray) -> int:
    """The address of ``array``'s first byte. A PinnedArray remembers it (an array's data never moves; a view is a
    new object): ``ndarray.ctypes.data`` costs about 1 µs, as much as the rest of a small async copy's launch."""
    if type(array) is PinnedArray:
        address = array.address
        if not address:
            address = array.address = array.ctypes.data
        return address
    return array.ctypes.data


def wrap_pinned(raw: np.ndarray, owner: Any) -> PinnedArray:
    """View ``raw`` as a PinnedArray holding ``owner`` (the allocation) alive for as long as any view lives."""
    arr = raw.view(PinnedArray)
    arr.pinned_owner = owner
    return arr


class BackendDevice(ABC):
    """One opened device. Streams are opaque objects created here; buffers are opaque handles."""

    info: DeviceInfo
    caps: Caps

    def lacks_type(self, dtype: str) -> str:
        """Why this device's kernels cannot compute with the element type named ``dtype`` ("float16", "bfloat16",
        "float64", "int64" ...): what its kernel language or the device lacks; "" where they can."""
        return ""

    @abstractmethod
    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes; where ``caps.memory_free_known`` is False the caller estimates free itself."""

    def release_cached(self) -> int:
        """Give the memory a backend caches for its next allocations back to the driver; the bytes given back (here
        none: a backend without such a cache)."""
        return 0

    @abstractmethod
    def alloc(self, nbytes: int) -> Any:
        """Allocate ``nbytes`` of device memory; raise OutOfMemory when it does not fit."""

    @abstractmethod
    def free(self, handle: Any) -> None:
        """Release an allocation; the caller has waited for every op that used it."""

    @abstractmethod
    def empty_pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A host array in page-locked memory (or an ordinary array where the backend has none)."""

    @abstractmethod
    def is_pinned(self, array: np.ndarray) -> bool:
        """True when ``array`` lives in page-locked memory this device can copy from asynchronously."""

    @abstractmethod
    def create_stream(self) -> Any:
        """A new stream that never blocks on other streams."""

    @abstractmethod
    def destroy_stream(self, stream: Any) -> None:
        """Release a stream after its work is done."""

    @abstractmethod
    def copy_h2d(self, dst: Any, offset: int, src: np.ndarray, stream: Any, timed: bool) -> Completion:
        """Enqueue host → device; ``src`` is C-contiguous and must stay alive until done."""

    @abstractmethod
    def copy_d2h(self, dst: np.ndarray, src: Any, offset: int, stream: Any, timed: bool) -> Completion:
        """Enqueue device → host into the C-contiguous ``dst``."""

    @abstractmethod
    def copy_d2d(
        self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int, stream: Any, timed: bool
    ) -> Completion:
        """Enqueue a device → device copy of ``nbytes``."""

    @abstractmethod
    def fill(self, dst: Any, nbytes: int, byte: int, stream: Any, timed: bool) -> Completion:
        """Enqueue a memset of the first ``nbytes`` of ``dst`` to ``byte``."""

    @abstractmethod
    def record(self, stream: Any) -> Completion:
        """Enqueue a marker that completes when everything before it on ``stream`` has."""

    @abstractmethod
    def wait_event(self, stream: Any, completion: Completion) -> None:
        """Make ``stream`` wait (on the device, not the host) until ``completion`` is done."""

    @abstractmethod
    def synchronize_stream(self, stream: Any) -> None:
        """Block the host until ``stream`` is empty."""

    @abstractmethod
    def compile(self, source: Any, name: str, options: Sequence[str]) -> Any:
        """Build kernel ``name`` from ``source``; raise CompileError with the compiler's log."""

    @abstractmethod
    def launch(self, kernel: Any, grid: Dims, block: Dims, args: Sequence[Any], stream: Any, timed: bool) -> Completion:
        """Enqueue a kernel; ``args`` holds BufferArg (or what ``kernel_arg`` made of one) and NumPy scalars."""

    def prepare_launch(self, kernel: Any, grid: Dims, block: Dims, args: Sequence[Any]) -> Any:
        """A launch checked and converted once, which ``launch_prepared`` enqueues untimed as often as asked: the
        front end repeats launches through it. Here, the arguments of ``launch`` as they are."""
        return (kernel, grid, block, args)

    def launch_prepared(self, prepared: Any, stream: Any) -> Completion:
        """Enqueue a launch from ``prepare_launch`` on ``stream``, untimed (traced launches go through ``launch``)."""
        kernel, grid, block, args = prepared
        return self.launch(kernel, grid, block, args, stream, False)

    def prepare_varying(self, kernel: Any, grid: Dims, block: Dims, types: Sequence[type]) -> Any:
        """Slots for launches of ``kernel`` with this grid and block whose arguments (converted, as ``launch`` takes
        them) have these types and change from call to call, for ``launch_varying``; None (here) where the backend
        has no such path: the front end then launches through ``launch``."""
        return None

    def launch_varying(self, varying: Any, stream: Any, values: Sequence[Any]) -> Completion:
        """Enqueue a launch from ``prepare_varying`` with ``values`` (of its types) on ``stream``, untimed."""
        raise NotImplementedError(f"{type(self).__name__} prepares no varying launches")

    def kernel_arg(self, arg: BufferArg) -> Any:
        """What ``launch`` takes for a buffer, made once per buffer by the front end (launch still takes BufferArg)."""
        return arg

    def kernel_limits(self) -> KernelLimits:
        """The largest block this device runs; launches past it are refused before they reach the driver."""
        return PORTABLE_LIMITS

    def occupancy_properties(self) -> dict[str, int]:
        """The device's limits on resident work as ``cudaDeviceProp`` names them (``multiProcessorCount``,
        ``regsPerMultiprocessor`` ...), from which a trace computes theoretical occupancy; empty where the backend
        has no such model (here)."""
        return {}

    def kernel_resources(self, kernel: Any) -> tuple[int, int]:
        """(registers per thread, static shared bytes per block) of a compiled ``kernel``, -1 where the backend does
        not say (here); asked once per kernel, at its first traced launch."""
        return -1, -1

    # Peer copies (Buffer.copy_from between two devices of this backend). The front end has already made ``stream``
    # wait (``wait_event``) for the source buffer's unfinished ops, so ``wait_event`` must take completions of the
    # backend's other devices.
    def peer_route(self, src: BackendDevice) -> PeerRoute:
        """How ``copy_peer`` from ``src`` travels; asked once per copy, so cache what it costs to learn."""
        return PeerRoute(direct=False, possible=False)

    def copy_peer(
        self, dst: Any, src_device: BackendDevice, src: Any, nbytes: int, stream: Any, timed: bool
    ) -> Completion:
        """Enqueue on ``stream`` a copy of ``nbytes`` from ``src`` (a buffer of ``src_device``) into ``dst``, after the
        work enqueued on ``stream`` before it.

        This default stages through host memory and blocks the caller until the copy is done (waiting for
        ``stream`` first); its span covers only the write into ``dst``. Backends override it with an enqueued copy.
        """
        self.synchronize_stream(stream)
        host = np.empty(nbytes, np.uint8)
        if nbytes:
            side = src_device.create_stream()
            try:
                src_device.copy_d2h(host, src, 0, side, False).wait()
            finally:
                src_device.destroy_stream(side)
        completion = self.copy_h2d(dst, 0, host, stream, timed)
        completion.wait()
        return completion

    @abstractmethod
    def clock_sample(self) -> ClockSample:
        """Read the device clock against the host clock; used once per trace to align them."""

    # Native graphs (``caps.graphs == "native"``); elsewhere graphs.py records and re-issues the calls itself.
    def begin_capture(self, stream: Any) -> None:
        """Start recording ``stream``'s work into a graph instead of running it; must not synchronize."""
        raise NotImplementedError(f"{self.info.backend} has no native graphs")

    def end_capture(self, stream: Any) -> Any:
        """Stop recording and return the launchable graph."""
        raise NotImplementedError(f"{self.info.backend} has no native graphs")

    def launch_graph(self, graph: Any, stream: Any, timed: bool) -> Completion:
        """Enqueue one replay of ``graph`` on ``stream``."""
        raise NotImplementedError(f"{self.info.backend} has no native graphs")

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing of their own
        """Release the device's own resources (streams and buffers are released by the front end first)."""


class Backend(ABC):
    """A registered backend: finds its devices and opens them."""

    name: str

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """(True, "") when the backend's library imports and a driver answers; else (False, why)."""

    @abstractmethod
    def devices(self) -> list[DeviceInfo]:
        """Every device this backend can open, in index order."""

    @abstractmethod
    def open(self, index: int) -> BackendDevice:
        """Open device ``index``."""


def pick_device(found: Sequence[T], index: int, owner: str, noun: str = "devices") -> T:
    """Entry ``index`` of what a backend lists for ``open``; InvalidArgument when there is none, worded
    "{owner} has {len(found)} {noun}; index {index} does not exist"."""
    if not 0 <= index < len(found):
        raise InvalidArgument(f"{owner} has {len(found)} {noun}; index {index} does not exist")
    return found[index]
