"""A CUDA (or HIP) device through CuPy: buffers from CuPy's pool (``pool.py``), streams, pooled events, NVRTC kernels.

Timed ops are bracketed by two pooled CUDA events and measured against a per-device epoch event; this is the
fallback timing source (CUPTI, used by the trace when present, is exact). Copies from pageable host memory are staged
through pinned chunks filled by several threads (``staging.py``), much faster than the driver's own pageable path.
The ROCm backend (``backends/rocm.py``) runs this code with CuPy's HIP build.

While a persistent kernel runs (``persistent/``) nothing here may wait for the whole device, which would then wait
forever: cudaFree (of the arena) and cudaFreeHost are deferred until the last one stops, and compiling is refused, as
loading a new module may synchronize the context (lazy loading). All three were seen waiting for a looping kernel on
an H200 (benchmarks/probes/persistent_probe.py); a buffer's free gives its block to the pool, with no CUDA call.
Memory allocated meanwhile comes from the arena allocated just before the first one launched (``arena.py``: the
kernel may read it, as CUDA promises), and once that is full from cudaMallocAsync on a private stream, freed
stream-ordered (a running kernel may not read that).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from struct import pack_into
from typing import Any

import numpy as np

from ...errors import CompileError, InvalidArgument, OutOfMemory
from ..base import (
    PORTABLE_LIMITS,
    BackendDevice,
    BufferArg,
    Caps,
    ClockSample,
    DeviceInfo,
    DoneCompletion,
    KernelLimits,
    LazyCompletion,
    PeerRoute,
    PinnedArray,
    StreamMarks,
    host_address,
    wrap_pinned,
)
from .arena import Arena
from .events import CudaCompletion, Epoch, EventPool, load_cupy, measure_epoch
from .launch import CONTEXT_ERROR, OCCUPANCY_PROPERTIES, PackedLaunch, PreparedLaunch, packed, prepare
from .peers import enable_peer
from .pool import BufferPool
from .staging import Stager

CAPS = Caps(
    concurrent_streams=True,
    pinned_memory=True,
    memory_free_known=True,
    graphs="native",
    timestamps="events",
    kernel_language="cuda",
    device_pointers=True,
)
_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind
_STAGE_MIN = 1 << 20  # pageable copies smaller than this go straight to the driver
_ATTR_MEMORY_POOLS = 115  # cudaDevAttrMemoryPoolsSupported: cudaMallocAsync works
_HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped (hipHostMallocMapped): the device reads and writes it directly
_FUNC_SHARED_SIZE_BYTES, _FUNC_NUM_REGS = 1, 4  # CUfunction_attribute: static shared bytes, registers per thread
IN_GRAPH = DoneCompletion()  # what an op enqueued during stream capture returns: it runs only when the graph does


class _Pinned:
    """Owner of one pinned host allocation (CuPy's pinned memory pointer)."""

    def __init__(self, mem: Any) -> None:
        self.mem = mem


class CudaDevice(BackendDevice):
    """One CUDA (or HIP) device through CuPy."""

    def __init__(self, info: DeviceInfo, caps: Caps) -> None:
        cupy = load_cupy()
        self.info, self.caps = info, caps
        self._id = info.index
        self._rt = cupy.cuda.runtime
        self._get_device = self._rt.getDevice
        self._rt.setDevice(self._id)
        self._timed_events = EventPool(timing=True)
        self._plain_events = EventPool(timing=False)
        self._pools = (self._timed_events, self._plain_events)
        self._clock_stream = cupy.cuda.Stream(non_blocking=True)
        self._epoch: Epoch | None = None
        self._stager = Stager(lambda n: load_cupy().cuda.alloc_pinned_memory(n), self._plain_events.take)
        self._capturing: set[int] = set()  # pointers of streams in stream capture: no timing events recorded there
        self._buffers = BufferPool(cupy)
        self._persistent_lock = threading.Lock()
        self._persistent = 0  # persistent kernels running now: nothing may wait for the whole device meanwhile
        self._deferred: list[tuple[str, int]] = []  # ("device" | "host", pointer) freed once none runs
        self._async_ptrs: dict[int, tuple[int, int]] = {}  # cudaMallocAsync'd while one ran -> (bytes, sequence)
        self._async_seq = 0  # counts those allocations: a kernel launched after one may read it
        self._arena: Arena | None = None  # allocated before a persistent kernel's launch, suballocated while one runs
        self._side_stream: Any = None
        self._limits: KernelLimits | None = None
        self._occupancy: dict[str, int] | None = None  # occupancy_properties, read once
        self._peer_routes: dict[int, PeerRoute] = {}  # source device ordinal -> how copies from it travel
        self._marks: dict[int, StreamMarks] = {}  # stream pointer -> its untimed ops' on-demand completions
        #: (CuPy function, grid, block, argument types) -> slots its launches are packed into (None: CuPy launches it)
        self._packed: dict[tuple, PackedLaunch | None] = {}
        # repeated launches go straight to cuLaunchKernel (CUDA only: HIP launches through CuPy)
        self._driver = None if self._rt.is_hip else cupy.cuda.driver
        self.clock_sample()

    def _use(self) -> None:
        if self._rt.getDevice() != self._id:
            self._rt.setDevice(self._id)

    # ------------------------------------------------------------------ memory
    def memory_info(self) -> tuple[int, int]:
        self._use()
        free, total = self._rt.memGetInfo()
        return int(free) + self._buffers.cached_bytes, int(total)  # the pool's unused blocks are free to our allocs

    def release_cached(self) -> int:
        self._use()  # nothing while a persistent kernel runs: cudaFree would wait for it, and it never ends
        return 0 if self._persistent else self._buffers.release()

    def alloc(self, nbytes: int) -> int:
        if nbytes == 0:
            return 0
        self._use()
        try:
            if self._persistent:
                with self._persistent_lock:
                    piece = self._arena.alloc(nbytes) if self._arena is not None else None
                if piece is not None:
                    return piece
                return self._alloc_beside_persistent(nbytes)
            pointer = self._buffers.alloc(nbytes)
            if pointer is not None:
                return pointer
        except self._rt.CUDARuntimeError as exc:
            if "MemoryAllocation" not in str(exc) and "out of memory" not in str(exc).lower():
                raise
        free, total = self.memory_info()
        raise OutOfMemory(nbytes, free, total, f"{self.info.backend}:{self._id}")

    def free(self, handle: int) -> None:
        if not handle or self._buffers.give_back(handle):  # back to the pool: no CUDA call, no wait
            return
        self._use()
        with self._persistent_lock:
            arena = self._arena
            if arena is not None and arena.owns(handle):
                arena.free(handle)
                if not arena and not self._persistent:  # its last piece, and no kernel may read it any longer
                    self._arena = None
                    self._rt.free(arena.base)
                return
            if self._async_ptrs.pop(handle, None) is None:
                raise InvalidArgument(f"{handle:#x} is no buffer of {self.info.backend}:{self._id}")
        self._rt.freeAsync(handle, self._side().ptr)  # made beside a persistent kernel: stream-ordered, no wait

    def _side(self) -> Any:
        if self._side_stream is None:
            self._side_stream = load_cupy().cuda.Stream(non_blocking=True)
        return self._side_stream

    def _alloc_beside_persistent(self, nbytes: int) -> int:
        """cudaMallocAsync on a private stream: the stream-ordered allocator never waits for other streams' kernels."""
        rt = self._rt
        pools = not rt.is_hip and rt.deviceGetAttribute(_ATTR_MEMORY_POOLS, self._id)
        if not pools:
            raise InvalidArgument(
                f"cannot allocate on {self.info.backend}:{self._id} while a persistent kernel runs: its allocator may "
                "wait for every kernel, and that one never ends; allocate before starting it, or stop() it first"
            )
        side = self._side()
        ptr = int(rt.mallocAsync(nbytes, side.ptr))
        side.synchronize()  # the memory is usable from every stream once this private stream has reached it
        with self._persistent_lock:
            self._async_seq += 1
            self._async_ptrs[ptr] = (nbytes, self._async_seq)
        return ptr

    # ------------------------------------------------------------------ persistent kernels (persistent/)
    def alloc_mapped(self, nbytes: int) -> tuple[np.ndarray, int, int]:
        """Zeroed page-locked host memory the device reads and writes directly: (host view, host ptr, device ptr)."""
        self._use()
        host = int(self._rt.hostAlloc(nbytes, _HOST_ALLOC_MAPPED))
        try:
            try:
                device = int(self._rt.hostGetDevicePointer(host, 0))
            except (AttributeError, TypeError):  # not in this CuPy: the driver reports the mapping's device address
                device = int(self._rt.pointerGetAttributes(host).devicePointer)
        except Exception:
            self._rt.freeHost(host)
            raise
        view = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(host), dtype=np.uint8)
        view[:] = 0
        return view, host, device

    def free_mapped(self, host: int) -> None:
        """Release memory from ``alloc_mapped``; deferred while any persistent kernel still runs."""
        with self._persistent_lock:
            if self._persistent:
                self._deferred.append(("host", host))
                return
        self._use()
        self._rt.freeHost(host)

    def persistent_started(self, arena_bytes: int) -> int:
        """A persistent kernel is about to launch: from now on frees are deferred and compiles refused. The first of
        several running gets an arena of ``arena_bytes`` (made now, before its launch; kept while pieces of it live).
        Returns the mark ``persistent_may_read`` takes."""
        self._use()
        with self._persistent_lock:
            if self._arena is None and not self._persistent and arena_bytes > 0:
                try:
                    self._arena = Arena(int(self._rt.malloc(arena_bytes)), arena_bytes)
                except self._rt.CUDARuntimeError:
                    free, total = self.memory_info()
                    raise OutOfMemory(
                        arena_bytes,
                        free,
                        total,
                        f"{self.info.backend}:{self._id} (a persistent kernel's arena: pass a smaller arena_bytes)",
                    ) from None
            self._persistent += 1
            self._buffers.keep_frees = True  # without the caching pool a free is a cudaFree, which could wait for it
            return self._async_seq

    def persistent_may_read(self, pointer: int, mark: int) -> bool:
        """Whether a persistent kernel launched at ``mark`` may read ``pointer``: anything but memory that
        cudaMallocAsync gave after its launch (CUDA promises a kernel only memory allocated before it)."""
        with self._persistent_lock:
            if self._arena is not None and self._arena.owns(pointer):
                return True
            for start, (nbytes, seq) in self._async_ptrs.items():
                if start <= pointer < start + nbytes:
                    return seq <= mark
        return True

    def arena_info(self) -> tuple[int, int, int]:
        """The persistent kernels' arena: (bytes, bytes in use, largest free piece); zeros where there is none."""
        with self._persistent_lock:
            arena = self._arena
            return (arena.size, arena.used, arena.largest_hole) if arena is not None else (0, 0, 0)

    def persistent_stopped(self) -> None:
        """A persistent kernel has exited; once none runs, release what was deferred meanwhile."""
        with self._persistent_lock:
            self._persistent -= 1
            if self._persistent:
                return
            deferred, self._deferred = self._deferred, []
            if self._arena is not None and not self._arena:  # no piece left: release it with the rest
                deferred.append(("device", self._arena.base))
                self._arena = None
        self._use()
        self._buffers.stop_keeping()
        for kind, ptr in deferred:
            (self._rt.free if kind == "device" else self._rt.freeHost)(ptr)

    def device_pointer(self, handle: int) -> int:
        return int(handle)

    def empty_pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        self._use()
        count = int(np.prod(shape, dtype=np.int64))
        mem = load_cupy().cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))
        raw = np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)
        return wrap_pinned(raw, _Pinned(mem))

    def is_pinned(self, array: np.ndarray) -> bool:
        if array.nbytes == 0:
            return True
        if isinstance(array, PinnedArray) and array.pinned_owner is not None:
            return True  # ours (empty_pinned): no driver query needed
        try:
            attrs = self._rt.pointerGetAttributes(array.ctypes.data)
        except self._rt.CUDARuntimeError:
            return False
        return int(attrs.type) == 1  # cudaMemoryTypeHost: page-locked (ours, CuPy's, PyTorch's or registered)

    # ------------------------------------------------------------------ streams and events
    def create_stream(self) -> Any:
        self._use()
        stream = load_cupy().cuda.Stream(non_blocking=True)
        self._marks[stream.ptr] = StreamMarks(lambda: self._mark(stream))
        return stream

    def destroy_stream(self, stream: Any) -> None:
        stream.synchronize()
        marks = self._marks.pop(stream.ptr, None)
        if marks is not None:
            marks.closed = True  # its ops are done; a completion asked for later records nothing

    def _begin(self, stream: Any, timed: bool) -> Any:
        if not timed:
            return None
        start = self._timed_events.take()
        start.record(stream)
        return start

    def _finish(self, stream: Any, start: Any) -> Any:
        ptr = stream.ptr
        if self._capturing and ptr in self._capturing:
            return IN_GRAPH  # an event recorded now would be a capture node that no one may query
        if start is None:  # untimed: no event now; one is recorded on this stream when the completion is asked for
            marks = self._marks.get(ptr)
            if marks is not None:
                number = marks.issued = next(marks.numbers)  # StreamMarks.enqueued, inlined
                return LazyCompletion(marks, number)
            return self._mark(stream)
        end = self._timed_events.take()
        end.record(stream)
        return CudaCompletion(end, start, self._epoch, self._pools)

    def _mark(self, stream: Any) -> CudaCompletion:
        """An event recorded on ``stream`` now (any thread may ask: the harvester, a waiting stream's thread)."""
        self._use()
        end = self._plain_events.take()
        end.record(stream)
        return CudaCompletion(end, None, None, self._pools)

    def record(self, stream: Any) -> CudaCompletion:
        self._use()
        if self._capturing and stream.ptr in self._capturing:
            return IN_GRAPH
        return self._mark(stream)  # an explicit marker: recorded now, not on demand

    def wait_event(self, stream: Any, completion: Any) -> None:
        if type(completion) is LazyCompletion:
            completion = completion.resolve()  # may record on another device's stream
            self._use()
        if isinstance(completion, CudaCompletion):
            stream.wait_event(completion.end)
        else:
            completion.wait()

    def synchronize_stream(self, stream: Any) -> None:
        stream.synchronize()

    # ------------------------------------------------------------------ copies
    def copy_h2d(self, dst: int, offset: int, src: np.ndarray, stream: Any, timed: bool) -> CudaCompletion:
        if self._get_device() != self._id:  # _use, inlined (small copies are a launch path)
            self._rt.setDevice(self._id)
        start = self._begin(stream, timed) if timed else None
        nbytes = src.nbytes
        if nbytes >= _STAGE_MIN and not self.is_pinned(src):
            self._stager.h2d(self._h2d_async, dst + offset, src, stream)
        elif nbytes:
            address = src.address if type(src) is PinnedArray else 0  # host_address, inlined for pinned memory
            self._rt.memcpyAsync(dst + offset, address or host_address(src), nbytes, _H2D, stream.ptr)
        if start is None and not self._capturing:  # _finish's lazy completion, inlined (a launch path)
            marks = self._marks.get(stream.ptr)
            if marks is not None:
                number = marks.issued = next(marks.numbers)
                return LazyCompletion(marks, number)
        return self._finish(stream, start)

    def copy_d2h(self, dst: np.ndarray, src: int, offset: int, stream: Any, timed: bool) -> CudaCompletion:
        if self._get_device() != self._id:  # _use, inlined
            self._rt.setDevice(self._id)
        start = self._begin(stream, timed) if timed else None
        nbytes = dst.nbytes
        if nbytes >= _STAGE_MIN and not self.is_pinned(dst):
            self._stager.d2h(self._d2h_async, dst, src + offset, stream)
        elif nbytes:
            address = dst.address if type(dst) is PinnedArray else 0  # host_address, inlined for pinned memory
            self._rt.memcpyAsync(address or host_address(dst), src + offset, nbytes, _D2H, stream.ptr)
        if start is None and not self._capturing:  # _finish's lazy completion, inlined (a launch path)
            marks = self._marks.get(stream.ptr)
            if marks is not None:
                number = marks.issued = next(marks.numbers)
                return LazyCompletion(marks, number)
        return self._finish(stream, start)

    def copy_d2d(
        self, dst: int, dst_offset: int, src: int, src_offset: int, nbytes: int, stream: Any, timed: bool
    ) -> CudaCompletion:
        self._use()
        start = self._begin(stream, timed)
        if nbytes:
            self._rt.memcpyAsync(dst + dst_offset, src + src_offset, nbytes, _D2D, stream.ptr)
        return self._finish(stream, start)

    def fill(self, dst: int, nbytes: int, byte: int, stream: Any, timed: bool) -> CudaCompletion:
        self._use()
        start = self._begin(stream, timed)
        if nbytes:
            self._rt.memsetAsync(dst, byte, nbytes, stream.ptr)
        return self._finish(stream, start)

    # ------------------------------------------------------------------ peer copies
    def peer_route(self, src: BackendDevice) -> PeerRoute:
        """Direct where ``cudaDeviceCanAccessPeer`` says so and peer access could be enabled (both ways, once per
        pair); otherwise ``cudaMemcpyPeerAsync`` stages the copy through host memory in the driver."""
        if not isinstance(src, CudaDevice):
            return PeerRoute(False, False)
        route = self._peer_routes.get(src._id)
        if route is None:
            possible = bool(self._rt.deviceCanAccessPeer(self._id, src._id))
            direct = possible and enable_peer(self._rt, self._id, src._id)
            if direct and self._rt.deviceCanAccessPeer(src._id, self._id):
                enable_peer(self._rt, src._id, self._id)
            self._use()
            route = self._peer_routes[src._id] = PeerRoute(direct, possible)
        return route

    def copy_peer(
        self, dst: int, src_device: BackendDevice, src: int, nbytes: int, stream: Any, timed: bool
    ) -> CudaCompletion:
        if not isinstance(src_device, CudaDevice):
            return super().copy_peer(dst, src_device, src, nbytes, stream, timed)
        self._use()
        start = self._begin(stream, timed)
        if nbytes:
            self._rt.memcpyPeerAsync(dst, self._id, src, src_device._id, nbytes, stream.ptr)
        return self._finish(stream, start)

    def _h2d_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._rt.memcpyAsync(dst, src, nbytes, _H2D, stream.ptr)

    def _d2h_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._rt.memcpyAsync(dst, src, nbytes, _D2H, stream.ptr)

    # ------------------------------------------------------------------ kernels
    def compile(self, source: Any, name: str, options: Sequence[str]) -> Any:
        cupy = load_cupy()
        if not isinstance(source, str):
            raise InvalidArgument(f"the {self.info.backend} backend compiles CUDA C source (a str), not {type(source)}")
        if self._persistent:
            raise InvalidArgument(
                f"cannot compile {name!r} while a persistent kernel runs on {self.info.backend}:{self._id}: loading "
                "a module may wait for every running kernel (lazy loading), and that one never ends; compile "
                "before starting it, or stop() it first"
            )
        self._use()
        try:
            module = cupy.RawModule(code=source, options=tuple(options))
            kernel = module.get_function(name)
            kernel.compile() if hasattr(kernel, "compile") else None
        except cupy.cuda.compiler.CompileException as exc:
            raise CompileError(name, exc.get_message() if hasattr(exc, "get_message") else str(exc), source) from None
        except cupy.cuda.driver.CUDADriverError as exc:
            raise CompileError(
                name, f'no kernel named {name!r} in the module ({exc}); use extern "C"', source
            ) from None
        return getattr(kernel, "kernel", kernel)

    def kernel_limits(self) -> KernelLimits:
        if self._limits is None:  # the device's properties: read once, no synchronization
            props, portable = self._rt.getDeviceProperties(self._id), PORTABLE_LIMITS
            x, y, z = (int(d) for d in props.get("maxThreadsDim", portable.dims))
            threads = int(props.get("maxThreadsPerBlock", portable.threads))
            self._limits = KernelLimits(threads, (x, y, z), int(props.get("sharedMemPerBlock", portable.shared_bytes)))
        return self._limits

    def occupancy_properties(self) -> dict[str, int]:
        if self._occupancy is None:  # read once: each trace asks at its first op on the device
            props = {} if self._rt.is_hip else self._rt.getDeviceProperties(self._id)  # ROCm: not CUDA's model
            self._occupancy = {k: int(v) for k, v in props.items() if k in OCCUPANCY_PROPERTIES and isinstance(v, int)}
        return self._occupancy

    def kernel_resources(self, kernel: Any) -> tuple[int, int]:
        driver = load_cupy().cuda.driver
        self._use()
        try:  # cuFuncGetAttribute: what the compiler gave the function (registers per thread: CUDA's only)
            shared = int(driver.funcGetAttribute(_FUNC_SHARED_SIZE_BYTES, kernel.ptr))
            registers = -1 if self._rt.is_hip else int(driver.funcGetAttribute(_FUNC_NUM_REGS, kernel.ptr))
        except Exception:  # noqa: BLE001 - a function CuPy made otherwise: its resources are then unknown
            return -1, -1
        return registers, shared

    def launch(
        self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: Sequence[Any], stream: Any, timed: bool
    ) -> CudaCompletion:
        self._use()
        values = tuple([np.uint64(a.handle) if type(a) is BufferArg else a for a in args])
        start = self._begin(stream, timed) if timed else None
        slots = self.prepare_varying(kernel, grid, block, tuple(map(type, values)))
        if slots is None:
            kernel(grid, block, values, stream=stream)
        else:
            try:
                slots.launch(stream.ptr, values)
            except self._driver.CUDADriverError as exc:
                if exc.status != CONTEXT_ERROR:
                    raise
                self._rt.setDevice(self._id)  # a thread whose first CUDA call this is: make the context current
                slots.launch(stream.ptr, values)
        return self._finish(stream, start)

    def prepare_launch(self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: Sequence[Any]) -> Any:
        if self._driver is not None and not self._capturing:
            prepared = prepare(self._driver.launchKernel, kernel.ptr, grid, block, args)
            if prepared is not None:
                return prepared
        return super().prepare_launch(kernel, grid, block, args)

    def launch_prepared(self, prepared: Any, stream: Any) -> Any:
        if type(prepared) is not PreparedLaunch:
            return super().launch_prepared(prepared, stream)
        if self._get_device() != self._id:  # _use, inlined (this is the launch path)
            self._rt.setDevice(self._id)
        ptr = stream.ptr
        try:
            prepared.call(ptr, prepared.params, 0)
        except self._driver.CUDADriverError as exc:
            if exc.status != CONTEXT_ERROR:
                raise
            self._rt.setDevice(self._id)  # a thread whose first CUDA call this is: make the context current
            prepared.call(ptr, prepared.params, 0)
        if self._capturing and ptr in self._capturing:
            return IN_GRAPH
        marks = self._marks.get(ptr)
        if marks is None:
            return self._mark(stream)
        number = marks.issued = next(marks.numbers)  # StreamMarks.enqueued, inlined
        return LazyCompletion(marks, number)

    def prepare_varying(self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], types: Sequence[type]) -> Any:
        if self._driver is None or self._capturing:
            return None
        key = (kernel, grid, block, *types)
        slots = self._packed.get(key, False)
        if slots is False:  # once per kernel, dims and argument types: None where CuPy's call must launch it
            if len(self._packed) >= 1024:
                self._packed.clear()
            slots = self._packed[key] = packed(self._driver.launchKernel, kernel.ptr, grid, block, key[3:])
        return slots

    def launch_varying(self, varying: Any, stream: Any, values: Sequence[Any]) -> Any:
        if self._get_device() != self._id:  # _use, inlined (this is the launch path)
            self._rt.setDevice(self._id)
        ptr = stream.ptr
        try:
            with varying.lock:  # PackedLaunch.launch, inlined (the launch path)
                pack_into(varying.fmt, varying.view, 0, *values)
                varying.call(ptr, varying.params, 0)
        except self._driver.CUDADriverError as exc:
            if exc.status != CONTEXT_ERROR:
                raise
            self._rt.setDevice(self._id)  # a thread whose first CUDA call this is: make the context current
            varying.launch(ptr, values)
        if not self._capturing:  # _finish's lazy completion, inlined (the launch path)
            marks = self._marks.get(ptr)
            if marks is not None:
                number = marks.issued = next(marks.numbers)
                return LazyCompletion(marks, number)
        return self._finish(stream, None)

    def kernel_arg(self, arg: BufferArg) -> np.uint64:
        """A buffer as a kernel argument: its device pointer (made once per buffer)."""
        return np.uint64(arg.handle)

    # ------------------------------------------------------------------ graphs
    def begin_capture(self, stream: Any) -> None:
        """Relaxed mode, so that other threads (a trace's harvester) may go on querying their events meanwhile."""
        self._use()
        marks = self._marks.get(stream.ptr)
        if marks is not None:
            marks.freeze()  # one marker for every op so far: none may be recorded on the stream while it captures
        self._capturing.add(stream.ptr)
        try:
            stream.begin_capture(self._rt.streamCaptureModeRelaxed)
        except BaseException:
            self._capturing.discard(stream.ptr)
            if marks is not None:
                marks.thaw()
            raise

    def end_capture(self, stream: Any) -> Any:
        self._use()
        try:
            return stream.end_capture()
        finally:
            self._capturing.discard(stream.ptr)
            marks = self._marks.get(stream.ptr)
            if marks is not None:
                marks.thaw()

    def launch_graph(self, graph: Any, stream: Any, timed: bool) -> CudaCompletion:
        self._use()
        start = self._begin(stream, timed)
        graph.launch(stream)
        return self._finish(stream, start)

    # ------------------------------------------------------------------ clock
    def clock_sample(self) -> ClockSample:
        """Record a new epoch event on an idle private stream; its completion time is bracketed on the host."""
        self._use()
        best = self._epoch = measure_epoch(self._clock_stream)
        return ClockSample(best.host_ns, best.host_ns, best.error_ns)

    def close(self) -> None:
        self._stager.close()
        self._use()  # the pool of this device: CuPy's pool lets go of the current device's blocks
        self._buffers.release()
        if self._side_stream is not None:
            self._side_stream.synchronize()
