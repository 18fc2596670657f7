"""The OpenCL backend (PyOpenCL): one in-order profiling queue per stream, timestamps from the device's own events.

Devices are numbered across all platforms in the order PyOpenCL lists them; ``gw.devices()`` shows which index is
which, so pick the platform and device by name, never "the first one". Free memory is not part of core OpenCL:
``Caps.memory_free_known`` is False and the front end reports total minus what gpuworkbench holds.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CompileError, InvalidArgument, OutOfMemory
from .base import (
    Backend,
    BackendDevice,
    BufferArg,
    Caps,
    ClockSample,
    DeviceInfo,
    Dims,
    KernelLimits,
    PinnedArray,
    pick_device,
    wrap_pinned,
)

CAPS = Caps(concurrent_streams=True, pinned_memory=True, timestamps="profiling", kernel_language="opencl")


def _cl() -> Any:
    import pyopencl as cl

    return cl


class _ClCompletion:
    """A PyOpenCL event: status polled without blocking, START/END read from its profiling info."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def done(self) -> bool:
        status = self.event.command_execution_status
        if status < 0:
            raise RuntimeError(f"OpenCL command failed with status {status}")
        return status == 0

    def wait(self) -> None:
        self.event.wait()

    def times_ns(self) -> tuple[int, int] | None:
        try:
            return int(self.event.profile.start), int(self.event.profile.end)
        except Exception:  # noqa: BLE001 - profiling info missing (not done, or a marker on some platforms)
            return None


class _PeerCompletion(_ClCompletion):
    """A peer copy staged through the host: the read on the source device, then the write on this one (``event``).

    Its span runs from the read's start, moved onto this device's clock through both devices' clock samples, to the
    write's end: the time the destination stream was held by the copy."""

    __slots__ = ("read", "shift", "host")

    def __init__(self, write: Any, read: Any, shift: int, host: np.ndarray) -> None:
        super().__init__(write)
        self.read, self.shift, self.host = read, shift, host  # host: the staging array, alive until done

    def times_ns(self) -> tuple[int, int] | None:
        try:
            start, end = int(self.read.profile.start) + self.shift, int(self.event.profile.end)
            return min(start, int(self.event.profile.start)), end
        except Exception:  # noqa: BLE001 - profiling info missing, as in _ClCompletion
            return None


class _Queue:
    """A stream: an in-order command queue with profiling on."""

    def __init__(self, ctx: Any, device: Any) -> None:
        cl = _cl()
        self.queue = cl.CommandQueue(ctx, device, properties=cl.command_queue_properties.PROFILING_ENABLE)


