"""``PersistentKernel``: the host side of a persistent kernel. It launches the kernel (or the CPU backend's loop) on a
stream of its own, writes commands into the ring, reads the answers, and stops it (at the latest at interpreter exit).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import listeners
from ..backends.base import BufferArg
from ..buffer import Buffer
from ..errors import BackendUnavailable, DeviceTimeout, GpuError, InvalidArgument
from .ring import (
    ANSWER,
    BODY,
    CUDA_SOURCE,
    DTYPE_CODES,
    DTYPES,
    HEADER,
    I64,
    PROCESSED,
    SLOT,
    STATE,
    STOP,
    Command,
    CpuLoop,
    Status,
)

if TYPE_CHECKING:
    from ..device import Device

#: The arena a CUDA persistent kernel's device suballocates while it runs (``backends/cuda/arena.py``): buffers made
#: meanwhile come from it, so that the kernel reads only memory that existed at its launch.
ARENA_BYTES = 256 << 20
_SPIN_S = 20e-6  # spin without yielding this long, then yield the GIL between polls
_ALIVE_EVERY_S = 0.01  # how often a wait checks that the kernel still runs
_RUNNING: set[PersistentKernel] = set()
_RUNNING_LOCK = threading.Lock()
_ATEXIT_REGISTERED = False
#: What a trace says while one runs (measured on an H200: attaching CUPTI then waited for the kernel to end).
_BLOCKING = "a persistent kernel runs, and attaching CUPTI would wait for it to end"
_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend device -> compiled gw_persistent


class _Answer:
    """The completion of one command, so that a Buffer it names is freed or reused only after its answer."""

    __slots__ = ("_kernel", "ticket")

    def __init__(self, kernel: PersistentKernel, ticket: int) -> None:
        self._kernel, self.ticket = kernel, ticket

    def done(self) -> bool:
        return self._kernel.processed >= self.ticket

    def wait(self) -> None:
        kernel = self._kernel
        kernel._wait(lambda: kernel.processed >= self.ticket, None, f"command {self.ticket}")

    def times_ns(self) -> tuple[int, int] | None:
        return None


class PersistentKernel:
    """A kernel looping on its own stream, serving commands from a ring in mapped host memory until ``stop()``.

    Create with ``device.persistent()``; use as a context manager. On the CPU backend it is a worker thread that runs
    the same loop with NumPy (same API, same results; a thread's latencies, not a GPU's).
    """

    Command = Command
    ECHO, SCALE, SUM = Command.ECHO, Command.SCALE, Command.SUM

    def __init__(
        self,
        device: Device,
        capacity: int = 256,
        threads: int = 256,
        label: str = "persistent",
        arena_bytes: int = ARENA_BYTES,
    ) -> None:
        device.check_open()
        kind = device.backend_kind
        if kind.value not in ("cuda", "rocm", "cpu"):
            raise BackendUnavailable(
                f"persistent kernels need host memory that a running kernel can poll (CUDA, ROCm) or the CPU "
                f"backend's emulation; {device.spec} is {kind.value}, whose kernels cannot see host writes while "
                "they run"
            )
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 2 <= capacity <= 1 << 16:
            raise InvalidArgument(f"capacity is the ring's slot count, 2 to 65536; got {capacity!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads not in (32, 64, 128, 256, 512, 1024):
            raise InvalidArgument(f"threads must be a power of two from 32 to 1024 (one block); got {threads!r}")
        if isinstance(arena_bytes, bool) or not isinstance(arena_bytes, int) or arena_bytes < 0:
            raise InvalidArgument(f"arena_bytes is a size in bytes, 0 or more; got {arena_bytes!r}")
        self.device, self.capacity, self.threads = device, capacity, threads
        self._emulated = kind.value == "cpu"
        self._spin_s = 0.0 if self._emulated else _SPIN_S  # the CPU loop needs the GIL to answer: yield at once
        self._lock = threading.Lock()
        self._next = 1
        self._unread: dict[int, tuple[int, int, Buffer | None]] = {}  # ticket -> (op, dtype code, buffer kept alive)
        self._answers: dict[int, tuple[int, int, float, int]] = {}  # answers taken out of the ring before result()
        self._waiters = 0
        self._state = "starting"
        self._fault: BaseException | None = None
        self._mark = 0  # the backend's mark at launch: which buffers this kernel may read
        backend = device.backend_device
        nbytes = HEADER + 2 * capacity * SLOT
        if self._emulated:
            self._loop: CpuLoop | None = CpuLoop()
            ring, self._host_ptr = np.zeros(nbytes, dtype=np.uint8), 0
            raw = backend.compile(self._loop, "gw_persistent", ())
            args: list[Any] = [BufferArg(ring, ring.dtype, nbytes), np.int64(capacity)]
        else:
            self._loop = None
            raw = _KERNELS.get(backend)
            if raw is None:  # compiled once per device, before any runs: compiling while one runs is refused
                raw = _KERNELS[backend] = backend.compile(CUDA_SOURCE, "gw_persistent", ())
            ring, self._host_ptr, device_ptr = backend.alloc_mapped(nbytes)
            args = [np.uint64(device_ptr), np.int64(capacity)]
        self._ring, self._mv = ring, memoryview(ring)
        self.stream = device.create_stream(label)
        try:
            if not self._emulated:
                self._mark = backend.persistent_started(arena_bytes)
                listeners.block(self, _BLOCKING)
            try:
                self._completion = backend.launch(raw, (1,), (threads,), args, self.stream.raw, False)
            except BaseException:
                if not self._emulated:
                    backend.persistent_stopped()
                    listeners.unblock(self)
                raise
        except BaseException:
            self.stream.close()
            if not self._emulated:
                backend.free_mapped(self._host_ptr)
            raise
        self.stream.persistent = self
        self._state = "running"
        with _RUNNING_LOCK:
            _RUNNING.add(self)
            _register_atexit()

    # ------------------------------------------------------------------ facts
    @property
    def running(self) -> bool:
        """True from launch until ``stop()`` has seen the kernel exit. Non-blocking."""
        return self._state in ("running", "stopping")

    @property
    def processed(self) -> int:
        """How many commands the kernel has answered so far. Non-blocking (one read of the ring)."""
        return I64.unpack_from(self._mv, PROCESSED)[0]

    @property
    def emulated(self) -> bool:
        """True on the CPU backend, where a worker thread, not a kernel, serves the ring."""
        return self._emulated

    # ------------------------------------------------------------------ commands
    def submit(self, op: Command | str | int, *args: Any, **kwargs: Any) -> int:
        """Write one command into the ring and return its ticket: ``submit("echo", a, b)``, ``submit("scale",
        buffer, a, n=None)``, ``submit("sum", buffer, n=None)``. Non-blocking unless the ring is full."""
        code = _command(op)
        try:
            if code is Command.ECHO:
                a, b = _echo_args(*args, **kwargs)
                return self._post(code, None, 0, a, b, 0)
            if code is Command.SCALE:
                buffer, a, n = _scale_args(*args, **kwargs)
            else:
                buffer, n = _sum_args(*args, **kwargs)
                a = 0.0
        except TypeError as exc:
            usage = {Command.ECHO: "(a, b)", Command.SCALE: "(buffer, a, n=None)", Command.SUM: "(buffer, n=None)"}
            raise InvalidArgument(f"{code.name} takes {usage[code]}: {exc}") from None
        dtype, n = self._check_buffer(buffer, n)
        return self._post(code, buffer, n, a, 0.0, dtype)

    def result(self, ticket: int, timeout_s: float | None = 10.0) -> Any:
        """The answer to ``ticket``: a float for ECHO and a float SUM, an int for an integer SUM, None for SCALE.
        Blocks (spinning, then yielding the GIL) until it comes; raises GpuError if the command failed."""
        with self._lock:
            entry = self._unread.get(ticket)
            if entry is None:
                raise InvalidArgument(f"ticket {ticket!r} was not issued by this persistent kernel or was already read")
            answer = self._answers.pop(ticket, None) or self._read_answer(ticket)
            if answer is None:
                self._waiters += 1
        if answer is None:
            try:
                answer = self._await_answer(ticket, timeout_s)
            finally:
                with self._lock:
                    self._waiters -= 1
        with self._lock:
            self._unread.pop(ticket, None)
        return self._decode(ticket, entry, answer)

    def call(self, op: Command | str | int, *args: Any, timeout_s: float | None = 10.0, **kwargs: Any) -> Any:
        """``result(submit(...))``: one command's round trip. Blocks until answered."""
        return self.result(self.submit(op, *args, **kwargs), timeout_s)

    def echo(self, a: float, b: float) -> float:
        """The kernel's a + b (the smallest round trip). Blocks until answered."""
        return self.result(self._post(Command.ECHO, None, 0, *_echo_args(a, b), 0))

    def scale(self, buffer: Buffer, a: float, n: int | None = None) -> None:
        """Multiply ``buffer``'s first ``n`` elements (all by default) by ``a`` in place. Blocks until done."""
        self.call(Command.SCALE, buffer, a, n=n)

    def sum(self, buffer: Buffer, n: int | None = None) -> float | int:
        """The sum of ``buffer``'s first ``n`` elements (all by default). Blocks until answered."""
        return self.call(Command.SUM, buffer, n=n)

    # ------------------------------------------------------------------ shutting down
    def stop(self, timeout_s: float = 10.0) -> None:
        """Let the kernel finish the commands already submitted and exit, then release its stream and ring.
        Blocks up to ``timeout_s``; raises GpuError if it has not exited by then (call again to keep waiting).
        Idempotent."""
        if self._state == "stopped":
            return
        if self._state == "running":
            I64.pack_into(self._mv, STOP, 1)  # first: whatever happens below, the kernel is on its way out
            self._state = "stopping"
        deadline = time.monotonic() + timeout_s
        while not self._exited():
            if time.monotonic() > deadline:
                raise GpuError(
                    f"the persistent kernel on {self.device.spec} has not exited {timeout_s} s after being asked to "
                    f"(state {self._kernel_state()}, {self.processed} of {self._next - 1} commands done): it may be "
                    "busy with a long command, or not yet scheduled; its memory is kept, call stop() again"
                )
            time.sleep(0.0002)
        self._finish()

    def _exited(self) -> bool:
        try:
            return bool(self._completion.done())
        except Exception as exc:  # noqa: BLE001 - a kernel that faulted has exited too; reported after cleanup
            self._fault = exc
            return True

    def _kernel_state(self) -> str:
        return ("launched", "looping", "exited")[min(I64.unpack_from(self._mv, STATE)[0], 2)]

    def _finish(self) -> None:
        """The kernel has exited: keep its answers, release stream and ring, and report a failure if there was one."""
        with self._lock:
            for ticket in list(self._unread):
                if ticket not in self._answers:
                    answer = self._read_answer(ticket)
                    if answer is not None:
                        self._answers[ticket] = answer
            self._ring = np.array(self._ring)  # a copy: late readers see the final ring, never freed memory
            self._mv = memoryview(self._ring)
            self._state = "stopped"
        with _RUNNING_LOCK:
            _RUNNING.discard(self)
        listeners.unblock(self)
        self.stream.persistent = None
        failure = self._fault
        try:
            self.stream.close()
        except GpuError as exc:  # the CPU loop itself raised
            failure = failure or exc
        except Exception as exc:  # noqa: BLE001 - a faulted CUDA context raises from every call
            failure = failure or exc
        if not self._emulated:
            backend = self.device.backend_device
            try:
                backend.persistent_stopped()  # releases what was freed meanwhile, once no persistent kernel runs
            except Exception as exc:  # noqa: BLE001 - after a fault every call fails; the kernel is gone all the same
                failure = failure or exc
            deadline = time.monotonic() + 1.0
            while self._waiters and time.monotonic() < deadline:  # threads still in a wait read the copy next
                time.sleep(0.0001)
            if not self._waiters and failure is None:
                backend.free_mapped(self._host_ptr)
        if failure is not None:
            raise GpuError(f"the persistent kernel on {self.device.spec} failed: {failure}") from failure

    def __enter__(self) -> PersistentKernel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"<PersistentKernel on {self.device.spec} {self._state}, {self.processed} commands done, "
            f"ring of {self.capacity}{', emulated by a thread' if self._emulated else ''}>"
        )

    # ------------------------------------------------------------------ the ring, host side
    def _post(self, code: int, buffer: Buffer | None, n: int, a: float, b: float, dtype: int) -> int:
        """Write a command into its slot, sequence number last; waits only when the ring is full."""
        with self._lock:
            if self._state != "running":
                raise InvalidArgument(f"the persistent kernel on {self.device.spec} is {self._state}; start a new one")
            ticket = self._next
            if ticket > self.capacity:
                self._make_room(ticket - self.capacity)
            pointer = 0
            if buffer is not None:
                if self._loop is not None:
                    self._loop.buffers[ticket] = buffer.check()
                else:
                    pointer = int(buffer.check())
                    self._check_readable(buffer, pointer)
            mv, slot = self._mv, HEADER + (ticket % self.capacity) * SLOT
            BODY.pack_into(mv, slot + 8, code, pointer, n, a, b, dtype)
            I64.pack_into(mv, slot, ticket)  # last: the kernel takes the command once it sees this number
            self._next = ticket + 1
            self._unread[ticket] = (code, dtype, buffer)
        if buffer is not None:
            buffer.touch(self.stream.id, _Answer(self, ticket))
        return ticket

    def _make_room(self, old: int) -> None:
        """Ticket ``old``'s slots are about to be reused: wait until it is answered and keep its answer if unread."""
        if self.processed < old:
            self._wait(lambda: self.processed >= old, 10.0, f"room in the ring (command {old})")
        if old in self._unread and old not in self._answers:
            answer = self._read_answer(old)
            assert answer is not None, "an answered command's slot holds its answer until the slot is reused"
            code, dtype, _ = self._unread[old]
            self._unread[old] = (code, dtype, None)  # answered: the buffer need not be kept alive any longer
            self._answers[old] = answer

    def _read_answer(self, ticket: int) -> tuple[int, int, float, int] | None:
        answer = ANSWER.unpack_from(self._mv, HEADER + (self.capacity + ticket % self.capacity) * SLOT)
        return answer if answer[0] == ticket else None

    def _await_answer(self, ticket: int, timeout_s: float | None) -> tuple[int, int, float, int]:
        found: list[tuple[int, int, float, int]] = []

        def ready() -> bool:
            answer = self._read_answer(ticket)
            # Taken out of the ring meanwhile? Then the slot may be being rewritten: the copy kept is the true one.
            answer = self._answers.get(ticket) or answer
            if answer is not None:
                found.append(answer)
            return answer is not None

        self._wait(ready, timeout_s, f"the answer to command {ticket}")
        with self._lock:
            self._answers.pop(ticket, None)
        return found[-1]

    def _wait(self, ready: Callable[[], bool], timeout_s: float | None, what: str) -> None:
        """Spin on ``ready`` for a few µs, then yield between polls; checks now and then that the kernel still runs."""
        start = time.perf_counter()
        next_check, spins = start + _ALIVE_EVERY_S, 0
        while not ready():
            spins += 1
            if spins & 31 and not self._emulated:
                continue
            now = time.perf_counter()
            waited = now - start
            if waited > self._spin_s:
                self._pause(waited)
            if now >= next_check:
                next_check = now + _ALIVE_EVERY_S
                if self._state != "running" or self._exited():
                    if ready():
                        return
                    raise GpuError(
                        f"the persistent kernel on {self.device.spec} is no longer running ({self._state}); "
                        f"{what} will never come"
                    )
            if timeout_s is not None and waited > timeout_s:
                raise DeviceTimeout(
                    f"no {what} from the persistent kernel on {self.device.spec} after {timeout_s} s "
                    f"(it has answered {self.processed} of {self._next - 1} commands)"
                )

    def _pause(self, waited_s: float) -> None:
        """Yield the GIL (and, after 2 ms, the CPU for 50 µs) between polls of a long wait."""
        time.sleep(0 if waited_s < 2e-3 else 5e-5)

    def _decode(self, ticket: int, entry: tuple[int, int, Buffer | None], answer: tuple[int, int, float, int]) -> Any:
        code, dtype, _ = entry
        _, status, value, ivalue = answer
        if status != Status.OK:
            if status == Status.RAISED and self._loop is not None:
                why = self._loop.errors.pop(ticket, "the command raised")
            else:
                why = {Status.UNKNOWN: f"unknown command {code}", Status.BAD_DTYPE: "unsupported element type"}.get(
                    status, f"status {status}"
                )
            name = {c.value: c.name for c in Command}.get(code, str(code))
            raise GpuError(
                f"command {ticket} ({name}) failed in the persistent kernel on {self.device.spec}: {why}; "
                "the kernel goes on taking commands"
            )
        if code == Command.SCALE:
            return None
        if code == Command.SUM and DTYPES[dtype].kind != "f":
            return int(ivalue)
        return float(value)

    def _check_readable(self, buffer: Buffer, pointer: int) -> None:
        """Refuse a buffer that CUDA does not promise this kernel: one allocated after its launch, outside the arena."""
        backend = self.device.backend_device
        if backend.persistent_may_read(pointer, self._mark):
            return
        size, used, hole = backend.arena_info()
        raise InvalidArgument(
            f"this {buffer.size_bytes}-byte buffer was allocated while the persistent kernel ran, outside its arena "
            f"({size} bytes, {used} in use, the largest free piece {hole} bytes): CUDA does not promise a running "
            "kernel memory allocated after its launch; allocate it before starting the kernel, or start it with a "
            "larger arena_bytes"
        )

    def _check_buffer(self, buffer: Any, n: int | None) -> tuple[int, int]:
        if not isinstance(buffer, Buffer):
            raise InvalidArgument(f"SCALE and SUM take a gpuworkbench Buffer, not {type(buffer).__name__}")
        if buffer.device is not self.device:
            raise InvalidArgument(f"the buffer is on {buffer.device.spec}, the persistent kernel on {self.device.spec}")
        buffer.check()
        dtype = DTYPE_CODES.get(buffer.dtype)
        if dtype is None:
            raise InvalidArgument(
                f"the persistent kernel works on float32, float64, int32 and int64 buffers, not {buffer.dtype}"
            )
        count = len(buffer) if n is None else n
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= len(buffer):
            raise InvalidArgument(f"n must be 0 to {len(buffer)} (the buffer's length), got {n!r}")
        return dtype, int(count)


