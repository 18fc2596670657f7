"""CUPTI's phases in this process, and each phase in words (``cupti.state()``, ``%gpu cupti``): what a CUDA call pays
for CUPTI now, and until when. docs/cupti.md draws the transitions between them.
"""

from __future__ import annotations

import enum
from typing import Any


class Phase(enum.Enum):
    """Where CUPTI stands, checked in this order (a block outranks a parked source, and so on)."""

    #: A trace's source has its kinds on.
    RECORDING = "recording"
    #: A persistent kernel runs: CUPTI is left as it is (attached or not) until the block ends.
    BLOCKED = "blocked"
    #: A stopped trace's source is parked with its kinds on, for the next trace to take over.
    LINGERING = "lingering"
    #: Kinds off, the detach armed: CUPTI is finalized at the exit of the next CUDA call.
    LETTING_GO = "letting go"
    #: Let go, and initialized again with no kind on shortly (``reattach_soon``).
    REATTACHING = "reattaching"
    #: Initialized again with no kind on: the next trace only enables its kinds.
    READY = "ready"
    #: Attached with its kinds off, not let go (the detach was refused, or another tool took CUPTI).
    ATTACHED = "attached"
    #: Let go (or never attached by us): CUDA calls pay nothing for it.
    NOT_ATTACHED = "not attached"


def render(life: Any, phase: Phase, why_blocked: str) -> str:
    """``phase`` of the lifecycle ``life`` in words; ``why_blocked``: the block's reason, read with the phase."""
    if phase is Phase.RECORDING:
        return "recording: a trace's source holds CUPTI"
    if phase is Phase.BLOCKED:
        attached = "attached" if life.attached else "not attached"
        return f"blocked: {why_blocked}; CUPTI is left as it is ({attached}) meanwhile"
    if phase is Phase.LINGERING:
        left = life.linger_timer.left_s()
        when = f"in {left:.0f} s" if left is not None else "soon"
        detach = life.detach
        watching = detach is not None and detach.watching
        return (
            f"lingering: attached with its kinds on, so that the next trace starts without attaching it; let go "
            f"{'at the first untraced launch, copy or memset, or ' if watching else ''}{when} unless a trace takes "
            f"it over (cupti.LINGER_S = {life.linger_s:g}). Every CUDA call pays for it meanwhile"
        )
    if phase is Phase.LETTING_GO:
        return "kinds off; CUPTI is let go at the exit of the next CUDA call"
    if phase is Phase.REATTACHING:
        return "not attached: CUDA calls pay nothing for it; initialized again (no kind on) shortly"
    if phase is Phase.READY:
        return (
            "ready: initialized again with no kind on, so that the next trace only enables its kinds; an empty launch "
            "pays a few % more than with CUPTI let go (%gpu cupti release)"
        )
    if phase is Phase.ATTACHED:
        if life.detach_refused:
            return (
                f"attached with its kinds off, not let go: CUPTI refused the detach (result {life.detach_refused}; "
                "another tool such as torch.profiler holds its one callback subscriber). Every CUDA call pays for it"
            )
        return "attached with its kinds off"
    if life.notebook:
        return "not attached: CUDA calls pay nothing for it; the next cell that traces attaches it before it runs"
    return "not attached: CUDA calls pay nothing for it"
