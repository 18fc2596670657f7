"""Letting CUPTI go once no trace uses it: a deadline clock, a watch for untraced work, and ``cuptiFinalize`` at a
CUDA call's exit.

Why: once any activity kind has been enabled, CUPTI keeps instrumenting the driver's API until it is finalized, even
with every kind disabled again (measured on an H200: an empty-kernel launch loop ran 1.26–1.54 × slower than in a
process that never traced after one kind was enabled and disabled, in fresh processes, ``probes/cupti_idle.py``;
1.19–1.41 × in one process, ``probes/cupti_states.py``; after ``cuptiFinalize``, 0.96–1.05 ×). CUPTI asks that
``cuptiFinalize`` be called at the exit of a CUDA API call, which PyTorch's Kineto does from a callback subscriber;
:class:`ExitDetach` does the same through ctypes. Nothing here imports cupti-python.
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
#: The detach the callback serves. The callback itself is one trampoline for the process, never freed: a thread may
#: still be inside it (returning early) when its subscriber goes.
_CURRENT: ExitDetach | None = None
_TRAMPOLINE: Any = None
_LIBCUDA: Any = None
#: Who else hears the calls this subscriber's callbacks report: ``fn(cbid, cbdata)`` (the call sites of a trace that
#: attributes work to source lines), or None.
HOOK: Any = None


def _on_api(_userdata: Any, _domain: int, cbid: int, data: Any) -> None:
    """Every driver API call's entry and exit, on its thread, while a detach is subscribed."""
    try:
        hook = HOOK
        if hook is not None:
            hook(cbid, data)
        detach = _CURRENT
        if detach is None or not data or ctypes.c_int.from_address(data).value != _API_EXIT:
            return
        if detach.armed:
            detach._exit()
        elif detach.watching:
            detach._work_seen(cbid)
    except BaseException:  # noqa: BLE001  nothing may escape into a CUDA call
        pass


