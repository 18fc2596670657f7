"""One WebGPU adapter opened as a device: buffers in whole words, streams as ordered submissions to its one queue,
WGSL compute pipelines, and the device clock read through timestamp queries where the adapter has them."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import CompileError, InvalidArgument, OutOfMemory
from ..base import BackendDevice, Caps, ClockSample, DeviceInfo, Dims, KernelLimits
from .adapters import load_wgpu
from .bindings import bind_group
from .memory import Alloc, padded, words
from .queue import QueueCompletion, QueueStream, Submitter

CAPS = Caps(concurrent_streams=False, timestamps="timestamp-query", kernel_language="wgsl")


class WebGPUDevice(BackendDevice):
    """One adapter opened as a WebGPU device, with timestamp queries when the adapter offers them."""

    def __init__(self, info: DeviceInfo, adapter: Any) -> None:
        wgpu = load_wgpu()
        features = ("timestamp-query", "timestamp-query-inside-encoders", "shader-f16")  # f16: float16 kernels
        wanted = [f for f in features if f in adapter.features]
        limit_names = ("max-buffer-size", "max-storage-buffer-binding-size")
        self._dev = adapter.request_device_sync(
            label=info.name, required_features=wanted, required_limits={k: adapter.limits[k] for k in limit_names}
        )
        self._queue = self._dev.queue
        self._timestamps = "timestamp-query" in wanted
        self._in_encoders = "timestamp-query-inside-encoders" in wanted
        self.info = info
        self.caps = CAPS if self._timestamps else replace(CAPS, timestamps="perf_counter")
        self._max_buffer, self._max_binding = (int(self._dev.limits[k]) for k in limit_names)
        self._max_groups = int(self._dev.limits["max-compute-workgroups-per-dimension"])
        self._held = 0
        self._lock = threading.Lock()  # guards _held and keeps each op's submissions together
        self._submitter = Submitter(self._dev, self._timestamps, self._in_encoders, self._lock)
        self._submit = self._submitter.submit
        self._scratch = self._dev.create_buffer(size=16, usage=wgpu.BufferUsage.COPY_DST)
        self._clock_stream = QueueStream()

    def lacks_type(self, dtype: str) -> str:
        if dtype == "float16":
            return "" if "shader-f16" in self._dev.features else "its adapter lacks shader-f16"
        if dtype in ("float32", "int32", "uint32"):
            return ""
        return "WGSL has no bfloat16" if dtype == "bfloat16" else "WGSL has no 64-bit types"

    def memory_info(self) -> tuple[int, int]:
        return max(self.info.total_memory - self._held, 0), self.info.total_memory

    def alloc(self, nbytes: int) -> Alloc | None:
        wgpu = load_wgpu()
        if nbytes == 0:
            return None
        spec = f"webgpu:{self.info.index}"
        if nbytes > self._max_buffer:
            free = self.memory_info()[0]
            raise OutOfMemory(
                nbytes, free, self.info.total_memory, f"{spec} (one buffer: at most {self._max_buffer} B)"
            )
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        try:
            buffer = self._dev.create_buffer(size=words(nbytes), usage=usage)
        except wgpu.GPUError as exc:
            raise OutOfMemory(nbytes, None, self.info.total_memory, f"{spec} ({exc})") from None
        with self._lock:
            self._held += nbytes
        return Alloc(buffer, nbytes)

    def free(self, handle: Alloc | None) -> None:
        if handle is not None:
            with self._lock:
                self._held -= handle.nbytes
            handle.buffer.destroy()

    def empty_pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)  # WebGPU stages every upload itself: there is no page-locked memory

    def is_pinned(self, array: np.ndarray) -> bool:
        return False

    def create_stream(self) -> QueueStream:
        return QueueStream()

    def destroy_stream(self, stream: QueueStream) -> None:
        self.synchronize_stream(stream)

    # ------------------------------------------------------------------ copies
    def copy_h2d(self, dst: Alloc, offset: int, src: np.ndarray, stream: QueueStream, timed: bool) -> QueueCompletion:
        if src.nbytes == 0:
            return self.record(stream)
        data = src.reshape(-1).view(np.uint8)
        size = padded(dst, offset, data.nbytes, "copy from host")
        if size != data.nbytes:
            data = np.concatenate([data, np.zeros(size - data.nbytes, np.uint8)])
        write = lambda: self._queue.write_buffer(dst.buffer, offset, data)  # noqa: E731 - staged now, copied on submit
        return self._submit(stream, lambda encoder, _: None, timed, before=write)

    def copy_d2h(self, dst: np.ndarray, src: Alloc, offset: int, stream: QueueStream, timed: bool) -> QueueCompletion:
        if dst.nbytes == 0:
            return self.record(stream)
        start, end = offset & ~3, words(offset + dst.nbytes)
        usage = load_wgpu().BufferUsage.MAP_READ | load_wgpu().BufferUsage.COPY_DST
        staging = self._dev.create_buffer(size=end - start, usage=usage)
        copy = lambda encoder, _: encoder.copy_buffer_to_buffer(src.buffer, start, staging, 0, end - start)  # noqa: E731
        return self._submit(stream, copy, timed, staging=staging, dst=dst, skip=offset - start)

    def copy_d2d(
        self, dst: Alloc, dst_offset: int, src: Alloc, src_offset: int, nbytes: int, stream: QueueStream, timed: bool
    ) -> QueueCompletion:
        if nbytes == 0:
            return self.record(stream)
        size = padded(dst, dst_offset, nbytes, "device copy")
        if src_offset % 4:
            raise InvalidArgument(f"webgpu device copy: source offset {src_offset} is not a multiple of 4 bytes")
        copy = lambda encoder, _: encoder.copy_buffer_to_buffer(src.buffer, src_offset, dst.buffer, dst_offset, size)  # noqa: E731
        return self._submit(stream, copy, timed)

    def fill(self, dst: Alloc, nbytes: int, byte: int, stream: QueueStream, timed: bool) -> QueueCompletion:
        if nbytes == 0:
            return self.record(stream)
        size = padded(dst, 0, nbytes, "fill")
        if byte == 0:
            return self._submit(stream, lambda encoder, _: encoder.clear_buffer(dst.buffer, 0, size), timed)
        data = np.full(size, byte, np.uint8)  # WebGPU clears to zero only: other bytes are written from the host
        write = lambda: self._queue.write_buffer(dst.buffer, 0, data)  # noqa: E731
        return self._submit(stream, lambda encoder, _: None, timed, before=write)

    def record(self, stream: QueueStream) -> QueueCompletion:
        return self._submit(stream, lambda encoder, _: None, False)

    def wait_event(self, stream: QueueStream, completion: Any) -> None:
        if not isinstance(completion, QueueCompletion) or completion.owner is not self._submitter:
            completion.wait()  # another device's op: only the host can wait for it
        # Otherwise nothing to do: the one queue runs submissions in order, so earlier work is already ahead.

    def synchronize_stream(self, stream: QueueStream) -> None:
        stream.collect(None, block=True)

    # ------------------------------------------------------------------ kernels
    def compile(self, source: Any, name: str, options: Sequence[str]) -> Any:
        wgpu = load_wgpu()
        if not isinstance(source, str):
            raise InvalidArgument(f"the WebGPU backend compiles WGSL source (a str), not {type(source).__name__}")
        if options:
            raise InvalidArgument(f"WGSL takes no compiler options (got {list(options)}); use constants in the source")
        try:
            module = self._dev.create_shader_module(label=name, code=source)
            compute = {"module": module, "entry_point": name}
            return self._dev.create_compute_pipeline(label=name, layout="auto", compute=compute)
        except wgpu.GPUError as exc:
            raise CompileError(name, str(exc), source) from None  # wgpu's validation message

    def launch(
        self, kernel: Any, grid: Dims, block: Dims, args: Sequence[Any], stream: QueueStream, timed: bool
    ) -> QueueCompletion:
        name = kernel.label or "kernel"
        if any(g > self._max_groups for g in grid):
            raise InvalidArgument(f"kernel {name!r}: grid {grid} exceeds {self._max_groups} workgroups per dimension")
        group = bind_group(self._dev, kernel, name, args, self._max_binding)

        def encode(encoder: Any, stamps: Any) -> None:
            compute = encoder.begin_compute_pass(timestamp_writes=stamps)
            compute.set_pipeline(kernel)
            if group is not None:
                compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*grid)
            compute.end()

        return self._submit(stream, encode, timed, kernel=True)

    def kernel_limits(self) -> KernelLimits:
        limits = self._dev.limits
        x, y, z = (int(limits[f"max-compute-workgroup-size-{a}"]) for a in "xyz")
        return KernelLimits(
            int(limits["max-compute-invocations-per-workgroup"]),
            (x, y, z),
            int(limits["max-compute-workgroup-storage-size"]),
        )

    def clock_sample(self) -> ClockSample:
        if not self._timestamps:
            now = time.perf_counter_ns()
            return ClockSample(now, now, 0)
        best: ClockSample | None = None
        for _ in range(5):
            t0 = time.perf_counter_ns()
            completion = self._submit(self._clock_stream, lambda e, _: e.clear_buffer(self._scratch, 0, 16), True)
            completion.wait()
            t1 = time.perf_counter_ns()
            times = completion.times_ns()
            assert times is not None
            sample = ClockSample(times[1], (t0 + t1) // 2, (t1 - t0) // 2)
            if best is None or sample.error_ns < best.error_ns:
                best = sample
        assert best is not None
        return best

    def close(self) -> None:
        self.synchronize_stream(self._clock_stream)
        self._dev.destroy()
