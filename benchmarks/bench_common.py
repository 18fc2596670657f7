"""What the benchmarks share: timing a function over repeats, and writing their results as JSON."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any


def run_times(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` runs of ``fn`` (each run synchronises at its end)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_of(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Seconds of the fastest of ``repeat`` runs of ``fn``."""
    return min(run_times(fn, repeat))


def median_of(fn: Callable[[], Any], repeat: int = 7) -> float:
    """Median seconds of ``repeat`` runs of ``fn``."""
    return statistics.median(run_times(fn, repeat))


def write_json(path: str | None, results: Any, indent: int = 1) -> None:
    """The results as one JSON file, where ``--json`` asks for it."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=indent)
