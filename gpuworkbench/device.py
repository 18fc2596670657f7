"""Device: one accelerator (or the CPU) behind one API, chosen automatically or by name."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

from . import backends, listeners
from ._memory import Ledger, as_dtype
from .backends.base import BackendDevice, Caps, DeviceInfo
from .buffer import Buffer
from .errors import BackendUnavailable, InvalidArgument
from .kernels import Kernel
from .persistent import PersistentKernel
from .persistent.kernel import ARENA_BYTES
from .streams import Stream, StreamAssignment, StreamPool, StreamSet


class BackendKind(str, Enum):
    """The backends gpuworkbench can drive."""

    CUDA = "cuda"
    ROCM = "rocm"
    OPENCL = "opencl"
    WEBGPU = "webgpu"
    CPU = "cpu"


def parse_spec(spec: str) -> tuple[str, int]:
    """'opencl:1' → ('opencl', 1); 'cuda' → ('cuda', 0)."""
    name, _, index = spec.strip().partition(":")
    backend = backends.canonical(name)  # an unknown name raises its own error, naming the known backends
    try:
        return backend, int(index) if index else 0
    except ValueError:
        raise InvalidArgument(f"device spec {spec!r} is not BACKEND[:INDEX], e.g. 'opencl:0'") from None


def auto_spec() -> tuple[str, int]:
    """The first GPU of cuda → rocm → opencl → webgpu, else the CPU. GPUWB_DEVICE overrides."""
    env = os.environ.get("GPUWB_DEVICE")
    if env:
        return parse_spec(env)
    for name in backends.PROBE_ORDER[:-1]:
        backend, _ = backends.usable(name)
        if backend is None:
            continue
        for info in backend.devices():
            if info.is_gpu:
                return name, info.index
    return "cpu", 0


class Device:
    """One device. ``Device()`` picks the best one; ``Device(0, backend="opencl")`` or ``Device("opencl:0")`` names it.

    Devices are shared: asking twice for the same backend and index returns the same object.
    """

    _open: dict[tuple[str, int], Device] = {}
    _open_lock = threading.Lock()

    def __new__(cls, index: int | str | None = None, backend: str | BackendKind | None = None) -> Device:
        if isinstance(index, str):
            if backend is not None:
                raise InvalidArgument("give either a spec string like 'opencl:0' or index + backend, not both")
            name, idx = parse_spec(index)
        elif backend is None:
            name, idx = auto_spec() if index is None else (auto_spec()[0], index)
        else:
            name = backends.canonical(backend.value if isinstance(backend, BackendKind) else str(backend))
            idx = 0 if index is None else index
        if not isinstance(idx, (int, np.integer)) or idx < 0:
            raise InvalidArgument(f"device index must be a non-negative int, not {idx!r}")
        key = (name, int(idx))
        with cls._open_lock:
            existing = cls._open.get(key)
            if existing is not None and not existing.closed:
                return existing
            self = super().__new__(cls)
            self._init(name, int(idx))
            cls._open[key] = self
            return self

    def _init(self, backend_name: str, index: int) -> None:
        backend, why = backends.usable(backend_name)
        if backend is None:
            raise BackendUnavailable(f"backend {backend_name!r} is not available here: {why}")
        infos = backend.devices()
        if index >= len(infos):
            found = ", ".join(f"{backend_name}:{i.index} {i.name}" for i in infos) or "none"
            raise BackendUnavailable(f"{backend_name} has no device {index}; devices found: {found}")
        self.backend_device: BackendDevice = backend.open(index)
        self.index = index
        self.backend_kind = BackendKind(backend_name)
        self.closed = False
        self.ledger = Ledger(self)  # bytes and buffers held here (_memory.py; Buffer reports to it)
        self._lock = threading.Lock()
        self._streams: list[Stream] = []
        self._next_stream_id = 0
        self.default_stream = self.create_stream("default")

    @classmethod
    def open_devices(cls) -> list[Device]:
        """Every device opened in this process and not closed yet."""
        with cls._open_lock:
            return [dev for dev in cls._open.values() if not dev.closed]

    @classmethod
    def with_backend(cls, index: int, kind: BackendKind | str) -> Device:
        """Device ``index`` of backend ``kind``."""
        return cls(index, backend=kind)

    # ------------------------------------------------------------------ facts
    @property
    def name(self) -> str:
        return self.backend_device.info.name

    @property
    def info(self) -> DeviceInfo:
        return self.backend_device.info

    @property
    def caps(self) -> Caps:
        return self.backend_device.caps

    @property
    def spec(self) -> str:
        """'cuda:0', the string GPUWB_DEVICE and ``%gpu use`` take."""
        return f"{self.backend_kind.value}:{self.index}"

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes. Where the backend cannot tell free memory (``caps.memory_free_known`` is False),
        free is the total minus what gpuworkbench holds. Non-blocking."""
        free, total = self.backend_device.memory_info()
        if not self.caps.memory_free_known:
            free = max(total - self.held_bytes, 0)
        return int(free), int(total)

    def empty_cache(self) -> int:
        """Give the memory the backend keeps for this device's next allocations (on CUDA the caching pool's unused
        blocks) back to the driver, for other libraries and processes, as ``torch.cuda.empty_cache()`` does; the bytes
        given back. ``memory_info()`` counts that memory as free either way."""
        self.check_open()
        return int(self.backend_device.release_cached())

    def used_bytes(self) -> int:
        """The device's used total (total − free), -1 where the backend cannot tell free memory."""
        if not self.caps.memory_free_known:
            return -1
        free, total = self.backend_device.memory_info()
        return int(total - free)

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers gpuworkbench holds on this device."""
        return self.ledger.held_bytes

    @property
    def live_buffers(self) -> list[Buffer]:
        """Buffers allocated on this device and not freed yet."""
        return self.ledger.live()

    # ------------------------------------------------------------------ factories
    def create_stream(self, label: str | None = None) -> Stream:
        """A new non-blocking stream."""
        self.check_open()
        with self._lock:
            sid = self._next_stream_id
            self._next_stream_id += 1
        stream = Stream(self, label or f"stream-{sid}", sid)
        self._streams.append(stream)
        for t in listeners.recording():
            if t.knows_device(self):
                t.label_stream(t.device_number(self), sid, stream.label)
        return stream

    def stream_labels(self) -> dict[int, str]:
        """Stream id → label, of every open stream."""
        return {s.id: s.label for s in self._streams}

    def prune_streams(self, waited: Mapping[int, Any]) -> None:
        """Let the streams of these ids drop their finished ops (and the arguments those keep: on the CPU a kernel's
        view of a buffer's memory), as a freed buffer's streams do; ``waited``: stream id -> a completion on it that
        the caller waited for."""
        for s in list(self._streams):
            if s.inflight and s.id in waited:
                s.prune_if_free(waited[s.id])

    def forget_stream(self, stream: Stream) -> None:
        """Drop a closed stream from the device's list."""
        if stream in self._streams:
            self._streams.remove(stream)

    def stream_pool(
        self, size: int = 4, assignment: StreamAssignment = StreamAssignment.ROUND_ROBIN, label: str = "pool"
    ) -> StreamPool:
        """``size`` streams handed out round-robin or to the least-loaded."""
        return StreamPool(self, size, assignment, label)

    def stream_set(self, depth: int, label: str = "set") -> StreamSet:
        """``depth`` streams addressed as ``get(i) → i % depth``."""
        return StreamSet(self, depth, label)

    def alloc(self, n: int | Sequence[int], dtype: Any = "float32") -> Buffer:
        """A device buffer of ``n`` elements, or of a shape ``(rows, cols)`` (uninitialised). Blocks only for the
        allocation itself."""
        return Buffer.allocate(self, n, dtype)

    def empty_pinned(self, shape: int | Sequence[int], dtype: Any = "float32") -> np.ndarray:
        """A host array in page-locked memory where the backend has it (CUDA, ROCm, OpenCL), else ordinary."""
        self.check_open()
        shape_t = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any((not isinstance(s, (int, np.integer))) or s < 0 for s in shape_t):
            raise InvalidArgument(f"shape must be non-negative ints, got {shape!r}")
        return self.backend_device.empty_pinned(shape_t, as_dtype(dtype))

    def is_pinned(self, array: np.ndarray) -> bool:
        """True when ``array`` is page-locked memory this device can copy asynchronously."""
        return self.backend_device.is_pinned(array)

    def compile(self, source: Any, name: str, options: Sequence[str] = ()) -> Kernel:
        """Build kernel ``name`` from CUDA C / OpenCL C / a Python callable, per ``caps.kernel_language``.
        Raises CompileError carrying the compiler's log. Blocks while compiling."""
        self.check_open()
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"kernel name must be a non-empty string, got {name!r}")
        raw = self.backend_device.compile(source, name, tuple(options))
        return Kernel(self, raw, name, source)

    def persistent(
        self, capacity: int = 256, threads: int = 256, label: str = "persistent", arena_bytes: int = ARENA_BYTES
    ) -> PersistentKernel:
        """Launch a kernel that loops on its own stream taking commands from a ring (CUDA, ROCm; a thread on the
        CPU backend) until ``stop()``. Blocks while compiling it (the first time) and launching it. On CUDA, buffers
        allocated while it runs come from an arena of ``arena_bytes`` made before its launch, so that it may read
        them."""
        return PersistentKernel(self, capacity, threads, label, arena_bytes)

    # ------------------------------------------------------------------ sync and lifetime
    def synchronize(self) -> None:
        """Block the host until every stream of this device is empty (raises if an op failed); a stream running a
        persistent kernel is skipped, as it is never empty until stopped."""
        self.check_open()
        for s in list(self._streams):
            if s.persistent is None:
                s.synchronize()

    def runs_persistent(self) -> bool:
        """True while a persistent kernel loops on one of this device's streams (persistent/)."""
        return any(s.persistent is not None for s in list(self._streams))

    def close(self) -> None:
        """Stop its persistent kernels, wait for all work, free every live buffer and stream, release the device."""
        if self.closed:
            return
        for s in list(self._streams):
            if s.persistent is not None:
                s.persistent.stop()
        self.synchronize()
        for buf in self.live_buffers:
            buf.free()
        for s in list(self._streams):
            s.close()
        self.backend_device.close()
        self.closed = True
        with Device._open_lock:
            Device._open.pop((self.backend_kind.value, self.index), None)

    def check_open(self) -> None:
        """Raise BufferClosed once the device is closed."""
        self.ledger.check_open()

    def __repr__(self) -> str:
        return f"<Device {self.spec} {self.name!r}>"


def devices() -> list[DeviceInfo]:
    """Every device of every backend found on this machine (probing never opens a device)."""
    found: list[DeviceInfo] = []
    for name in backends.PROBE_ORDER:
        backend, _ = backends.usable(name)
        if backend is not None:
            found.extend(backend.devices())
    return found


def backend_status() -> dict[str, str]:
    """Per backend: "" when usable, else why not (for ``gpuworkbench info`` and ``%gpu``)."""
    return {name: backends.usable(name)[1] for name in backends.PROBE_ORDER}
