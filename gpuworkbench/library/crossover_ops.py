"""The problems ``gw.crossover`` times: each library op as a problem of one size (its inputs, NumPy's answer, the
device call, the bytes its kernel moves and its relative work), the default sizes, and the checks of what a caller
asks for. ``OPS`` holds float32's problems; ``op_for`` makes one op's problem for another dtype (its inputs cast, its
result's dtype as the library gives it, its kernel's name and bytes)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import library as lib
from ..errors import InvalidArgument
from ..pykernel.ktypes import ITEMSIZE, NUMPY_TYPES, kernel_type, numpy_dtype
from . import _kernels as k
from . import _row_kernels as rk
from ._call import FLOATS, NUMBERS

ROW = 1024  # row length of the row operations' problems (shorter when the size does not divide by it)
MAX_ELEMENTS = 2**31 - 1  # kernel extents are 32-bit


@dataclass(frozen=True)
class CrossoverOp:
    """One library op as a problem of one size: inputs, NumPy's answer, the device call, bytes and work."""

    name: str
    kernel: str  # the span name its launches get in a trace
    unit: str  # "n" (an n × n matmul) or "elements"
    defaults: tuple[int, ...]
    inputs: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    numpy: Callable[[dict[str, np.ndarray]], np.ndarray]
    call: Callable[..., Any]  # call(**inputs, device=dev) or call(**buffers, out=out, stream=s)
    out: Callable[[int], tuple[tuple[int, ...], Any]]  # the result's shape and dtype
    nbytes: Callable[[int], int]  # what the kernel reads and writes: the span's ``bytes`` (library.KERNEL_BYTES)
    work: Callable[[int], float]  # relative cost, to predict the next size's time
    # the bytes for item sizes s (the input's) and r (the result's): nbytes is typed_bytes(size, 4, 4) for float32
    typed_bytes: Callable[[int, int, int], int] = lambda size, s, r: 0
    takes: tuple[str, ...] = FLOATS  # the kernel types the op takes
    dtype: str = "float32"


def row_shape(size: int) -> tuple[int, int]:
    """(rows, cols) of a row op's problem of ``size`` elements: rows of ROW elements (fewer where ROW does not
    divide the size: the largest power of two that does)."""
    cols = math.gcd(size, ROW)
    return size // cols, cols


def _matrix(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a": rng.standard_normal((size, size), dtype=np.float32),
        "b": rng.standard_normal((size, size), dtype=np.float32),
    }


def _rows_input(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(row_shape(size), dtype=np.float32)}


def _layer_norm_input(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.standard_normal(row_shape(size), dtype=np.float32)
    cols = x.shape[1]
    return {"x": x, "gamma": rng.standard_normal(cols, dtype=np.float32), "beta": np.zeros(cols, np.float32)}


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _np_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + np.float32(1e-5)) * gamma + beta


_MATMUL_SIZES = tuple(2**p for p in range(3, 13))  # n = 8 .. 4096
_VECTOR_SIZES = tuple(2**p for p in range(8, 27, 2))  # 2^8 .. 2^26 elements


def _same(size: int) -> tuple[tuple[int, ...], Any]:
    return row_shape(size), np.float32


def _per_row(dtype: Any) -> Callable[[int], tuple[tuple[int, ...], Any]]:
    return lambda size: ((row_shape(size)[0],), dtype)


def _row_op(
    name: str, kernel: Any, numpy: Callable[..., np.ndarray], call: Callable[..., Any], **kw: Any
) -> CrossoverOp:
    out = kw.pop("out", _same)
    typed = kw.pop("typed_bytes", lambda size, s, r: 2 * s * size)
    return CrossoverOp(
        name=name,
        kernel=kernel().name,
        unit="elements",
        defaults=_VECTOR_SIZES,
        inputs=kw.pop("inputs", _rows_input),
        numpy=lambda a: numpy(**a),
        call=call,
        out=out,
        nbytes=lambda size: typed(size, 4, np.dtype(out(size)[1]).itemsize),
        work=lambda s: float(s),
        typed_bytes=typed,
        takes=kw.pop("takes", FLOATS),
    )


def _per_row_op(
    name: str, kernel: Any, numpy: Callable[..., np.ndarray], call: Callable[..., Any], dtype: Any = np.float32
) -> CrossoverOp:
    """A row reduction: one result per row, of ``dtype``; the library call along the last axis."""
    return _row_op(
        name,
        kernel,
        numpy,
        lambda **kw: call(**kw, axis=-1),
        out=_per_row(dtype),
        typed_bytes=lambda size, s, r: s * size + r * row_shape(size)[0],
        takes=NUMBERS,
    )


