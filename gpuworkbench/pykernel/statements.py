"""Kernel statements → the typed tree, and ``translate``: a decorated function → ``KernelIR``, or a refusal.

Locals take their type from their first assignment (or a declaration, ``t: gw.f32 = 0``), loops run over ``range``,
shared arrays are declared at the top of the body, and barriers some threads might skip are refused (``divergence``).
"""

from __future__ import annotations

import ast
import builtins
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .divergence import Divergence
from .expressions import ExpressionTranslator
from .ir import Assign, Barrier, Const, Expr, For, If, KernelIR, Param, Return, Store, Var, walk_exprs
from .ktypes import FLOATS, INTS, SCALAR_TYPES, ScalarType, kernel_type
from .names import safe_name
from .reader import MISSING
from .words import barrier, shared

_UNSUPPORTED_STMT = {
    "While": "while loops are not supported in kernels: use for k in range(...)",
    "Break": "break is not supported in kernels: loop over the range you need, or guard the body with if",
    "Continue": "continue is not supported in kernels: guard the rest of the loop body with if",
    "Try": "try/except is not supported in kernels",
    "TryStar": "try/except is not supported in kernels",
    "With": "with blocks are not supported in kernels",
    "Raise": "raise is not supported in kernels",
    "Assert": "assert is not supported in kernels",
    "FunctionDef": "nested functions are not supported in kernels",
    "AsyncFunctionDef": "nested functions are not supported in kernels",
    "ClassDef": "classes are not supported in kernels",
    "Import": "imports belong outside the kernel",
    "ImportFrom": "imports belong outside the kernel",
    "Global": "global is not supported: kernels read constants from outside and write only their arrays",
    "Nonlocal": "nonlocal is not supported: kernels read constants from outside and write only their arrays",
    "Delete": "del is not supported in kernels",
    "Match": "match is not supported in kernels: use if/elif/else",
    "AsyncFor": "async for is not supported in kernels",
    "AsyncWith": "async with is not supported in kernels",
}


