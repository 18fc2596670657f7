"""The WebGPU backend as the registry sees it: whether wgpu-py loads and finds native adapters, listing and opening
them."""

from __future__ import annotations

import threading
from typing import Any

from ..base import Backend, DeviceInfo, pick_device
from .adapters import NATIVE, describe, load_wgpu
from .device import WebGPUDevice


class WebGPUBackend(Backend):
    """Every Vulkan, Metal and D3D12 adapter wgpu finds."""

    name = "webgpu"

    def __init__(self) -> None:
        self._adapters: list[tuple[DeviceInfo, Any]] | None = None
        self._lock = threading.Lock()

    def available(self) -> tuple[bool, str]:
        try:
            load_wgpu()
        except ImportError as exc:
            return False, f"wgpu is not installed ({exc}); pip install 'gpuworkbench[webgpu]'"
        try:
            found = self._list()
        except Exception as exc:  # noqa: BLE001 - a missing or broken driver shows up here
            return False, f"wgpu could not list adapters ({exc})"
        if not found:
            return False, "no Vulkan, Metal or D3D12 adapter (Linux without a GPU: apt-get install mesa-vulkan-drivers)"
        return True, ""

    def _list(self) -> list[tuple[DeviceInfo, Any]]:
        with self._lock:
            if self._adapters is None:
                adapters = [a for a in load_wgpu().gpu.enumerate_adapters_sync() if a.info["backend_type"] in NATIVE]
                self._adapters = [(describe(i, a), a) for i, a in enumerate(adapters)]
            return self._adapters

    def devices(self) -> list[DeviceInfo]:
        return [info for info, _ in self._list()]

    def open(self, index: int) -> WebGPUDevice:
        return WebGPUDevice(*pick_device(self._list(), index, "WebGPU", "adapters"))
