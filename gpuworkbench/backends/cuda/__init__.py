"""The CUDA backend (CuPy); the ROCm backend runs the same code with CuPy's HIP build.

``backend`` probes and opens devices; ``device`` is one device's memory, streams, copies, kernels and graphs;
``events`` pools the CUDA events that complete and time its ops; ``launch`` packs repeated kernel launches for
``cuLaunchKernel``; ``peers`` enables peer access and names the links between GPUs (``%gpu``'s listing).
"""

from __future__ import annotations

from .backend import CudaBackend
from .device import CAPS, CudaDevice
from .peers import peer_links

__all__ = ["CAPS", "CudaBackend", "CudaDevice", "peer_links"]