class ExitDetach:
    """Finalizes CUPTI in the exit of a driver API call on any thread, once armed; one per trace that turns CUPTI's
    kinds on (``Lifecycle.mark_attached``), subscribed on that trace's thread.

    ``subscribe`` where no other thread is inside a CUDA call is known to be safe: on the H200, subscribing while
    another thread launched kernels crashed that thread in 3 of 5 runs; subscribing on the thread starting a trace and
    enabling the callbacks later from another thread did not, in 5 of 5. ``arm`` (any thread) enables the driver
    API's callbacks; the first exit then unsubscribes and finalizes. ``watch`` (any thread) enables them to report the
    first call that enqueues device work instead. While either is on, every driver call's entry and exit runs a ctypes
    callback (it takes the GIL). ``disarm`` turns them off again unless a finalize has begun.
    ``lib``: libcupti through ctypes. ``on_detached`` runs right after ``cuptiFinalize``, on that thread, inside the
    CUDA call: it must be quick (set flags, signal a thread)."""

    def __init__(self, lib: Any, on_detached: Callable[[], None]) -> None:
        self._lib = lib
        self._on_detached = on_detached
        self._gate = threading.Lock()  # held while armed is decided: the callback finalizes, ``disarm`` does not
        self._subscriber = ctypes.c_void_p()
        self.subscribed = self.armed = self.watching = False
        self._domain_on = False  # the driver API's callbacks are enabled (armed, watching, or a watch that fired)
        self._work = b""
        self._on_work: Callable[[], None] | None = None
        self._sites = b""  # driver callback ids enabled one by one for ``HOOK`` (``report_sites``); b"": none
        #: A thread whose work the watch does not report (``threading.get_ident``; 0: none): ours, priming.
        self.ignored_thread = 0
        #: Set once CUPTI is finalized (or the attempt failed: ``status``).
        self.done = threading.Event()
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
        lib.cuptiEnableCallback.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        lib.cuptiEnableCallback.restype = ctypes.c_int

    def subscribe(self) -> int:
        """Become CUPTI's callback subscriber, with no callback enabled; 0, or the CUPTI result that refused it
        (e.g. another subscriber, such as Kineto's, exists)."""
        global _CURRENT, _TRAMPOLINE
        if _TRAMPOLINE is None:
            _TRAMPOLINE = _CALLBACK(_on_api)
        status = int(self._lib.cuptiSubscribe(ctypes.byref(self._subscriber), _TRAMPOLINE, None))
        self.subscribed = not status
        if self.subscribed:
            _CURRENT = self
        return status

    def arm(self) -> int:
        """Enable the driver API's callbacks: the next exit of a call finalizes CUPTI. 0, or CUPTI's refusal."""
        if not self.subscribed or self.done.is_set():
            return -1
        with self._gate:
            self.armed, self.watching = True, False
            status = self._domain(True)
            if status:
                self.armed = False
        return status

    def _domain(self, on: bool) -> int:
        """Enable or disable the driver API's callbacks unless they are so already (under ``_gate``); the calls
        ``report_sites`` asked for stay enabled."""
        if on == self._domain_on:
            return 0
        status = int(self._lib.cuptiEnableDomain(int(on), self._subscriber, _DRIVER_API_DOMAIN))
        if not status:
            self._domain_on = on
            if not on and self._sites:
                self._enable_each(self._sites, True)
        return status

    def report_sites(self, work: bytes) -> int:
        """Have CUPTI call back at the driver calls ``work`` marks (``work[cbid]`` non-zero), for ``HOOK``; b"" turns
        them off. 0, or CUPTI's refusal (-1: not subscribed)."""
        if not self.subscribed or self.done.is_set():
            return -1
        with self._gate:
            old, self._sites = self._sites, work
            if self._domain_on:
                return 0  # every call calls back already; a later ``_domain(False)`` keeps these
            return self._enable_each(work or old, bool(work))

    def _enable_each(self, work: bytes, on: bool) -> int:
        """Enable or disable the callbacks of the driver calls ``work`` marks, one by one (under ``_gate``)."""
        for cbid, marked in enumerate(work):
            if marked:
                status = int(self._lib.cuptiEnableCallback(int(on), self._subscriber, _DRIVER_API_DOMAIN, cbid))
                if status:
                    return status
        return 0

    def watch(self, on_work: Callable[[], None], work: bytes) -> int:
        """Enable the driver API's callbacks and call ``on_work`` at the exit of the first call whose callback id
        ``work`` marks (``work[cbid]`` non-zero: a launch, copy or memset), on that call's thread, inside the call: it
        must only signal. 0, or CUPTI's refusal."""
        if not self.subscribed or self.done.is_set():
            return -1
        with self._gate:
            self._work, self._on_work = work, on_work
            self.watching = True
            status = self._domain(True)
            if status:
                self.watching = False
        return status

    def _work_seen(self, cbid: int) -> None:
        """A call's exit while watching: the first one that enqueues work reports it (once; two threads at once may
        both report, which ``on_work`` must allow)."""
        work = self._work
        if cbid >= len(work) or not work[cbid] or not self.watching or threading.get_ident() == self.ignored_thread:
            return
        self.watching = False
        on_work = self._on_work
        if on_work is not None:
            on_work()

    def host_exit(self) -> bool:
        """Make one cheap CUDA driver call (``cuCtxGetCurrent``) on this thread, so that an armed detach finalizes in
        its exit here rather than in another thread's next call (a finalize takes ~2 ms on an H200). False if the
        driver cannot be loaded; another thread's call may still come first, which is as safe."""
        global _LIBCUDA
        if not self.armed:
            return False
        try:
            if _LIBCUDA is None:
                _LIBCUDA = ctypes.CDLL("libcuda.so.1")  # loaded already by whoever made CUDA calls: the same library
            _LIBCUDA.cuCtxGetCurrent(ctypes.byref(ctypes.c_void_p()))
        except OSError:
            return False
        return True

    def _exit(self) -> None:
        """A CUDA call's exit: the first one while armed (on any thread) unsubscribes and finalizes."""
        if not self.armed or not self._gate.acquire(blocking=False):
            return  # not armed, another thread's exit is finalizing, or ``disarm`` is deciding
        try:
            if not self.armed or self.done.is_set():
                return
            self._lib.cuptiUnsubscribe(self._subscriber)
            self.subscribed = self.armed = self._domain_on = False
            self._sites = b""
            self.status = int(self._lib.cuptiFinalize())  # ctypes lets the GIL go meanwhile
            self.finalized = not self.status
            with contextlib.suppress(BaseException):
                self._on_detached()
            self.done.set()
        finally:
            self._gate.release()

    def disarm(self, timeout_s: float = 2.0, keep_domain: bool = False) -> bool:
        """Turn the callbacks off (armed, watching, or a watch that fired). True: CUPTI stays attached; False: it was
        finalized (this waited up to ``timeout_s`` for a finalize under way). ``keep_domain``: only stop finalizing
        and watching, and leave the callbacks on (each then returns at once) for ``quiet`` to turn off from another
        thread: turning them off took ~60 µs of a trace's start on an H200."""
        if self.done.is_set():
            return not self.finalized
        if not self._gate.acquire(timeout=timeout_s):
            return not self.finalized
        try:
            if not self.done.is_set():
                self.armed = self.watching = False
                if not keep_domain:
                    self._domain(False)  # also after a watch that fired: its callbacks are still on
            return not self.finalized
        finally:
            self._gate.release()

    def quiet(self) -> None:
        """Turn the callbacks off if neither a finalize nor a watch needs them (after ``disarm(keep_domain=True)``)."""
        with self._gate:
            if not self.done.is_set() and not self.armed and not self.watching:
                self._domain(False)

    def unsubscribe(self) -> None:
        """Let another client subscribe (before it starts) or leave at exit; finalizes nothing."""
        if self.disarm() and self.subscribed:
            self._lib.cuptiUnsubscribe(self._subscriber)
            self.subscribed = self._domain_on = False
            self._sites = b""


