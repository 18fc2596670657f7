"""Python kernel bodies → a small typed tree that every backend's generator reads; refusals point at the line.

Types and conversions are decided once, here, and every conversion is explicit in the tree, so that CUDA C, OpenCL C,
WGSL and NumPy compute the same thing; a generator only spells what it is given.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from .errors import CompileError, InvalidArgument


# ------------------------------------------------------------------------------------------------ annotation types
class ScalarType:
    """An element type: ``a: gw.f32`` is a scalar argument, ``x: gw.f32[:]`` a 1-D array, ``gw.f32(v)`` a cast.

    2-D arrays: ``gw.f32[:, :]`` has the launch shape (rows = y extent, columns = x extent); ``gw.f32[:, gw.width.w]``
    has rows of ``w`` elements, ``w`` being an integer scalar parameter of the same kernel (``gw.f32[:, "w"]`` says
    the same, but linters read a string in an annotation as a name and report it undefined)."""

    def __init__(self, name: str, dtype: Any) -> None:
        self.name, self.dtype = name, np.dtype(dtype)

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
        return self.dtype.type(value)

    def __repr__(self) -> str:
        return f"gw.{self.name}"


class WidthName:
    """``gw.width.w``: names the integer parameter ``w`` that holds a 2-D array's row width."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"gw.width.{self.name}"


class _Widths:
    """``gw.width``: any attribute of it names a parameter, ``gw.width.w`` → the parameter ``w``."""

    def __getattr__(self, name: str) -> WidthName:
        if name.startswith("__"):
            raise AttributeError(name)
        return WidthName(name)

    def __repr__(self) -> str:
        return "gw.width"


WIDTH = _Widths()


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
                        ("i64", np.int64)]
}  # fmt: skip
FLOATS = ("f32", "f64")
INTS = ("i32", "u32", "i64")


# ------------------------------------------------------------------------------------- cooperative kernels' words
def _kernel_only(what: str) -> NoReturn:
    raise InvalidArgument(f"gw.{what}() is kernel language: it works inside a @gw.kernel body, not in plain Python")


def shared(shape: int | tuple[int, ...], dtype: Any = "float32") -> Any:
    """``tile = gw.shared((16, 16), gw.f32)`` in a kernel body: an array every thread of a block shares.

    The shape is 1 or 2 constant ints, fixed when the kernel is decorated; ``dtype`` a kernel type (``gw.f32``) or its
    NumPy name. Declared at the top level of the body; its contents start undefined (write before reading)."""
    _kernel_only("shared")


def barrier() -> None:
    """``gw.barrier()`` in a kernel body: every thread of the block waits here; what the block wrote before it
    (shared and global arrays) is what its threads read after it. Every thread must reach the same barriers."""
    _kernel_only("barrier")


def local_id(axis: int = 0) -> int:
    """The thread's index within its block along ``axis`` (0: x, along a row; 1: y), from 0 to group_size - 1."""
    _kernel_only("local_id")


def group_id(axis: int = 0) -> int:
    """The block's index along ``axis``: the thread's index is group_id(a) * group_size(a) + local_id(a)."""
    _kernel_only("group_id")


def group_size(axis: int = 0) -> int:
    """Threads per block along ``axis``: the launch's block."""
    _kernel_only("group_size")


def num_groups(axis: int = 0) -> int:
    """Blocks in the launch along ``axis``."""
    _kernel_only("num_groups")


_BUILTINS = {id(f): f.__name__ for f in (local_id, group_id, group_size, num_groups)}
# "isize" is the flat element offset into an array: 64-bit in C and NumPy, i32 in WGSL (which has nothing wider).
NUMPY_TYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "u32": "uint32", "i64": "int64", "bool": "bool",
               "isize": "int64"}  # fmt: skip
_INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "i64": (-(2**63), 2**63 - 1),
              "isize": (-(2**31), 2**31 - 1)}  # fmt: skip


