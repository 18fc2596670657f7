"""Trace a Dask cluster: ``with gw.dask.trace(client) as t:`` records a gpuworkbench trace in every worker.

The workbench rides Dask's ``distributed``, never a scheduler of its own: a ``WorkerPlugin`` starts a trace in each
worker (and in workers that join later); on exit the client gathers every worker's spans and Dask tasks, maps them
onto its own clock by offsets measured with direct round trips, and merges them into one finished ``Trace``
(``ClusterTrace``): per worker a host device with its task and thread rows, then its devices, named by its address.
``t.summary()`` adds per-worker busy / idle, the straggler and device idle between tasks; ``t.export(folder)``
writes one Kineto file per worker (ranks for HolisticTraceAnalysis) and the merged Chrome trace. Needs
``distributed`` (``pip install 'gpuworkbench[dask]'``).
"""

from __future__ import annotations

try:
    import distributed  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("gpuworkbench.dask needs Dask's distributed: pip install 'gpuworkbench[dask]'") from exc

from ._plugin import TracePlugin
from ._trace import ClusterTrace, live, trace
from .summary import ClusterSummary

__all__ = ["ClusterSummary", "ClusterTrace", "TracePlugin", "live", "trace"]