class Deadline:
    """One daemon thread that calls ``fn(token)`` once the deadline armed last passes; ``disarm`` cancels it.
    The thread starts on the first ``arm`` and ends after ``idle_s`` with nothing armed (None: never)."""

    def __init__(self, fn: Callable[[int], None], name: str, idle_s: float | None = 60.0) -> None:
        self._fn = fn
        self._name = name
        self._idle_s = idle_s
        self._cond = threading.Condition()
        self._due: tuple[float, int] | None = None
        self._busy = False  # ``fn`` is running
        self._thread: threading.Thread | None = None

    def arm(self, delay_s: float, token: int) -> None:
        """Call ``fn(token)`` in ``delay_s`` seconds, replacing any call armed before."""
        with self._cond:
            self._due = (time.monotonic() + delay_s, token)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()  # ``wait_idle`` may wait on the same condition

    def disarm(self) -> None:
        """Cancel the armed call. The thread is not woken (a trace's start calls this): it finds nothing due when its
        wait ends."""
        with self._cond:
            self._due = None

    @property
    def armed(self) -> bool:
        return self._due is not None

    def left_s(self) -> float | None:
        """Seconds until the armed call (None: none armed)."""
        due = self._due
        return None if due is None else max(0.0, due[0] - time.monotonic())

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until no call is armed within that time and none runs; True if so. For a caller
        that must not share the host with a call due now (the pre-run hook, before the cell's clock starts)."""
        end = time.monotonic() + timeout_s

        def idle() -> bool:
            return not self._busy and (self._due is None or self._due[0] > end)

        with self._cond:
            return self._cond.wait_for(idle, timeout_s)

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
                        self._busy = True
                        break
                    self._cond.wait(left)
            try:
                with contextlib.suppress(Exception):
                    self._fn(token)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
