"""Where user code is, per thread, as it runs: each line of user code that starts, and each return into it, logged by
Python's own monitoring (``sys.monitoring``, Python 3.12 and later).

CuPy, PyTorch and Numba enqueue work from C, so their launches pass no code of ours. A trace with lines watches user
code: ``PY_START`` sees each code object once and, for one of user code (``lines``' verdict), turns on ``LINE``,
``PY_RETURN`` and ``PY_YIELD`` events for that code object alone; library code is never instrumented (``DISABLE``),
so PyTorch's own Python runs untouched. Each event logs (thread, time, location) into the trace's ``CallSites``
(``cupti/sites.py``) and keeps the thread's place in ``SourceLines.current``. A harvest gives each CUDA API record
the last entry its thread logged before the call ended: the line that was running, operators included (``x * 2``
calls CuPy with no Python call event), and after a user function returned, the caller's line again. A thread with no
entries (PyTorch's autograd engine) takes the home thread's. Our own ops read ``current`` instead of walking the
stack. No CUDA call pays anything: the cost is one Python callback per line of user code run.
"""

from __future__ import annotations

import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any

from .cupti.sites import CallSites
from .lines import SourceLines

MONITORING: Any = getattr(sys, "monitoring", None)  # Python 3.12+
#: Tool ids tried, in order (0 debugger, 1 coverage, 2 profiler and 5 optimizer are named by Python; 3 and 4 free).
TOOL_IDS = (4, 3)
_ident = threading.get_ident
_now = time.time_ns
_LOCK = threading.Lock()


class CallWatch:
    """The monitoring of one trace: ``start`` claims a tool id, ``stop`` gives it back and uninstruments."""

    EVENTS = ("LINE", "PY_RETURN", "PY_YIELD")

    def __init__(self, lines: SourceLines, sites: CallSites) -> None:
        self.lines, self.sites = lines, sites
        self.tool = -1
        self._codes: list[CodeType] = []  # instrumented: cleared at stop
        self._local = 0

    @staticmethod
    def available() -> bool:
        return MONITORING is not None

    def start(self, frame: FrameType | None) -> bool:
        """Watch from now on, the stack from ``frame`` outwards included (code already running, such as the cell that
        starts the trace); False where no tool id is free (other tools hold them)."""
        mon = MONITORING
        if mon is None:
            return False
        with _LOCK:
            for tool in TOOL_IDS:
                if mon.get_tool(tool) is None:
                    mon.use_tool_id(tool, "gpuworkbench lines")
                    self.tool = tool
                    break
            else:
                return False
        events = mon.events
        self._local = 0
        for name in self.EVENTS:
            self._local |= getattr(events, name)
        line_cb, return_cb = self._callbacks()
        mon.register_callback(self.tool, events.PY_START, self._start)
        mon.register_callback(self.tool, events.LINE, line_cb)
        mon.register_callback(self.tool, events.PY_RETURN, return_cb)
        mon.register_callback(self.tool, events.PY_YIELD, return_cb)
        lines = self.lines
        here = lines.current[_ident()] = lines.at(frame)
        if here >= 0:  # where the trace starts: the place of work made before the next line
            self.sites.log.append((_ident() & 0xFFFFFFFF, _now(), here))
        while frame is not None:
            if not lines.is_library(frame.f_code):
                self._instrument(frame.f_code)
            frame = frame.f_back
        lines.watched = True
        mon.set_events(self.tool, events.PY_START)
        return True

    def stop(self) -> None:
        """Stop watching: events off, code uninstrumented, the tool id given back."""
        mon = MONITORING
        if mon is None or self.tool < 0:
            return
        self.lines.watched = False
        with _LOCK:
            mon.set_events(self.tool, 0)
            for code in self._codes:
                mon.set_local_events(self.tool, code, 0)
            self._codes.clear()
            for name in ("PY_START", *self.EVENTS):
                mon.register_callback(self.tool, getattr(mon.events, name), None)
            mon.free_tool_id(self.tool)
            self.tool = -1

    def _instrument(self, code: CodeType) -> None:
        self._codes.append(code)
        MONITORING.set_local_events(self.tool, code, self._local)

    def _start(self, code: CodeType, _offset: int) -> Any:
        """A code object's first start: user code gets watched; either way, its starts are not seen again."""
        if not self.lines.is_library(code):
            self._instrument(code)
        return MONITORING.DISABLE

    def _callbacks(self) -> tuple[Any, Any]:
        """The LINE and PY_RETURN / PY_YIELD callbacks, with what they touch bound as locals: they run once per line
        of user code (a dict lookup, a tuple and an append where the line was seen before)."""
        lines = self.lines
        by_line = lines.by_line
        current = lines.current
        append = self.sites.log.append
        in_focus, at, getframe, ident, now = lines.in_focus, lines.at, sys._getframe, _ident, _now  # noqa: SLF001

        def on_line(code: CodeType, line: int) -> None:
            loc = by_line.get((id(code), line))
            if loc is None:  # first time here, or a function the cell called: its caller's line
                loc = in_focus(code, line) if code.co_filename in lines.focus else at(getframe(1))
            me = ident()
            current[me] = loc
            append((me & 0xFFFFFFFF, now(), loc))

        def on_return(_code: CodeType, _offset: int, _value: object) -> None:
            caller = getframe(1).f_back  # back where it was called from
            loc = at(caller) if caller is not None else -1
            me = ident()
            if loc >= 0:
                current[me] = loc
                append((me & 0xFFFFFFFF, now(), loc))
            else:
                current.pop(me, None)

        return on_line, on_return
