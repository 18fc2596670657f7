"""The WebGPU backend (wgpu-py): Vulkan, Metal and D3D12 in one, WGSL kernels, timestamps from timestamp queries.

WebGPU gives a device **one queue**. A stream here is an ordered series of submissions to that queue, so streams
serialise: ``Caps.concurrent_streams`` is False and a trace shows two streams' work one after another. WebGPU has no
memory query either: ``Caps.memory_free_known`` is False, and the total reported is the adapter's ``max_buffer_size``
(the largest single buffer), a stand-in for device memory, not a measurement. Software adapters (lavapipe,
"llvmpipe ... (CPU) via Vulkan") report ``is_gpu`` False, so auto-selection never picks them; name them to use them.

Kernels: ``Device.compile(wgsl, name)`` takes WGSL; ``name`` is the ``@compute`` entry point. When launching:

- ``grid`` is the number of workgroups (1 to 3 dimensions); ``block`` is ignored: ``@workgroup_size`` decides threads.
- Buffer arguments bind, in argument order, to ``@group(0) @binding(0)``, ``(1)``, ... as storage buffers. Each must
  be used by the shader: WebGPU's automatic layout leaves out bindings the code never touches.
- Scalar arguments (32-bit only: f32, i32, u32) are packed in argument order into one uniform struct bound at
  binding = number of buffers: ``struct Args { a: f32, n: u32 }`` ``@group(0) @binding(2) var<uniform> args: Args;``

Buffers occupy whole 4-byte words, because WebGPU copies move words: a copy into a buffer must start on a word and
end on one or at the buffer's end. Completion is polled without blocking through buffer-map promises, which wgpu-py
resolves from its own per-device poll thread (``queue.on_submitted_work_done`` is broken in wgpu-py 0.32).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import CompileError, InvalidArgument, OutOfMemory
from .base import Backend, BackendDevice, Caps, ClockSample, DeviceInfo, KernelLimits
from .webgpu_adapters import _NATIVE, _describe, _wgpu
from .webgpu_bindings import _bind_group
from .webgpu_memory import _Alloc, _padded, _words
from .webgpu_queue import _Completion, _Stream, _Submitter

CAPS = Caps(
    concurrent_streams=False,
    pinned_memory=False,
    memory_free_known=False,
    graphs="recorded",  # graphs.py records the calls and re-issues them
    timestamps="timestamp-query",
    kernel_language="wgsl",
    device_pointers=False,
)


class WebGPUDevice(BackendDevice):
    """One adapter opened as a WebGPU device, with timestamp queries when the adapter offers them."""

    def __init__(self, info: DeviceInfo, adapter: Any) -> None:
        wgpu = _wgpu()
        wanted = [f for f in ("timestamp-query", "timestamp-query-inside-encoders") if f in adapter.features]
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
        self._submitter = _Submitter(self._dev, self._timestamps, self._in_encoders, self._lock)
        self._submit = self._submitter.submit
        self._scratch = self._dev.create_buffer(size=16, usage=wgpu.BufferUsage.COPY_DST)
        self._clock_stream = _Stream()

    def memory_info(self) -> tuple[int, int]:
        return max(self.info.total_memory - self._held, 0), self.info.total_memory

    def alloc(self, nbytes: int) -> _Alloc | None:
        wgpu = _wgpu()
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
            buffer = self._dev.create_buffer(size=_words(nbytes), usage=usage)
        except wgpu.GPUError as exc:
            raise OutOfMemory(nbytes, None, self.info.total_memory, f"{spec} ({exc})") from None
        with self._lock:
            self._held += nbytes
        return _Alloc(buffer, nbytes)

    def free(self, handle: _Alloc | None) -> None:
        if handle is not None:
            with self._lock:
                self._held -= handle.nbytes
            handle.buffer.destroy()

    def empty_pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)  # WebGPU stages every upload itself: there is no page-locked memory

    def is_pinned(self, array: np.ndarray) -> bool:
        return False

    def create_stream(self) -> _Stream:
        return _Stream()

    def destroy_stream(self, stream: _Stream) -> None:
        self.synchronize_stream(stream)

    # ------------------------------------------------------------------ copies
    def copy_h2d(self, dst: _Alloc, offset: int, src: np.ndarray, stream: _Stream, timed: bool) -> _Completion:
        if src.nbytes == 0:
            return self.record(stream)
        data = src.reshape(-1).view(np.uint8)
        size = _padded(dst, offset, data.nbytes, "copy from host")
        if size != data.nbytes:
            data = np.concatenate([data, np.zeros(size - data.nbytes, np.uint8)])
        write = lambda: self._queue.write_buffer(dst.buffer, offset, data)  # noqa: E731 - staged now, copied on submit
        return self._submit(stream, lambda encoder, _: None, timed, before=write)

    def copy_d2h(self, dst: np.ndarray, src: _Alloc, offset: int, stream: _Stream, timed: bool) -> _Completion:
        if dst.nbytes == 0:
            return self.record(stream)
        start, end = offset & ~3, _words(offset + dst.nbytes)
        usage = _wgpu().BufferUsage.MAP_READ | _wgpu().BufferUsage.COPY_DST
        staging = self._dev.create_buffer(size=end - start, usage=usage)
        copy = lambda encoder, _: encoder.copy_buffer_to_buffer(src.buffer, start, staging, 0, end - start)  # noqa: E731
        return self._submit(stream, copy, timed, staging=staging, dst=dst, skip=offset - start)

    def copy_d2d(
        self, dst: _Alloc, dst_offset: int, src: _Alloc, src_offset: int, nbytes: int, stream: _Stream, timed: bool
    ) -> _Completion:
        if nbytes == 0:
            return self.record(stream)
        size = _padded(dst, dst_offset, nbytes, "device copy")
        if src_offset % 4:
            raise InvalidArgument(f"webgpu device copy: source offset {src_offset} is not a multiple of 4 bytes")
        copy = lambda encoder, _: encoder.copy_buffer_to_buffer(src.buffer, src_offset, dst.buffer, dst_offset, size)  # noqa: E731
        return self._submit(stream, copy, timed)

    def fill(self, dst: _Alloc, nbytes: int, byte: int, stream: _Stream, timed: bool) -> _Completion:
        if nbytes == 0:
            return self.record(stream)
        size = _padded(dst, 0, nbytes, "fill")
        if byte == 0:
            return self._submit(stream, lambda encoder, _: encoder.clear_buffer(dst.buffer, 0, size), timed)
        data = np.full(size, byte, np.uint8)  # WebGPU clears to zero only: other bytes are written from the host
        write = lambda: self._queue.write_buffer(dst.buffer, 0, data)  # noqa: E731
        return self._submit(stream, lambda encoder, _: None, timed, before=write)

    def record(self, stream: _Stream) -> _Completion:
        return self._submit(stream, lambda encoder, _: None, False)

    def wait_event(self, stream: _Stream, completion: Any) -> None:
        if not isinstance(completion, _Completion) or completion._owner is not self._submitter:
            completion.wait()  # another device's op: only the host can wait for it
        # Otherwise nothing to do: the one queue runs submissions in order, so earlier work is already ahead.

    def synchronize_stream(self, stream: _Stream) -> None:
        stream.collect(None, block=True)

    # ------------------------------------------------------------------ kernels
    def compile(self, source: Any, name: str, options: Sequence[str]) -> Any:
        wgpu = _wgpu()
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
        self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: Sequence[Any], stream: _Stream,
        timed: bool,
    ) -> _Completion:  # fmt: skip
        name = kernel.label or "kernel"
        if any(g > self._max_groups for g in grid):
            raise InvalidArgument(f"kernel {name!r}: grid {grid} exceeds {self._max_groups} workgroups per dimension")
        group = _bind_group(self._dev, kernel, name, args, self._max_binding)

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


class WebGPUBackend(Backend):
    """Every Vulkan, Metal and D3D12 adapter wgpu finds."""

    name = "webgpu"

    def __init__(self) -> None:
        self._adapters: list[tuple[DeviceInfo, Any]] | None = None
        self._lock = threading.Lock()

    def available(self) -> tuple[bool, str]:
        try:
            _wgpu()
        except ImportError as exc:
            return False, f"wgpu is not installed ({exc}); pip install 'gpuworkbench[webgpu]'"
        try:
            found = self._list()
        except Exception as exc:  # noqa: BLE001 - a missing or broken driver shows up here
            return False, f"wgpu could not list adapters ({exc})"
        if not found:
            return False, "no Vulkan, Metal or D3D12 adapter (Linux without a GPU: apt-get install mesa-vulkan-drivers)"
        return True, ""

    def _list(self) -> list[tuple[DeviceInfo, Any]]:
        with self._lock:
            if self._adapters is None:
                adapters = [a for a in _wgpu().gpu.enumerate_adapters_sync() if a.info["backend_type"] in _NATIVE]
                self._adapters = [(_describe(i, a), a) for i, a in enumerate(adapters)]
            return self._adapters

    def devices(self) -> list[DeviceInfo]:
        return [info for info, _ in self._list()]

    def open(self, index: int) -> WebGPUDevice:
        found = self._list()
        if not 0 <= index < len(found):
            raise InvalidArgument(f"WebGPU has {len(found)} adapters; index {index} does not exist")
        return WebGPUDevice(*found[index])
