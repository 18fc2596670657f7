"""The CUDA backend as the registry sees it: whether CuPy and a driver answer, which GPUs there are, opening one."""

from __future__ import annotations

from ..base import Backend, DeviceInfo, pick_device
from .device import CAPS, CudaDevice
from .events import load_cupy


class CudaBackend(Backend):
    """NVIDIA GPUs through CuPy (CuPy's CUDA build)."""

    name = "cuda"
    caps = CAPS
    #: True where this backend wants CuPy's HIP build (the ROCm backend), False for its CUDA build.
    hip = False

    def available(self) -> tuple[bool, str]:
        try:
            cupy = load_cupy()
        except ImportError as exc:
            return False, f"CuPy is not installed ({exc}); pip install 'gpuworkbench[cuda13]' (or cuda12)"
        if bool(cupy.cuda.runtime.is_hip) != self.hip:
            return False, "CuPy here is the " + ("HIP (ROCm)" if cupy.cuda.runtime.is_hip else "CUDA") + " build"
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - no driver, no device: CuPy raises several kinds
            return False, f"no {self.name.upper()} driver or device answers ({exc})"
        return (count > 0), "" if count else f"no {self.name.upper()} device found"

    def devices(self) -> list[DeviceInfo]:
        ok, _ = self.available()
        if not ok:
            return []
        rt = load_cupy().cuda.runtime
        found = []
        for i in range(rt.getDeviceCount()):
            props = rt.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            detail = f"compute capability {props.get('major', '?')}.{props.get('minor', '?')}"
            found.append(DeviceInfo(self.name, i, name, True, int(props["totalGlobalMem"]), detail))
        return found

    def open(self, index: int) -> CudaDevice:
        return CudaDevice(pick_device(self.devices(), index, self.name), self.caps)