# --------------------------------------------------------------------------------------------------------- the tree
@dataclass(eq=False)
class Param:
    """One kernel parameter: the index, a scalar or an array (``cname``: its name in generated code)."""

    name: str
    cname: str
    kind: str  # "index", "scalar", "array", or "shared" (a workgroup-shared array declared in the body)
    type: str  # element or scalar type; "i32" for the index
    annotation: Any
    ndim: int = 0
    width: str | None = None  # 2-D arrays: the cname of the scalar giving the row width (None: the launch width)
    written: bool = False
    shape: tuple[int, ...] = ()  # shared arrays (kind "shared"): their static shape


@dataclass(eq=False)
class Const:
    value: Any
    type: str


@dataclass(eq=False)
class Var:
    name: str  # cname
    type: str
    role: str  # "index", "scalar", "domain" (the launch extents), "local", "loop"


@dataclass(eq=False)
class Load:
    array: Param
    index: Expr  # the flat element offset
    type: str


@dataclass(eq=False)
class Unary:
    op: str  # "neg", "not", "invert"
    operand: Expr
    type: str


@dataclass(eq=False)
class Binary:
    op: str  # + - * / // % & | ^ << >> and or; both operands have ``type`` (shifts: the left's)
    left: Expr
    right: Expr
    type: str


@dataclass(eq=False)
class Compare:
    op: str
    left: Expr
    right: Expr
    type: str = "bool"


@dataclass(eq=False)
class Select:
    cond: Expr
    a: Expr
    b: Expr
    type: str


@dataclass(eq=False)
class Call:
    func: str  # a name from FUNCTIONS, or "clamp" (stencil reads)
    args: tuple
    type: str


@dataclass(eq=False)
class Cast:
    operand: Expr
    type: str


@dataclass(eq=False)
class Builtin:
    """A thread's place in its block: ``local_id``, ``group_id``, ``group_size`` or ``num_groups`` along ``axis``."""

    name: str
    axis: int  # 0: x (along a row), 1: y
    type: str = "i32"


Expr = Const | Var | Load | Unary | Binary | Compare | Select | Call | Cast | Builtin


@dataclass(eq=False)
class Assign:
    var: Var
    value: Expr
    line: int


@dataclass(eq=False)
class Store:
    array: Param
    index: Expr
    value: Expr
    line: int


@dataclass(eq=False)
class If:
    cond: Expr
    body: list
    orelse: list
    line: int


@dataclass(eq=False)
class For:
    var: Var
    start: Expr
    stop: Expr
    step: Expr
    body: list
    line: int


@dataclass(eq=False)
class Return:
    line: int


@dataclass(eq=False)
class Barrier:
    """``gw.barrier()``: every thread of the block waits here; writes before it are seen by the block after it."""

    line: int


@dataclass(eq=False)
class KernelIR:
    """A translated kernel: parameters in order, index and domain variables, hoisted locals and the body."""

    name: str  # the Python name (traces, messages)
    cname: str  # the entry point in generated code
    params: list[Param]
    indices: list[Var]
    domain: list[Var]  # gw_nx (and gw_ny): the launch extents, passed after the arguments
    locals: list[Var]
    body: list
    where: str  # "file.py:12"
    default_float: str
    types_used: set[str] = field(default_factory=set)
    shared: list[Param] = field(default_factory=list)  # workgroup-shared arrays, in declaration order
    uses_barrier: bool = False
    uses_builtins: bool = False  # local_id, group_id, group_size or num_groups

    @property
    def ndim(self) -> int:
        return len(self.indices)

    @property
    def cooperative(self) -> bool:
        """Whether threads work together in blocks (shared arrays, barriers, block indices): launches then need
        shapes that are a multiple of the block, and the CPU runs the kernel block by block."""
        return bool(self.shared) or self.uses_barrier or self.uses_builtins

    @property
    def shared_bytes(self) -> int:
        """Bytes of workgroup-shared memory one block holds."""
        return sum(int(np.prod(p.shape)) * np.dtype(NUMPY_TYPES[p.type]).itemsize for p in self.shared)

    @property
    def arguments(self) -> list[Param]:
        """The parameters a caller passes (everything but the index)."""
        return [p for p in self.params if p.kind != "index"]


