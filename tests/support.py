"""Helpers shared by the tests (imported as ``from support import ...``; conftest.py holds the fixtures)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench import backends

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
