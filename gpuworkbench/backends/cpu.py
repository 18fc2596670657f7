"""The CPU backend: NumPy memory, one worker thread per stream, so independent streams really run at once.

Always available. Memory is bounded by a budget (default half of RAM, ``GPUWB_CPU_MEMORY`` in bytes overrides) so
that running out of memory behaves as on a GPU. NumPy releases the GIL in copies and most ufuncs, which is what lets
two streams' work overlap.
"""

from __future__ import annotations

import inspect
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import CompileError, InvalidArgument, OutOfMemory
from .base import Backend, BackendDevice, BufferArg, Caps, ClockSample, DeviceInfo, Dims

CAPS = Caps(concurrent_streams=True, memory_free_known=True, timestamps="perf_counter", kernel_language="python")


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_budget() -> int:
    """The CPU backend's memory budget: ``GPUWB_CPU_MEMORY`` bytes, else half of physical RAM."""
    env = os.environ.get("GPUWB_CPU_MEMORY")
    return int(float(env)) if env else _ram_bytes() // 2


class _Op:
    """One queued piece of work and its completion; the worker stamps start and end with perf_counter_ns.

    ``end`` set (last) means done: no threading primitive per op (they cost microseconds on the launch path); a
    waiter sleeps on its worker's one condition, which the worker notifies only while someone waits."""

    __slots__ = ("fn", "args", "start", "end", "error", "worker")

    def __init__(self, fn: Callable[..., None] | None, args: tuple, worker: _Worker) -> None:
        self.fn, self.args, self.worker = fn, args, worker
        self.start = self.end = 0
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.end != 0

    def wait(self) -> None:
        if self.end:
            return
        worker = self.worker
        with worker.cond:
            worker.waiters += 1  # counted before the check below, so the worker notifies if it finishes after it
            try:
                while not self.end:
                    worker.cond.wait()
            finally:
                worker.waiters -= 1

    def times_ns(self) -> tuple[int, int] | None:
        return (self.start, self.end) if self.end else None


class _Worker:
    """A stream: a FIFO of ops run by one thread."""

    def __init__(self, name: str) -> None:
        self.queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self.cond = threading.Condition(threading.Lock())
        self.waiters = 0  # threads in _Op.wait on this stream
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        get, clock = self.queue.get, time.perf_counter_ns
        while True:
            op = get()
            if op is None:
                return
            op.start = clock()
            try:
                if op.fn is not None:
                    op.fn(*op.args)
            except BaseException as exc:  # noqa: BLE001 - a failing kernel must not kill the stream
                op.error = exc
            op.fn = op.args = None  # drop the work (and the host arrays it holds) as soon as it is done
            op.end = clock()  # last: done() reads it, and the error is set before
            if self.waiters:
                with self.cond:
                    self.cond.notify_all()

    def submit(self, fn: Callable[..., None] | None, args: tuple = ()) -> _Op:
        """Queue ``fn(*args)`` (None: a marker) and return its completion."""
        op = _Op(fn, args, self)
        self.queue.put(op)
        return op


