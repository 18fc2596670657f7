"""libcupti through ctypes: our activity-buffer callbacks and flush, Kineto's callbacks to hand CUPTI back, CUPTI's
C strings read safely, and whether cupti-python (or another CUPTI client) is here at all.

Why raw buffers: cupti-python builds a Python object per record inside CUPTI's buffer callback (10–40 µs a record, on
CUPTI's thread, holding the GIL), which slowed kernel launches on other threads ~10× while a flush ran. So cupti-python
only enables kinds, names enums, describes record layouts (its NumPy dtypes) and pushes/pops external ids; the buffer
callbacks are our own, registered on the same libcupti through ctypes. The completed-buffer callback only copies the
valid bytes; decoding happens at a flush (``decode.py``). ``cupti`` is imported lazily, so this imports without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .walk import RecordWalker

#: Size of each activity buffer handed to CUPTI (a traced launch costs 256 bytes of records: kernel, API call).
#: Small enough that CUPTI hands full buffers back by itself every few ms of busy launching.
BUFFER_BYTES = 512 << 10
#: Empty buffers kept for reuse once CUPTI hands them back; more are freed.
POOL_MAX = 8

# Hints for CUPTI results that mean "CUPTI cannot be used here".
RESULT_HINTS: dict[str, str] = {
    "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED": "another CUPTI client (Nsight Systems, a framework profiler ...) is "
    "attached to this process",
    "ERROR_NOT_COMPATIBLE": "this CUPTI does not match the driver (a cupti-python / nvidia-cuda-cupti newer than the "
    "driver's CUDA version?)",
    "ERROR_CUDA_COMPILER_NOT_COMPATIBLE": "this CUPTI does not match the driver",
    "ERROR_NOT_INITIALIZED": "CUPTI could not initialize (no CUDA driver, or a driver too old for this CUPTI?)",
    "ERROR_INSUFFICIENT_PRIVILEGES": "the driver refuses profiling to this user",
    "ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED": "tracing is not supported on this virtualized GPU",
    "ERROR_LEGACY_PROFILER_NOT_SUPPORTED": "the driver refuses the activity API here",
}

REQUEST_FN = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
COMPLETE_FN = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)

#: Kineto's buffer callbacks (exported C++ symbols of libtorch), to hand CUPTI back to PyTorch's profiler.
KINETO_SYMBOLS = (
    "_ZN9libkineto16CuptiActivityApi25bufferRequestedTrampolineEPPhPmS3_",
    "_ZN9libkineto16CuptiActivityApi25bufferCompletedTrampolineEP8CUctx_stjPhmm",
)
_KINETO: Any = None
_MEM_FD: int | None = None


class CuptiUnavailable(Exception):
    """CUPTI cannot be used in this process; the message says why."""


class CuptiCallFailed(Exception):
    """A libcupti call made through ctypes returned an error (``status`` is its ``CUptiResult``)."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what} returned {status}")
        self.status = status


def describe(exc: BaseException, cupti: Any = None) -> str:
    """A readable reason from a cupti-python exception (a ``cuptiError`` carries a ``CUptiResult``)."""
    status = getattr(exc, "status", None)
    if status is None or cupti is None:
        return f"{type(exc).__name__}: {exc}"
    try:
        name = cupti.Result(status).name
    except ValueError:
        name = f"result {status}"
    hint = RESULT_HINTS.get(name)
    return f"CUPTI_{name}" + (f": {hint}" if hint else "")


@functools.cache
def available() -> tuple[bool, str]:
    """Whether ``cupti-python`` imports here (cheap: no CUDA call; the answer is kept), with a reason."""
    try:
        from cupti import cupti  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a missing libcupti / cuda-bindings)
        return False, f"cupti-python is not importable: {type(exc).__name__}: {exc}"
    try:
        from importlib.metadata import version

        return True, f"cupti-python {version('cupti-python')}"
    except ImportError:  # PackageNotFoundError
        return True, "cupti-python (version unknown)"


