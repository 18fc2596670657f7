"""A kernel's arguments as one WebGPU bind group: buffers bound in argument order, scalars packed into one uniform
struct after them, checked against what WGSL and the device's binding limit accept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import InvalidArgument
from ..base import BufferArg
from .adapters import load_wgpu


def bind_group(dev: Any, kernel: Any, name: str, args: Sequence[Any], max_binding: int) -> Any:
    """The bind group at group 0 for launching ``kernel`` with ``args`` on ``dev``; None where it takes no argument."""
    wgpu = load_wgpu()
    buffers = [a for a in args if isinstance(a, BufferArg)]
    entries = []
    for i, a in enumerate(buffers):
        if a.handle is None or a.handle.buffer.size > max_binding:
            why = "is empty" if a.handle is None else f"is larger than one binding may be ({max_binding} B)"
            raise InvalidArgument(f"kernel {name!r}: buffer argument {i} {why}")
        entries.append(
            {"binding": i, "resource": {"buffer": a.handle.buffer, "offset": 0, "size": a.handle.buffer.size}}
        )
    scalars = [np.asarray(a) for a in args if not isinstance(a, BufferArg)]
    if scalars:
        for a in scalars:
            if a.dtype.itemsize != 4 or a.dtype.kind not in "fiu":
                raise InvalidArgument(f"kernel {name!r}: scalar {a} is {a.dtype}; WGSL scalars are f32, i32 or u32")
        packed = b"".join(a.tobytes() for a in scalars)
        packed += bytes(-len(packed) % 16)
        uniform = dev.create_buffer_with_data(data=packed, usage=wgpu.BufferUsage.UNIFORM)
        entries.append({"binding": len(buffers), "resource": {"buffer": uniform, "offset": 0, "size": len(packed)}})
    try:
        return dev.create_bind_group(layout=kernel.get_bind_group_layout(0), entries=entries) if entries else None
    except wgpu.GPUError as exc:
        raise InvalidArgument(f"kernel {name!r}: arguments do not fit its bindings ({exc})") from None