class OpenCLDevice(BackendDevice):
    """One OpenCL device with its own context."""

    def __init__(self, info: DeviceInfo, cl_device: Any) -> None:
        cl = _cl()
        self.info, self.caps, self._dev = info, CAPS, cl_device
        self._ctx = cl.Context([cl_device])
        self._scratch_queue = cl.CommandQueue(
            self._ctx, cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE
        )
        self._scratch = cl.Buffer(self._ctx, cl.mem_flags.READ_WRITE, 64)
        self._max_alloc = int(cl_device.max_mem_alloc_size)
        self._held = 0
        self._pinned_ranges: dict[int, tuple[int, int]] = {}  # live pinned arrays' address ranges
        self._pinned_keys = itertools.count()
        self._lock = threading.Lock()
        self._clock_offset: int | None = None  # device ns - host ns at the last clock sample (peer copy spans)
        self._peer_queue: Any = None  # reads of this device's buffers for peer copies into other devices
        self._limits: KernelLimits | None = None

    def lacks_type(self, dtype: str) -> str:
        if dtype == "float64" and "cl_khr_fp64" not in self._dev.extensions.split():
            return "its device lacks cl_khr_fp64"
        return ""  # 16-bit floats are held as bits and converted by vload_half / vstore_half (core OpenCL C)

    def memory_info(self) -> tuple[int, int]:
        total = self.info.total_memory
        return total - self._held, total

    def alloc(self, nbytes: int) -> Any:
        cl = _cl()
        if nbytes == 0:
            return None
        with self._lock:
            free = self.info.total_memory - self._held
            if nbytes > free or nbytes > self._max_alloc:
                limit = f" (one allocation may be at most {self._max_alloc} B)" if nbytes > self._max_alloc else ""
                raise OutOfMemory(nbytes, free, self.info.total_memory, f"opencl:{self.info.index}{limit}")
            self._held += nbytes
        try:
            return cl.Buffer(self._ctx, cl.mem_flags.READ_WRITE, nbytes)
        except cl.Error as exc:
            with self._lock:
                self._held -= nbytes
            raise OutOfMemory(nbytes, free, self.info.total_memory, f"opencl:{self.info.index} ({exc})") from None

    def free(self, handle: Any) -> None:
        if handle is not None:
            with self._lock:
                self._held -= handle.size
            handle.release()

    def empty_pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        cl = _cl()
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = max(nbytes, 1)  # OpenCL maps no empty buffer: map one byte and view none of it
        buf = cl.Buffer(self._ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, size)
        mapped, _ = cl.enqueue_map_buffer(
            self._scratch_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (size,), np.uint8, is_blocking=True
        )
        pinned = wrap_pinned(mapped[:nbytes].view(dtype).reshape(shape), (self._ctx, buf, mapped))
        if nbytes:
            # Plain-ndarray views (np.ascontiguousarray, np.asarray) lose the subclass: is_pinned finds them by address
            # while the pinned array lives.
            key, start = next(self._pinned_keys), pinned.__array_interface__["data"][0]
            self._pinned_ranges[key] = (start, start + nbytes)
            weakref.finalize(pinned, self._pinned_ranges.pop, key, None)
        return pinned

    def is_pinned(self, array: np.ndarray) -> bool:
        node: Any = array
        while isinstance(node, np.ndarray):
            if isinstance(node, PinnedArray) and node.pinned_owner is not None:
                return node.pinned_owner[0] is self._ctx
            node = node.base
        if not array.nbytes or not array.flags.c_contiguous:
            return False
        low = array.__array_interface__["data"][0]
        high = low + array.nbytes
        return any(start <= low and high <= end for start, end in list(self._pinned_ranges.values()))

    def create_stream(self) -> _Queue:
        return _Queue(self._ctx, self._dev)

    def destroy_stream(self, stream: _Queue) -> None:
        stream.queue.finish()

    def _submit(self, stream: _Queue, event: Any) -> _ClCompletion:
        stream.queue.flush()  # without a flush, a polled command may never be submitted
        return _ClCompletion(event)

    def copy_h2d(self, dst: Any, offset: int, src: np.ndarray, stream: _Queue, timed: bool) -> _ClCompletion:
        cl = _cl()
        if src.nbytes == 0:
            return self.record(stream)
        return self._submit(stream, cl.enqueue_copy(stream.queue, dst, src, dst_offset=offset, is_blocking=False))

    def copy_d2h(self, dst: np.ndarray, src: Any, offset: int, stream: _Queue, timed: bool) -> _ClCompletion:
        cl = _cl()
        if dst.nbytes == 0:
            return self.record(stream)
        return self._submit(stream, cl.enqueue_copy(stream.queue, dst, src, src_offset=offset, is_blocking=False))

    def copy_d2d(
        self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int, stream: _Queue, timed: bool
    ) -> _ClCompletion:
        cl = _cl()
        if nbytes == 0:
            return self.record(stream)
        event = cl.enqueue_copy(stream.queue, dst, src, byte_count=nbytes, src_offset=src_offset, dst_offset=dst_offset)
        return self._submit(stream, event)

    def fill(self, dst: Any, nbytes: int, byte: int, stream: _Queue, timed: bool) -> _ClCompletion:
        cl = _cl()
        if nbytes == 0:
            return self.record(stream)
        return self._submit(stream, cl.enqueue_fill_buffer(stream.queue, dst, np.uint8(byte), 0, nbytes))

    def record(self, stream: _Queue) -> _ClCompletion:
        return self._submit(stream, _cl().enqueue_marker(stream.queue))

    def wait_event(self, stream: _Queue, completion: Any) -> None:
        if isinstance(completion, _ClCompletion):
            _cl().enqueue_barrier(stream.queue, wait_for=[self._local(completion.event)])
            stream.queue.flush()
        else:
            completion.wait()

    def _local(self, event: Any) -> Any:
        """``event`` itself when it belongs to this device's context; for another device's event (a peer copy), a
        user event of this context completed by its callback, so that no host thread waits."""
        cl = _cl()
        if event.context.int_ptr == self._ctx.int_ptr:
            return event
        mirror = cl.UserEvent(self._ctx)
        complete = cl.command_execution_status.COMPLETE
        event.set_callback(complete, lambda status: mirror.set_status(complete if status >= 0 else status))
        return mirror

    # ------------------------------------------------------------------ peer copies
    def copy_peer(
        self, dst: Any, src_device: BackendDevice, src: Any, nbytes: int, stream: _Queue, timed: bool
    ) -> _ClCompletion:
        """Through host memory, enqueued on both devices: a marker on ``stream``, the source's read after it (on its
        own peer queue), then the write on ``stream`` after the read; events chain across the two contexts by
        callbacks (``_local``), so nothing here blocks."""
        if not isinstance(src_device, OpenCLDevice):
            return super().copy_peer(dst, src_device, src, nbytes, stream, timed)
        cl = _cl()
        if nbytes == 0:
            return self.record(stream)
        shift = 0
        if timed:
            for dev in (self, src_device):
                if dev._clock_offset is None:
                    dev.clock_sample()
            shift = self._clock_offset - src_device._clock_offset
        marker = cl.enqueue_marker(stream.queue)
        stream.queue.flush()
        host = np.empty(nbytes, np.uint8)
        read_queue = src_device._reader()
        read = cl.enqueue_copy(read_queue, host, src, wait_for=[src_device._local(marker)], is_blocking=False)
        read_queue.flush()
        write = cl.enqueue_copy(stream.queue, dst, host, wait_for=[self._local(read)], is_blocking=False)
        stream.queue.flush()
        return _PeerCompletion(write, read, shift, host)

    def _reader(self) -> Any:
        with self._lock:
            if self._peer_queue is None:
                props = _cl().command_queue_properties.PROFILING_ENABLE
                self._peer_queue = _cl().CommandQueue(self._ctx, self._dev, properties=props)
            return self._peer_queue

    def synchronize_stream(self, stream: _Queue) -> None:
        stream.queue.finish()

    def compile(self, source: Any, name: str, options: Sequence[str]) -> Any:
        cl = _cl()
        if not isinstance(source, str):
            raise InvalidArgument(f"the OpenCL backend compiles OpenCL C source (a str), not {type(source).__name__}")
        program = cl.Program(self._ctx, source)
        try:
            program.build(options=list(options))
        except cl.Error as exc:
            log = ""
            try:
                log = program.get_build_info(self._dev, cl.program_build_info.LOG)
            except Exception:  # noqa: BLE001 - fall back to the exception text, which PyOpenCL fills with the log
                pass
            raise CompileError(name, log.strip() or str(exc), source) from None
        try:
            kernel = cl.Kernel(program, name)
        except cl.Error:
            names = program.get_info(cl.program_info.KERNEL_NAMES)
            raise CompileError(name, f"no kernel named {name!r} in the program (it has: {names})", source) from None
        return (kernel, threading.Lock())

    def launch(
        self, kernel: Any, grid: Dims, block: Dims, args: Sequence[Any], stream: _Queue, timed: bool
    ) -> _ClCompletion:
        cl = _cl()
        knl, lock = kernel
        values = [a.handle if type(a) is BufferArg else a for a in args]
        global_size = tuple(g * b for g, b in zip(grid, block))
        with lock:  # argument setting and enqueue must not interleave between threads
            try:
                knl.set_args(*values)
            except (cl.Error, TypeError) as exc:  # TypeError: too few or too many arguments
                raise InvalidArgument(
                    f"kernel {knl.function_name!r}: arguments do not fit its signature ({exc})"
                ) from None
            try:
                event = cl.enqueue_nd_range_kernel(stream.queue, knl, global_size, block)
            except cl.Error as exc:
                raise InvalidArgument(
                    f"kernel {knl.function_name!r}: {self.info.name} refused grid {grid} × block {block} "
                    f"(at most {self._dev.max_work_group_size} threads per block; {exc})"
                ) from None
        return self._submit(stream, event)

    def kernel_arg(self, arg: BufferArg) -> Any:
        """A buffer as a kernel argument: its cl.Buffer (made once per buffer)."""
        return arg.handle

    def kernel_limits(self) -> KernelLimits:
        if self._limits is None:  # the device's properties: read once (the library asks on every row op)
            dims = [int(d) for d in self._dev.max_work_item_sizes][:3] + [1, 1, 1]
            self._limits = KernelLimits(
                int(self._dev.max_work_group_size), (dims[0], dims[1], dims[2]), int(self._dev.local_mem_size)
            )
        return self._limits

    def kernel_resources(self, kernel: Any) -> tuple[int, int]:
        """OpenCL says no registers; its local memory per work-group is the kernel's ``__local`` arrays."""
        try:
            return -1, int(kernel[0].get_work_group_info(_cl().kernel_work_group_info.LOCAL_MEM_SIZE, self._dev))
        except Exception:  # noqa: BLE001 - a driver that does not answer: unknown
            return -1, -1

    def clock_sample(self) -> ClockSample:
        cl = _cl()
        best: ClockSample | None = None
        for _ in range(5):
            t0 = time.perf_counter_ns()
            event = cl.enqueue_fill_buffer(self._scratch_queue, self._scratch, np.uint8(0), 0, 4)
            event.wait()
            t1 = time.perf_counter_ns()
            sample = ClockSample(int(event.profile.end), (t0 + t1) // 2, (t1 - t0) // 2)
            if best is None or sample.error_ns < best.error_ns:
                best = sample
        assert best is not None
        self._clock_offset = best.device_ns - best.host_ns
        return best

    def close(self) -> None:
        self._scratch_queue.finish()
        if self._peer_queue is not None:
            self._peer_queue.finish()


class OpenCLBackend(Backend):
    """Every device of every OpenCL platform."""

    name = "opencl"

    def __init__(self) -> None:
        self._devices: list[tuple[DeviceInfo, Any]] | None = None

    def available(self) -> tuple[bool, str]:
        try:
            cl = _cl()
        except ImportError as exc:
            return False, f"pyopencl is not installed ({exc}); pip install 'gpuworkbench[opencl]'"
        try:
            if not cl.get_platforms():
                return False, "no OpenCL platform is registered"
        except cl.Error as exc:
            return False, f"no OpenCL platform answers ({exc}); install an ICD such as pocl"
        return bool(self._list()), "" if self._list() else "OpenCL platforms have no devices"

    def _list(self) -> list[tuple[DeviceInfo, Any]]:
        if self._devices is None:
            cl = _cl()
            found = []
            for platform in cl.get_platforms():
                try:
                    devs = platform.get_devices()
                except cl.Error:
                    continue
                for d in devs:
                    is_gpu = bool(d.type & cl.device_type.GPU)
                    info = DeviceInfo(
                        "opencl",
                        len(found),
                        f"{d.name.strip()} ({platform.name.strip()})",
                        is_gpu,
                        int(d.global_mem_size),
                        d.version.strip(),
                    )
                    found.append((info, d))
            self._devices = found
        return self._devices

    def devices(self) -> list[DeviceInfo]:
        return [info for info, _ in self._list()]

    def open(self, index: int) -> OpenCLDevice:
        return OpenCLDevice(*pick_device(self._list(), index, "OpenCL"))
