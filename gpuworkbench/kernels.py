"""Kernels: raw source compiled per backend, and ``elementwise``: one expression compiled for every backend."""

from __future__ import annotations

import ast
import re
import threading
import weakref
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dispatch
from .backends.base import BufferArg
from .buffer import Buffer
from .errors import CompileError, InvalidArgument
from .streams import Event, Stream
from .trace import recorder

_REPEATS = 16  # prepared launches kept per Kernel
_MISSES, _SKIP = 16, 256  # after 16 launches in a row that were not repeats, 256 launches look for none
_IMMUTABLE_DIMS = (int, tuple)
_IMMUTABLE_SCALARS = (int, float, np.number, np.bool_)
_PREPARING: weakref.WeakSet = weakref.WeakSet()  # kernels holding prepared launches


def _drop_prepared() -> None:
    """A buffer was freed: prepared launches may name it (on the CPU they hold a view of its memory), so drop all."""
    for kernel in list(_PREPARING):
        kernel._repeats.clear()


Buffer.on_free.append(_drop_prepared)

if TYPE_CHECKING:
    from .device import Device


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if type(value) is int and value > 0:  # the common case, kept cheap: this is on every launch
        return (value,)
    dims = (value,) if isinstance(value, (int, np.integer)) or not hasattr(value, "__iter__") else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims
    ):
        raise InvalidArgument(f"{what} must be 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims)


def _scalar(value: Any, position: int) -> Any:
    """Kernel scalars: NumPy scalars pass as they are; Python int → int32 (int64 if needed), float → float32."""
    if isinstance(value, np.generic):
        return value
    if isinstance(value, bool):
        return np.int32(value)
    if isinstance(value, int):
        return np.int32(value) if -(2**31) <= value < 2**31 else np.int64(value)
    if isinstance(value, float):
        return np.float32(value)
    raise InvalidArgument(f"kernel argument {position} is a {type(value).__name__}; pass a Buffer or a number")


class Kernel:
    """A compiled kernel on one device. Call ``k(grid, block, args, stream=s)``: grid in blocks, block in threads."""

    def __init__(self, device: Device, raw: Any, name: str, source: Any) -> None:
        self.device, self._raw, self.name, self.source = device, raw, name, source
        self._backend_launch = device._backend.launch
        self._prepare, self._launch_prepared = device._backend.prepare_launch, device._backend.launch_prepared
        self._repeats: dict[tuple, tuple] = {}  # see _repeat
        self._last: tuple | None = None  # the last launch's key and objects
        self._misses = 0  # launches in a row that were not repeats
        self._skip = 0  # launches still to make without a key, after _MISSES misses

    def __call__(
        self,
        grid: Any,
        block: Any,
        args: Sequence[Any],
        stream: Stream | None = None,
        name: str | None = None,
        nbytes: int = 0,
    ) -> Event:
        """Enqueue the kernel on ``stream`` (the device's default stream if None). Non-blocking; returns an Event.

        ``nbytes``: the bytes the kernel reads and writes, where the caller knows them; traces keep it in the span's
        ``bytes`` (``gw.library`` sets it, so that the analysis can tell the problem size)."""
        # This is the launch path: every check stays, in as few Python steps as the common case allows; a repeat
        # of an earlier launch (the same grid, block, stream and argument objects) skips them (see _repeat).
        key = None
        if self._skip:  # launches lately were not repeats (a scalar that changes every time): no key for a while
            self._skip -= 1
        else:
            kind = type(args)
            if kind is tuple or kind is list:  # else the checks below say what is wrong
                n = len(args)  # one and two arguments spelled out: a third of the key's cost
                if n == 1:
                    key = (id(grid), id(block), id(stream), id(args[0]))
                elif n == 2:
                    key = (id(grid), id(block), id(stream), id(args[0]), id(args[1]))
                else:
                    key = (id(grid), id(block), id(stream), *map(id, args))
                hit = self._repeats.get(key)
                if hit is not None and hit[0] == Buffer.frees:
                    s = hit[1]
                    if s._capture is None and not s.closed:
                        self._misses = 0
                        values = hit[3]
                        traces = recorder.ACTIVE
                        if traces:  # a trace records it (and says whether to time it)
                            name = name or self.name
                            if len(traces) == 1:  # _dispatch.enqueue's one-trace branch, inlined
                                completion = traces[0].record_op(s, "kernel", nbytes, name, -1, hit[6], values)
                            else:
                                completion = _dispatch.enqueue(s, "kernel", nbytes, name, -1, hit[6], values)
                        else:
                            completion = self._launch_prepared(hit[2], s._raw)
                            s._inflight.append((completion, values))  # Stream._track, inlined
                            s._appended += 1
                            if s._appended & 63 == 0:
                                s._prune_now()
                        sid = s.id
                        for i in hit[4]:
                            args[i]._inflight[sid] = completion  # Buffer._touch, inlined
                        return Event(completion, s, values)
                self._misses += 1
                if self._misses >= _MISSES:
                    self._misses, self._skip = 0, _SKIP
        grid_t = (grid,) if type(grid) is int and grid > 0 else _dims(grid, "grid")
        block_t = (block,) if type(block) is int and block > 0 else _dims(block, "block")
        if not isinstance(args, (tuple, list)):
            raise InvalidArgument("kernel args must be a tuple or list")
        device = self.device
        if stream is None:
            stream = device.default_stream
        elif not isinstance(stream, Stream):
            raise InvalidArgument(f"stream must be a gpuworkbench Stream, not {type(stream).__name__}")
        if stream.device is not device:
            raise InvalidArgument(f"stream {stream.label!r} is on {stream.device.spec}, kernel on {device.spec}")
        frees = Buffer.frees  # before the checks: a buffer freed after them makes what is prepared below stale
        values: list[Any] = []
        buffers: list[Buffer] = []
        scalars: list[Any] = []  # the scalar arguments as given: a repeat's key holds their ids
        usable = not device.closed  # else Buffer._arg raises BufferClosed
        for a in args:
            if isinstance(a, Buffer):
                if a.device is not device:
                    raise InvalidArgument(
                        f"kernel argument {len(values)} is a buffer on {a.device.spec}, not {device.spec}"
                    )
                arg = a._karg if usable else None  # made at its first launch, dropped when it is freed
                values.append(a._arg() if arg is None else arg)
                buffers.append(a)
            else:
                values.append(a if isinstance(a, np.generic) else _scalar(a, len(values)))
                scalars.append(a)
        # _enqueue, inlined: one Python frame fewer on every launch
        if stream.closed:
            stream._check_open()
        repeatable = key is not None and stream._capture is None
        if stream._capture is None and not recorder.ACTIVE:  # _dispatch.enqueue_call's quiet branch, inlined
            completion = self._backend_launch(self._raw, grid_t, block_t, values, stream._raw, False)
            stream._track(completion, values)
        else:
            launch_args = (self._raw, grid_t, block_t, values, stream._raw)
            name = name or self.name
            completion = _dispatch.enqueue_call(
                stream, "kernel", nbytes, name, -1, self._backend_launch, launch_args, values
            )
        sid = stream.id
        for b in buffers:
            b._inflight[sid] = completion  # Buffer._touch, inlined
        if repeatable and usable:
            last = self._last
            if last is not None and last[0] == key:
                self._repeat(key, last[1], args, grid_t, block_t, values, stream, frees)
            else:  # its objects kept: a scalar made per call must not lend its id to the next call's
                self._last = (key, (grid, block, scalars))
        return Event(completion, stream, values)

    def _run_prepared(self, prepared: Any, grid: tuple, block: tuple, values: list, stream: Any, timed: bool) -> Any:
        """A repeat inside a trace: the prepared launch where the trace times it by CUPTI (untimed), else the
        backend's launch with the converted arguments and its events."""
        if timed:
            return self._backend_launch(self._raw, grid, block, values, stream, True)
        return self._launch_prepared(prepared, stream)

    def _repeat(
        self,
        key: tuple,
        keep: tuple,
        args: Sequence[Any],
        grid: tuple,
        block: tuple,
        values: list,
        stream: Stream,
        frees: int,
    ) -> None:
        """Prepare (through the backend) a launch made twice in a row, for ``__call__`` to repeat: untraced through the
        prepared launch, traced through the backend's launch with the arguments converted here.

        ``key`` holds the ids of the grid, block, stream and argument objects of the call. An entry keeps each of
        them alive but the Buffers (``keep``; the stream is the device's), so no other object can take one of those
        ids. A Buffer is not kept, which would keep its memory: an entry is valid while ``Buffer.frees`` is what it was
        before the call's checks (``frees``), since a Buffer dies only through ``free`` (its finaliser calls it), which
        counts; every free also drops the entries (``_drop_prepared``). Scalars and tuples are immutable, so equal ids
        mean equal arguments; a list of dims or a structured scalar is not prepared."""
        grid_arg, block_arg, scalars = keep
        if not (type(grid_arg) in _IMMUTABLE_DIMS and type(block_arg) in _IMMUTABLE_DIMS):
            return  # a list of dims may change in place under the same id
        if not all(isinstance(a, _IMMUTABLE_SCALARS) for a in scalars):
            return
        repeats = self._repeats
        if len(repeats) >= _REPEATS:
            repeats.clear()
        positions = tuple(i for i, a in enumerate(args) if isinstance(a, Buffer))
        prepared = self._prepare(self._raw, grid, block, values)
        traced = partial(self._run_prepared, prepared, grid, block, values, stream._raw)  # call(timed), for a trace
        repeats[key] = (frees, stream, prepared, values, positions, keep, traced)
        _PREPARING.add(self)

    def _enqueue(
        self,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        values: list[Any],
        buffers: list[Buffer],
        stream: Stream,
        name: str | None,
        nbytes: int,
    ) -> Event:
        """Enqueue checked, converted arguments (``values``; ``buffers``: the Buffers among them, now in use)."""
        if stream.closed:
            stream._check_open()
        completion = _dispatch.enqueue_call(
            stream,
            "kernel",
            nbytes,
            name or self.name,
            -1,
            self._backend_launch,
            (self._raw, grid, block, values, stream._raw),
            values,
        )
        sid = stream.id
        for b in buffers:
            b._touch(sid, completion)
        return Event(completion, stream, values)

    def __repr__(self) -> str:
        return f"<Kernel {self.name!r} on {self.device.spec}>"


# ---------------------------------------------------------------------------------------------------------- elementwise
_C_TYPES = {
    "cuda": {
        "float32": "float",
        "float64": "double",
        "int32": "int",
        "uint32": "unsigned int",
        "int64": "long long",
        "uint64": "unsigned long long",
        "int16": "short",
        "uint16": "unsigned short",
        "int8": "signed char",
        "uint8": "unsigned char",
    },
    "opencl": {
        "float32": "float",
        "float64": "double",
        "int32": "int",
        "uint32": "uint",
        "int64": "long",
        "uint64": "ulong",
        "int16": "short",
        "uint16": "ushort",
        "int8": "char",
        "uint8": "uchar",
    },
}
_FUNCS = {
    # name: (C name for float kernels, C name for integer kernels, NumPy function)
    "sin": ("sin", None, np.sin),
    "cos": ("cos", None, np.cos),
    "tan": ("tan", None, np.tan),
    "tanh": ("tanh", None, np.tanh),
    "exp": ("exp", None, np.exp),
    "log": ("log", None, np.log),
    "sqrt": ("sqrt", None, np.sqrt),
    "floor": ("floor", None, np.floor),
    "ceil": ("ceil", None, np.ceil),
    "pow": ("pow", None, np.power),
    "abs": ("fabs", "abs", np.abs),
    "min": ("fmin", "min", np.minimum),
    "max": ("fmax", "max", np.maximum),
}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%", ast.BitAnd: "&&", ast.BitOr: "||"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


class _ToC(ast.NodeVisitor):
    """Turns one parsed expression into C, with array params indexed by ``gw_i``."""

    def __init__(self, arrays: set[str], scalars: set[str], float32: bool, floats: bool, float_names: set[str]) -> None:
        self.arrays, self.scalars, self.float32, self.floats = arrays, scalars, float32, floats
        self.float_names = float_names

    def _is_float(self, node: ast.AST) -> bool:
        """Whether C evaluates ``node`` in floating point (the usual arithmetic conversions)."""
        if isinstance(node, ast.Name):
            return node.id in self.float_names
        if isinstance(node, ast.Constant):
            return isinstance(node.value, float)
        if isinstance(node, ast.BinOp):
            logical = isinstance(node.op, (ast.BitAnd, ast.BitOr))
            return not logical and (self._is_float(node.left) or self._is_float(node.right))
        if isinstance(node, ast.UnaryOp):
            return isinstance(node.op, (ast.USub, ast.UAdd)) and self._is_float(node.operand)
        if isinstance(node, ast.Call):
            fname = node.func.id if isinstance(node.func, ast.Name) else ""
            if fname == "where":
                return any(self._is_float(a) for a in node.args[1:])
            return fname in _FUNCS and (self.floats or _FUNCS[fname][1] is None)
        return False  # comparisons give int

    def generic_visit(self, node: ast.AST) -> str:
        raise InvalidArgument(f"elementwise expressions cannot contain {type(node).__name__} ({ast.unparse(node)!r})")

    def visit_Name(self, node: ast.Name) -> str:
        if node.id in self.arrays:
            return f"{node.id}[gw_i]"
        if node.id in self.scalars:
            return node.id
        raise InvalidArgument(f"elementwise expression uses {node.id!r}, which is not a declared parameter")

    def visit_Constant(self, node: ast.Constant) -> str:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise InvalidArgument(f"elementwise constant {node.value!r} is not a number")
        if isinstance(node.value, float):
            text = repr(node.value)
            if "e" not in text and "." not in text:
                text += ".0"
            return text + ("f" if self.float32 else "")
        return str(node.value)

    def visit_BinOp(self, node: ast.BinOp) -> str:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise InvalidArgument(f"operator {ast.unparse(node)!r} is not supported in elementwise expressions")
        if isinstance(node.op, ast.Mod) and (self._is_float(node.left) or self._is_float(node.right)):
            real = "float" if self.float32 else "double"  # C has no float %; fmod is what NumPy's side computes
            return f"fmod(({real})({self.visit(node.left)}), ({real})({self.visit(node.right)}))"
        return f"({self.visit(node.left)} {op} {self.visit(node.right)})"

    def visit_UnaryOp(self, node: ast.UnaryOp) -> str:
        ops = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "!", ast.Not: "!"}
        if type(node.op) not in ops:
            raise InvalidArgument(f"operator in {ast.unparse(node)!r} is not supported")
        return f"({ops[type(node.op)]}{self.visit(node.operand)})"

    def visit_Compare(self, node: ast.Compare) -> str:
        if len(node.ops) != 1:
            raise InvalidArgument(f"chained comparison {ast.unparse(node)!r}: write (a < b) & (b < c)")
        return f"({self.visit(node.left)} {_CMPOPS[type(node.ops[0])]} {self.visit(node.comparators[0])})"

    def visit_Call(self, node: ast.Call) -> str:
        fname = node.func.id if isinstance(node.func, ast.Name) else ""
        args = [self.visit(a) for a in node.args]
        if fname == "where" and len(args) == 3:
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if fname not in _FUNCS:
            known = ", ".join(sorted([*_FUNCS, "where"]))
            raise InvalidArgument(f"function {fname or ast.unparse(node.func)!r} is not supported; known: {known}")
        c_float, c_int, _ = _FUNCS[fname]
        c_name = c_float if self.floats or c_int is None else c_int
        return f"{c_name}({', '.join(args)})"


