"""Who gives ``Trace.summary`` its crossover figures (the ``too-small-for-gpu`` advice): figures the tracer cannot
know itself, from a provider the package root registers (the kernel library's cache reader)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .recorder import Trace


class _Crossovers:
    """Who gives ``Trace.summary`` its crossover figures: a function of the trace (the kernel library registers one)."""

    provider: Callable[[Trace], Any] | None = None


CROSSOVERS = _Crossovers()


def provide_crossovers(provider: Callable[[Trace], Any] | None) -> None:
    """Have ``Trace.summary`` ask ``provider(trace)`` for crossover figures (per device number, a CrossoverPoint per
    kernel name), for the ``too-small-for-gpu`` advice; None stops asking."""
    CROSSOVERS.provider = provider
