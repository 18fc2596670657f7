"""What the CPU backend's generated NumPy source calls at run time (it imports this module as ``gw_rt``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GpuError
from . import ktypes


def __getattr__(name: str) -> Any:
    """``bfloat16``: ml_dtypes' (None where it is not installed: no bf16 kernel runs then), imported on first use."""
    if name == "bfloat16":
        return ktypes.bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def narrow(lanes: np.ndarray | None, cond: Any) -> np.ndarray:
    """The lanes (indices into the launch) of ``lanes`` (all when None) where ``cond`` holds."""
    cond = np.asarray(cond, dtype=bool)
    return np.flatnonzero(cond) if lanes is None else lanes[cond]


def last(value: Any) -> Any:
    """The value the last lane stores when every lane writes one element: on a GPU some lane wins; here the last."""
    value = np.asarray(value)
    return value[-1] if value.ndim else value[()]


def run_block(threads: list) -> None:
    """Run one block's threads (generators) phase by phase: each runs up to its next ``gw.barrier()`` (a ``yield``)
    before any runs on, so what the block wrote before a barrier is what every thread reads after it."""
    live = threads
    while live:
        waiting = []
        for thread in live:
            try:
                next(thread)
            except StopIteration:
                continue
            waiting.append(thread)
        if waiting and len(waiting) != len(live):
            raise GpuError(
                f"{len(live) - len(waiting)} of {len(live)} threads of a block ended while the others wait at a "
                "gw.barrier(): every thread of a block must reach the same barriers"
            )
        live = waiting
