"""The kernel's types: ``gw.index``, the scalar types (``gw.f32`` ...) and arrays of them, as annotations and casts.

A translated kernel names every type by a short string ("f32", "i32", "bool", and "isize" for a flat element offset);
the tables here map those strings to NumPy and give each integer type its range.

``f16`` and ``bf16`` are storage types: arrays, shared arrays and locals hold them, and a value read from one computes
as f32 (a store rounds it back to the nearest). bfloat16 has no NumPy dtype: its arrays use ``ml_dtypes.bfloat16``
where ml_dtypes is installed (``bfloat16()``, None otherwise), imported when a bfloat16 is first asked for, not with
the package.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..errors import InvalidArgument


@functools.cache
def bfloat16() -> Any:
    """bfloat16's NumPy scalar type, where the package that defines one is installed (None otherwise)."""
    try:
        from ml_dtypes import bfloat16 as found
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return found


class ScalarType:
    """An element type: ``a: gw.f32`` is a scalar argument, ``x: gw.f32[:]`` a 1-D array, ``gw.f32(v)`` a cast.

    2-D arrays: ``gw.f32[:, :]`` has the launch shape (rows = y extent, columns = x extent); ``gw.f32[:, gw.width.w]``
    has rows of ``w`` elements, ``w`` being an integer scalar parameter of the same kernel (``gw.f32[:, "w"]`` says
    the same, but linters read a string in an annotation as a name and report it undefined)."""

    def __init__(self, name: str, dtype: Any) -> None:
        self.name = name
        self._dtype = None if dtype is None else np.dtype(dtype)  # None: bf16's, looked up on first use

    @property
    def dtype(self) -> np.dtype | None:
        """The NumPy dtype; None for bf16 without ml_dtypes."""
        if self._dtype is None and self.name == "bf16" and bfloat16() is not None:
            self._dtype = np.dtype(bfloat16())
        return self._dtype

    def __getitem__(self, dims: Any) -> ArrayType:
        if dims == slice(None):
            return ArrayType(self, 1, None)
        if isinstance(dims, tuple) and len(dims) == 2 and dims[0] == slice(None):
            if dims[1] == slice(None):
                return ArrayType(self, 2, None)
            name = dims[1].name if isinstance(dims[1], WidthName) else dims[1]
            if isinstance(name, str) and name.isidentifier():
                return ArrayType(self, 2, name)
        raise InvalidArgument(
            f"array annotation {self!r}[{dims!r}] is not one of {self!r}[:] (1-D), {self!r}[:, :] (2-D, the launch "
            f"shape) or {self!r}[:, gw.width.w] (2-D, rows of w elements, w an integer parameter)"
        )

    def __call__(self, value: Any) -> Any:
        return numpy_dtype(self.name).type(value)

    def __repr__(self) -> str:
        return f"gw.{self.name}"


class WidthName:
    """``gw.width.w``: names the integer parameter ``w`` that holds a 2-D array's row width."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"gw.width.{self.name}"


class Widths:
    """``gw.width``: any attribute of it names a parameter, ``gw.width.w`` → the parameter ``w``."""

    def __getattr__(self, name: str) -> WidthName:
        if name.startswith("__"):
            raise AttributeError(name)
        return WidthName(name)

    def __repr__(self) -> str:
        return "gw.width"


WIDTH = Widths()


class ArrayType:
    """A kernel array parameter: element type, 1 or 2 dimensions, and for 2-D the scalar holding the row width."""

    def __init__(self, element: ScalarType, ndim: int, width: str | None) -> None:
        self.element, self.ndim, self.width = element, ndim, width

    def __repr__(self) -> str:
        dims = ":" if self.ndim == 1 else ":, :" if self.width is None else f":, gw.width.{self.width}"
        return f"{self.element!r}[{dims}]"


class IndexType:
    """The thread index: ``i: gw.index`` (1-D) or ``x: gw.index, y: gw.index`` (2-D; x runs along a row)."""

    def __repr__(self) -> str:
        return "gw.index"


INDEX = IndexType()
SCALAR_TYPES = {
    name: ScalarType(name, dtype)
    for name, dtype in [("f32", np.float32), ("f64", np.float64), ("i32", np.int32), ("u32", np.uint32),
                        ("i64", np.int64), ("f16", np.float16), ("bf16", None)]
}  # fmt: skip
FLOATS = ("f32", "f64")  # the floats a value computes in
HALVES = ("f16", "bf16")  # 16-bit floats: storage only, computed as f32
INTS = ("i32", "u32", "i64")
# "isize" is the flat element offset into an array: 64-bit in C and NumPy, i32 in WGSL (which has nothing wider).
NUMPY_TYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "u32": "uint32", "i64": "int64", "bool": "bool",
               "isize": "int64", "f16": "float16", "bf16": "bfloat16"}  # fmt: skip


def numpy_dtype(t: str) -> np.dtype:
    """The NumPy dtype of kernel type ``t``; InvalidArgument for bf16 where ml_dtypes (its only NumPy dtype) is
    missing."""
    if t == "bf16":
        if bfloat16() is None:
            raise InvalidArgument("bfloat16 has no NumPy dtype without the ml_dtypes package: pip install ml_dtypes")
        return np.dtype(bfloat16())
    return np.dtype(NUMPY_TYPES[t])


def kernel_type(dtype: Any) -> str | None:
    """The kernel type holding NumPy ``dtype`` ("f32", "bf16" ...), None for one kernels do not take."""
    bfloat16()  # registers the name "bfloat16" with NumPy, where ml_dtypes is installed
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return None
    return next((t for t, s in SCALAR_TYPES.items() if s.dtype is not None and s.dtype == dt), None)


ITEMSIZE = {"f32": 4, "f64": 8, "i32": 4, "u32": 4, "i64": 8, "f16": 2, "bf16": 2, "bool": 1, "isize": 8}
INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1),
             "isize": (-(2**31), 2**31 - 1)}  # fmt: skip

# The names a kernel's signature spells them by: ``i: gw.index``, ``x: gw.f32[:]``, ``gw.f32[:, gw.width.w]``.
index = INDEX
width = WIDTH
f32 = SCALAR_TYPES["f32"]
f64 = SCALAR_TYPES["f64"]
i32 = SCALAR_TYPES["i32"]
u32 = SCALAR_TYPES["u32"]
i64 = SCALAR_TYPES["i64"]
f16 = SCALAR_TYPES["f16"]
bf16 = SCALAR_TYPES["bf16"]
