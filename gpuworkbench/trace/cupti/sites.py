"""Other libraries' call sites: the source line of each CUDA call that enqueues work, read in CUPTI's callback.

CuPy, PyTorch and Numba enqueue work from C, so their launches pass no code of ours. CUPTI calls back at the entry of
every driver call a trace enables (the launches, copies and memsets of ``kinds.work_table``: a runtime call such as
PyTorch's ``cudaLaunchKernel`` reaches the driver too), on the calling thread, which then holds the GIL. The callback
finds the caller's user frame (``lines.SourceLines``) and logs (thread, time, location, correlation id). A harvest
joins each API record to its entry by correlation id, or, for a runtime call (the driver call inside it has an id of
its own), to the entry logged on its thread inside the call's time (``locate``); the device work it enqueued takes
the same location by correlation id (``foreign.py``). A driver call's own record starts after its entry callbacks
ran, so the id, not the time, joins those. Our own ops find their location as they are enqueued, so a call made
from gpuworkbench's code is skipped here.
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
#: Offset of CUpti_CallbackData's ``correlationId`` (after the site, four pointers, the context, its uid and the
#: correlation data pointer): the id the call's API record and the work it enqueued carry.
_CORRELATION = 64
_site_of = ctypes.c_int.from_address
_u32_at = ctypes.c_uint32.from_address
_ident = threading.get_ident
_now = time.time_ns  # the window clock (CUPTI's own on Linux; ``clock.WindowClock`` where not)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
#: Harvests a logged call waits for its API record before it is dropped.
KEEP = 40


class CallSites:
    """The call-site log of one trace, filled by CUPTI's callback (``__call__``), joined at each harvest."""

    def __init__(self, lines: SourceLines, work: bytes) -> None:
        self.lines = lines
        self.work = work  # driver callback id -> 1 where the call enqueues device work
        #: (thread & 0xFFFFFFFF, window ns, location, correlation id): one append, atomic across threads
        self.log: list[tuple[int, int, int, int]] = []
        self._thread = np.empty(0, np.int64)
        self._time = np.empty(0, np.int64)
        self._loc = np.empty(0, np.int64)
        self._born = np.empty(0, np.int64)
        self._corr = np.empty(0, np.int64)
        self._cycle = 0
        self.calls = 0  # callbacks that logged a site

    def __call__(self, cbid: int, data: Any) -> None:
        """A driver call's entry or exit, on its thread (``detach.HOOK``)."""
        work = self.work
        if cbid >= len(work) or not work[cbid] or _site_of(data).value != _ENTER:
            return
        # above this and detach._on_api: whoever made the CUDA call (None on a thread that runs no Python, such as
        # PyTorch's autograd engine: its work is charged to the home thread's line)
        caller = sys._getframe(1).f_back  # noqa: SLF001
        if caller is not None and caller.f_code.co_filename.startswith(_PACKAGE):
            return  # one of our ops: located as it was enqueued
        loc = self.lines.at(caller)
        if loc < 0 and _ident() != self.lines.home:
            loc = self.lines.at(sys._current_frames().get(self.lines.home))  # noqa: SLF001
        self.log.append((_ident() & 0xFFFFFFFF, _now(), loc, _u32_at(data + _CORRELATION).value))
        self.calls += 1

    def _take(self) -> None:
        """Move the log into the sorted arrays (by thread, then time); drop entries older than ``KEEP`` harvests."""
        self._cycle += 1
        log = self.log
        n = len(log)
        keep = self._cycle - self._born < KEEP
        thread, stamp, loc, born = self._thread[keep], self._time[keep], self._loc[keep], self._born[keep]
        corr = self._corr[keep]
        if n:
            fresh = np.array(log[:n], np.int64).reshape(n, 4)
            del log[:n]
            thread = np.concatenate([thread, fresh[:, 0]])
            stamp = np.concatenate([stamp, fresh[:, 1]])
            loc = np.concatenate([loc, fresh[:, 2]])
            corr = np.concatenate([corr, fresh[:, 3]])
            born = np.concatenate([born, np.full(n, self._cycle, np.int64)])
        order = np.lexsort((stamp, thread))
        self._thread, self._time, self._loc, self._born = thread[order], stamp[order], loc[order], born[order]
        self._corr = corr[order]

    def locate(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray, corr: np.ndarray) -> np.ndarray:
        """The location of each API call (CUPTI thread id, start and end on the window clock, correlation id): the
        entry logged with its id, else the one logged on its thread inside the call; -1 where none was."""
        self._take()
        out = np.full(thread.size, -1, np.int64)
        if not self._time.size or not thread.size:
            return out
        by_id = np.argsort(self._corr, kind="stable")
        ids = self._corr[by_id]
        at = np.minimum(np.searchsorted(ids, corr), ids.size - 1)
        hit = ids[at] == corr
        out[hit] = self._loc[by_id[at[hit]]]
        for t in np.unique(thread).tolist():  # a few threads: one search each
            lo, hi = np.searchsorted(self._thread, [t, t + 1])
            if lo == hi:
                continue
            times = self._time[lo:hi]
            calls = np.flatnonzero((thread == t) & ~hit)
            at = np.minimum(np.searchsorted(times, start[calls]), times.size - 1)
            inside = (times[at] >= start[calls]) & (times[at] <= end[calls])
            out[calls[inside]] = self._loc[lo:hi][at[inside]]
        return out
