"""Helpers shared by the tests (imported as ``from support import ...``; conftest.py holds the fixtures)."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench import backends

#: The repository's root: tests in any folder find the project's files from here.
ROOT = Path(__file__).resolve().parents[1]
POCL_PLATFORM = "Portable Computing Language"
BACKENDS = ["cpu", "opencl", pytest.param("cuda", marks=pytest.mark.gpu)]
#: BACKENDS plus WebGPU on lavapipe, for tests of the front end that every backend must pass:
#: ``pytestmark = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)``.
WITH_WEBGPU = [*BACKENDS, "webgpu"]


def pocl_index() -> int | None:
    """The OpenCL index of the PoCL device, found by platform name in ``gw.devices()``; None without PoCL."""
    for info in gw.devices():
        if info.backend == "opencl" and info.name.endswith(f"({POCL_PLATFORM})"):
            return info.index
    return None


def open_device(name: str) -> gw.Device:
    """The shared Device for backend ``name``, or a skip saying why it is not here."""
    if name == "cpu":
        return gw.Device(0, backend="cpu")
    if name == "opencl":
        index = pocl_index()
        if index is None:
            pytest.skip(f"no OpenCL device on the {POCL_PLATFORM!r} platform: {backends.usable('opencl')[1]}")
        return gw.Device(index, backend="opencl")
    backend, why = backends.usable(name)
    if backend is None or not backend.devices():
        pytest.skip(f"no {name} device: {why or 'none found'}")
    if name == "webgpu":  # the software adapter (lavapipe) where there is one: what CI has
        found = backend.devices()
        soft = [d for d in found if "llvmpipe" in d.name]
        return gw.Device((soft or found)[0].index, backend=name)
    return gw.Device(0, backend=name)


def cuda_devices(count: int) -> list[gw.Device]:
    """The first ``count`` CUDA devices, or a skip saying why there are not that many."""
    backend, why = backends.usable("cuda")
    if backend is None:
        pytest.skip(f"no CUDA device: {why}")
    found = backend.devices()
    if len(found) < count:
        pytest.skip(f"needs {count} CUDA devices, found {len(found)}")
    return [gw.Device(i, backend="cuda") for i in range(count)]


def cupy_with_cupti() -> Any:
    """CuPy, where a CUDA device and CUPTI (cupti-python) are here too; the calling test is skipped, saying which is
    missing, otherwise."""
    cupy = pytest.importorskip("cupy")
    ok, why = gw.backends.get("cuda").available()
    if not ok:
        pytest.skip(f"no CUDA device: {why}")
    available, why = gw.cupti.CuptiSource.available()
    if not available:
        pytest.skip(why)
    return cupy


def traced_rounds(dev: gw.Device, rounds: int = 3, wait_each: bool = False, keep_y: bool = False) -> gw.Trace:
    """A trace of ``rounds`` rounds on ``dev``: a 16 KiB upload of x on one stream, ``y = 2*x + 1`` ("scale_add") on
    a second, y's read-back on the first (the kernel waited for on the host first when ``wait_each``). x is freed
    inside the trace, y too unless ``keep_y`` (its bytes then stay held in the memory plot)."""
    upload, compute = dev.create_stream("upload"), dev.create_stream("compute")
    kernel = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
    host = dev.empty_pinned(4096, "float32")
    host[:] = 1
    with gw.trace() as t:
        x, y = dev.alloc(4096), dev.alloc(4096)
        for _ in range(rounds):
            x.copy_from_host_async(host, upload)
            kernel(x, y, stream=compute)
            if wait_each:
                compute.synchronize()
            y.copy_to_host_async(host, upload)
        upload.synchronize()
        compute.synchronize()
        x.free()
        if not keep_y:
            y.free()
    return t


def release_leftovers(dev: gw.Device) -> list[gw.Buffer]:
    """Collect garbage, free the buffers still live on ``dev`` and return them (empty when nothing leaked)."""
    leaked = dev.live_buffers
    if leaked:  # maybe garbage in a reference cycle: collect before calling it a leak
        del leaked
        gc.collect()
        leaked = dev.live_buffers
    for buf in leaked:
        buf.free()
    return leaked


class Gate:
    """A CPU-backend kernel that blocks its stream until ``open()``: makes 'still pending' deterministic.

    A watchdog opens the gate after ``limit_s`` so that a broken test fails instead of hanging the suite.
    """

    def __init__(self, dev: gw.Device, limit_s: float = 10.0) -> None:
        assert dev.backend_kind is gw.BackendKind.CPU, "a gate blocks a CPU stream"
        self.event = threading.Event()
        self._watchdog = threading.Timer(limit_s, self.event.set)
        self._watchdog.daemon = True
        self._watchdog.start()
        self._kernel = dev.compile(lambda: self.event.wait(), "gate")

    def close_on(self, stream: gw.Stream) -> gw.Event:
        """Enqueue the blocking kernel on ``stream``; later work on it waits until ``open()``."""
        return self._kernel(1, 1, (), stream=stream)

    def open(self) -> None:
        self.event.set()
        self._watchdog.cancel()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()


def sample(n: int, dtype: str, seed: int = 0) -> np.ndarray:
    """``n`` values of ``dtype`` that every backend computes exactly (small integers)."""
    rng = np.random.default_rng(seed)
    return rng.integers(-100, 100, n).astype(dtype)


def span(kind: str, stream: int, start: int, end: int, *, unit: int = 1, **extra: object) -> dict:
    """One span record for ``table_from_records``: times given in ``unit`` ns (``unit=1000``: in µs); ``extra``
    sets any other column (``device``, ``name``, ``bytes`` ...)."""
    return {"kind": kind, "stream": stream, "start_ns": start * unit, "end_ns": end * unit, **extra}


def rows(table: Any) -> list[dict]:
    """A table's rows as dicts, whether a DataFrame or a dict of NumPy columns."""
    if isinstance(table, dict):
        n = len(next(iter(table.values())))
        return [{c: table[c][i] for c in table} for i in range(n)]
    return table.to_dict("records")


def dask_client(module: str) -> Iterator[Any]:
    """A client of a real 2-process ``distributed.LocalCluster`` (one thread a worker), for a module-scoped fixture;
    ``module``'s functions are pickled by value, so the workers need not import the test module. Skips without
    distributed."""
    distributed = pytest.importorskip("distributed")
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module])
    cluster = distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None, silence_logs=40
    )
    client = distributed.Client(cluster)
    client.wait_for_workers(2, timeout=60)
    yield client
    client.close()
    cluster.close()