# ----------------------------------------------------------------------------------------------------- functions
FLOAT_FUNCTIONS = (
    "sqrt",
    "exp",
    "exp2",
    "log",
    "log2",
    "log10",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "floor",
    "ceil",
    "trunc",
)
FUNCTIONS = (*FLOAT_FUNCTIONS, "atan2", "pow", "abs", "min", "max")
NUMPY_NAMES = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "atan2": "arctan2", "pow": "power"}


def _known_functions() -> dict[int, str]:
    """id(function object) → our name, for math.*, numpy.* and the builtins a kernel may call."""
    known: dict[int, str] = {}
    for name in FLOAT_FUNCTIONS + ("atan2", "pow"):
        for obj in (getattr(math, name, None), getattr(np, NUMPY_NAMES.get(name, name), None)):
            if obj is not None:
                known[id(obj)] = name
    for obj, name in [(builtins.abs, "abs"), (math.fabs, "abs"), (np.abs, "abs"), (np.fabs, "abs"),
                      (builtins.min, "min"), (np.minimum, "min"), (np.fmin, "min"), (builtins.max, "max"),
                      (np.maximum, "max"), (np.fmax, "max"), (builtins.pow, "pow"), (builtins.int, "int"),
                      (builtins.float, "float"), (builtins.range, "range")]:  # fmt: skip
        known[id(obj)] = name
    return known


_KNOWN = _known_functions()
_MISSING = object()

# Names generated code cannot use as they are: C, OpenCL C and CUDA words, WGSL's keywords and reserved words (as
# naga lists them), the math functions we call (CUDA's f-suffixed ones too) and the NumPy source's own names.
_C_WORDS = """asm auto blockDim blockIdx bool break case catch char class const constant continue default delete dim3 do
    double else enum event_t explicit export extern false float for friend global goto gridDim half if image1d_t
    image2d_t image3d_t INFINITY inline int intptr_t kernel local long main mutable namespace NAN new operator
    printf private protected ptrdiff_t public read_only read_write register restrict return sampler_t short
    signed size_t sizeof static struct switch template this threadIdx throw true try typedef typename uchar uint
    uintptr_t ulong union unsigned ushort using virtual void volatile warpSize while write_only"""
_WGSL_WORDS = """abstract active alias alignas alignof array arrayLength as asm asm_fragment async atomic attribute
    auto await become binding_array bitcast bool break case cast catch class co_await co_return co_yield coherent
    column_major common compile compile_fragment CompileShader ComputeShader concept const const_assert
    const_cast consteval constexpr constinit continue continuing crate debugger decltype default delete demote
    demote_to_helper diagnostic discard do DomainShader dynamic_cast else enable enum explicit export extends
    extern external f16 f32 fallthrough false filter final finally fn for friend from function fxgroup
    GeometryShader get goto groupshared handle highp Hullshader i32 i64 if impl implements import inline inout
    instanceof interface layout let loop lowp macro macro_rules mat2x2 mat2x3 mat2x4 mat3x2 mat3x3 mat3x4 mat4x2
    mat4x3 mat4x4 match mediump meta mod module move mut mutable namespace new nil noexcept noinline
    nointerpolation noperspective NULL null nullptr of operator override package packoffset partition pass patch
    pixelfragment precise precision premerge priv protected ptr pub public readonly ref regardless register
    reinterpret_cast requires resource restrict return sampler sampler_comparison select self Self set shared
    signed sizeof smooth snorm static static_assert static_cast std storage storageBarrier struct subroutine
    super switch target template texture_1d texture_2d texture_2d_array texture_3d texture_cube
    texture_cube_array texture_depth_2d texture_depth_2d_array texture_depth_cube texture_depth_cube_array
    texture_depth_multisampled_2d texture_multisampled_2d texture_storage_1d texture_storage_2d
    texture_storage_2d_array texture_storage_3d this thread_local throw trait true try type typedef typeid
    typename typeof u32 u64 uniform union unless unorm unsafe unsized use using var varying vec2 vec3 vec4
    virtual volatile wgsl where while with workgroup workgroupBarrier writeonly yield"""
