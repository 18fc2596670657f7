"""``gw.library``: common array operations written once with ``@gw.kernel``, the same on every backend.

Each op takes NumPy arrays with ``device=`` (copied there and back: the call blocks and returns a NumPy array) or
``gw.Buffer`` inputs read with their ``shape`` (the op is enqueued on ``stream`` and returns a Buffer at once)::

    c = gw.library.matmul(a, b, device=dev)                      # NumPy in, NumPy out
    a_buf = dev.alloc((m, k)); ...; c_buf = gw.library.matmul(a_buf, b_buf, stream=s)   # Buffers, on stream s

Every op takes float16, bfloat16 (an ``ml_dtypes.bfloat16`` array), float32 and float64; sum, max, argmax, cumsum
and transpose take int32 and int64 too. Results follow NumPy: the same dtype, except the sum and cumsum of integers
(int64, as NumPy's on 64-bit platforms) and argmax's indices (int64; int32 on WebGPU, for Buffers, since WGSL has no
64-bit integers). 16-bit floats compute and accumulate in float32, float64 in float64, integers in int64. A device
that cannot hold a dtype says so, naming what it lacks: float64 needs cl_khr_fp64 on OpenCL, float16 the shader-f16
feature on WebGPU, which has no 64-bit types nor bfloat16. Shapes and dtypes that do not fit raise InvalidArgument
naming both inputs.
Row operations (softmax, log_softmax, layer_norm, and sum / max / argmax / cumsum with ``axis=-1``) work along the
last axis; ``axis=None`` reduces (or for cumsum, scans) the flattened array, as NumPy does.

Every launch records the bytes its kernel reads and writes in the trace's ``bytes`` column (``KERNEL_BYTES`` spells
them out per kernel), so that an analysis can tell the problem size from a span: ``gw.crossover`` measures from which
size each op beats NumPy, and the advice ``too-small-for-gpu`` compares the spans' bytes with it.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from ..device import Device
from ..errors import InvalidArgument
from ..pykernel.ktypes import ITEMSIZE, NUMPY_TYPES, numpy_dtype
from ..streams import Stream
from . import _kernels as k
from . import _row_kernels as rk
from ._call import NUMBERS, Call
from ._held_rows import hold_bytes, row_layer_norm_held, row_softmax_held

__all__ = ["argmax", "cumsum", "layer_norm", "log_softmax", "matmul", "max", "softmax", "sum", "transpose"]

Array = Any  # a NumPy array or a gw.Buffer
_METHODS = {"naive": k.matmul_naive, "tiled": k.matmul_tiled}

#: What each kernel's span carries in ``bytes``: the bytes its launch reads and writes (inputs once, output once), with
#: ``s`` the input's item size (2 for float16 and bfloat16, 4 for float32 and int32, 8 for float64 and int64) and
#: ``r`` the result's. Kernels of other dtypes than float32 carry the type in their name (``row_sum_i32``).
KERNEL_BYTES = {
    "matmul_tiled": "s·(m·k + k·n + m·n): a, b and c",
    "matmul_naive": "s·(m·k + k·n + m·n): a, b and c",
    "transpose": "2·s·rows·cols: x and its transpose",
    "row_softmax": "2·s·rows·cols: x and the result (softmax and log_softmax)",
    "row_layer_norm": "2·s·rows·cols + 2·s·cols: x, the result, gamma and beta",
    "row_sum": "s·rows·cols + r·rows: x and one result per row (r = 8 for the int64 sum of int32)",
    "row_max": "s·rows·cols + s·rows: x and one result per row",
    "row_argmax": "s·rows·cols + r·rows: x and one index per row (r = 8, int64; 4 where int32)",
    "row_cumsum": "(s + r)·rows·cols: x and the scan (r = 8 for the int64 scan of int32)",
}


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def _rows(call: Call, name: str, axis: int | None) -> tuple[int, int, tuple[int, ...]]:
    """(rows, cols, the shape the rows reduce to) for an op along the last axis (or over everything: axis=None)."""
    shape = call.shape(name)
    if axis is None:
        return 1, math.prod(shape), ()
    if not shape:
        raise InvalidArgument(f"{call.op}: {name} is 0-d; it has no axis {axis}")
    if axis not in (-1, len(shape) - 1):
        raise InvalidArgument(
            f"{call.op}: works along the last axis (axis=-1) or over everything (axis=None), not axis={axis} of "
            f"{name} {shape}; move the axis last (np.moveaxis or gw.library.transpose) first"
        )
    cols = shape[-1]
    return math.prod(shape[:-1]), cols, shape[:-1]


def _held(call: Call, cols: int) -> int:
    """The shared bytes that hold a row of ``cols`` values for the held-row kernels, 0 where it does not fit them or
    the device's shared memory (with the block's reduction array beside it)."""
    hold = hold_bytes(call.type, cols)
    if hold and hold + rk.ROW * 8 > call.device.backend_device.kernel_limits().shared_bytes:
        return 0
    return hold


def _launch_rows(kernel: Any, call: Call, rows: int, nbytes: int, *args: Any) -> None:
    if rows:
        kernel.launch(rows * rk.ROW, *args, stream=call.stream, nbytes=nbytes)


def matmul(
    a: Array,
    b: Array,
    out: Array | None = None,
    *,
    method: str = "tiled",
    device: Device | str | None = None,
    stream: Stream | None = None,
) -> Array:
    """``a @ b`` for 2-D ``a`` (m × k) and ``b`` (k × n): ``method`` "tiled" (register-blocked: 64 × 64 tiles of c per
    block of 16 × 16 threads, 4 × 4 per thread, through shared memory) or "naive" (one thread per element reading
    straight from memory)."""
    factory = _METHODS.get(method)
    if factory is None:
        raise InvalidArgument(f"matmul: method {method!r} is not one of {', '.join(_METHODS)}")
    with Call("matmul", {"a": a, "b": b}, device, stream) as call:
        sa, sb = call.shape("a"), call.shape("b")
        if len(sa) != 2 or len(sb) != 2 or sa[1] != sb[0]:
            raise InvalidArgument(f"matmul: a {sa} and b {sb} do not chain: need (m, k) and (k, n)")
        (m, kk), n = sa, sb[1]
        if out is not None and (out is a or out is b):
            raise InvalidArgument("matmul: out must not be one of the inputs")
        c = call.output(out, (m, n))
        ba, bb = call.buffer("a"), call.buffer("b")
        if m and n:
            # the tiled kernel: a thread per 4 × 4 values of c, the launch covering whole BLOCK × BLOCK tiles
            shape = (_round_up(m, k.BLOCK) // 4, _round_up(n, k.BLOCK) // 4) if method == "tiled" else (m, n)
            nbytes = ITEMSIZE[call.type] * (m * kk + kk * n + m * n)
            factory(call.type).launch(shape, c, ba, bb, m, n, kk, stream=call.stream, nbytes=nbytes)
        return call.result(c)


def transpose(x: Array, out: Array | None = None, *, device: Device | str | None = None,
              stream: Stream | None = None) -> Array:  # fmt: skip
    """``x.T`` of a 2-D ``x``, through shared tiles."""
    with Call("transpose", {"x": x}, device, stream, NUMBERS) as call:
        shape = call.shape("x")
        if len(shape) != 2:
            raise InvalidArgument(f"transpose: x is {shape}; it takes a 2-D array")
        if out is not None and out is x:
            raise InvalidArgument("transpose: out must not be x")
        rows, cols = shape
        result = call.output(out, (cols, rows))
        bx = call.buffer("x")
        if rows and cols:
            k.transpose(call.type).launch(k.transpose_shape(call.type, rows, cols), result, bx, rows, cols,
                                          stream=call.stream, nbytes=2 * ITEMSIZE[call.type] * rows * cols)  # fmt: skip
        return call.result(result)


def _softmax(op: str, x: Array, out: Array | None, device: Any, stream: Any, take_log: int) -> Array:
    with Call(op, {"x": x}, device, stream) as call:
        rows, cols, _ = _rows(call, "x", -1)
        result = call.output(out, call.shape("x"))
        nbytes = 2 * ITEMSIZE[call.type] * rows * cols
        distinct = result is not call.buffer("x")
        hold = _held(call, cols)
        if hold:  # the row held in shared memory: one read, one exp per value
            kernel = row_softmax_held(call.type, hold, distinct)
        else:
            kernel = rk.row_softmax(call.type, distinct=distinct)
        _launch_rows(kernel, call, rows, nbytes, result, call.buffer("x"), cols, take_log)
        return call.result(result)


def softmax(x: Array, out: Array | None = None, *, device: Device | str | None = None,
            stream: Stream | None = None) -> Array:  # fmt: skip
    """exp(x - max) / sum(exp(x - max)) along the last axis (the maximum subtracted: no overflow)."""
    return _softmax("softmax", x, out, device, stream, 0)


def log_softmax(x: Array, out: Array | None = None, *, device: Device | str | None = None,
                stream: Stream | None = None) -> Array:  # fmt: skip
    """x - max - log(sum(exp(x - max))) along the last axis."""
    return _softmax("log_softmax", x, out, device, stream, 1)


def layer_norm(
    x: Array,
    gamma: Array | None = None,
    beta: Array | None = None,
    eps: float = 1e-5,
    out: Array | None = None,
    *,
    device: Device | str | None = None,
    stream: Stream | None = None,
) -> Array:
    """(x - mean) / sqrt(var + eps) * gamma + beta along the last axis (gamma ones and beta zeros when left out;
    each of the last axis's length)."""
    with Call("layer_norm", {"x": x, "gamma": gamma, "beta": beta}, device, stream) as call:
        rows, cols, _ = _rows(call, "x", -1)
        for name in ("gamma", "beta"):
            if name in call.inputs and call.shape(name) != (cols,):
                raise InvalidArgument(f"layer_norm: x is {call.shape('x')}, {name} is {call.shape(name)}; "
                                      f"{name} must be ({cols},)")  # fmt: skip
        result = call.output(out, call.shape("x"))
        params = []
        for name, fill in (("gamma", 1), ("beta", 0)):
            if name in call.inputs:
                params.append(call.buffer(name))
            else:
                params.append(call.alloc((builtins.max(cols, 1),), call.dtype))
                params[-1].copy_from_host(np.full(builtins.max(cols, 1), fill, call.dtype))
        nbytes = 2 * ITEMSIZE[call.type] * (rows * cols + cols)
        distinct = result is not call.buffer("x")
        hold = _held(call, cols)
        if hold:  # the row held in shared memory: one read, two-pass statistics
            kernel = row_layer_norm_held(call.type, hold, distinct)
        else:  # 16-bit rows: shifted sums, more values a step on long rows (unroll_shifted)
            u = rk.unroll_shifted(cols) if ITEMSIZE[call.type] == 2 else 0
            kernel = rk.row_layer_norm(call.type, u, distinct)
        _launch_rows(kernel, call, rows if cols else 0, nbytes, result, call.buffer("x"), *params, cols, float(eps))
        return call.result(result)


def _index_type(call: Call) -> str:
    """argmax's index type: int64 as NumPy's, int32 where the device's kernels have no int64 (WebGPU)."""
    return "i32" if call.device.backend_device.lacks_type("int64") else "i64"


def _result_type(op: str, call: Call) -> str:
    """The kernel type of a reduction's result, as NumPy's: the sum (and scan) of integers is int64, argmax an index."""
    if op == "argmax":
        return _index_type(call)
    if op in ("sum", "cumsum"):
        t = k.sum_type(call.type)
        if t != call.type:
            call.need(t, f"the {op} of {call.dtype} is {NUMPY_TYPES[t]}, as in NumPy")
        return t
    return call.type


def _reduce(op: str, factory: Any, x: Array, axis: int | None, out: Any, device: Any, stream: Any) -> Array:
    with Call(op, {"x": x}, device, stream, NUMBERS) as call:
        rows, cols, shape = _rows(call, "x", axis)
        if cols == 0 and op in ("max", "argmax"):
            raise InvalidArgument(f"{op}: x {call.shape('x')} has no elements to take the {op} of")
        t = _result_type(op, call)
        host = np.int64 if op == "argmax" else None  # NumPy's indices are int64, whatever the device's are
        result = call.output(out, shape or (1,), numpy_dtype(t), host)
        kernel = factory(call.type, t) if op == "argmax" else factory(call.type)
        nbytes = ITEMSIZE[call.type] * rows * cols + ITEMSIZE[t] * rows
        _launch_rows(kernel, call, rows, nbytes, result, call.buffer("x"), cols)
        return call.result(result, scalar=not shape and out is None)


def sum(x: Array, axis: int | None = None, out: Array | None = None, *, device: Device | str | None = None,
        stream: Stream | None = None) -> Array:  # fmt: skip
    """The sum along the last axis (``axis=-1``) or of everything (``axis=None``), added as a tree (in float32 for
    16-bit floats and float32, float64 for float64, int64 for integers, whose sum is int64 as NumPy's)."""
    return _reduce("sum", rk.row_sum, x, axis, out, device, stream)


def max(x: Array, axis: int | None = None, out: Array | None = None, *, device: Device | str | None = None,
        stream: Stream | None = None) -> Array:  # fmt: skip
    """The largest element along the last axis or of everything; NaN where there is one, as in NumPy."""
    return _reduce("max", rk.row_max, x, axis, out, device, stream)


def argmax(x: Array, axis: int | None = None, out: Array | None = None, *, device: Device | str | None = None,
           stream: Stream | None = None) -> Array:  # fmt: skip
    """The index (int64, as NumPy's) of the first largest element along the last axis, or in the flattened array.
    WebGPU has no int64: its Buffers get int32 indices (NumPy inputs still get int64 back)."""
    return _reduce("argmax", rk.row_argmax, x, axis, out, device, stream)


def cumsum(x: Array, axis: int | None = None, out: Array | None = None, *, device: Device | str | None = None,
           stream: Stream | None = None) -> Array:  # fmt: skip
    """Inclusive prefix sums along the last axis, or of the flattened array (``axis=None``, NumPy's default); of
    integers in int64, as NumPy's."""
    with Call("cumsum", {"x": x}, device, stream, NUMBERS) as call:
        rows, cols, _ = _rows(call, "x", axis)
        shape = call.shape("x") if axis is not None else (cols,)
        t = _result_type("cumsum", call)
        result = call.output(out, shape, numpy_dtype(t))
        nbytes = (ITEMSIZE[call.type] + ITEMSIZE[t]) * rows * cols
        kernel = rk.row_cumsum(call.type, distinct=result is not call.buffer("x"))
        _launch_rows(kernel, call, rows, nbytes, result, call.buffer("x"), cols)
        return call.result(result)
