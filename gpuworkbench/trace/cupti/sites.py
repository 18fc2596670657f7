"""Other libraries' call sites: a log of where user code was, per thread, and the join that gives each of their CUDA
API records its source line.

CuPy, PyTorch and Numba enqueue work from C, so their launches pass no code of ours. Two things fill the log of a trace
with lines: on Python 3.12 and later, each line of user code as it starts and each return into it
(``trace/call_watch.py``, Python's monitoring: no CUDA call pays anything); before 3.12, CUPTI's callback at the entry
of each driver call that enqueues work (``CallSites.__call__`` as ``detach.HOOK``: two ctypes calls per CUDA call,
entry and exit). A harvest gives each API record the last entry its thread logged before the call ended (``locate``):
the line running when the call was made, or the callback inside it; the device work takes the same location by
correlation id (``foreign.py``). A thread with no entries (PyTorch's autograd engine runs backward on a thread
without Python frames) takes the home thread's: the line that called ``loss.backward()``. Our own ops find their
location as they are enqueued, so the callback skips a call made from gpuworkbench's code.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Any

import numpy as np

from ..lines import SourceLines

_ENTER = 0  # CUPTI_API_ENTER: the first field (callbackSite) of CUpti_CallbackData
_site_of = ctypes.c_int.from_address
_ident = threading.get_ident
_now = time.time_ns  # the window clock (CUPTI's own on Linux; ``clock.WindowClock`` where not)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
#: How far after a call's end an entry may lie and still be its own, where none lies before it on its thread (which only
#: the clock's error can cause: the log starts before the traced code does). The window clock is mapped onto CUPTI's
#: (``clock.WindowClock``), which after torch.profiler counts CPU ticks; that mapping was seen off by more than 50 µs
#: for a cell's first call (H200), so the slack is a millisecond, far above the error and below a line's usual length.
SLACK_NS = 1_000_000
#: Harvests a log entry is kept after it was logged (each thread's last entry is kept whatever its age: it is where
#: that thread still is).
KEEP = 40


class CallSites:
    """The call-site log of one trace (filled by ``call_watch.CallWatch`` or CUPTI's callback), joined at harvests."""

    def __init__(self, lines: SourceLines, work: bytes = b"") -> None:
        self.lines = lines
        self.work = work  # driver callback id -> 1 where the call enqueues device work (the callback's filter)
        #: (thread & 0xFFFFFFFF, window ns, location): one append, atomic across threads
        self.log: list[tuple[int, int, int]] = []
        self._thread = np.empty(0, np.int64)
        self._time = np.empty(0, np.int64)
        self._loc = np.empty(0, np.int64)
        self._born = np.empty(0, np.int64)
        self._cycle = 0
        self.calls = 0  # callbacks that logged a site
        self.watch: Any = None  # the ``call_watch.CallWatch`` that fills the log, where Python's monitoring does

    def __call__(self, cbid: int, data: Any) -> None:
        """A driver call's entry or exit, on its thread (``detach.HOOK``)."""
        work = self.work
        if cbid >= len(work) or not work[cbid] or _site_of(data).value != _ENTER:
            return
        # above this and detach._on_api: whoever made the CUDA call (None on a thread that runs no Python)
        caller = sys._getframe(1).f_back  # noqa: SLF001
        if caller is not None and caller.f_code.co_filename.startswith(_PACKAGE):
            return  # one of our ops: located as it was enqueued
        loc = self.lines.at(caller)
        if loc < 0 and _ident() != self.lines.home:
            loc = self.lines.at(sys._current_frames().get(self.lines.home))  # noqa: SLF001
        if loc >= 0:
            self.log.append((_ident() & 0xFFFFFFFF, _now(), loc))
            self.calls += 1

    def _take(self) -> None:
        """Move the log into the arrays sorted by thread, then time; drop entries older than ``KEEP`` harvests but
        each thread's last."""
        self._cycle += 1
        log = self.log
        n = len(log)
        thread, stamp, loc, born = self._thread, self._time, self._loc, self._born
        if n:
            fresh = np.array(log[:n], np.int64).reshape(n, 3)
            del log[:n]
            thread = np.concatenate([thread, fresh[:, 0]])
            stamp = np.concatenate([stamp, fresh[:, 1]])
            loc = np.concatenate([loc, fresh[:, 2]])
            born = np.concatenate([born, np.full(n, self._cycle, np.int64)])
            order = np.lexsort((stamp, thread))
            thread, stamp, loc, born = thread[order], stamp[order], loc[order], born[order]
        last = np.append(thread[1:] != thread[:-1], True) if thread.size else np.zeros(0, bool)
        keep = last | (self._cycle - born < KEEP)
        self._thread, self._time, self._loc, self._born = thread[keep], stamp[keep], loc[keep], born[keep]

    def locate(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The location of each API call (CUPTI thread id, start and end on the window clock): the last entry its
        thread logged before the call ended, else the home thread's; -1 where neither has one."""
        self._take()
        out = np.full(thread.size, -1, np.int64)
        if not self._time.size or not thread.size:
            return out
        home = self.lines.home & 0xFFFFFFFF
        for t in np.unique(thread).tolist():  # a few threads: one search each
            calls = np.flatnonzero(thread == t)
            out[calls] = self._last_before(t, end[calls])
            missing = calls[out[calls] < 0]
            if missing.size and t != home:
                out[missing] = self._last_before(home, end[missing])
        return out

    def _last_before(self, thread: int, end: np.ndarray) -> np.ndarray:
        """The location of ``thread``'s last entry at or before each time in ``end``, else of its first entry within
        ``SLACK_NS`` after it (-1: none)."""
        lo, hi = np.searchsorted(self._thread, [thread, thread + 1])
        if lo == hi:
            return np.full(end.size, -1, np.int64)
        times, locs = self._time[lo:hi], self._loc[lo:hi]
        at = np.searchsorted(times, end, side="right") - 1
        late = (at < 0) & (times[0] <= end + SLACK_NS)
        return np.where(at >= 0, locs[np.maximum(at, 0)], np.where(late, locs[0], -1))