_CALLED = ("fmin", "fmax", "fabs", "fmod", "clamp", "np", "numpy", "range", "isinf", "isnan", "round", "rsqrt",
           "barrier", "grid", "block", "get_local_id", "get_group_id", "get_local_size", "get_num_groups",
           "workgroupBarrier", "storageBarrier")  # fmt: skip
RESERVED = {
    "_",  # WGSL's placeholder (_ = e), not a name
    *_C_WORDS.split(),
    *_WGSL_WORDS.split(),
    *_CALLED,
    *FUNCTIONS,
    *(f + "f" for f in (*FUNCTIONS, *_CALLED[:4])),
}


def safe_name(name: str, taken: set[str]) -> str:
    """``name`` as generated code may spell it: suffixed with ``_`` while it is reserved or taken."""
    out = name
    while out in RESERVED or out in taken or out.startswith("__"):
        out = (out.lstrip("_") or "v") + "_" if out.startswith("__") else out + "_"
    taken.add(out)
    return out


def walk_exprs(node: Any) -> Any:
    """Every expression in a statement list, expression or statement, depth first."""
    if isinstance(node, list):
        for s in node:
            yield from walk_exprs(s)
        return
    if isinstance(node, (Const, Var, Load, Unary, Binary, Compare, Select, Call, Cast, Builtin)):
        yield node
    children = {
        Load: ("index",),
        Unary: ("operand",),
        Binary: ("left", "right"),
        Compare: ("left", "right"),
        Select: ("cond", "a", "b"),
        Cast: ("operand",),
        Assign: ("var", "value"),
        Store: ("index", "value"),
        If: ("cond", "body", "orelse"),
        For: ("var", "start", "stop", "step", "body"),
    }.get(type(node), ())
    for name in children:
        yield from walk_exprs(getattr(node, name))
    if isinstance(node, Call):
        for a in node.args:
            yield from walk_exprs(a)


def expr_children(x: Expr) -> list:
    """The operands of one expression (none for literals, variables and builtins)."""
    if isinstance(x, (Const, Var, Builtin)):
        return []
    if isinstance(x, Load):
        return [x.index]
    if isinstance(x, (Unary, Cast)):
        return [x.operand]
    if isinstance(x, (Binary, Compare)):
        return [x.left, x.right]
    if isinstance(x, Select):
        return [x.cond, x.a, x.b]
    if isinstance(x, Call):
        return list(x.args)
    raise AssertionError(x)


def has_barrier(stmts: list) -> int:
    """The line of the first barrier in ``stmts`` (0 when there is none)."""
    for s in stmts:
        if isinstance(s, Barrier):
            return s.line
        inner = s.body + s.orelse if isinstance(s, If) else s.body if isinstance(s, For) else []
        line = has_barrier(inner)
        if line:
            return line
    return 0


