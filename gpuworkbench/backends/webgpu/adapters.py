"""Loading wgpu-py and the adapters the WebGPU backend offers: native APIs only (Vulkan, Metal, D3D12), each described
as a ``DeviceInfo``, so that listing devices needs no device opened."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..base import DeviceInfo

NATIVE = ("Vulkan", "Metal", "D3D12")  # WebGPU over OpenGL has no reliable compute: left out
_GPU_TYPES = ("DiscreteGPU", "IntegratedGPU")


def load_wgpu() -> Any:
    """wgpu-py, imported on first use (so that the registry can list backends without it)."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # Mesa's Vulkan loader warns into every cell's output without one; a private directory silences it.
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="gpuworkbench-xdg-")
    import wgpu

    return wgpu


def describe(index: int, adapter: Any) -> DeviceInfo:
    """Adapter ``index`` as a ``DeviceInfo``: its name, API and type, whether it is a GPU, its largest buffer."""
    info = adapter.info
    name = f"{info['device']} ({info['adapter_type']}) via {info['backend_type']}"
    if info.get("description"):
        name += f", {info['description']}"
    detail = "timestamp-query" if "timestamp-query" in adapter.features else "no timestamp-query"
    total = int(adapter.limits["max-buffer-size"])
    return DeviceInfo("webgpu", index, name, info["adapter_type"] in _GPU_TYPES, total, detail)
