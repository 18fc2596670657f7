"""Reading a kernel function: its source and AST, its closure, its signature, and refusals that point at a line.

``Reader`` is the base of the translator (``expressions``, then ``statements``): it holds what the walk has found so
far (parameters, locals, names taken in generated code) and raises every ``CompileError`` with file, line and caret.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import types
from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import CompileError
from .ir import Param, Var
from .ktypes import HALVES, INTS, ArrayType, IndexType, ScalarType
from .names import safe_name

MISSING = object()  # what ``Reader.resolve`` returns for a name that refers to nothing


class Reader:
    """One function's source, AST and closure; its parameters once ``signature()`` has read them."""

    def __init__(self, fn: Callable[..., Any], name: str | None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        try:
            lines, self.first_line = inspect.getsourcelines(fn)
            self.filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
        except (OSError, TypeError):
            raise CompileError(
                self.name, "the kernel's source is not available: define it in a file or a notebook cell"
            ) from None
        self.lines = lines
        source = "".join(lines)
        self.shift = 0  # a nested def is parsed inside "if 1:" (not dedented: its strings may start at column 0)
        if lines[0][:1] in (" ", "\t"):
            source, self.shift = "if 1:\n" + source, 1
        tree = ast.parse(source)
        node = tree.body[0].body[0] if self.shift else tree.body[0]
        if not isinstance(node, ast.FunctionDef):
            raise CompileError(self.name, f"{self.where(node)}: @gw.kernel decorates a plain def function")
        self.node = node
        code = fn.__code__
        cells = fn.__closure__ or ()
        self.closure = {}
        for var, cell in zip(code.co_freevars, cells):
            try:
                self.closure[var] = cell.cell_contents
            except ValueError:  # an empty cell: the name is not bound yet
                pass
        self.vars: dict[str, Var] = {}
        self.params: list[Param] = []
        self.arrays: dict[str, Param] = {}
        self.locals: list[Var] = []
        self.finished_loops: set[str] = set()
        self.taken: set[str] = set()
        self.assigned = {
            t.id
            for n in ast.walk(node)
            for t in (n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)])
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and isinstance(t, ast.Name)
        }
        loops = [n for n in ast.walk(node) if isinstance(n, ast.For)]
        self.loop_names = {n.target.id for n in loops if isinstance(n.target, ast.Name)}
        self.default_float = "f32"
        self.depth = 0  # statements nested in if / for: shared arrays are declared at depth 0
        self.shared: list[Param] = []
        self.uses_barrier = self.uses_builtins = False
        self.indices: list[Var] = []  # the index parameters' variables (set by the translation)
        self.domain: list[Var] = []  # gw_nx (and gw_ny): the launch extents

    # ------------------------------------------------------------------ errors
    def line_of(self, node: ast.AST) -> int:
        return self.first_line + getattr(node, "lineno", 1) - 1 - self.shift

    def fail_line(self, line: int, message: str) -> NoReturn:
        """``fail`` at a line of the function (as ``line_of`` numbers it) rather than at an AST node."""
        self.fail(types.SimpleNamespace(lineno=line - self.first_line + 1 + self.shift), message)

    def where(self, node: ast.AST) -> str:
        return f"{self.filename}:{self.line_of(node)}"

    def fail(self, node: ast.AST, message: str) -> NoReturn:
        row = getattr(node, "lineno", 1) - self.shift
        text = self.lines[row - 1].rstrip("\n") if 0 < row <= len(self.lines) else ""
        column = getattr(node, "col_offset", None)
        if column is None:  # a line of the tree (no AST node): point at the statement's first character
            column = len(text) - len(text.lstrip())
        caret = " " * column + "^"
        error = CompileError(self.name, f"{self.where(node)}: {message}\n{text}\n{caret}")
        error.filename = self.filename  # type: ignore[attr-defined]
        error.lineno = self.line_of(node)  # type: ignore[attr-defined]
        error.line = text.strip()  # type: ignore[attr-defined]
        raise error

    def dispatch(self, prefix: str, node: ast.AST, unsupported: dict[str, str], what: str) -> Any:
        """``self.<prefix>_<node type>(node)``; where there is no such method, a refusal saying why."""
        kind = type(node).__name__
        method = getattr(self, f"{prefix}_{kind}", None)
        if method is None:
            self.fail(node, unsupported.get(kind, f"{kind} {what} are not supported in kernels"))
        return method(node)

    # ------------------------------------------------------------------ signature
    def signature(self) -> None:
        args = self.node.args
        if args.vararg or args.kwarg or args.kwonlyargs:
            self.fail(self.node, "kernel parameters are plain names: no *args, **kwargs or keyword-only parameters")
        if args.defaults:
            self.fail(args.defaults[0], "kernel parameters cannot have default values")
        plain = [*args.posonlyargs, *args.args]
        annotations = getattr(self.fn, "__annotations__", {})
        for a in plain:
            if a.arg.startswith("gw_"):
                self.fail(a, f"parameter {a.arg!r}: names starting with gw_ are reserved for generated code")
            annotation = annotations.get(a.arg, MISSING)
            if annotation is MISSING:
                self.fail(a, f"parameter {a.arg!r} needs a type annotation: gw.index, gw.f32, gw.f32[:], ...")
            if isinstance(annotation, str):
                try:
                    annotation = eval(annotation, dict(self.fn.__globals__), dict(self.closure))  # noqa: S307
                except Exception as exc:  # noqa: BLE001 - any failure to read the annotation is the user's to fix
                    self.fail(a, f"parameter {a.arg!r}: annotation {annotation!r} cannot be read ({exc})")
            self.param(a, annotation)
        indices = [p for p in self.params if p.kind == "index"]
        if not indices:
            self.fail(self.node, "the first parameter must be the thread index, e.g. i: gw.index")
        if len(indices) > 2:
            self.fail(self.node, "kernels have 1 or 2 index parameters (i, or x and y)")
        if any(p.type == "f64" for p in self.params):
            self.default_float = "f64"
        scalars = {p.name: p for p in self.params if p.kind == "scalar"}
        for p in self.arrays.values():
            a = next(x for x in plain if x.arg == p.name)
            if p.ndim == 2 and p.width is None and len(indices) == 1:
                self.fail(
                    a,
                    f"array {p.name!r} is 2-D in a 1-D kernel: give its row width, {p.annotation!r}"
                    f"[:, gw.width.w] with w an integer parameter",
                )
            if p.width is not None:
                w = scalars.get(p.width)
                if w is None or w.type not in INTS:
                    self.fail(a, f"array {p.name!r}: its row width {p.width!r} must be an integer scalar parameter")
                p.width = w.cname

    def param(self, a: ast.arg, annotation: Any) -> None:
        cname = safe_name(a.arg, self.taken)
        if isinstance(annotation, IndexType):
            if any(p.kind != "index" for p in self.params):
                self.fail(a, f"index parameter {a.arg!r} must come before the other parameters")
            self.params.append(Param(a.arg, cname, "index", "i32", annotation))
            self.vars[a.arg] = Var(cname, "i32", "index")
        elif isinstance(annotation, ScalarType):
            if annotation.name in HALVES:
                self.fail(a, f"parameter {a.arg!r}: a scalar cannot be {annotation!r} (16-bit floats compute as f32): "
                          f"declare it gw.f32, or pass the value in an array")  # fmt: skip
            self.params.append(Param(a.arg, cname, "scalar", annotation.name, annotation))
            self.vars[a.arg] = Var(cname, annotation.name, "scalar")
        elif isinstance(annotation, ArrayType):
            p = Param(a.arg, cname, "array", annotation.element.name, annotation, annotation.ndim, annotation.width)
            self.params.append(p)
            self.arrays[a.arg] = p
        else:
            self.fail(
                a,
                f"parameter {a.arg!r}: {annotation!r} is not a kernel type; use gw.index, a scalar type (gw.f32, "
                f"gw.f64, gw.i32, gw.u32, gw.i64) or an array of one (gw.f32[:], gw.f16[:], gw.bf16[:, :] ...)",
            )

    def resolve(self, node: ast.expr) -> Any:
        """The Python object a non-local name or attribute chain refers to (``MISSING`` when there is none)."""
        if isinstance(node, ast.Name):
            if node.id in self.closure:
                return self.closure[node.id]
            if node.id in self.fn.__globals__:
                return self.fn.__globals__[node.id]
            return getattr(builtins, node.id, MISSING)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if isinstance(base, types.ModuleType):
                return getattr(base, node.attr, MISSING)
        return MISSING