class _Divergence:
    """Refuses barriers that some threads of a block might not reach: under an ``if`` or in a loop whose condition or
    range depends on the thread (its index, ``local_id``, array contents, or locals computed from them), or after a
    ``return`` that only some threads take. A GPU hangs or computes garbage there; WGSL refuses it outright."""

    WHY = "every thread of a block must reach the same barriers"

    def __init__(self, translator: _Translator) -> None:
        self.tr = translator
        self.varying_vars: set[int] = set()  # id() of locals and loop variables that may differ between threads
        self.returned = 0  # line of a return that only some threads took, once the walk has passed one

    def varying(self, x: Expr) -> bool:
        if isinstance(x, Var):
            return x.role == "index" or id(x) in self.varying_vars
        if isinstance(x, Builtin):
            return x.name == "local_id"
        if isinstance(x, Load):
            return True  # array contents may differ between threads (and WGSL counts every storage read so)
        return any(self.varying(c) for c in expr_children(x))

    def mark(self, stmts: list, divergent: bool) -> bool:
        changed = False
        for s in stmts:
            if isinstance(s, Assign):
                if id(s.var) not in self.varying_vars and (divergent or self.varying(s.value)):
                    self.varying_vars.add(id(s.var))
                    changed = True
            elif isinstance(s, If):
                inner = divergent or self.varying(s.cond)
                changed |= self.mark(s.body, inner)
                changed |= self.mark(s.orelse, inner)
            elif isinstance(s, For):
                inner = divergent or any(self.varying(e) for e in (s.start, s.stop, s.step))
                if inner and id(s.var) not in self.varying_vars:
                    self.varying_vars.add(id(s.var))
                    changed = True
                changed |= self.mark(s.body, inner)
        return changed

    def check(self, body: list) -> None:
        while self.mark(body, False):
            pass
        self.walk(body, [])

    def walk(self, stmts: list, where: list[str]) -> None:
        for s in stmts:
            if isinstance(s, Barrier):
                if where:
                    self.tr.fail_line(s.line, f"gw.barrier() {where[-1]} depends on the thread: {self.WHY}")
                if self.returned:
                    self.tr.fail_line(
                        s.line,
                        f"gw.barrier() after a return that only some threads take (line {self.returned}): "
                        f"{self.WHY}; guard the work with if instead of returning",
                    )
            elif isinstance(s, Return) and where:
                self.returned = self.returned or s.line
            elif isinstance(s, If):
                inner = [*where, f"under the if at line {s.line}, whose condition"] if self.varying(s.cond) else where
                self.walk(s.body, inner)
                self.walk(s.orelse, inner)
            elif isinstance(s, For):
                varies = any(self.varying(e) for e in (s.start, s.stop, s.step))
                inner = [*where, f"in the loop at line {s.line}, whose range"] if varies else where
                before = self.returned
                self.walk(s.body, inner)
                if self.returned and not before and has_barrier(s.body):  # the next iteration's barriers
                    self.tr.fail_line(
                        has_barrier(s.body),
                        f"gw.barrier() in a loop with a return that only some threads take (line {self.returned}): "
                        f"{self.WHY}; guard the work with if instead of returning",
                    )


