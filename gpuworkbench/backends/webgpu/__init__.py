"""The WebGPU backend (wgpu-py): Vulkan, Metal and D3D12 in one, WGSL kernels, timestamps from timestamp queries.

WebGPU gives a device **one queue**. A stream here is an ordered series of submissions to that queue, so streams
serialise: ``Caps.concurrent_streams`` is False and a trace shows two streams' work one after another. WebGPU has no
memory query either: ``Caps.memory_free_known`` is False, and the total reported is the adapter's ``max_buffer_size``
(the largest single buffer), a stand-in for device memory, not a measurement. Software adapters (lavapipe,
"llvmpipe ... (CPU) via Vulkan") report ``is_gpu`` False, so auto-selection never picks them; name them to use them.

Kernels: ``Device.compile(wgsl, name)`` takes WGSL; ``name`` is the ``@compute`` entry point. When launching:

- ``grid`` is the number of workgroups (1 to 3 dimensions); ``block`` is ignored: ``@workgroup_size`` decides threads.
- Buffer arguments bind, in argument order, to ``@group(0) @binding(0)``, ``(1)``, ... as storage buffers. Each must
  be used by the shader: WebGPU's automatic layout leaves out bindings the code never touches.
- Scalar arguments (32-bit only: f32, i32, u32) are packed in argument order into one uniform struct bound at
  binding = number of buffers: ``struct Args { a: f32, n: u32 }`` ``@group(0) @binding(2) var<uniform> args: Args;``

Buffers occupy whole 4-byte words, because WebGPU copies move words: a copy into a buffer must start on a word and
end on one or at the buffer's end. Completion is polled without blocking through buffer-map promises, which wgpu-py
resolves from its own per-device poll thread (``queue.on_submitted_work_done`` is broken in wgpu-py 0.32).
"""

from __future__ import annotations

from .backend import WebGPUBackend
from .device import CAPS, WebGPUDevice

__all__ = ["CAPS", "WebGPUBackend", "WebGPUDevice"]
