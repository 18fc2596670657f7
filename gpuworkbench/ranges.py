"""``gw.range(name)``: mark a region of host time in every recording trace, and as an NVTX range for other tools."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import listeners
from .errors import InvalidArgument

#: The NVTX domain of the workbench's own ranges: a CUPTI trace leaves these out of other libraries' ranges.
NVTX_DOMAIN = "gpuworkbench"

_NVTX: Any = None  # the nvtx package's Domain for our ranges, False when nvtx is not installed


def _nvtx_domain() -> Any:
    global _NVTX
    if _NVTX is None:
        try:
            import nvtx

            _NVTX = nvtx.get_domain(NVTX_DOMAIN)
        except Exception:  # noqa: BLE001  (not installed, or an nvtx without domains)
            _NVTX = False
    return _NVTX


@contextmanager
def range(name: str) -> Iterator[None]:  # noqa: A001 - the public name mirrors nvtx's and torch's ranges
    """``with gw.range("step"):`` shows the region as a ``range`` span on this thread's host row of every recording
    trace, and pushes the same NVTX range (domain "gpuworkbench") where the ``nvtx`` package is installed, so that
    Nsight Systems and torch.profiler see it too."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a range needs a non-empty name (a str), got {name!r}")
    domain = _nvtx_domain()
    pushed = False
    if domain:
        try:
            domain.push_range(domain.get_event_attributes(message=name))
            pushed = True
        except Exception:  # noqa: BLE001  NVTX is a courtesy to other tools: never the user's error
            pass
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        end = time.perf_counter_ns()
        if pushed:
            with contextlib.suppress(Exception):
                domain.pop_range()
        thread = threading.get_ident()
        for t in listeners.recording():
            t.host_range(name, start, end, thread)