# --------------------------------------------------------------------------------------------------- the translator
class _Translator:
    """Walks one function's AST, checking each construct and building the typed tree."""

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
            annotation = annotations.get(a.arg, _MISSING)
            if annotation is _MISSING:
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
            self.params.append(Param(a.arg, cname, "scalar", annotation.name, annotation))
            self.vars[a.arg] = Var(cname, annotation.name, "scalar")
        elif isinstance(annotation, ArrayType):
            p = Param(a.arg, cname, "array", annotation.element.name, annotation, annotation.ndim, annotation.width)
            self.params.append(p)
            self.arrays[a.arg] = p
        else:
            self.fail(
                a,
                f"parameter {a.arg!r}: {annotation!r} is not a kernel type; use gw.index, a scalar type "
                f"(gw.f32, gw.f64, gw.i32, gw.u32, gw.i64) or an array of one (gw.f32[:], gw.f32[:, :])",
            )

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
        lo, hi = _INT_RANGE[t]
        if lo <= v <= hi:
            return v
        if t == "u32" and -(2**31) <= v < 0:
            return v + 2**32  # C's conversion of a negative constant to unsigned
        self.fail(node, f"constant {v} does not fit {t}; write gw.i64({v}) for a 64-bit value")

    def cast(self, e: Expr, t: str, node: ast.AST) -> Expr:
        if e.type == t:
            return e
        if isinstance(e, Const):
            return Const(self.convert(e.value, t, node), t)
        return Cast(e, t)

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
        method = getattr(self, f"expr_{type(node).__name__}", None)
        if method is None:
            self.fail(
                node,
                _UNSUPPORTED_EXPR.get(
                    type(node).__name__, f"{type(node).__name__} expressions are not supported in kernels"
                ),
            )
        return method(node)

    def expr_Constant(self, node: ast.Constant) -> Expr:
        v = node.value
        if isinstance(v, bool):
            return Const(v, "bool")
        if isinstance(v, int):
            return Const(v, "int")
        if isinstance(v, float):
            return Const(v, "float")
        self.fail(node, f"constant {v!r} is not a number; kernels compute with numbers and booleans only")

    def resolve(self, node: ast.expr) -> Any:
        """The Python object a non-local name or attribute chain refers to (``_MISSING`` when there is none)."""
        if isinstance(node, ast.Name):
            if node.id in self.closure:
                return self.closure[node.id]
            if node.id in self.fn.__globals__:
                return self.fn.__globals__[node.id]
            return getattr(builtins, node.id, _MISSING)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if isinstance(base, types.ModuleType):
                return getattr(base, node.attr, _MISSING)
        return _MISSING

    def constant(self, value: Any, node: ast.AST) -> Expr | None:
        if isinstance(value, (bool, np.bool_)):
            return Const(bool(value), "bool")
        if isinstance(value, int):
            return Const(value, "int")
        if isinstance(value, float):
            return Const(value, "float")
        if isinstance(value, np.generic):
            for t, dt in NUMPY_TYPES.items():
                if t != "isize" and value.dtype == np.dtype(dt):
                    return Const(value.item(), t)
        return None

    def expr_Name(self, node: ast.Name) -> Expr:
        name = node.id
        if name in self.vars:
            return self.vars[name]
        if name in self.arrays:
            self.fail(node, f"array {name!r} must be indexed: {name}[i]")
        if name in self.finished_loops or name in self.loop_names:
            self.fail(node, f"loop variable {name!r} is only defined inside its loop")
        if name in self.assigned:
            self.fail(node, f"local {name!r} is used before it is assigned")
        value = self.resolve(node)
        if value is _MISSING:
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
        const = None if value is _MISSING else self.constant(value, node)
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
        return Load(array, index, array.type)

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
        if id(obj) in _BUILTINS and obj is not _MISSING:
            return self.builtin(_BUILTINS[id(obj)], node)
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
            return self.cast(e, t, node)
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
        name = _KNOWN.get(id(obj)) if obj is not _MISSING else None
        if name is None and obj is _MISSING and isinstance(func, ast.Name) and func.id in FUNCTIONS:
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
            return Load(array, axes[0], array.type)
        return Load(array, self.flat(array, axes[1], axes[0], node), array.type)

    # ------------------------------------------------------------------ statements
    def block(self, stmts: list[ast.stmt]) -> list:
        out: list = []
        for s in stmts:
            out.extend(self.stmt(s))
        return out

    def stmt(self, node: ast.stmt) -> list:
        method = getattr(self, f"stmt_{type(node).__name__}", None)
        if method is None:
            self.fail(
                node,
                _UNSUPPORTED_STMT.get(
                    type(node).__name__, f"{type(node).__name__} statements are not supported in kernels"
                ),
            )
        return method(node)

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
            self.fail(node.annotation, "a local's annotation is a scalar type: gw.f32, gw.f64, gw.i32, gw.u32, gw.i64")
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
        try:
            dtype = np.dtype(value) if value is not _MISSING and not isinstance(value, bool) else None
        except TypeError:
            dtype = None
        for t, s in SCALAR_TYPES.items():
            if dtype is not None and dtype == s.dtype:
                return t
        self.fail(node, "a shared array's type is gw.f32, gw.f64, gw.i32, gw.u32 or gw.i64 (or their NumPy names)")

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
            _Divergence(self).check(body)
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


def translate(fn: Callable[..., Any], name: str | None = None) -> KernelIR:
    """The typed tree of ``fn``; raises CompileError at the first unsupported construct, naming file:line."""
    if not inspect.isfunction(fn):
        raise InvalidArgument(f"@gw.kernel decorates a Python function, not {type(fn).__name__}")
    return _Translator(fn, name).translate()
