"""Lazy device ops: describe uploads, kernels and downloads now; run them later on streams a policy picks.

``op = gw.ops.upload(host).then(f).then(gw.ops.download())`` enqueues nothing. ``op.sync()`` runs it and blocks until
its result is ready, ``await op`` does the same without blocking the event loop, ``op.sync_on(stream)`` runs all of it
on one stream. ``then`` chains dependent work on one stream; ``zip`` puts independent ops on different streams and
joins them with events; ``map`` transforms a result on the host; ``shared`` makes an op that runs once for all its
consumers. Buffers an op allocates for itself are freed once it has finished; the buffers it returns are the caller's.

``policy`` picks streams, ``run`` drives one execution, ``op`` holds the op and its combinators, ``steps`` the ops
that enqueue one thing each.
"""

from __future__ import annotations

from .op import Op, SharedOp
from .policy import DEFAULT_POLICY, Assigned, LeastPending, OnStream, Policy, RoundRobin, op_streams
from .steps import PREV, copy, download, elementwise, fill, kernel, upload, zip

__all__ = [
    "DEFAULT_POLICY",
    "PREV",
    "Assigned",
    "LeastPending",
    "OnStream",
    "Op",
    "Policy",
    "RoundRobin",
    "SharedOp",
    "copy",
    "download",
    "elementwise",
    "fill",
    "kernel",
    "op_streams",
    "upload",
    "zip",
]
