"""The ROCm backend: CuPy's HIP build through the CUDA backend's code, minus what HIP lacks here (native graphs)."""

from __future__ import annotations

from dataclasses import replace

from .cuda import CAPS as CUDA_CAPS
from .cuda import CudaBackend

CAPS = replace(CUDA_CAPS, graphs="recorded")  # CuPy has no HIP stream capture: graphs.py records and re-issues


class RocmBackend(CudaBackend):
    """AMD GPUs through CuPy built for ROCm (HIP); kernels are HIP C++ compiled by hiprtc."""

    name = "rocm"
    caps = CAPS
    hip = True
