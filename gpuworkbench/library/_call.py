"""One library call's plumbing: NumPy arrays uploaded to ``device=`` and results copied back, or Buffers used where
they are (with their ``shape``); dtype, shape and device checks that name what does not fit, the device's included
(float64 on an OpenCL device without cl_khr_fp64, say)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..buffer import Buffer
from ..device import Device
from ..errors import InvalidArgument
from ..pykernel.kernel import check_types
from ..pykernel.ktypes import NUMPY_TYPES, kernel_type
from ..streams import Stream

FLOATS = ("f16", "bf16", "f32", "f64")  # what every op takes
NUMBERS = (*FLOATS, "i32", "i64")  # what sum, max, argmax, cumsum and transpose take


def _describe(value: Any) -> str:
    return f"{value.dtype} {tuple(value.shape)}"


class Call:
    """The inputs of one op on one device. ``with Call(...) as call:`` frees what it uploaded or allocated itself."""

    def __init__(
        self, op: str, inputs: dict[str, Any], device: Device | str | None, stream: Stream | None,
        takes: tuple[str, ...] = FLOATS,
    ) -> None:  # fmt: skip
        self.op, self.inputs = op, {k: v for k, v in inputs.items() if v is not None}
        self._temps: list[Buffer] = []
        self._out: np.ndarray | None = None  # NumPy mode: the caller's array to fill
        self._new: Buffer | None = None  # Buffer mode: the output allocated here
        self._over: Buffer | None = None  # Buffer mode on WebGPU: the input that the result is copied over at the end
        self._host: np.dtype | None = None  # NumPy mode: the result's dtype where the device's differs
        kinds = {isinstance(v, Buffer) for v in self.inputs.values()}
        for name, v in self.inputs.items():
            if not isinstance(v, (Buffer, np.ndarray)):
                raise InvalidArgument(f"{op}: {name} is a {type(v).__name__}; pass a NumPy array or a gw.Buffer")
        if len(kinds) > 1:
            spelled = ", ".join(f"{k} is a {'Buffer' if isinstance(v, Buffer) else 'NumPy array'}" for k, v in
                                self.inputs.items())  # fmt: skip
            raise InvalidArgument(f"{op}: pass all NumPy arrays (with device=) or all Buffers ({spelled})")
        self.numpy = kinds == {False}
        self.type = self._check_dtypes(takes)  # the inputs' kernel type ("f32", "i32" ...)
        self.dtype = next(iter(self.inputs.values())).dtype
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
        self.need(self.type)

    def _check_dtypes(self, takes: tuple[str, ...]) -> str:
        """The inputs' one kernel type, among ``takes``; a mismatch names both inputs."""
        items = list(self.inputs.items())
        for (k1, v1), (k2, v2) in zip(items, items[1:]):
            if v1.dtype != v2.dtype:
                raise InvalidArgument(f"{self.op}: {k1} is {_describe(v1)}, {k2} is {_describe(v2)}; they must have "
                                      "one dtype")  # fmt: skip
        name, value = items[0]
        t = kernel_type(value.dtype)
        if t not in takes:
            spelled = [NUMPY_TYPES[k] for k in takes]
            raise InvalidArgument(
                f"{self.op}: {name} is {_describe(value)}; it takes {', '.join(spelled[:-1])} or {spelled[-1]}"
            )
        return t

    def need(self, t: str, why: str = "") -> None:
        """InvalidArgument naming the device and what it lacks where its kernels cannot hold kernel type ``t``;
        ``why`` says why the op needs it, where the inputs are not of that type."""
        try:
            check_types(self.device, {t}, self.op)
        except InvalidArgument as exc:
            raise InvalidArgument(f"{exc}{f' ({why})' if why else ''}") from None

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

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> Buffer:
        buf = self.device.alloc(shape, dtype)
        self._temps.append(buf)
        return buf

    def output(self, out: Any, shape: tuple[int, ...], dtype: Any = None, host: Any = None) -> Buffer:
        """Where the result goes: ``out`` (checked) or a new Buffer; in NumPy mode a device buffer copied back.
        ``dtype``: the result's (None: the inputs'); ``host``: in NumPy mode, the dtype the caller gets where the
        device's differs (argmax's int64 indices from WebGPU's int32)."""
        dtype, shape = self.dtype if dtype is None else np.dtype(dtype), shape or (1,)
        device_dtype = dtype
        if self.numpy and host is not None:
            dtype, self._host = np.dtype(host), np.dtype(host)
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
                if self.device.caps.kernel_language == "wgsl" and any(v is out for v in self.inputs.values()):
                    self._over = out  # WebGPU cannot bind a buffer it writes twice in one dispatch: copied over after
                    return self.alloc(shape, dtype)
                return out
        if self.numpy:
            return self.alloc(shape, device_dtype)
        self._new = self.device.alloc(shape, dtype)  # the caller's once returned; freed here only on failure
        return self._new

    def result(self, buf: Buffer, scalar: bool = False) -> Any:
        """The Buffer (enqueued, not waited for), or for NumPy inputs the host array (blocks)."""
        if not self.numpy:
            self._new = None
            if self._over is not None:
                self._over.copy_from(buf, self.stream)
                return self._over
            return buf
        if self._host is not None and self._host != buf.dtype:
            host = buf.copy_to_host().astype(self._host)
            if self._out is not None:
                self._out.reshape(-1)[:] = host.reshape(-1)
                return self._out
        elif self._out is not None:
            buf.copy_to_host(self._out.reshape(-1))
            return self._out
        else:
            host = buf.copy_to_host()
        return host.reshape(-1)[0] if scalar else host

    def __enter__(self) -> Call:
        return self

    def __exit__(self, *exc: Any) -> None:
        for buf in self._temps:
            buf.free()
        if self._new is not None:  # failed before the result was handed back
            self._new.free()