class _PythonKernel:
    """A CPU kernel: a Python callable taking NumPy arrays (and ``grid``/``block`` if it names them)."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name = fn, name
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins have no signature; they are called unchecked
            self.signature = None
        params = self.signature.parameters if self.signature is not None else {}
        self.wants_grid = "grid" in params
        self.wants_block = "block" in params
        # Argument counts that fit the signature: the keywords passed are fixed per kernel, so a count checked once
        # stays checked (Signature.bind costs more than the rest of a launch).
        self.fits: set[int] = set()


class CpuDevice(BackendDevice):
    """The host's cores behind the backend protocol."""

    def __init__(self, index: int, budget: int | None = None) -> None:
        self.budget = default_budget() if budget is None else int(budget)
        self.info = DeviceInfo("cpu", index, _cpu_name(), False, self.budget, f"{os.cpu_count()} cores")
        self.caps = CAPS
        self._held = 0
        self._lock = threading.Lock()
        self._count = 0

    def memory_info(self) -> tuple[int, int]:
        return self.budget - self._held, self.budget

    def alloc(self, nbytes: int) -> np.ndarray:
        with self._lock:
            if self._held + nbytes > self.budget:
                raise OutOfMemory(nbytes, self.budget - self._held, self.budget, "cpu:0 (budget)")
            self._held += nbytes
        try:
            return np.empty(nbytes, dtype=np.uint8)
        except MemoryError:
            with self._lock:
                self._held -= nbytes
            raise OutOfMemory(nbytes, self.budget - self._held, self.budget, "cpu:0 (host RAM)") from None

    def free(self, handle: np.ndarray) -> None:
        with self._lock:
            self._held -= handle.nbytes

    def empty_pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def is_pinned(self, array: np.ndarray) -> bool:
        return False

    def create_stream(self) -> _Worker:
        with self._lock:
            self._count += 1
            return _Worker(f"gpuworkbench-cpu-stream-{self._count}")

    def destroy_stream(self, stream: _Worker) -> None:
        stream.queue.put(None)

    def copy_h2d(self, dst: np.ndarray, offset: int, src: np.ndarray, stream: _Worker, timed: bool) -> _Op:
        flat = src.reshape(-1).view(np.uint8)
        target = dst[offset : offset + flat.nbytes]
        return stream.submit(lambda: np.copyto(target, flat))

    def copy_d2h(self, dst: np.ndarray, src: np.ndarray, offset: int, stream: _Worker, timed: bool) -> _Op:
        flat = dst.reshape(-1).view(np.uint8)
        source = src[offset : offset + flat.nbytes]
        return stream.submit(lambda: np.copyto(flat, source))

    def copy_d2d(
        self, dst: np.ndarray, dst_offset: int, src: np.ndarray, src_offset: int, nbytes: int, stream: _Worker, timed
    ) -> _Op:
        target, source = dst[dst_offset : dst_offset + nbytes], src[src_offset : src_offset + nbytes]
        return stream.submit(lambda: np.copyto(target, source))

    def fill(self, dst: np.ndarray, nbytes: int, byte: int, stream: _Worker, timed: bool) -> _Op:
        target = dst[:nbytes]
        return stream.submit(lambda: target.fill(byte))

    def record(self, stream: _Worker) -> _Op:
        return stream.submit(None)

    def wait_event(self, stream: _Worker, completion: Any) -> None:
        stream.submit(completion.wait)

    def synchronize_stream(self, stream: _Worker) -> None:
        stream.submit(None).wait()

    def compile(self, source: Any, name: str, options: Sequence[str]) -> _PythonKernel:
        if callable(source):
            return _PythonKernel(source, name)
        if not isinstance(source, str):
            raise InvalidArgument(f"the CPU backend compiles a Python callable or Python source, not {type(source)}")
        namespace: dict[str, Any] = {"np": np, "numpy": np}
        try:
            exec(compile(source, f"<kernel {name}>", "exec"), namespace)  # noqa: S102 - user's own kernel source
        except SyntaxError as exc:
            raise CompileError(name, f"line {exc.lineno}: {exc.msg}", source) from None
        except Exception as exc:  # noqa: BLE001 - the source's top-level code failed while defining the kernel
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == f"<kernel {name}>"]
            where = f"line {frames[-1].lineno}: " if frames else ""
            raise CompileError(name, f"{where}{type(exc).__name__}: {exc}", source) from None
        if not callable(namespace.get(name)):
            raise CompileError(name, f"the source defines no function named {name!r}", source)
        return _PythonKernel(namespace[name], name)

    def kernel_arg(self, arg: BufferArg) -> np.ndarray:
        """A buffer as kernels see it: a typed view of its bytes (made once per buffer by the front end)."""
        return arg.handle[: arg.length * arg.dtype.itemsize].view(arg.dtype)

    def launch(
        self, kernel: _PythonKernel, grid: Dims, block: Dims, args: Sequence[Any], stream: _Worker, timed: bool
    ) -> _Op:
        values = [self.kernel_arg(a) if type(a) is BufferArg else a for a in args]
        if kernel.wants_grid or kernel.wants_block:
            extra: dict[str, Any] = {}
            if kernel.wants_grid:
                extra["grid"] = grid
            if kernel.wants_block:
                extra["block"] = block
            if len(values) not in kernel.fits:
                self._check_fit(kernel, values, extra)
            fn = kernel.fn
            return stream.submit(lambda: fn(*values, **extra))
        if len(values) not in kernel.fits:
            self._check_fit(kernel, values, {})
        return stream.submit(kernel.fn, tuple(values))

    @staticmethod
    def _check_fit(kernel: _PythonKernel, values: list[Any], extra: dict[str, Any]) -> None:
        """InvalidArgument unless ``kernel`` takes these arguments; remembers a count that fits."""
        if kernel.signature is not None:
            try:
                kernel.signature.bind(*values, **extra)
            except TypeError as exc:
                raise InvalidArgument(f"kernel {kernel.name!r}: arguments do not fit its signature ({exc})") from None
        kernel.fits.add(len(values))

    def clock_sample(self) -> ClockSample:
        now = time.perf_counter_ns()
        return ClockSample(now, now, 0)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "CPU"


class CpuBackend(Backend):
    """NumPy + worker threads; one device."""

    name = "cpu"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo("cpu", 0, _cpu_name(), False, default_budget(), f"{os.cpu_count()} cores")]

    def open(self, index: int) -> CpuDevice:
        if index != 0:
            raise InvalidArgument(f"the CPU backend has one device (index 0), not index {index}")
        return CpuDevice(index)