def _command(op: Any) -> Command:
    if isinstance(op, Command):
        return op
    try:
        return Command[op.upper()] if isinstance(op, str) else Command(op)
    except (KeyError, ValueError):
        raise InvalidArgument(f"unknown command {op!r}; commands: {', '.join(c.name for c in Command)}") from None


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgument(f"{what} must be a number, not {type(value).__name__}")
    return float(value)


def _echo_args(a: Any, b: Any = 0.0) -> tuple[float, float]:
    return _number(a, "ECHO's a"), _number(b, "ECHO's b")


def _scale_args(buffer: Any, a: Any, n: int | None = None) -> tuple[Any, float, int | None]:
    return buffer, _number(a, "SCALE's factor"), n


def _sum_args(buffer: Any, n: int | None = None) -> tuple[Any, int | None]:
    return buffer, n


def _register_atexit() -> None:
    """Register ``_stop_all`` once, at the first launch: after CuPy's own exit hooks, so that it runs before them."""
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(_stop_all)
        _ATEXIT_REGISTERED = True


def _stop_all() -> None:
    """At interpreter exit, stop every persistent kernel still running (a kernel must never outlive its host)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for kernel in running:
        try:
            kernel.stop(timeout_s=5.0)
        except Exception as exc:  # noqa: BLE001 - at exit: say so and go on with the others
            print(f"gpuworkbench: {exc}", file=sys.stderr)
