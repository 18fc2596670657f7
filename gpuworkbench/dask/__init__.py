"""Trace a Dask cluster: ``with gw.dask.trace(client) as t:`` records a gpuworkbench trace in every worker.

The workbench rides Dask's ``distributed``, never a scheduler of its own: a ``WorkerPlugin`` starts a trace in each
worker (and in workers that join later); on exit the client gathers every worker's spans and Dask tasks, maps them
onto its own clock by offsets measured with direct round trips, and merges them into one finished ``Trace``
(``ClusterTrace``): per worker a host device with its task and thread rows, then its devices, named by its address.
``t.summary()`` adds per-worker busy / idle, the straggler and device idle between tasks; ``t.export(folder)``
writes one Kineto file per worker (ranks for HolisticTraceAnalysis) and the merged Chrome trace. Tracing needs
``distributed`` (``pip install 'gpuworkbench[dask]'``); the workers' summary (``summary.py``) is NumPy alone, so it
reads a cluster trace anywhere.
"""

from __future__ import annotations

import importlib
from typing import Any

from .summary import ClusterSummary

_NEEDS_DISTRIBUTED = {"TracePlugin": "_plugin", "ClusterTrace": "_trace", "live": "_trace", "trace": "_trace"}


def __getattr__(name: str) -> Any:
    """The tracing names, imported on first use: they need Dask's ``distributed``."""
    module = _NEEDS_DISTRIBUTED.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuworkbench.dask' has no attribute {name!r}")
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        raise ImportError("gpuworkbench.dask needs Dask's distributed: pip install 'gpuworkbench[dask]'") from exc
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["ClusterSummary", "ClusterTrace", "TracePlugin", "live", "trace"]
