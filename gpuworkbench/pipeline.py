"""An N-deep buffered pipeline: upload batch i+1 while batch i computes and batch i-1 downloads.

Uploads, kernels and downloads each get their own stream, so copies of one direction queue on one copy engine in
order and never wait behind the other direction; ``depth`` slots of device buffers are reused, with device-side event
waits (never a host sync) guarding each reuse. Pinned host arrays are copied directly; pageable ones are staged
through pinned slots, which the host must fill, so pinned inputs are what make the pipeline reach its bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidArgument

if TYPE_CHECKING:
    from .buffer import Buffer
    from .device import Device
    from .streams import Event, Stream

Process = Callable[["Buffer", "Buffer", "Stream"], Any]


@dataclass(frozen=True)
class PipelineRun:
    """What one ``Pipeline.run`` did: batches, bytes each way, and host wall time."""

    batches: int
    bytes_in: int
    bytes_out: int
    wall_s: float
    staged_inputs: int
    staged_outputs: int


class Pipeline:
    """``process(in_buf, out_buf, stream)`` enqueues the compute for one batch; ``run`` streams batches through it.

    ``depth`` is the number of buffer slots (2 = double buffering).
    """

    def __init__(self, device: Device, process: Process, depth: int = 2, label: str = "pipeline") -> None:
        if not callable(process):
            raise InvalidArgument("process must be callable as process(in_buf, out_buf, stream)")
        if not isinstance(depth, int) or depth < 1:
            raise InvalidArgument(f"pipeline depth must be >= 1, got {depth!r}")
        self.device, self.process, self.depth = device, process, depth
        self.upload = device.create_stream(f"{label}-h2d")
        self.compute = device.create_stream(f"{label}-compute")
        self.download = device.create_stream(f"{label}-d2h")
        self._layout: tuple[int, np.dtype, int, np.dtype] | None = None
        self._in: list[Buffer] = []
        self._out: list[Buffer] = []
        self._pin_in: list[np.ndarray] = []
        self._pin_out: list[np.ndarray] = []

    def _ensure_slots(self, n_in: int, dt_in: np.dtype, n_out: int, dt_out: np.dtype) -> None:
        layout = (n_in, dt_in, n_out, dt_out)
        if self._layout == layout:
            return
        self._free_slots()
        dev = self.device
        self._in = [dev.alloc(n_in, dt_in) for _ in range(self.depth)]
        self._out = [dev.alloc(n_out, dt_out) for _ in range(self.depth)]
        self._layout = layout

    def _staging(self, which: str, slot: int) -> np.ndarray:
        pins, (n_in, dt_in, n_out, dt_out) = (self._pin_in if which == "in" else self._pin_out), self._layout
        while len(pins) <= slot:
            n, dt = (n_in, dt_in) if which == "in" else (n_out, dt_out)
            pins.append(self.device.empty_pinned(n, dt))
        return pins[slot]

    def _needs_staging(self, array: np.ndarray) -> bool:
        return self.device.caps.pinned_memory and not self.device.is_pinned(array)

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> PipelineRun:
        """Upload each ``inputs[i]``, process it, download into ``outputs[i]``. Blocks until all outputs are filled."""
        if len(inputs) != len(outputs):
            raise InvalidArgument(f"pipeline got {len(inputs)} inputs but {len(outputs)} outputs")
        if not inputs:
            return PipelineRun(0, 0, 0, 0.0, 0, 0)
        first_in, first_out = inputs[0], outputs[0]
        for i, (a, b) in enumerate(zip(inputs, outputs)):
            if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
                raise InvalidArgument(f"batch {i}: inputs and outputs must be NumPy arrays")
            if a.dtype != first_in.dtype or a.size != first_in.size:
                raise InvalidArgument(
                    f"batch {i}: input is {a.size} {a.dtype}, batch 0 is {first_in.size} {first_in.dtype}"
                )
            if b.dtype != first_out.dtype or b.size != first_out.size:
                raise InvalidArgument(
                    f"batch {i}: output is {b.size} {b.dtype}, batch 0 is {first_out.size} {first_out.dtype}"
                )
            if not b.flags.c_contiguous or not b.flags.writeable:
                raise InvalidArgument(f"batch {i}: outputs must be writable C-contiguous arrays")
        self._ensure_slots(first_in.size, first_in.dtype, first_out.size, first_out.dtype)
        depth = self.depth
        h2d: list[Event | None] = [None] * depth
        computed: list[Event | None] = [None] * depth
        d2h: list[Event | None] = [None] * depth
        unstaged: list[tuple[Event, int] | None] = [None] * depth  # download into a pinned slot, not yet copied out
        staged_in = staged_out = 0
        start = time.perf_counter()

        def drain(slot: int) -> None:
            pending = unstaged[slot]
            if pending is not None:
                pending[0].wait()
                np.copyto(outputs[pending[1]].reshape(-1), self._pin_out[slot])
                unstaged[slot] = None

        try:
            for i, (src, dst) in enumerate(zip(inputs, outputs)):
                s = i % depth
                if computed[s] is not None:
                    self.upload.wait_event(computed[s])  # the slot's input buffer is free once its compute is done
                # reshape keeps a pinned array's type (ascontiguousarray would drop it and force staging)
                host_in = (src if src.flags.c_contiguous else np.ascontiguousarray(src)).reshape(-1)
                if self._needs_staging(host_in):
                    pin = self._staging("in", s)
                    if h2d[s] is not None:
                        h2d[s].wait()  # the host may refill the pinned slot only once its last upload is done
                    np.copyto(pin, host_in)
                    host_in, staged_in = pin, staged_in + 1
                h2d[s] = self._in[s].copy_from_host_async(host_in, self.upload)
                self.compute.wait_event(h2d[s])
                if d2h[s] is not None:
                    self.compute.wait_event(d2h[s])  # the slot's output buffer is free once downloaded
                self.process(self._in[s], self._out[s], self.compute)
                computed[s] = self.compute.record()
                self.download.wait_event(computed[s])
                host_out = dst.reshape(-1)
                if self._needs_staging(host_out):
                    drain(s)
                    d2h[s] = self._out[s].copy_to_host_async(self._staging("out", s), self.download)
                    unstaged[s] = (d2h[s], i)
                    staged_out += 1
                else:
                    d2h[s] = self._out[s].copy_to_host_async(host_out, self.download)
        finally:
            for ev in d2h:
                if ev is not None:
                    ev.wait()
            for s in range(depth):
                drain(s)
        wall = time.perf_counter() - start
        n = len(inputs)
        return PipelineRun(n, n * first_in.nbytes, n * first_out.nbytes, wall, staged_in, staged_out)

    def _free_slots(self) -> None:
        for b in self._in + self._out:
            b.free()
        self._in, self._out, self._pin_in, self._pin_out, self._layout = [], [], [], [], None

    def close(self) -> None:
        """Free the slots and release the streams (waits for their work)."""
        self._free_slots()
        for s in (self.upload, self.compute, self.download):
            s.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
