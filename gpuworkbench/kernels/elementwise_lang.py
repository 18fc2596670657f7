"""The elementwise language: a C-like expression in Python syntax → CUDA C / OpenCL C, WGSL, or NumPy (C's meaning).

``&``, ``|`` and ``~`` are logical and/or/not, comparisons give int 0/1, ``/`` and ``%`` truncate on integers (C),
and ``where``, min, max, abs and the usual math functions are known; float constants are single precision when no
parameter is float64.
"""

from __future__ import annotations

import ast
from typing import Any

import numpy as np

from ..errors import InvalidArgument

FUNCS = {
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


class ToC(ast.NodeVisitor):
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
            return fname in FUNCS and (self.floats or FUNCS[fname][1] is None)
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
        if fname not in FUNCS:
            known = ", ".join(sorted([*FUNCS, "where"]))
            raise InvalidArgument(f"function {fname or ast.unparse(node.func)!r} is not supported; known: {known}")
        c_float, c_int, _ = FUNCS[fname]
        c_name = c_float if self.floats or c_int is None else c_int
        return f"{c_name}({', '.join(args)})"


_WGSL_TYPES = {"float32": "f32", "int32": "i32", "uint32": "u32"}
WGSL_GROUP = 256  # threads per workgroup in generated WGSL; grids past 65535 groups spill into y


class ToWGSL(ast.NodeVisitor):
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
        if fname not in FUNCS:
            known = ", ".join(sorted([*FUNCS, "where"]))
            raise InvalidArgument(f"function {fname or ast.unparse(node.func)!r} is not supported; known: {known}")
        t = "f32" if self.floats or FUNCS[fname][1] is None else self.meet(*args)
        return f"{fname}({', '.join(self.cast(a, t) for a in args)})", t


def wgsl_source(name: str, params: list[tuple[str, np.dtype]], statements: list, mask: tuple[bool, ...]) -> str:
    """WGSL for one elementwise kernel: arrays at bindings 0..k in order, scalars and the count in a uniform after."""
    for pname, dt in params:
        if dt.name not in _WGSL_TYPES:
            raise InvalidArgument(
                f"elementwise parameter {pname!r} is {dt}; WebGPU kernels take float32, int32 and uint32 only"
            )
    types = {n: _WGSL_TYPES[dt.name] for n, dt in params}
    arrays = [n for (n, _), a in zip(params, mask) if a]
    outputs = {target for target, _ in statements}
    to_wgsl = ToWGSL(types, set(arrays))
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
        f"@compute @workgroup_size({WGSL_GROUP})\n"
        f"fn {name}(@builtin(global_invocation_id) gw_id: vec3<u32>,\n"
        f"        @builtin(num_workgroups) gw_groups: vec3<u32>) {{\n"
        f"    let gw_i = gw_id.x + gw_id.y * gw_groups.x * {WGSL_GROUP}u;\n"
        f"    if (gw_i < gw_args.gw_n) {{\n{body}\n    }}\n}}\n"
    )


def _is_integer(value: Any) -> bool:
    return np.asarray(value).dtype.kind in "iub"


def c_div(a: Any, b: Any) -> Any:
    """C's ``/``: division truncating toward zero when both operands are integers, true division otherwise."""
    if not (_is_integer(a) and _is_integer(b)):
        return np.true_divide(a, b)
    quotient = np.floor_divide(a, b)
    return quotient + ((np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0)))


def c_int(value: Any) -> Any:
    """A C truth value: comparisons and logical operators give int 0 or 1."""
    return np.asarray(value).astype(np.int32)


class ToNumPy(ast.NodeTransformer):
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