def import_cupti() -> Any:
    """cupti-python's ``cupti`` module; CuptiUnavailable if it does not import."""
    try:
        from cupti import cupti
    except Exception as exc:
        raise CuptiUnavailable(f"cupti-python is not importable: {type(exc).__name__}: {exc}") from exc
    return cupti


def libcupti_path(cupti: Any) -> str:
    """Path of the libcupti that cupti-python loaded: ours must register on that very instance."""
    cupti.get_timestamp()  # makes cupti-python load the library if it has not yet
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.rsplit("/", 1)[-1].startswith("libcupti.so"):
                    return path
    except OSError:
        pass
    try:  # cupti-python finds libcupti through cuda-pathfinder; ask it the same question
        from cuda import pathfinder

        return str(pathfinder.load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception as exc:  # noqa: BLE001
        raise CuptiUnavailable(f"cannot locate the libcupti that cupti-python loaded: {exc!r}") from exc


class RawCupti(RecordWalker):
    """libcupti through ctypes: our buffer callbacks, flush, and the record walk; one per process (kept for good:
    CUPTI has no "unregister", so the callbacks must outlive every registration). ``receiver()``: the source that
    records now, or None (the records of a completed buffer are then dropped)."""

    def __init__(self, path: str, receiver: Callable[[], Any]) -> None:
        lib = ctypes.CDLL(path)  # already loaded by cupti-python: dlopen returns that same instance
        lib.cuptiActivityRegisterCallbacks.argtypes = [REQUEST_FN, COMPLETE_FN]
        lib.cuptiActivityRegisterCallbacks.restype = ctypes.c_int
        lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        lib.cuptiActivityFlushAll.restype = ctypes.c_int
        lib.cuptiActivityGetNextRecord.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.cuptiActivityGetNextRecord.restype = ctypes.c_int
        super().__init__(lib.cuptiActivityGetNextRecord)
        self.path = path
        self.lib = lib
        self._receiver = receiver
        self._lock = threading.Lock()  # guards the pool and the buffers CUPTI holds (CUPTI calls from any thread)
        self._pool: list[Any] = []
        self._live: dict[int, Any] = {}
        # ctypes releases the GIL around foreign calls: flushes never block other Python threads.
        self.flush_all = lib.cuptiActivityFlushAll
        self._request_fn = REQUEST_FN(self._on_request)  # kept alive for good: CUPTI has no "unregister"
        self._complete_fn = COMPLETE_FN(self._on_complete)
        #: Whether CUPTI's buffer callbacks are ours as far as we know (registering costs ~1 ms: done when not).
        self.ours = False

    def hand_back(self) -> bool:
        """Give CUPTI's buffer callbacks back to PyTorch's profiler (Kineto) where it is loaded: Kineto may register
        its callbacks only once per process, so after a trace of ours its next session would otherwise send its
        records to us (measured: torch.profiler then saw 0 kernels). True when handed back."""
        self.ours = False  # the other tool registers its own anyway
        callbacks = kineto_callbacks()
        if callbacks is None:
            return False
        return not self.lib.cuptiActivityRegisterCallbacks(*callbacks)

    def register(self) -> None:
        """Make CUPTI hand its activity buffers to us (replaces any callbacks registered before)."""
        status = self.lib.cuptiActivityRegisterCallbacks(self._request_fn, self._complete_fn)
        if status:
            raise CuptiCallFailed("cuptiActivityRegisterCallbacks", status)
        self.ours = True

    def _on_request(self, buf_out: Any, size_out: Any, max_records_out: Any) -> None:
        """CUPTI asks for an empty buffer (on whichever thread records an activity): one from the pool."""
        try:
            with self._lock:
                buf = self._pool.pop() if self._pool else None
            if buf is None:
                buf = (ctypes.c_uint64 * (BUFFER_BYTES // 8))()  # 8-byte aligned, as CUPTI requires
            addr = ctypes.addressof(buf)
            with self._lock:
                self._live[addr] = buf
            buf_out[0] = addr
            size_out[0] = ctypes.sizeof(buf)
            max_records_out[0] = 0
        except BaseException:  # noqa: BLE001  nothing may escape into CUPTI; a NULL buffer drops the records
            with contextlib.suppress(BaseException):
                buf_out[0] = None
                size_out[0] = 0

    def _on_complete(self, context: Any, stream_id: int, buf: int | None, size: int, valid: int) -> None:
        """CUPTI hands back a buffer (its thread, or inside a flush): copy the valid bytes, pool the buffer, return."""
        try:
            source = self._receiver()
            if buf and valid and source is not None:
                source.ingest((ctypes.c_char * valid).from_address(buf))  # copied there, before the buffer is reused
            with self._lock:
                kept = self._live.pop(buf, None) if buf else None
                if kept is not None and len(self._pool) < POOL_MAX:
                    self._pool.append(kept)
        except BaseException:  # noqa: BLE001  nothing may escape into CUPTI's thread
            pass


def open_raw(cupti: Any, receiver: Callable[[], Any]) -> RawCupti:
    """A :class:`RawCupti` on the libcupti that cupti-python loaded; CuptiUnavailable if ctypes cannot open it."""
    path = libcupti_path(cupti)
    try:
        return RawCupti(path, receiver)
    except (OSError, AttributeError) as exc:
        raise CuptiUnavailable(f"cannot open {path} through ctypes: {exc}") from exc


def kineto_callbacks() -> tuple[Any, Any] | None:
    """PyTorch's profiler's CUPTI buffer callbacks where torch is loaded (None: not loaded, or not found)."""
    global _KINETO
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if _KINETO is None:
        _KINETO = False
        folder = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or ""), "lib")
        for name in ("libtorch_cpu.so", "libkineto.so", "libtorch_cuda.so"):
            try:
                lib = ctypes.CDLL(os.path.join(folder, name))  # loaded already: the same instance
                request, complete = (ctypes.cast(getattr(lib, s), ctypes.c_void_p).value for s in KINETO_SYMBOLS)
            except (OSError, AttributeError):
                continue
            _KINETO = (ctypes.cast(request, REQUEST_FN), ctypes.cast(complete, COMPLETE_FN))
            break
    return _KINETO or None


def other_client() -> str:
    """Why another CUPTI client holds CUPTI now ('' if none is known): PyTorch's profiler, or a tool injected through
    ``CUDA_INJECTION64_PATH`` (Nsight Systems, Nsight Compute). CUPTI's activity callbacks are one per process: taking
    them would break that tool, so a trace then times its own ops by events."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch._C._autograd._profiler_enabled():
                return "torch.profiler is recording (it holds CUPTI)"
        except Exception:  # noqa: BLE001  (a torch without the C profiler switch)
            pass
    injected = os.environ.get("CUDA_INJECTION64_PATH", "")
    if injected and "cupti" not in os.path.basename(injected).lower():
        return f"a CUDA tool is injected into this process (CUDA_INJECTION64_PATH={injected}: Nsight Systems?)"
    return ""


def read_c_string(pointer: int, limit: int = 1 << 16) -> str:
    """A NUL-terminated string at ``pointer`` in this process, read without touching memory that may be unmapped."""
    global _MEM_FD
    if _MEM_FD is None:
        try:
            _MEM_FD = os.open("/proc/self/mem", os.O_RDONLY)
        except OSError:
            _MEM_FD = -1
    if _MEM_FD < 0:
        return ctypes.string_at(pointer).decode("utf-8", "replace")  # no /proc (not Linux): read it directly
    out = b""
    while len(out) < limit:
        try:
            chunk = os.pread(_MEM_FD, 1024, pointer + len(out))
        except OSError:
            return out.decode("utf-8", "replace") if out else ""
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode("utf-8", "replace")
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")
