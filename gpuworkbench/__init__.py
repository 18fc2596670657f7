"""gpuworkbench: drive any accelerator from a notebook through one small API, and see what it does.

``import gpuworkbench as gw; dev = gw.Device()`` picks the best device (CUDA → ROCm → OpenCL → WebGPU → CPU);
``with gw.trace() as t:`` records every copy, kernel and allocation; ``%load_ext gpuworkbench`` adds the magics.
"""

from __future__ import annotations

from typing import Any

from .buffer import Buffer
from .device import BackendKind, Device, backend_status, devices
from .errors import BackendUnavailable, BufferClosed, CompileError, GpuError, InvalidArgument, OutOfMemory
from .kernels import ElementwiseKernel, Kernel, elementwise
from .pipeline import Pipeline, PipelineRun
from .streams import Event, Stream, StreamAssignment, StreamPool, StreamSet
from .trace.recorder import Trace

__version__ = "0.1.0"


def trace(capacity: int = 1_000_000, interval_s: float = 0.01, source: str = "auto") -> Trace:
    """A Trace to use as ``with gw.trace() as t:``; records every op on every device without synchronizing."""
    return Trace(capacity=capacity, interval_s=interval_s, source=source)


def live(trace: Trace | None = None, device: Device | str | None = None, **options: Any) -> Any:
    """A dashboard widget that follows ``trace`` (or a trace it starts) while later cells run; ``.stop()`` ends it.

    Imports Bokeh and ipywidgets only when called, so that ``import gpuworkbench`` stays fast.
    """
    from .viz.dashboard import live as _live

    return _live(trace, Device(device) if isinstance(device, str) else device, **options)


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's shell
    """``%load_ext gpuworkbench``: registers the ``%gpu`` and ``%%gpu`` magics."""
    from .magics import register

    register(ipython)


__all__ = [
    "BackendKind",
    "BackendUnavailable",
    "Buffer",
    "BufferClosed",
    "CompileError",
    "Device",
    "ElementwiseKernel",
    "Event",
    "GpuError",
    "InvalidArgument",
    "Kernel",
    "OutOfMemory",
    "Pipeline",
    "PipelineRun",
    "Stream",
    "StreamAssignment",
    "StreamPool",
    "StreamSet",
    "Trace",
    "backend_status",
    "devices",
    "elementwise",
    "live",
    "trace",
]