class Translator(ExpressionTranslator):
    """Walks one function's AST, checking each construct and building the typed tree."""

    # ------------------------------------------------------------------ statements
    def block(self, stmts: list[ast.stmt]) -> list:
        out: list = []
        for s in stmts:
            out.extend(self.stmt(s))
        return out

    def stmt(self, node: ast.stmt) -> list:
        return self.dispatch("stmt", node, _UNSUPPORTED_STMT, "statements")

    def stmt_Pass(self, node: ast.Pass) -> list:
        return []

    def stmt_Expr(self, node: ast.Expr) -> list:
        if node is self.node.body[0] and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return []  # the docstring
        if isinstance(node.value, ast.Call) and self.resolve(node.value.func) is barrier:
            if node.value.args or node.value.keywords:
                self.fail(node.value, "gw.barrier() takes no arguments")
            self.uses_barrier = True
            return [Barrier(self.line_of(node))]
        if isinstance(node.value, ast.Call):
            self.expr(node.value)  # an unknown function is the better message
        self.fail(node, "this expression does nothing: a kernel's statements assign, store, branch or loop")

    def stmt_Return(self, node: ast.Return) -> list:
        if node.value is not None:
            self.fail(node, "kernels return nothing: write results into an array parameter")
        return [Return(self.line_of(node))]

    def stmt_Assign(self, node: ast.Assign) -> list:
        if len(node.targets) != 1:
            self.fail(node, "assign one target at a time (a = b = 0 is not supported)")
        return self.assign(node.targets[0], lambda: self.expr(node.value), node)

    def stmt_AugAssign(self, node: ast.AugAssign) -> list:
        target = node.target
        if isinstance(target, ast.Name) and target.id not in self.vars:
            self.expr_Name(target)  # raises: used before assignment, or not assignable
        current = (
            ast.Subscript(value=target.value, slice=target.slice, ctx=ast.Load())
            if isinstance(target, ast.Subscript)
            else ast.Name(id=getattr(target, "id", ""), ctx=ast.Load())
        )
        ast.copy_location(current, target)
        return self.assign(target, lambda: self.binop(node.op, self.expr(current), self.expr(node.value), node), node)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> list:
        if not isinstance(node.target, ast.Name) or node.value is None:
            self.fail(node, "an annotated assignment declares a local with a value: t: gw.f32 = 0")
        declared = self.resolve(node.annotation)
        if not isinstance(declared, ScalarType):
            self.fail(
                node.annotation,
                "a local's annotation is a scalar type: gw.f32, gw.f64, gw.f16, gw.bf16, gw.i32, gw.u32, gw.i64",
            )
        return self.assign(node.target, lambda: self.expr(node.value), node, declared.name)

    def assign(self, target: ast.expr, value: Callable[[], Expr], node: ast.stmt, declared: str | None = None) -> list:
        line = self.line_of(node)
        if isinstance(target, ast.Subscript):
            array, index = self.element(target)
            v = self.numeric(value(), node) if array.type != "bool" else value()
            array.written = True
            return [Store(array, index, self.cast(v, array.type, node), line)]
        if isinstance(target, (ast.Tuple, ast.List)):
            self.fail(target, "unpacking is not supported: assign one name at a time")
        if not isinstance(target, ast.Name):
            self.fail(target, f"cannot assign to {ast.unparse(target)!r}: assign a local name or an array element")
        name = target.id
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if self.resolve(node.value.func) is shared:
                return self.declare_shared(name, node.value, node)
        if name in self.arrays and self.arrays[name].kind == "shared":
            self.fail(target, f"shared array {name!r} is declared once; assign its elements: {name}[...] = v")
        if name in self.arrays or (name in self.vars and self.vars[name].role == "scalar"):
            self.fail(target, f"parameter {name!r} cannot be assigned: copy it into a local first")
        if name in self.vars and self.vars[name].role == "index":
            self.fail(target, f"the thread index {name!r} cannot be assigned")
        if name in self.vars and self.vars[name].role == "loop":
            self.fail(target, f"loop variable {name!r} cannot be assigned inside its loop")
        if name in self.loop_names:
            self.fail(target, f"{name!r} is both a loop variable and a local; give them different names")
        if name.startswith("gw_"):
            self.fail(target, f"local {name!r}: names starting with gw_ are reserved for generated code")
        v = value()
        var = self.vars.get(name)
        if var is None:
            t = declared or self.local_type(v)
            var = Var(safe_name(name, self.taken), t, "local")
            self.vars[name] = var
            self.locals.append(var)
        elif declared is not None and declared != var.type:
            self.fail(node, f"local {name!r} is already {var.type}; it cannot be redeclared as {declared}")
        elif declared is None:
            self.check_assignable(var, name, v, node)
        if var.type != "bool":
            v = self.numeric(v, node)
        return [Assign(var, self.cast(v, var.type, node), line)]

    def declare_shared(self, name: str, call: ast.Call, node: ast.stmt) -> list:
        """``name = gw.shared(shape, dtype)``: a workgroup-shared array of constant shape, declared once at the top."""
        if self.depth:
            self.fail(node, "declare shared arrays at the top level of the kernel body, not inside if or for")
        if name in self.arrays or name in self.vars:
            self.fail(node.targets[0], f"{name!r} is already a parameter, a local or a shared array; use another name")
        if name.startswith("gw_"):
            self.fail(node.targets[0], f"{name!r}: names starting with gw_ are reserved for generated code")
        keywords = {k.arg: k.value for k in call.keywords}
        if set(keywords) - {"shape", "dtype"} or len(call.args) + len(keywords) not in (1, 2):
            self.fail(call, "gw.shared(shape, dtype): a shape such as 256 or (16, 16) and a type such as gw.f32")
        args = dict(zip(("shape", "dtype"), call.args)) | keywords
        if len(args) != len(call.args) + len(keywords):
            self.fail(call, "gw.shared() is given the same argument twice")
        shape_node = args.get("shape")
        if shape_node is None:
            self.fail(call, "gw.shared() needs a shape such as 256 or (16, 16)")
        items = shape_node.elts if isinstance(shape_node, ast.Tuple) else [shape_node]
        shape = []
        for item in items:
            e = self.expr(item)
            if not (isinstance(e, Const) and e.type in ("int", *INTS) and e.value > 0):
                self.fail(item, "a shared array's shape is made of positive constant ints (numbers from outside too)")
            shape.append(int(e.value))
        if not 1 <= len(shape) <= 2:
            self.fail(shape_node, "shared arrays have 1 or 2 dimensions")
        if int(np.prod(shape)) >= 2**31:
            self.fail(shape_node, f"shared array {name!r} of {shape} elements is far beyond any device")
        dtype_node = args.get("dtype")
        element = "f32" if dtype_node is None else self.shared_type(dtype_node)
        cname = safe_name(name, self.taken)
        p = Param(name, cname, "shared", element, f"gw.shared({tuple(shape)}, gw.{element})", len(shape), None)
        p.shape = tuple(shape)
        self.arrays[name] = p
        self.shared.append(p)
        return []

    def shared_type(self, node: ast.expr) -> str:
        """The element type named by ``gw.f32``, ``np.float32`` or ``"float32"`` / ``"f32"``."""
        value = node.value if isinstance(node, ast.Constant) else self.resolve(node)
        if isinstance(value, ScalarType):
            return value.name
        if isinstance(value, str) and value in SCALAR_TYPES:
            return value
        found = None if value is MISSING or value is None or isinstance(value, bool) else kernel_type(value)
        if found is not None:
            return found
        self.fail(node, "a shared array's type is gw.f32, gw.f64, gw.f16, gw.bf16, gw.i32, gw.u32 or gw.i64 (or their "
                  "NumPy names)")  # fmt: skip

    def local_type(self, v: Expr) -> str:
        if v.type == "int" and isinstance(v, Const) and not -(2**31) <= v.value < 2**31:
            return "i64"
        return self.concrete(v.type)

    def check_assignable(self, var: Var, name: str, v: Expr, node: ast.AST) -> None:
        if var.type == "bool" and v.type != "bool":
            self.fail(node, f"local {name!r} holds a bool (from its first assignment); assign it a comparison")
        if var.type in INTS and v.type in ("float", *FLOATS):
            self.fail(
                node,
                f"local {name!r} is {var.type} (from its first assignment); a {self.concrete(v.type)} "
                f"value would be truncated: start it as a float (0.0) or convert with int(...)",
            )

    def stmt_If(self, node: ast.If) -> list:
        cond = self.truth(self.expr(node.test), node.test)
        self.depth += 1
        body, orelse = self.block(node.body), self.block(node.orelse)
        self.depth -= 1
        return [If(cond, body, orelse, self.line_of(node))]

    def stmt_For(self, node: ast.For) -> list:
        if node.orelse:
            self.fail(node, "for ... else is not supported")
        if not isinstance(node.target, ast.Name):
            self.fail(node.target, "a kernel loop has one loop variable: for k in range(n)")
        it = node.iter
        if not (isinstance(it, ast.Call) and self.resolve_range(it.func)):
            self.fail(it, "kernels loop over range(...) only: for k in range(start, stop, step)")
        if it.keywords or not 1 <= len(it.args) <= 3:
            self.fail(it, "range() takes 1 to 3 positional arguments")
        name = node.target.id
        if name in self.vars:
            role = self.vars[name].role
            what = "an enclosing loop's variable" if role == "loop" else "a parameter" if role != "local" else "a local"
            self.fail(node.target, f"loop variable {name!r} is already {what}; use another name")
        if name in self.arrays:
            self.fail(node.target, f"loop variable {name!r} is already an array parameter; use another name")
        bounds = [self.numeric(self.expr(a), a) for a in it.args]
        for a, e in zip(it.args, bounds):
            if e.type not in ("int", *INTS):
                self.fail(a, f"range() takes integers, not {e.type}")
        if len(bounds) == 1:
            bounds.insert(0, Const(0, "int"))
        if len(bounds) == 2:
            bounds.append(Const(1, "int"))
        t = "int"
        for e in bounds:
            t = self.meet(t, e.type)
        t = self.concrete(t)
        start, stop, step = (self.cast(e, t, node) for e in bounds)
        if isinstance(step, Const) and step.value == 0:
            self.fail(it, "range() step must not be zero")
        var = Var(safe_name(name, self.taken), t, "loop")
        self.vars[name] = var
        self.depth += 1
        body = self.block(node.body)
        self.depth -= 1
        del self.vars[name]
        self.finished_loops.add(name)
        self.taken.discard(var.name)  # a later loop may use the name again: each loop scopes its own
        return [For(var, start, stop, step, body, self.line_of(node))]

    def resolve_range(self, func: ast.expr) -> bool:
        if isinstance(func, ast.Name) and (func.id in self.vars or func.id in self.assigned):
            return False
        return self.resolve(func) is builtins.range

    # ------------------------------------------------------------------ whole kernel
    def translate(self) -> KernelIR:
        self.signature()
        self.indices = [self.vars[p.name] for p in self.params if p.kind == "index"]
        self.taken.update(("gw_nx", "gw_ny"))
        self.domain = [Var(n, "i32", "domain") for n in ("gw_nx", "gw_ny")[: len(self.indices)]]
        body = self.block(self.node.body)
        if self.uses_barrier:
            Divergence(self.fail_line).check(body)
        ir = KernelIR(
            name=self.name,
            cname=safe_name(self.name, set(self.taken)),
            params=self.params,
            indices=self.indices,
            domain=self.domain,
            locals=self.locals,
            body=body,
            where=self.where(self.node),
            default_float=self.default_float,
        )
        ir.types_used = {e.type for e in walk_exprs(body)} | {p.type for p in self.params + self.shared}
        ir.shared, ir.uses_barrier, ir.uses_builtins = self.shared, self.uses_barrier, self.uses_builtins
        return ir


def translate(fn: Callable[..., Any], name: str | None = None) -> KernelIR:
    """The typed tree of ``fn``; raises CompileError at the first unsupported construct, naming file:line."""
    if not inspect.isfunction(fn):
        raise InvalidArgument(f"@gw.kernel decorates a Python function, not {type(fn).__name__}")
    return Translator(fn, name).translate()
