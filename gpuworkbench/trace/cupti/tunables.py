"""What CUPTI's lifecycle can be tuned by: how long a stopped trace's source lingers, whether untraced work ends the
linger, priming, who quiets a taken-over watch, re-initialization and the notebook mode.

Read from the environment (``GPUWB_CUPTI_*``) when a lifecycle is made; attributes of it from then on, so that a test
makes a lifecycle of its own and sets them there. ``cupti.LINGER_S`` and the other upper-case names of the package read
and set those of the process's lifecycle.
"""

from __future__ import annotations

import os


def _reattach_s() -> float | None:
    value = float(os.environ.get("GPUWB_CUPTI_REATTACH_S", "") or "nan")
    return None if value != value else value  # unset or empty: off


class Tunables:
    """The lifecycle's tunables, with their defaults and environment variables."""

    def __init__(self) -> None:
        #: Seconds at most that CUPTI stays attached with its kinds on after the last trace that used it stops (its
        #: source parks): a trace started meanwhile takes it over without enabling anything. Then, or at the first
        #: untraced launch, copy or memset (``watch_untraced``), it is let go (``cuptiFinalize``), because an attached
        #: CUPTI slows every launch of the process, traced or not. 0: let go as each trace ends.
        self.linger_s = float(os.environ.get("GPUWB_CUPTI_LINGER_S", "30"))
        #: Seconds after CUPTI was let go at a CUDA call's exit until it is initialized again on a thread of ours, with
        #: no kind on (``reattach_soon``): the next trace then only enables its kinds (~0.3 ms on an H200) rather than
        #: attaching (~12–16 ms). Off (None) unless ``GPUWB_CUPTI_REATTACH_S`` sets it: initialized, CUPTI costs every
        #: launch of the process, traced or not (untraced launches of a script right after a trace ran 1.11 × those
        #: of a process that never traced, H200: docs/benchmarks.md). Never in a notebook (``notebook``), whose
        #: kernel readies CUPTI between cells.
        self.reattach_s = _reattach_s()
        #: Whether a lingering source is let go at the first untraced call that enqueues device work (a launch, copy
        #: or memset of any library on any thread), rather than lingering on for ``linger_s``.
        self.watch_untraced = os.environ.get("GPUWB_CUPTI_WATCH", "1") != "0"
        #: Prime CUPTI as a source parks (``prime.py``): a 4-byte copy and memset per active device, so that the next
        #: op CUPTI records does not pay for the park's forced flush. ``GPUWB_CUPTI_PRIME=0`` turns it off.
        self.prime_at_park = os.environ.get("GPUWB_CUPTI_PRIME", "1") != "0"
        #: Who turns a taken-over watch's callbacks off: "trace" (the taking trace's harvest thread, as it begins and
        #: at each wake, ``quiet_taken_over``: no other thread woken beside the first op; ``CuptiSource.start`` took
        #: 36–45 µs against 51–60 µs with "linger", H200 host, ``probes/trace_start_steps.py``) or "linger" (the
        #: linger thread, woken by the take-over: for sources started without a trace's harvest thread).
        self.quiet_by = os.environ.get("GPUWB_CUPTI_QUIET_BY", "trace")
        #: Set by ``%load_ext gpuworkbench`` (``set_notebook``): its hooks attach CUPTI before each cell that traces
        #: (``warm_for_cell``) and let it go before the others, so a let-go is not followed by a re-initialization
        #: ``reattach_s`` later, which could fall inside a running cell and stall its CUDA calls (4–9 ms once on an
        #: H200, ``probes/cupti_attach.py``) and would leave untraced cells paying *ready*'s cost.
        self.notebook = False
        #: How long the pre-run hook waits for the prime thread (``warm_for_cell``); priming took ~1–3 ms on an H100.
        self.prime_wait_s = 0.1
        #: Whether ``prepare`` also attaches CUPTI to the process (its first callback registration: ~20 ms on an
        #: H100), so that the first trace does not pay it.
        self.attach_early = True
