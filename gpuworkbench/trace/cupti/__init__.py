"""CUPTI activity records (kernels, copies, memsets, API calls, allocations, NVTX) as a trace's source of device time.

One concept per module:

- ``binding``: libcupti through ctypes (our buffer callbacks and flush, Kineto's to hand CUPTI back), cupti-python
  import; ``walk``: where records start in a buffer; ``layout``: record layouts and kind tables; ``decode``: a
  flush's buffers as columns; ``kinds``: which kinds a source enables, and the API filter;
- ``clock``: CUPTI's timestamps in ns (ticks after torch.profiler) and on the ops' window clock;
- ``source``: ``CuptiSource``, what one trace reads of CUPTI; ``join``: records to our op ids; ``ops``: ops waiting
  for their records; ``foreign``: other libraries' records as spans;
- ``nvtx``: NVTX pointed at the libcupti that cupti-python loads, so that every library's ranges reach a trace;
- ``lifecycle``: CUPTI's lifetime in the process as one object (``LIFECYCLE``), its ``phase`` (``phase``) and
  ``tunables``; ``detach``: ``cuptiFinalize`` at a CUDA call's exit and the deadline threads; ``prime``: priming
  CUPTI as a source parks.

docs/cupti.md draws the phases and what each costs. The functions here act on ``LIFECYCLE``; ``cupti.LINGER_S`` and
the other upper-case tunables read and set its attributes. The lifecycle listens for blocks (a persistent kernel) in
``listeners.BLOCKERS``. ``cupti`` (cupti-python) is imported lazily: this package imports without it.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ...listeners import BLOCKERS
from .binding import CuptiUnavailable, other_client
from .lifecycle import LIFECYCLE, Lifecycle
from .nvtx import mismatch, point_nvtx_at_cupti
from .phase import Phase
from .source import CuptiSource

__all__ = [
    "LIFECYCLE",
    "CuptiSource",
    "CuptiUnavailable",
    "Lifecycle",
    "Phase",
    "block",
    "blocked",
    "between_cells",
    "callbacks_unknown",
    "detached",
    "hand_over",
    "let_go",
    "lingering",
    "new_source",
    "nvtx_mismatch",
    "other_client",
    "point_nvtx_at_cupti",
    "prepare",
    "prime_here",
    "quiet_taken_over",
    "reattach_soon",
    "set_notebook",
    "settle",
    "state",
    "timestamps_are_ticks",
    "timestamps_may_change",
    "unblock",
    "warm_for_cell",
]

new_source = LIFECYCLE.new_source
state = LIFECYCLE.state
detached = LIFECYCLE.detached
lingering = LIFECYCLE.lingering
let_go = LIFECYCLE.let_go
settle = LIFECYCLE.settle
reattach_soon = LIFECYCLE.reattach_soon
warm_for_cell = LIFECYCLE.warm_for_cell
between_cells = LIFECYCLE.between_cells
prime_here = LIFECYCLE.prime_here
prepare = LIFECYCLE.prepare
set_notebook = LIFECYCLE.set_notebook
block = LIFECYCLE.block
unblock = LIFECYCLE.unblock
blocked = LIFECYCLE.blocked
hand_over = LIFECYCLE.hand_over
quiet_taken_over = LIFECYCLE.quiet_taken_over
callbacks_unknown = LIFECYCLE.callbacks_unknown
timestamps_may_change = LIFECYCLE.timestamps_may_change
timestamps_are_ticks = LIFECYCLE.timestamps_are_ticks

BLOCKERS.append(LIFECYCLE)


def _forward(attribute: str) -> property:
    def get(_module: types.ModuleType) -> Any:
        return getattr(LIFECYCLE, attribute)

    def put(_module: types.ModuleType, value: Any) -> None:
        setattr(LIFECYCLE, attribute, value)

    return property(get, put, doc=f"``LIFECYCLE.{attribute}`` (see ``tunables.py``).")


class _Package(types.ModuleType):
    """This package, whose upper-case tunables read and set those of the process's lifecycle (``gw.cupti.LINGER_S``)."""

    LINGER_S = _forward("linger_s")
    REATTACH_S = _forward("reattach_s")
    WATCH_UNTRACED = _forward("watch_untraced")
    PRIME_AT_PARK = _forward("prime_at_park")
    QUIET_BY = _forward("quiet_by")
    NOTEBOOK = _forward("notebook")
    PRIME_WAIT_S = _forward("prime_wait_s")
    ATTACH_EARLY = _forward("attach_early")
    detach_refused = property(lambda _module: LIFECYCLE.detach_refused, doc="``LIFECYCLE.detach_refused``.")


sys.modules[__name__].__class__ = _Package


def nvtx_mismatch() -> str:
    """A warning where NVTX_INJECTION64_PATH names another libcupti than the one CUPTI runs from, else ""."""
    raw = LIFECYCLE.raw
    return mismatch(raw.path) if raw is not None else ""