_WGSL_TYPES = {"float32": "f32", "int32": "i32", "uint32": "u32"}
_WGSL_GROUP = 256  # threads per workgroup in generated WGSL; grids past 65535 groups spill into y


class _ToWGSL(ast.NodeVisitor):
    """Turns one parsed expression into WGSL with C's meaning; each node gives (text, type), types meet as in C.

    WGSL converts nothing implicitly, so operands are cast to the type C would compute in; "af"/"ai" are literals."""

    def __init__(self, types: dict[str, str], arrays: set[str]) -> None:
        self.types, self.arrays, self.used = types, arrays, set()
        self.floats = "f32" in types.values()

    @staticmethod
    def cast(value: tuple[str, str], to: str) -> str:
        text, t = value
        if t == to or (t == "ai" and to != "bool") or (t == "af" and to == "f32"):
            return text
        return f"{to}({text})"

    @staticmethod
    def meet(*values: tuple[str, str]) -> str:
        kinds = {t for _, t in values}
        return "f32" if kinds & {"f32", "af"} else "u32" if "u32" in kinds else "i32"

    def generic_visit(self, node: ast.AST) -> tuple[str, str]:
        raise InvalidArgument(f"elementwise expressions cannot contain {type(node).__name__} ({ast.unparse(node)!r})")

    def visit_Name(self, node: ast.Name) -> tuple[str, str]:
        if node.id not in self.types:
            raise InvalidArgument(f"elementwise expression uses {node.id!r}, which is not a declared parameter")
        self.used.add(node.id)
        return (f"{node.id}[gw_i]" if node.id in self.arrays else f"gw_args.{node.id}"), self.types[node.id]

    def visit_Constant(self, node: ast.Constant) -> tuple[str, str]:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise InvalidArgument(f"elementwise constant {node.value!r} is not a number")
        if isinstance(node.value, int):
            return str(node.value), "ai"
        text = repr(node.value)
        return (text if "e" in text or "." in text else text + ".0"), "af"

    def visit_BinOp(self, node: ast.BinOp) -> tuple[str, str]:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise InvalidArgument(f"operator {ast.unparse(node)!r} is not supported in elementwise expressions")
        left, right = self.visit(node.left), self.visit(node.right)
        t = "bool" if op in ("&&", "||") else self.meet(left, right)
        return f"({self.cast(left, t)} {op} {self.cast(right, t)})", t

    def visit_UnaryOp(self, node: ast.UnaryOp) -> tuple[str, str]:
        value = self.visit(node.operand)
        if isinstance(node.op, (ast.Invert, ast.Not)):
            return f"(!{self.cast(value, 'bool')})", "bool"
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise InvalidArgument(f"operator in {ast.unparse(node)!r} is not supported")
        t = value[1] if value[1] in ("f32", "af", "ai", "u32") else "i32"
        sign = "" if isinstance(node.op, ast.UAdd) else "0u - " if t == "u32" else "-"
        return f"({sign}{self.cast(value, t)})", t

    def visit_Compare(self, node: ast.Compare) -> tuple[str, str]:
        if len(node.ops) != 1:
            raise InvalidArgument(f"chained comparison {ast.unparse(node)!r}: write (a < b) & (b < c)")
        left, right = self.visit(node.left), self.visit(node.comparators[0])
        t = self.meet(left, right)
        return f"({self.cast(left, t)} {_CMPOPS[type(node.ops[0])]} {self.cast(right, t)})", "bool"

    def visit_Call(self, node: ast.Call) -> tuple[str, str]:
        fname = node.func.id if isinstance(node.func, ast.Name) else ""
        args = [self.visit(a) for a in node.args]
        if fname == "where" and len(args) == 3:
            t = self.meet(args[1], args[2])
            return f"select({self.cast(args[2], t)}, {self.cast(args[1], t)}, {self.cast(args[0], 'bool')})", t
        if fname not in _FUNCS:
            known = ", ".join(sorted([*_FUNCS, "where"]))
            raise InvalidArgument(f"function {fname or ast.unparse(node.func)!r} is not supported; known: {known}")
        t = "f32" if self.floats or _FUNCS[fname][1] is None else self.meet(*args)
        return f"{fname}({', '.join(self.cast(a, t) for a in args)})", t


