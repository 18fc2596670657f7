"""Backend registry: one module (or package) per backend, found by name, probed in the order cuda → rocm → opencl →
webgpu → cpu."""

from __future__ import annotations

import importlib
from functools import cache

from ..errors import BackendUnavailable, InvalidArgument
from .base import Backend

#: Probe order for auto-selection, and the module (or package) + class that implements each backend.
PROBE_ORDER: tuple[str, ...] = ("cuda", "rocm", "opencl", "webgpu", "cpu")
_MODULES: dict[str, tuple[str, str]] = {
    "cuda": ("cuda", "CudaBackend"),
    "rocm": ("rocm", "RocmBackend"),
    "opencl": ("opencl", "OpenCLBackend"),
    "webgpu": ("webgpu", "WebGPUBackend"),
    "cpu": ("cpu", "CpuBackend"),
}
ALIASES = {"stub": "cpu", "hip": "rocm", "cl": "opencl", "wgpu": "webgpu"}


def canonical(name: str) -> str:
    """The registered name for ``name`` (case-insensitive, aliases resolved); InvalidArgument if unknown."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _MODULES:
        raise InvalidArgument(
            f"unknown backend {name!r}; known backends: {', '.join(PROBE_ORDER)} (alias 'stub' = cpu)"
        )
    return key


@cache
def get(name: str) -> Backend:
    """The backend object for ``name``; BackendUnavailable when its module or library is missing."""
    key = canonical(name)
    module_name, class_name = _MODULES[key]
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"{__name__}.{module_name}":
            raise BackendUnavailable(f"backend {key!r} is not implemented in this version of gpuworkbench") from None
        raise BackendUnavailable(f"backend {key!r} is not available: {exc}") from None
    return getattr(module, class_name)()


def usable(name: str) -> tuple[Backend | None, str]:
    """(backend, "") when ``name`` imports and answers, else (None, the reason)."""
    try:
        backend = get(name)
    except BackendUnavailable as exc:
        return None, str(exc)
    ok, why = backend.available()
    return (backend, "") if ok else (None, why)
