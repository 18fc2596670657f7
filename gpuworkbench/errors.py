"""Errors raised by gpuworkbench: one base class, narrow subclasses, messages in the user's terms."""

from __future__ import annotations

from ._format import binary_bytes


class GpuError(Exception):
    """Base class of every error gpuworkbench raises on purpose."""


class BackendUnavailable(GpuError):
    """A backend or device was asked for that is not installed or not present on this machine."""


class InvalidArgument(GpuError, ValueError):
    """An argument does not fit: a size, a dtype, a stream of another device, an unknown option."""


class BufferClosed(GpuError):
    """A buffer was used after ``free()`` (or after its device was closed)."""


class DeviceTimeout(GpuError, TimeoutError):
    """The device did not answer within the time a wait was given (a persistent kernel's command, say)."""


class OutOfMemory(GpuError, MemoryError):
    """The device (or the CPU backend's budget) cannot hold the requested allocation."""

    def __init__(self, asked: int, free: int | None, total: int | None, device: str = "") -> None:
        self.asked, self.free, self.total = asked, free, total
        where = f" on {device}" if device else ""
        have = f"{binary_bytes(free)} free of {binary_bytes(total)}" if free is not None else "free memory unknown"
        super().__init__(f"cannot allocate {binary_bytes(asked)}{where}: {have}")


class CompileError(GpuError):
    """A kernel failed to compile; ``log`` holds the compiler's own log, ``source`` the numbered source."""

    def __init__(self, name: str, log: str, source: str = "") -> None:
        self.name, self.log, self.source = name, log.strip(), source
        numbered = "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(source.splitlines()))
        text = f"kernel {name!r} failed to compile:\n{self.log}"
        if numbered:
            text += f"\n--- source ---\n{numbered}"
        super().__init__(text)