def _wgsl_source(name: str, params: list[tuple[str, np.dtype]], statements: list, mask: tuple[bool, ...]) -> str:
    """WGSL for one elementwise kernel: arrays at bindings 0..k in order, scalars and the count in a uniform after."""
    for pname, dt in params:
        if dt.name not in _WGSL_TYPES:
            raise InvalidArgument(
                f"elementwise parameter {pname!r} is {dt}; WebGPU kernels take float32, int32 and uint32 only"
            )
    types = {n: _WGSL_TYPES[dt.name] for n, dt in params}
    arrays = [n for (n, _), a in zip(params, mask) if a]
    outputs = {target for target, _ in statements}
    to_wgsl = _ToWGSL(types, set(arrays))
    lines = [f"{n}[gw_i] = {to_wgsl.cast(to_wgsl.visit(e), types[n])};" for n, e in statements]
    lines += [f"_ = arrayLength(&{n});" for n in arrays if n not in to_wgsl.used | outputs]  # keep it in the layout
    fields = [f"{n}: {types[n]}" for (n, _), a in zip(params, mask) if not a] + ["gw_n: u32"]
    decls = [
        f"@group(0) @binding({b}) var<storage, {'read_write' if n in outputs else 'read'}> {n}: array<{types[n]}>;"
        for b, n in enumerate(arrays)
    ]
    body = "\n".join(f"        {line}" for line in lines)
    return (
        f"struct GwArgs {{ {', '.join(fields)} }}\n" + "\n".join(decls) + "\n"
        f"@group(0) @binding({len(arrays)}) var<uniform> gw_args: GwArgs;\n\n"
        f"@compute @workgroup_size({_WGSL_GROUP})\n"
        f"fn {name}(@builtin(global_invocation_id) gw_id: vec3<u32>,\n"
        f"        @builtin(num_workgroups) gw_groups: vec3<u32>) {{\n"
        f"    let gw_i = gw_id.x + gw_id.y * gw_groups.x * {_WGSL_GROUP}u;\n"
        f"    if (gw_i < gw_args.gw_n) {{\n{body}\n    }}\n}}\n"
    )


