"""One library call's plumbing: NumPy arrays uploaded to ``device=`` and results copied back, or Buffers used where
they are (with their ``shape``); dtype, shape and device checks that name what does not fit."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..buffer import Buffer
from ..device import Device
from ..errors import InvalidArgument
from ..streams import Stream

FLOAT = np.dtype(np.float32)


def _describe(value: Any) -> str:
    return f"{value.dtype} {tuple(value.shape)}"


class Call:
    """The inputs of one op on one device. ``with Call(...) as call:`` frees what it uploaded or allocated itself."""

    def __init__(
        self, op: str, inputs: dict[str, Any], device: Device | str | None, stream: Stream | None, dtypes: Any = None
    ) -> None:
        self.op, self.inputs = op, {k: v for k, v in inputs.items() if v is not None}
        self._temps: list[Buffer] = []
        self._out: np.ndarray | None = None  # NumPy mode: the caller's array to fill
        self._new: Buffer | None = None  # Buffer mode: the output allocated here
        kinds = {isinstance(v, Buffer) for v in self.inputs.values()}
        for name, v in self.inputs.items():
            if not isinstance(v, (Buffer, np.ndarray)):
                raise InvalidArgument(f"{op}: {name} is a {type(v).__name__}; pass a NumPy array or a gw.Buffer")
        if len(kinds) > 1:
            spelled = ", ".join(f"{k} is a {'Buffer' if isinstance(v, Buffer) else 'NumPy array'}" for k, v in
                                self.inputs.items())  # fmt: skip
            raise InvalidArgument(f"{op}: pass all NumPy arrays (with device=) or all Buffers ({spelled})")
        self.numpy = kinds == {False}
        self._check_dtypes(dtypes or {})
        if self.numpy:
            if isinstance(device, str):
                device = Device(device)
            if device is None and isinstance(stream, Stream):
                device = stream.device
            if not isinstance(device, Device):
                raise InvalidArgument(f"{op}: NumPy inputs need device= (a gw.Device or a spec such as 'opencl:0')")
        else:
            first = next(iter(self.inputs.values()))
            if device is not None and device is not first.device:
                raise InvalidArgument(f"{op}: the buffers are on {first.device.spec}, not on device={device!r}")
            device = first.device
            for name, v in self.inputs.items():
                if v.device is not device:
                    raise InvalidArgument(f"{op}: buffers are on different devices ({device.spec}, {v.device.spec} "
                                          f"for {name})")  # fmt: skip
        self.device: Device = device
        if stream is not None and (not isinstance(stream, Stream) or stream.device is not device):
            raise InvalidArgument(f"{op}: stream must be a Stream of {device.spec}")
        self.stream = stream or device.default_stream

    def _check_dtypes(self, dtypes: dict[str, Any]) -> None:
        """Every input float32 (or what ``dtypes`` names); a mismatch names both inputs."""
        floats = [(k, v) for k, v in self.inputs.items() if k not in dtypes]
        for (k1, v1), (k2, v2) in zip(floats, floats[1:]):
            if v1.dtype != v2.dtype:
                raise InvalidArgument(f"{self.op}: {k1} is {_describe(v1)}, {k2} is {_describe(v2)}; both must be "
                                      "float32")  # fmt: skip
        for k, v in self.inputs.items():
            want = np.dtype(dtypes.get(k, FLOAT))
            if v.dtype != want:
                raise InvalidArgument(
                    f"{self.op}: {k} is {_describe(v)}; it must be {want} (WebGPU's only float, and the library's): "
                    f"convert with .astype(np.{want})"
                )

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.inputs[name].shape)

    def buffer(self, name: str, shape: tuple[int, ...] | None = None) -> Buffer:
        """The input as a Buffer on the device (uploaded once for NumPy inputs)."""
        v = self.inputs[name]
        if isinstance(v, Buffer):
            return v
        buf = self.alloc(tuple(v.shape) or (1,), v.dtype)
        if v.size:
            buf.copy_from_host(np.ascontiguousarray(v).reshape(-1))
        self.inputs[name] = buf
        return buf

    def alloc(self, shape: tuple[int, ...], dtype: Any = FLOAT) -> Buffer:
        buf = self.device.alloc(shape, dtype)
        self._temps.append(buf)
        return buf

    def output(self, out: Any, shape: tuple[int, ...], dtype: Any = FLOAT) -> Buffer:
        """Where the result goes: ``out`` (checked) or a new Buffer; in NumPy mode a device buffer copied back."""
        dtype, shape = np.dtype(dtype), shape or (1,)
        if out is not None:
            kind = np.ndarray if self.numpy else Buffer
            if not isinstance(out, kind):
                raise InvalidArgument(f"{self.op}: out must be a {kind.__name__} like the inputs, not "
                                      f"{type(out).__name__}")  # fmt: skip
            if tuple(out.shape) != shape or out.dtype != dtype:
                raise InvalidArgument(f"{self.op}: out is {_describe(out)}; the result is {dtype} {shape}")
            if self.numpy:
                if not (out.flags.c_contiguous and out.flags.writeable):
                    raise InvalidArgument(f"{self.op}: out must be a writable C-contiguous array")
                self._out = out
            else:
                if out.device is not self.device:
                    raise InvalidArgument(f"{self.op}: out is on {out.device.spec}, the inputs on {self.device.spec}")
                return out
        if self.numpy:
            return self.alloc(shape, dtype)
        self._new = self.device.alloc(shape, dtype)  # the caller's once returned; freed here only on failure
        return self._new

    def result(self, buf: Buffer, scalar: bool = False) -> Any:
        """The Buffer (enqueued, not waited for), or for NumPy inputs the host array (blocks)."""
        if not self.numpy:
            self._new = None
            return buf
        if self._out is not None:
            buf.copy_to_host(self._out.reshape(-1))
            return self._out
        host = buf.copy_to_host()
        return host.reshape(-1)[0] if scalar else host

    def __enter__(self) -> Call:
        return self

    def __exit__(self, *exc: Any) -> None:
        for buf in self._temps:
            buf.free()
        if self._new is not None:  # failed before the result was handed back
            self._new.free()
