"""Letting CUPTI go once no trace has used it for a while: a deadline clock, and ``cuptiFinalize`` at a CUDA call's
exit.

Why: once any activity kind has been enabled, CUPTI keeps instrumenting the driver's API until it is finalized, even
with every kind disabled again (measured on an H200 with ``benchmarks/probes/cupti_idle.py``: an empty-kernel launch
loop ran 1.26–1.54 × slower than in a process that never traced after one kind was enabled and disabled; after
``cuptiFinalize``, 0.96 ×). CUPTI asks that ``cuptiFinalize`` be called at the exit of a CUDA API call, which
PyTorch's Kineto does from a callback subscriber; :class:`ExitDetach` does the same through ctypes. Nothing here
imports cupti-python.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

#: ``void (*)(void *userdata, CUpti_CallbackDomain, CUpti_CallbackId, const void *cbdata)``.
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
_DRIVER_API_DOMAIN = 1  # CUPTI_CB_DOMAIN_DRIVER_API: every runtime call goes through the driver too
_API_EXIT = 1  # CUPTI_API_EXIT, the first field (callbackSite) of CUpti_CallbackData


class ExitDetach:
    """Finalizes CUPTI in the exit of the next driver API call on any thread; ``cancel`` stops waiting for one.

    ``lib``: libcupti through ctypes. ``on_detached`` runs right after ``cuptiFinalize``, on that thread, inside the
    CUDA call: it must only set flags. One use: ``arm`` once, then it finalizes or is cancelled."""

    def __init__(self, lib: Any, on_detached: Callable[[], None]) -> None:
        self._lib = lib
        self._on_detached = on_detached
        self._gate = threading.Lock()  # whoever takes it decides: the callback finalizes, ``cancel`` does not
        self._subscriber = ctypes.c_void_p()
        self._fn = _CALLBACK(self._on_api)  # kept alive while subscribed
        #: Set once unsubscribed, finalized or not.
        self.done = threading.Event()
        #: Whether CUPTI was finalized, and cuptiFinalize's result.
        self.finalized = False
        self.status = 0
        lib.cuptiSubscribe.argtypes = [ctypes.POINTER(ctypes.c_void_p), _CALLBACK, ctypes.c_void_p]
        lib.cuptiSubscribe.restype = ctypes.c_int
        lib.cuptiEnableDomain.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int]
        lib.cuptiEnableDomain.restype = ctypes.c_int
        lib.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        lib.cuptiUnsubscribe.restype = ctypes.c_int
        lib.cuptiFinalize.argtypes = []
        lib.cuptiFinalize.restype = ctypes.c_int

    def arm(self) -> int:
        """Subscribe to the driver API's callbacks; 0, or the CUPTI result that refused it (nothing left subscribed;
        e.g. another subscriber such as Kineto's exists)."""
        status = self._lib.cuptiSubscribe(ctypes.byref(self._subscriber), self._fn, None)
        if status:
            self.done.set()
            return int(status)
        status = self._lib.cuptiEnableDomain(1, self._subscriber, _DRIVER_API_DOMAIN)
        if status:
            self._lib.cuptiUnsubscribe(self._subscriber)
            self.done.set()
        return int(status)

    def _on_api(self, _userdata: Any, _domain: int, _cbid: int, data: Any) -> None:
        """Every driver API call's entry and exit, on its thread, until the first exit finalizes."""
        try:
            if not data or ctypes.c_int.from_address(data).value != _API_EXIT:
                return
            if not self._gate.acquire(blocking=False):
                return  # another thread's exit is finalizing, or ``cancel`` won
            self._lib.cuptiUnsubscribe(self._subscriber)
            self.status = int(self._lib.cuptiFinalize())  # ctypes lets the GIL go meanwhile
            self.finalized = not self.status
            with contextlib.suppress(BaseException):
                self._on_detached()
            self.done.set()
        except BaseException:  # noqa: BLE001  nothing may escape into a CUDA call
            pass

    def cancel(self, timeout_s: float = 2.0) -> bool:
        """Stop waiting for an API exit. True: CUPTI stays attached; False: it was (or is being) finalized, and this
        waited up to ``timeout_s`` for that to end."""
        if self.done.is_set():
            return not self.finalized
        if self._gate.acquire(blocking=False):
            self._lib.cuptiUnsubscribe(self._subscriber)
            self.done.set()
            return True
        self.done.wait(timeout_s)
        return False


class Deadline:
    """One daemon thread that calls ``fn(token)`` once the deadline armed last passes; ``disarm`` cancels it.
    The thread starts on the first ``arm`` and ends after ``idle_s`` with nothing armed."""

    def __init__(self, fn: Callable[[int], None], name: str, idle_s: float = 60.0) -> None:
        self._fn = fn
        self._name = name
        self._idle_s = idle_s
        self._cond = threading.Condition()
        self._due: tuple[float, int] | None = None
        self._thread: threading.Thread | None = None

    def arm(self, delay_s: float, token: int) -> None:
        """Call ``fn(token)`` in ``delay_s`` seconds, replacing any call armed before."""
        with self._cond:
            self._due = (time.monotonic() + delay_s, token)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._due = None
            self._cond.notify()

    @property
    def armed(self) -> bool:
        return self._due is not None

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._due is None:
                        if not self._cond.wait(self._idle_s) and self._due is None:
                            self._thread = None
                            return
                        continue
                    left = self._due[0] - time.monotonic()
                    if left <= 0:
                        token, self._due = self._due[1], None
                        break
                    self._cond.wait(left)
            with contextlib.suppress(Exception):
                self._fn(token)