def _is_integer(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "iub"


def _c_div(a: Any, b: Any) -> Any:
    """C's ``/``: division truncating toward zero when both operands are integers, true division otherwise."""
    if not (_is_integer(a) and _is_integer(b)):
        return np.true_divide(a, b)
    quotient = np.floor_divide(a, b)
    return quotient + ((np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0)))


def _c_int(value: Any) -> Any:
    """A C truth value: comparisons and logical operators give int 0 or 1."""
    return np.asarray(value).astype(np.int32)


class _ToNumPy(ast.NodeTransformer):
    """Rewrites the expression for NumPy with C's meaning: ``/`` and ``%`` truncate on integers, comparisons and
    ``& | ~`` give int 0/1 (logical, not bitwise), and where/min/max/abs map to NumPy functions."""

    @staticmethod
    def _call(name: str, *args: ast.expr) -> ast.Call:
        return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name):
            node.func = ast.Name(id=f"_np_{node.func.id}", ctx=ast.Load())
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Div):
            return self._call("_c_div", node.left, node.right)
        if isinstance(node.op, ast.Mod):
            return self._call("_np_fmod", node.left, node.right)
        if isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            logic = "_np_logical_and" if isinstance(node.op, ast.BitAnd) else "_np_logical_or"
            return self._call("_c_int", self._call(logic, node.left, node.right))
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, (ast.Invert, ast.Not)):
            return self._call("_c_int", self._call("_np_logical_not", node.operand))
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        return self._call("_c_int", node)


