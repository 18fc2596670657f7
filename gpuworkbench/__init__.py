"""gpuworkbench: drive any accelerator from a notebook through one small API, and see what it does.

``import gpuworkbench as gw; dev = gw.Device()`` picks the best device (CUDA → ROCm → OpenCL → WebGPU → CPU);
``with gw.trace() as t:`` records every copy, kernel and allocation; ``%load_ext gpuworkbench`` adds the magics.
"""

from __future__ import annotations

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
    "trace",
]