OPS: dict[str, CrossoverOp] = {
    op.name: op
    for op in (
        CrossoverOp(
            name="matmul",
            kernel=k.matmul_tiled().name,
            unit="n",
            defaults=_MATMUL_SIZES,
            inputs=_matrix,
            numpy=lambda a: a["a"] @ a["b"],
            call=lambda **kw: lib.matmul(**kw, method="tiled"),
            out=lambda n: ((n, n), np.float32),
            nbytes=lambda n: 12 * n * n,
            work=lambda n: float(n) ** 3,
            typed_bytes=lambda n, s, r: 3 * s * n * n,
        ),
        _row_op(
            "transpose",
            k.transpose,
            lambda x: np.ascontiguousarray(x.T),
            lib.transpose,
            out=lambda s: (row_shape(s)[::-1], np.float32),
            takes=NUMBERS,
        ),
        _row_op("softmax", rk.row_softmax, _np_softmax, lib.softmax),
        _row_op("log_softmax", rk.row_softmax, _np_log_softmax, lib.log_softmax),
        _row_op(
            "layer_norm",
            rk.row_layer_norm,
            _np_layer_norm,
            lib.layer_norm,
            inputs=_layer_norm_input,
            typed_bytes=lambda size, s, r: 2 * s * (size + row_shape(size)[1]),
        ),
        _per_row_op("sum", rk.row_sum, lambda x: x.sum(axis=-1), lib.sum),
        _per_row_op("max", rk.row_max, lambda x: x.max(axis=-1), lib.max),
        _per_row_op("argmax", rk.row_argmax, lambda x: x.argmax(axis=-1), lib.argmax, np.int64),
        _row_op(
            "cumsum",
            rk.row_cumsum,
            lambda x: np.cumsum(x, axis=-1),
            lambda **kw: lib.cumsum(**kw, axis=-1),
            typed_bytes=lambda size, s, r: (s + r) * size,
            takes=NUMBERS,
        ),
    )
}


def check_ops(op: str | Iterable[str] | None) -> list[str]:
    """The op names asked for (None or "all": every op), without repeats; InvalidArgument for an unknown one."""
    if op is None or op == "all":
        return list(OPS)
    names = [op] if isinstance(op, str) else list(op)
    if not names:
        raise InvalidArgument(f"crossover: no op given; name one or more of {', '.join(OPS)} (or 'all')")
    for name in names:
        if not isinstance(name, str) or name not in OPS:
            raise InvalidArgument(f"crossover: unknown op {name!r}; the library's ops are {', '.join(OPS)} (or 'all')")
    return list(dict.fromkeys(names))


def _check_sizes(op: str, sizes: Any) -> list[int] | None:
    """The sizes asked for ``op``, sorted and without repeats; None: the op's defaults."""
    if sizes is None:
        return None
    if isinstance(sizes, (int, np.integer)) or not isinstance(sizes, Iterable):
        raise InvalidArgument(f"crossover: sizes must be a list of positive ints, not {sizes!r}")
    found = []
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise InvalidArgument(f"crossover: size {size!r} for {op} is not a positive int")
        elements = int(size) ** 2 if OPS[op].unit == "n" else int(size)
        if elements > MAX_ELEMENTS:
            raise InvalidArgument(
                f"crossover: size {size} for {op} is {elements:,} elements; kernels take at most {MAX_ELEMENTS:,}"
            )
        found.append(int(size))
    if not found:
        raise InvalidArgument(f"crossover: no sizes given for {op}")
    return sorted(set(found))


def sizes_for(ops: list[str], sizes: Any) -> dict[str, list[int] | None]:
    """Per op, the sizes asked for (one list for every op, or a dict per op), checked; None: the op's defaults."""
    if isinstance(sizes, Mapping):
        unknown = [name for name in sizes if name not in ops]
        if unknown:
            raise InvalidArgument(
                f"crossover: sizes given for {', '.join(map(str, unknown))}, not among the ops asked "
                f"for ({', '.join(ops)})"
            )
        return {op: _check_sizes(op, sizes.get(op)) for op in ops}
    return {op: _check_sizes(op, sizes) for op in ops}


def check_dtype(ops: list[str], dtype: Any) -> str:
    """``dtype``'s name, checked against every op asked for; InvalidArgument naming the op that does not take it."""
    t = kernel_type(dtype)
    name = NUMPY_TYPES[t] if t is not None else str(dtype)
    for op in ops:
        if t not in OPS[op].takes:
            takes = ", ".join(NUMPY_TYPES[x] for x in OPS[op].takes)
            raise InvalidArgument(f"crossover: {op} does not take {name}; it takes {takes}")
    return name


def _cast(values: np.ndarray, t: str) -> np.ndarray:
    """Standard normal inputs as kernel type ``t``: integers scaled to whole numbers from about -100 to 100."""
    if t.startswith("i"):
        return np.rint(values * 32).astype(numpy_dtype(t))
    return values.astype(numpy_dtype(t))


def op_for(name: str, dtype: str, index: str = "i64") -> CrossoverOp:
    """``OPS[name]`` for inputs of ``dtype`` (checked by ``check_dtype``); ``index``: argmax's index type on the
    device (int32 where it has no int64)."""
    base = OPS[name]
    if dtype == "float32" and (name != "argmax" or index == "i64"):
        return base
    t = kernel_type(dtype)
    result = index if name == "argmax" else k.sum_type(t) if name in ("sum", "cumsum") else t
    s, r = ITEMSIZE[t], ITEMSIZE[result]
    inputs = base.inputs
    return replace(
        base,
        kernel=f"{base.kernel}_{t}" if t != "f32" else base.kernel,
        inputs=lambda size, rng: {key: _cast(v, t) for key, v in inputs(size, rng).items()},
        out=lambda size: (base.out(size)[0], numpy_dtype(result)),
        nbytes=lambda size: base.typed_bytes(size, s, r),
        dtype=dtype,
    )
