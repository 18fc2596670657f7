"""gpuworkbench: drive any accelerator from a notebook through one small API, and see what it does.

``import gpuworkbench as gw; dev = gw.Device()`` picks the best device (CUDA → ROCm → OpenCL → WebGPU → CPU);
``with gw.trace() as t:`` records every copy, kernel and allocation; ``%load_ext gpuworkbench`` adds the magics.
"""

from __future__ import annotations

from typing import Any

from . import ops
from ._version import __version__
from .buffer import Buffer
from .device import BackendKind, Device, backend_status, devices
from .errors import (
    BackendUnavailable,
    BufferClosed,
    CompileError,
    DeviceTimeout,
    GpuError,
    InvalidArgument,
    OutOfMemory,
)
from .graphs import Graph
from .kernels import ElementwiseKernel, Kernel, elementwise
from .ops import LeastPending, OnStream, Op, Policy, RoundRobin
from .persistent import PersistentKernel
from .pipeline import Pipeline, PipelineRun
from .pykernel import (
    barrier,
    bf16,
    f16,
    f32,
    f64,
    group_id,
    group_size,
    i32,
    i64,
    index,
    kernel,
    local_id,
    num_groups,
    shared,
    u32,
    width,
)
from .ranges import range
from .streams import Event, Stream, StreamAssignment, StreamPool, StreamSet
from .trace import cupti
from .trace.compare import compare
from .trace.lines import treat_as_library
from .trace.recorder import Trace, provide_crossovers
from .trace.recorder import new_trace as _new_trace
from .trace.timeit import timeit

cupti.point_nvtx_at_cupti()  # before the process's first NVTX call, so that every library's ranges reach a trace


def trace(
    capacity: int = 1_000_000,
    interval_s: float = 0.05,
    source: str = "auto",
    others: bool | None = None,
    lines: bool = False,
    counters: bool = False,
) -> Trace:
    """A Trace to use as ``with gw.trace() as t:``; records every op on every device without synchronizing.
    ``others`` (on unless False or ``GPUWB_TRACE_OTHERS=0``): other libraries' CUDA work too (CuPy, PyTorch ...);
    ``lines``: each op carries the source line that issued it (``t.statistics().lines``); ``counters``: the host's
    CPU and memory, and each device's counters where its platform offers some, sampled while it records
    (``t.counters()``, ``t.counter_sources``, ``t.counters_plot()``)."""
    return _new_trace(
        capacity=capacity, interval_s=interval_s, source=source, others=others, lines=lines, counters=counters
    )


def live(trace: Trace | None = None, device: Device | str | None = None, client: Any = None, **options: Any) -> Any:
    """A dashboard widget that follows ``trace`` (or a trace it starts) while later cells run; ``.stop()`` ends it.
    ``counters=True``: the trace it starts samples counters, and it shows their newest values.
    ``client`` (a Dask ``distributed.Client``): follow a trace of its whole cluster (``gw.dask.live``).

    Imports Bokeh and ipywidgets only when called, so that ``import gpuworkbench`` stays fast.
    """
    if client is not None:
        from .dask import live as _cluster_live

        return _cluster_live(client, **options)
    from .viz.dashboard import live as _live

    return _live(trace, Device(device) if isinstance(device, str) else device, **options)


def __getattr__(name: str) -> Any:
    """``gw.dask``, ``gw.library``, ``gw.crossover`` and ``gw.load_trace`` on first use: ``import gpuworkbench``
    imports neither Dask nor the library, whose kernels are translated as it loads (~0.1 s), nor the trace reader
    and its decoder (~30 ms)."""
    import importlib

    if name == "load_trace":
        return importlib.import_module(".trace.kineto", __name__).load_trace
    if name in ("dask", "library"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("crossover", "CrossoverResult"):
        return getattr(importlib.import_module(".library.crossover_measure", __name__), name)
    raise AttributeError(f"module 'gpuworkbench' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's shell
    """``%load_ext gpuworkbench``: registers the ``%gpu`` and ``%%gpu`` magics and the JupyterLab panel's comm."""
    from .notebook.comm import register as serve_panel
    from .notebook.magics import register

    register(ipython)
    serve_panel(ipython)  # a no-op outside a Jupyter kernel
    _prepare_tracing()


def _cached_crossovers(trace: Trace) -> Any:
    """The crossover figures cached for ``trace``'s devices (``gw.crossover``), for its summary's advice: the kernel
    library is imported only when a summary asks."""
    from .library.crossover_cache import cached_crossovers

    return cached_crossovers(trace)


provide_crossovers(_cached_crossovers)


def _prepare_tracing() -> None:
    """What ``%load_ext`` readies so that the first traced cell does not pay for it."""
    from .trace.harvest_threads import THREADS
    from .trace.recorder import make_spares

    cupti.prepare()  # CUPTI's one-time setup (~75 ms of the first trace otherwise)
    THREADS.warm()  # a harvest thread waiting (starting one took 0.3-0.4 ms of a trace's start)
    make_spares()  # the first trace's object (made on its start: ~0.1 ms on a cold CPU)


__all__ = [
    "BackendKind",
    "BackendUnavailable",
    "Buffer",
    "BufferClosed",
    "CompileError",
    "CrossoverResult",
    "Device",
    "DeviceTimeout",
    "ElementwiseKernel",
    "Event",
    "GpuError",
    "Graph",
    "InvalidArgument",
    "Kernel",
    "LeastPending",
    "OnStream",
    "Op",
    "OutOfMemory",
    "PersistentKernel",
    "Pipeline",
    "PipelineRun",
    "Policy",
    "RoundRobin",
    "Stream",
    "StreamAssignment",
    "StreamPool",
    "StreamSet",
    "Trace",
    "__version__",
    "backend_status",
    "barrier",
    "compare",
    "crossover",
    "devices",
    "elementwise",
    "bf16",
    "f16",
    "f32",
    "f64",
    "group_id",
    "group_size",
    "i32",
    "i64",
    "index",
    "kernel",
    "library",
    "live",
    "load_trace",
    "local_id",
    "num_groups",
    "ops",
    "range",
    "shared",
    "timeit",
    "trace",
    "treat_as_library",
    "u32",
    "width",
]