class ElementwiseKernel:
    """One expression, every backend: ``f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1")``.

    Call it with buffers (and numbers for scalar parameters) in declared order: ``f(x, y, stream=s)``. Parameters
    assigned to are outputs. The language is C-like arithmetic in Python syntax: ``+ - * / %``, comparisons,
    ``&`` / ``|`` / ``~`` as logical and/or/not, ``where(c, a, b)``, and sin, cos, tan, tanh, exp, log, sqrt, floor,
    ceil, pow, abs, min, max. Float constants are single precision when no parameter is float64.
    """

    def __init__(self, params: str, body: str, name: str = "elementwise") -> None:
        self.name = name
        self.params = self._parse_params(params)
        self.body = body
        self.statements = self._parse_body(body)
        self.outputs = [target for target, _ in self.statements]
        self._cache: dict[tuple[int, tuple[bool, ...]], Any] = {}
        self._lock = threading.Lock()
        # (name, dtype, is an output) per parameter, and launch plans by (device, buffer mask, length, block): the
        # kernel, grid, block and trailing arguments, worked out once per signature (the checks still run per call)
        self._spec = [(n, dt, n in self.outputs) for n, dt in self.params]
        self._plans: dict[tuple[int, int, int, Any], tuple[Kernel, tuple, tuple, list]] = {}
        self.source("opencl")  # checks names, operators and functions here, for every backend (the CPU's too)

    @staticmethod
    def _parse_params(params: str) -> list[tuple[str, np.dtype]]:
        parsed = []
        for part in [p.strip() for p in params.split(",") if p.strip()]:
            pieces = part.split()
            if len(pieces) != 2 or not pieces[1].isidentifier():
                raise InvalidArgument(f"elementwise parameter {part!r} must read 'dtype name', e.g. 'float32 x'")
            try:
                dt = np.dtype(pieces[0])
            except TypeError:
                raise InvalidArgument(f"elementwise parameter {part!r}: {pieces[0]!r} is not a dtype") from None
            if dt.name not in _C_TYPES["cuda"]:
                raise InvalidArgument(f"elementwise parameter {part!r}: dtype {dt} is not supported on devices")
            parsed.append((pieces[1], dt))
        if not parsed:
            raise InvalidArgument("elementwise needs at least one parameter")
        names = [n for n, _ in parsed]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"elementwise parameters repeat a name: {names}")
        return parsed

    def _parse_body(self, body: str) -> list[tuple[str, ast.expr]]:
        names = {n for n, _ in self.params}
        statements = []
        for text in [s.strip() for s in re.split(r"[;\n]", body) if s.strip()]:
            text = text.replace("&&", "&").replace("||", "|")
            try:
                tree = ast.parse(text, mode="exec")
            except SyntaxError as exc:
                raise InvalidArgument(f"elementwise statement {text!r} is not valid: {exc.msg}") from None
            stmt = tree.body[0] if len(tree.body) == 1 else None
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                raise InvalidArgument(f"elementwise statement {text!r} must read 'output = expression'")
            target = stmt.targets[0].id
            if target not in names:
                raise InvalidArgument(f"elementwise statement assigns {target!r}, which is not a declared parameter")
            statements.append((target, stmt.value))
        if not statements:
            raise InvalidArgument("elementwise body assigns nothing; write e.g. 'y = 2*x + 1'")
        return statements

    # ------------------------------------------------------------------ per-backend source
    def source(self, language: str, is_array: Sequence[bool] | None = None) -> str:
        """The generated CUDA C, OpenCL C or WGSL (``language`` "cuda", "opencl", "wgsl") for the array/scalar mask."""
        mask = tuple(is_array) if is_array is not None else (True,) * len(self.params)
        if language == "wgsl":
            return _wgsl_source(self.name, self.params, self.statements, mask)
        arrays = {n for (n, _), a in zip(self.params, mask) if a}
        scalars = {n for (n, _), a in zip(self.params, mask) if not a}
        float_names = {n for n, dt in self.params if dt.kind == "f"}
        floats = bool(float_names)
        float32 = floats and not any(dt == np.float64 for _, dt in self.params)
        to_c = _ToC(arrays, scalars, float32, floats, float_names)
        types = _C_TYPES[language]
        lines = [f"{n}[gw_i] = ({types[dict(self.params)[n].name]})({to_c.visit(e)});" for n, e in self.statements]
        index_t = "long long" if language == "cuda" else "long"
        sig = []
        for (n, dt), a in zip(self.params, mask):
            const = "const " if n not in self.outputs else ""
            if language == "cuda":
                sig.append(f"{const}{types[dt.name]}* __restrict__ {n}" if a else f"const {types[dt.name]} {n}")
            else:
                sig.append(f"__global {const}{types[dt.name]}* restrict {n}" if a else f"const {types[dt.name]} {n}")
        sig.append(f"const {index_t} gw_n")  # gw_ names cannot clash with parameters like n or i
        body = "\n".join(f"        {line}" for line in lines)
        if language == "cuda":
            return (
                f'extern "C" __global__ void {self.name}({", ".join(sig)}) {{\n'
                f"    {index_t} gw_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"    if (gw_i < gw_n) {{\n{body}\n    }}\n}}\n"
            )
        prelude = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if "double" in " ".join(sig) else ""
        return (
            f"{prelude}__kernel void {self.name}({', '.join(sig)}) {{\n"
            f"    {index_t} gw_i = get_global_id(0);\n"
            f"    if (gw_i < gw_n) {{\n{body}\n    }}\n}}\n"
        )

    def _numpy_callable(self, mask: tuple[bool, ...]) -> Any:
        """The CPU kernel: one Python function whose body is the statements rewritten for NumPy (C's meaning), so a
        launch costs the worker a call and the NumPy operations, not a namespace copy and an eval per statement."""
        env = {f"_np_{k}": v[2] for k, v in _FUNCS.items()} | {"_np_where": np.where, "_np_fmod": np.fmod}
        env |= {"_np_logical_and": np.logical_and, "_np_logical_or": np.logical_or, "_np_logical_not": np.logical_not}
        env |= {"_c_div": _c_div, "_c_int": _c_int, "_gw_errstate": np.errstate}
        dtypes = {f"_gw_t_{n}": dt.type for (n, dt), a in zip(self.params, mask) if not a}
        env |= dtypes
        lines = [f"    {n} = _gw_t_{n}({n})" for (n, _), a in zip(self.params, mask) if not a]
        lines.append("    with _gw_errstate(all='ignore'):")
        for target, expr in self.statements:
            rewritten = _ToNumPy().visit(ast.parse(ast.unparse(expr), mode="eval").body)
            lines.append(f"        {target}[...] = {ast.unparse(ast.fix_missing_locations(rewritten))}")
        params = ", ".join(n for n, _ in self.params)
        source = f"def _gw_kernel({params}):\n" + "\n".join(lines) + "\n"
        exec(compile(source, f"<elementwise {self.name}>", "exec"), env)  # noqa: S102 - our own generated code
        return env["_gw_kernel"]

    def _kernel_for(self, device: Device, mask: tuple[bool, ...]) -> Any:
        key = (id(device), mask)
        with self._lock:
            kernel = self._cache.get(key)
            if kernel is None:
                language = device.caps.kernel_language
                if language == "python":
                    src: Any = self._numpy_callable(mask)
                elif language in ("cuda", "opencl", "wgsl"):
                    src = self.source(language, mask)
                else:
                    raise InvalidArgument(f"elementwise has no code generator for {language!r} kernels yet")
                try:
                    kernel = device.compile(src, self.name)
                except CompileError as exc:  # our generator produced bad code: show it, it is our bug
                    raise CompileError(self.name, f"generated code failed to compile: {exc.log}", exc.source) from None
                self._cache[key] = kernel
            return kernel

    def __call__(self, *args: Any, stream: Stream | None = None, block: int = 256, name: str | None = None) -> Event:
        """Enqueue the expression over every element on ``stream`` (traced as ``name``, default the kernel's name).
        Non-blocking; returns an Event."""
        spec = self._spec
        if len(args) != len(spec):
            raise InvalidArgument(f"{self.name} takes {len(spec)} arguments ({self._sig()}), got {len(args)}")
        device: Any = None
        n = mask = 0
        bit = 1
        scalar_output = None
        values: list[Any] = []
        for a, (pname, dt, output) in zip(args, spec):
            if isinstance(a, Buffer):
                if a.dtype is not dt and a.dtype != dt:
                    raise InvalidArgument(f"{self.name}: parameter {pname!r} is {dt}, buffer holds {a.dtype}")
                if device is None:
                    device, n = a.device, a._len
                elif a._len != n:
                    raise InvalidArgument(f"{self.name}: buffers differ in length ({n} and {a._len} for {pname!r})")
                elif a.device is not device:
                    raise InvalidArgument(f"{self.name}: buffers are on different devices")
                mask |= bit
                values.append(a)
            elif output:
                scalar_output = scalar_output or (pname, a)
            else:
                try:
                    values.append(dt.type(a))
                except (TypeError, ValueError, OverflowError):
                    raise InvalidArgument(
                        f"{self.name}: parameter {pname!r} is {dt}, got {type(a).__name__} {a!r}"
                    ) from None
            bit <<= 1
        if device is None:
            raise InvalidArgument(f"{self.name} needs at least one buffer argument")
        if scalar_output is not None:
            pname, a = scalar_output
            raise InvalidArgument(f"{self.name}: output {pname!r} must be a Buffer, not {type(a).__name__}")
        if stream is None:
            stream = device.default_stream
        elif not isinstance(stream, Stream) or stream.device is not device:
            where = f"on {stream.device.spec}" if isinstance(stream, Stream) else f"a {type(stream).__name__}"
            raise InvalidArgument(f"{self.name}: stream must be a Stream of {device.spec}, got {where}")
        if n == 0:
            return stream.record()
        plan = self._plans.get((id(device), mask, n, block)) if type(block) is int else None
        if plan is None:
            plan = self._plan(device, mask, n, block)
        kernel, grid, block_t, tail = plan
        if tail:
            values += tail
        # Through the Kernel's call: the plan's grid, block and tail are the same objects every time, so a call with
        # the same buffers and stream is a repeat, launched prepared (the checks it repeats are a few attribute reads)
        return kernel(grid, block_t, values, stream, name)

    def _plan(self, device: Device, mask: int, n: int, block: Any) -> tuple[Kernel, tuple, tuple, list]:
        """Compile (once per device and buffer mask) and work out the launch of ``n`` elements; cached."""
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
            raise InvalidArgument(f"{self.name}: block must be a positive int, got {block!r}")
        key = (id(device), mask, n, block)
        kernel = self._kernel_for(device, tuple(bool(mask >> i & 1) for i in range(len(self.params))))
        language = device.caps.kernel_language
        if language == "python":
            plan: tuple[Kernel, tuple, tuple, list] = (kernel, (1,), (1,), [])
        elif language == "wgsl":  # the count is a u32; the workgroup size is fixed in the source
            groups = -(-n // _WGSL_GROUP)
            plan = (kernel, (min(groups, 65535), -(-groups // 65535)), (_WGSL_GROUP,), [np.uint32(n)])
        else:
            block = int(block)
            plan = (kernel, ((n + block - 1) // block,), (block,), [np.int64(n)])
        if len(self._plans) >= 256:  # many sizes: start over rather than grow without bound
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def _sig(self) -> str:
        return ", ".join(f"{dt} {n}" for n, dt in self.params)

    def __repr__(self) -> str:
        return f"<elementwise {self.name}({self._sig()}): {self.body!r}>"


def elementwise(params: str, body: str, name: str = "elementwise") -> ElementwiseKernel:
    """One C-like expression compiled for CUDA and OpenCL and evaluated with NumPy on the CPU."""
    return ElementwiseKernel(params, body, name)


__all__ = ["BufferArg", "ElementwiseKernel", "Kernel", "elementwise"]
