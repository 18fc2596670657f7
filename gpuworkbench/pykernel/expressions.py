"""Kernel expressions → typed tree expressions, with C's arithmetic conversions and Python's meaning of the operators.

Types are decided here, once: literals take the other operand's type, ``/`` of integers gives a float, and every
conversion becomes an explicit ``Cast`` (or is folded into a constant), so no generator converts anything itself.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .ir import Binary, Builtin, Call, Cast, Compare, Const, Expr, Load, Param, Select, Unary, Var
from .ktypes import FLOATS, HALVES, INT_RANGE, INTS, ScalarType, kernel_type
from .names import FLOAT_FUNCTIONS, FUNCTIONS, KNOWN
from .reader import MISSING, Reader
from .words import BLOCK_PLACES, barrier, shared

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
           ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}  # fmt: skip
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_FOLD: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b, "**": lambda a, b: a**b, "&": lambda a, b: a & b,
    "|": lambda a, b: a | b, "^": lambda a, b: a ^ b, "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}  # fmt: skip


def _fold_call(name: str, values: list[Any]) -> Any:
    """A math function of literals, computed now (None where Python's math refuses, e.g. sqrt(-1.0))."""
    try:
        if name in ("min", "max", "abs"):
            return {"min": min, "max": max, "abs": abs}[name](*values)
        if name in ("floor", "ceil", "trunc"):
            return float(getattr(math, name)(values[0]))
        if name == "exp2":
            return 2.0 ** values[0]
        return float(getattr(math, name)(*values))
    except (ValueError, OverflowError, ZeroDivisionError):
        return None


_UNSUPPORTED_EXPR = {
    "ListComp": "list comprehensions are not supported in kernels: loop with for k in range(...)",
    "SetComp": "comprehensions are not supported in kernels",
    "DictComp": "comprehensions are not supported in kernels",
    "GeneratorExp": "generator expressions are not supported in kernels",
    "Lambda": "lambdas are not supported in kernels",
    "List": "lists are not supported in kernels: pass arrays as Buffer parameters",
    "Tuple": "tuples are not supported in kernels",
    "Dict": "dicts are not supported in kernels",
    "Set": "sets are not supported in kernels",
    "JoinedStr": "strings are not supported in kernels",
    "NamedExpr": "the walrus operator := is not supported in kernels",
    "Await": "await is not supported in kernels",
    "Yield": "yield is not supported in kernels",
    "YieldFrom": "yield is not supported in kernels",
    "Starred": "*args is not supported in kernels",
    "Slice": "slices are not supported: a kernel reads and writes one element at a time",
}


class ExpressionTranslator(Reader):
    """The expression half of the translator: types, conversions and every expression a kernel may write."""

    # ------------------------------------------------------------------ types
    def concrete(self, t: str) -> str:
        return "i32" if t == "int" else self.default_float if t == "float" else t

    def meet(self, a: str, b: str) -> str:
        """The type C's arithmetic conversions give ``a op b`` (bool counts as i32; literals take the other side)."""
        a, b = ("i32" if t == "bool" else t for t in (a, b))
        if a == b:
            return a
        floats = [t for t in (a, b) if t in FLOATS]
        if floats:
            return "f64" if "f64" in floats else "f32"
        if "float" in (a, b):
            return "float" if {a, b} <= {"int", "float"} else self.default_float
        if "int" in (a, b):
            return b if a == "int" else a
        return "i64" if "i64" in (a, b) else "u32" if "u32" in (a, b) else "i32"

    def convert(self, value: Any, t: str, node: ast.AST) -> Any:
        if t == "bool":
            return bool(value)
        if t in FLOATS:
            return float(value)
        try:
            v = int(value)
        except (OverflowError, ValueError):
            self.fail(node, f"constant {value!r} has no {t} value")
        lo, hi = INT_RANGE[t]
        if lo <= v <= hi:
            return v
        if t == "u32" and -(2**31) <= v < 0:
            return v + 2**32  # C's conversion of a negative constant to unsigned
        self.fail(node, f"constant {v} does not fit {t}; write gw.i64({v}) for a 64-bit value")

    def cast(self, e: Expr, t: str, node: ast.AST) -> Expr:
        if e.type == t:
            return e
        if t in HALVES:  # rounding to a 16-bit float starts from f32 (there are no 16-bit literals)
            return Cast(self.cast(e, "f32", node), t)
        if isinstance(e, Const):
            return Const(self.convert(e.value, t, node), t)
        return Cast(e, t)

    def read(self, e: Expr) -> Expr:
        """A value as it computes: a 16-bit float (an array element, a local) is read as f32."""
        return Cast(e, "f32") if e.type in HALVES else e

    def truth(self, e: Expr, node: ast.AST) -> Expr:
        if e.type == "bool":
            return e
        if isinstance(e, Const):
            return Const(bool(e.value), "bool")
        return Compare("!=", e, Const(0.0 if e.type in FLOATS else 0, e.type))

    def numeric(self, e: Expr, node: ast.AST) -> Expr:
        """``e`` as a number: bools become i32 0/1, literals keep their abstract type."""
        return self.cast(e, "i32", node) if e.type == "bool" else e

    # ------------------------------------------------------------------ expressions
    def expr(self, node: ast.expr) -> Expr:
        return self.dispatch("expr", node, _UNSUPPORTED_EXPR, "expressions")

    def expr_Constant(self, node: ast.Constant) -> Expr:
        v = node.value
        if isinstance(v, bool):
            return Const(v, "bool")
        if isinstance(v, int):
            return Const(v, "int")
        if isinstance(v, float):
            return Const(v, "float")
        self.fail(node, f"constant {v!r} is not a number; kernels compute with numbers and booleans only")

    def constant(self, value: Any, node: ast.AST) -> Expr | None:
        if isinstance(value, (bool, np.bool_)):
            return Const(bool(value), "bool")
        if isinstance(value, int):
            return Const(value, "int")
        if isinstance(value, float):
            return Const(value, "float")
        if isinstance(value, np.generic):
            t = kernel_type(value.dtype)
            if t in HALVES:  # a 16-bit float computes as f32
                return Const(float(value), "f32")
            if t is not None:
                return Const(value.item(), t)
        return None

    def expr_Name(self, node: ast.Name) -> Expr:
        name = node.id
        if name in self.vars:
            return self.read(self.vars[name])
        if name in self.arrays:
            self.fail(node, f"array {name!r} must be indexed: {name}[i]")
        if name in self.finished_loops or name in self.loop_names:
            self.fail(node, f"loop variable {name!r} is only defined inside its loop")
        if name in self.assigned:
            self.fail(node, f"local {name!r} is used before it is assigned")
        value = self.resolve(node)
        if value is MISSING:
            self.fail(node, f"name {name!r} is not defined: not a parameter, a local or a constant")
        const = self.constant(value, node)
        if const is None:
            what = type(value).__name__
            self.fail(
                node,
                f"{name!r} refers to a {what}; a kernel can use numbers from outside (constants, read "
                f"when it is decorated), its parameters and its locals",
            )
        return const

    def expr_Attribute(self, node: ast.Attribute) -> Expr:
        value = self.resolve(node)
        const = None if value is MISSING else self.constant(value, node)
        if const is None:
            self.fail(node, f"{ast.unparse(node)!r} is not a number a kernel can use")
        return const

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Expr:
        o = self.expr(node.operand)
        if isinstance(node.op, ast.Not):
            o = self.truth(o, node)
            return Const(not o.value, "bool") if isinstance(o, Const) else Unary("not", o, "bool")
        if isinstance(node.op, ast.Invert) and o.type == "bool":
            return Const(not o.value, "bool") if isinstance(o, Const) else Unary("not", o, "bool")
        o = self.numeric(o, node)
        if isinstance(node.op, ast.UAdd):
            return o
        if isinstance(node.op, ast.Invert):
            if o.type not in ("int", *INTS):
                self.fail(node, f"~ needs an integer, not {o.type}")
            return Const(~o.value, "int") if o.type == "int" else Unary("invert", o, o.type)
        if isinstance(o, Const) and o.type in ("int", "float"):
            return Const(-o.value, o.type)
        return Unary("neg", o, self.concrete(o.type))

    def expr_BinOp(self, node: ast.BinOp) -> Expr:
        return self.binop(node.op, self.expr(node.left), self.expr(node.right), node)

    def binop(self, op: ast.operator, left: Expr, right: Expr, node: ast.AST) -> Expr:
        sym = _BINOPS.get(type(op))
        if sym is None:
            self.fail(node, f"operator {type(op).__name__} is not supported in kernels")
        abstract = ("int", "float", "bool")
        if isinstance(left, Const) and isinstance(right, Const) and left.type in abstract and right.type in abstract:
            return self.fold(sym, left.value, right.value, node)
        if sym in ("&", "|", "^") and left.type == "bool" and right.type == "bool":
            if sym == "^":
                return Compare("!=", left, right)
            return Binary("and" if sym == "&" else "or", left, right, "bool")
        left, right = self.numeric(left, node), self.numeric(right, node)
        t = self.meet(left.type, right.type)
        if sym == "/":
            t = self.concrete(t) if t in ("float", *FLOATS) else self.default_float
        elif sym == "**":
            return self.power(left, right, node)
        elif sym in ("&", "|", "^", "<<", ">>"):
            if left.type not in ("int", *INTS) or right.type not in ("int", *INTS):
                self.fail(node, f"{sym} needs integers (or two booleans), not {left.type} and {right.type}")
            if sym in ("<<", ">>"):
                t = self.concrete(left.type)
            t = self.concrete(t)
        else:
            t = self.concrete(t)
        left, right = self.cast(left, t, node), self.cast(right, t, node)
        if sym in ("+", "-") and isinstance(right, Const) and right.value < 0:  # x + -1 reads better as x - 1
            sym, right = "-" if sym == "+" else "+", Const(-right.value, t)
        return Binary(sym, left, right, t)

    def power(self, base: Expr, exponent: Expr, node: ast.AST) -> Expr:
        if isinstance(exponent, Const) and exponent.type == "int" and 0 <= exponent.value <= 4:
            t = self.concrete(base.type)
            base = self.cast(base, t, node)
            result: Expr = Const(self.convert(1, t, node), t)
            for k in range(exponent.value):
                result = base if k == 0 else Binary("*", result, base, t)
            return result
        if base.type in ("int", *INTS) and exponent.type in ("int", *INTS):
            self.fail(
                node,
                "integer ** needs a constant exponent from 0 to 4; for powers of two use 1 << k, "
                "otherwise pow(float(a), b)",
            )
        t = self.meet(base.type, exponent.type)
        t = self.concrete(t) if t in ("float", *FLOATS) else self.default_float
        return Call("pow", (self.cast(base, t, node), self.cast(exponent, t, node)), t)

    def fold(self, sym: str, a: Any, b: Any, node: ast.AST) -> Const:
        try:
            value = _FOLD[sym](a, b)
        except ZeroDivisionError:
            self.fail(node, "division by zero")
        except (OverflowError, ValueError) as exc:
            self.fail(node, f"constant expression fails: {exc}")
        if isinstance(value, bool):
            return Const(value, "bool")
        return Const(value, "int" if isinstance(value, int) else "float")

    def expr_BoolOp(self, node: ast.BoolOp) -> Expr:
        op = "and" if isinstance(node.op, ast.And) else "or"
        values = [self.truth(self.expr(v), v) for v in node.values]
        # a constant that does not decide the result drops out (x and True is x); one that does ends the chain there
        deciding = op == "or"
        kept = []
        for v in values:
            if isinstance(v, Const) and v.value != deciding:
                continue
            kept.append(v)
            if isinstance(v, Const):
                break
        values = kept or [Const(not deciding, "bool")]
        result = values[0]
        for v in values[1:]:
            if isinstance(result, Const) and isinstance(v, Const):
                result = Const(result.value and v.value if op == "and" else result.value or v.value, "bool")
            else:
                result = Binary(op, result, v, "bool")
        return result

    def expr_Compare(self, node: ast.Compare) -> Expr:
        operands = [self.expr(node.left), *(self.expr(c) for c in node.comparators)]
        result: Expr | None = None
        for op, left, right in zip(node.ops, operands, operands[1:]):
            sym = _CMPOPS.get(type(op))
            if sym is None:
                self.fail(node, f"comparison {type(op).__name__} (is / in) is not supported; use == != < <= > >=")
            pair = self.compare(sym, left, right, node)
            result = pair if result is None else Binary("and", result, pair, "bool")
        assert result is not None
        return result

    def compare(self, sym: str, left: Expr, right: Expr, node: ast.AST) -> Expr:
        abstract = ("int", "float", "bool")
        if isinstance(left, Const) and isinstance(right, Const) and left.type in abstract and right.type in abstract:
            return self.fold(sym, left.value, right.value, node)
        if left.type == right.type == "bool" and sym in ("==", "!="):
            return Compare(sym, left, right)
        left, right = self.numeric(left, node), self.numeric(right, node)
        t = self.concrete(self.meet(left.type, right.type))
        return Compare(sym, self.cast(left, t, node), self.cast(right, t, node))

    def expr_IfExp(self, node: ast.IfExp) -> Expr:
        cond = self.truth(self.expr(node.test), node.test)
        a, b = self.expr(node.body), self.expr(node.orelse)
        if isinstance(cond, Const):
            return a if cond.value else b
        if a.type == b.type == "bool":
            return Select(cond, a, b, "bool")
        a, b = self.numeric(a, node), self.numeric(b, node)
        t = self.concrete(self.meet(a.type, b.type))
        return Select(cond, self.cast(a, t, node), self.cast(b, t, node), t)

    def expr_Subscript(self, node: ast.Subscript) -> Expr:
        array, index = self.element(node)
        return self.read(Load(array, index, array.type))

    def element(self, node: ast.Subscript) -> tuple[Param, Expr]:
        """The array and the flat element offset of ``a[i]`` or ``a[row, col]``."""
        if not isinstance(node.value, ast.Name) or node.value.id not in self.arrays:
            what = ast.unparse(node.value)
            self.fail(node, f"{what!r} is not an array; only array parameters and shared arrays are indexed")
        array = self.arrays[node.value.id]
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if any(isinstance(s, ast.Slice) for s in items):
            self.fail(node, "slices are not supported: a kernel reads and writes one element at a time, a[i]")
        if len(items) != array.ndim:
            spell = f"{array.name}[i]" if array.ndim == 1 else f"{array.name}[row, col]"
            self.fail(node, f"array {array.name!r} is {array.ndim}-D: index it as {spell}")
        index = [self.index_expr(s) for s in items]
        if array.ndim == 1:
            return array, index[0]
        return array, self.flat(array, index[0], index[1], node)

    def index_expr(self, node: ast.expr) -> Expr:
        e = self.numeric(self.expr(node), node)
        if e.type not in ("int", *INTS):
            self.fail(node, f"an index must be an integer, not {e.type}: use int(...)")
        return self.cast(e, self.concrete(e.type), node)

    def flat(self, array: Param, row: Expr, col: Expr, node: ast.AST) -> Expr:
        if array.kind == "shared":
            width: Expr = Const(array.shape[1], "int")
        elif array.width is None:
            width = self.domain_var(0)
        else:
            width = next(self.vars[p.name] for p in self.params if p.cname == array.width)
        row, width, col = (self.cast(e, "isize", node) for e in (row, width, col))
        return Binary("+", Binary("*", row, width, "isize"), col, "isize")

    def domain_var(self, axis: int) -> Var:
        return self.domain[axis]

    def expr_Call(self, node: ast.Call) -> Expr:
        if node.keywords:
            self.fail(node, "keyword arguments are not supported in kernel calls")
        if any(isinstance(a, ast.Starred) for a in node.args):
            self.fail(node, "*args is not supported in kernel calls")
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.arrays:
            if func.attr != "at":
                self.fail(node, f"arrays have one method, at(dx, dy) (a clamped neighbour read), not {func.attr!r}")
            if self.arrays[func.value.id].kind == "shared":
                self.fail(node, "at() reads array parameters of the launch shape, not shared arrays")
            return self.neighbour(self.arrays[func.value.id], node)
        obj = self.resolve(func)
        if id(obj) in BLOCK_PLACES and obj is not MISSING:
            return self.builtin(BLOCK_PLACES[id(obj)], node)
        if obj is shared:
            self.fail(node, "gw.shared() declares an array on its own line at the top of the body: t = gw.shared(...)")
        if obj is barrier:
            self.fail(node, "gw.barrier() is a statement on its own line, not a value")
        callee = self.callee(func)
        if isinstance(callee, ScalarType) or callee in ("int", "float"):
            if len(node.args) != 1:
                self.fail(node, f"{ast.unparse(func)}() converts one value")
            t = callee.name if isinstance(callee, ScalarType) else "i32" if callee == "int" else self.default_float
            e = self.numeric(self.expr(node.args[0]), node)
            return self.read(self.cast(e, t, node))  # gw.f16(x): x rounded to f16, computing on as f32
        if callee == "range":
            self.fail(node, "range() may only be the iterable of a for loop")
        args = [self.numeric(self.expr(a), a) for a in node.args]
        return self.math(callee, args, node)

    def builtin(self, name: str, node: ast.Call) -> Expr:
        """``gw.local_id(axis)`` and friends: the axis is a constant, 0 (x) or 1 (y) in a 2-D kernel."""
        n = len(self.indices)
        if len(node.args) > 1:
            self.fail(node, f"gw.{name}() takes one axis: 0 (x){' or 1 (y)' if n == 2 else ''}")
        axis_e = self.expr(node.args[0]) if node.args else Const(0, "int")
        if not (isinstance(axis_e, Const) and axis_e.type in ("int", *INTS) and 0 <= axis_e.value < n):
            self.fail(node, f"gw.{name}(axis): in a {n}-D kernel the axis is {'0' if n == 1 else '0 (x) or 1 (y)'}")
        self.uses_builtins = True
        return Builtin(name, int(axis_e.value))

    def callee(self, func: ast.expr) -> Any:
        if isinstance(func, ast.Name) and (func.id in self.vars or func.id in self.assigned):
            self.fail(func, f"{func.id!r} is a variable, not a function")
        obj = self.resolve(func)
        if isinstance(obj, ScalarType):
            return obj
        name = KNOWN.get(id(obj)) if obj is not MISSING else None
        if name is None and obj is MISSING and isinstance(func, ast.Name) and func.id in FUNCTIONS:
            name = func.id  # sqrt(x) without importing it: the name is unambiguous
        if name is None:
            self.fail(
                func,
                f"calls to {ast.unparse(func)!r} are not supported: a kernel calls math functions "
                f"({', '.join(FUNCTIONS)}), int(), float() and casts such as gw.f32(x)",
            )
        return name

    def math(self, name: str, args: list[Expr], node: ast.Call) -> Expr:
        if name in FLOAT_FUNCTIONS and len(args) != 1:
            self.fail(node, f"{name}() takes one argument")
        if name in ("atan2", "pow") and len(args) != 2:
            self.fail(node, f"{name}() takes two arguments")
        if name == "abs" and len(args) != 1:
            self.fail(node, "abs() takes one argument")
        if name in ("min", "max") and len(args) < 2:
            self.fail(node, f"{name}() takes two or more numbers")
        for a in args:
            if a.type not in ("int", "float", *FLOATS, *INTS):
                self.fail(node, f"{name}() needs numbers, not {a.type}")
        if all(isinstance(a, Const) and a.type in ("int", "float") for a in args):
            folded = _fold_call(name, [a.value for a in args])
            if folded is not None:
                return Const(folded, "int" if isinstance(folded, int) else "float")
        if name in ("min", "max", "abs"):
            t = args[0].type
            for a in args[1:]:
                t = self.meet(t, a.type)
            t = self.concrete(t)
            cast = [self.cast(a, t, node) for a in args]
            if name == "abs":
                return cast[0] if t == "u32" else Call("abs", (cast[0],), t)
            result = cast[0]
            for a in cast[1:]:
                result = Call(name, (result, a), t)
            return result
        t = args[0].type if len(args) == 1 else self.meet(args[0].type, args[1].type)
        t = self.concrete(t) if t in ("float", *FLOATS) else self.default_float
        return Call(name, tuple(self.cast(a, t, node) for a in args), t)

    def neighbour(self, array: Param, node: ast.Call) -> Expr:
        """``a.at(dx[, dy])``: the element at an offset from this thread's index, clamped to the array's edges."""
        n = len(self.indices)
        if array.ndim != n or (n == 2 and array.width is not None):
            shape = "gw.f32[:]" if n == 1 else "gw.f32[:, :]"
            self.fail(node, f"at() reads arrays of the launch shape: {array.name!r} must be declared like {shape}")
        if len(node.args) != n:
            self.fail(node, f"{array.name}.at() takes {n} offset{'s' if n > 1 else ''} in a {n}-D kernel")
        offsets = [self.index_expr(a) for a in node.args]
        axes = []
        for index, offset, extent in zip(self.indices, offsets, self.domain):
            if isinstance(offset, Const) and offset.value == 0:
                axes.append(index)  # this thread's own row or column: inside the array already
                continue
            moved = self.binop(ast.Add(), index, offset, node)
            last = Binary("-", extent, Const(1, "i32"), "i32")
            axes.append(Call("clamp", (self.cast(moved, "i32", node), Const(0, "i32"), last), "i32"))
        if n == 1:
            return self.read(Load(array, axes[0], array.type))
        return self.read(Load(array, self.flat(array, axes[1], axes[0], node), array.type))
