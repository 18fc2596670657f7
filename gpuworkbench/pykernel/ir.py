"""The typed tree a kernel body becomes: expressions, statements and ``KernelIR``, which every generator reads.

Every type is decided and every conversion made explicit before a generator sees the tree (see ``statements``), so
CUDA C, OpenCL C, WGSL and NumPy compute the same thing; a generator only spells what it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .ktypes import ITEMSIZE


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
    """A literal; "int" and "float" are the abstract types of Python literals until an operand gives them one."""

    value: Any  # a Python bool, int or float
    type: str


@dataclass(eq=False)
class Var:
    """A named value: the index, a scalar parameter, a launch extent, a local or a loop variable."""

    name: str  # cname
    type: str
    role: str  # "index", "scalar", "domain" (the launch extents), "local", "loop"


@dataclass(eq=False)
class Load:
    """An array element read."""

    array: Param
    index: Expr  # the flat element offset
    type: str


@dataclass(eq=False)
class Unary:
    """A unary operator."""

    op: str  # "neg", "not", "invert"
    operand: Expr
    type: str


@dataclass(eq=False)
class Binary:
    """An arithmetic, bitwise or logical operator on two operands of one type."""

    op: str  # + - * / // % & | ^ << >> and or; both operands have ``type`` (shifts: the left's)
    left: Expr
    right: Expr
    type: str


@dataclass(eq=False)
class Compare:
    """A comparison of two operands of one type: a bool."""

    op: str
    left: Expr
    right: Expr
    type: str = "bool"


@dataclass(eq=False)
class Select:
    """``a if cond else b``."""

    cond: Expr
    a: Expr
    b: Expr
    type: str


@dataclass(eq=False)
class Call:
    """A math function (or the clamp of a stencil read) of operands converted to ``type``."""

    func: str  # a name from FUNCTIONS, or "clamp" (stencil reads)
    args: tuple
    type: str


@dataclass(eq=False)
class Cast:
    """An explicit conversion to ``type``."""

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
    """A local variable's assignment."""

    var: Var
    value: Expr
    line: int


@dataclass(eq=False)
class Store:
    """An array element write."""

    array: Param
    index: Expr
    value: Expr
    line: int


@dataclass(eq=False)
class If:
    """``if cond: body else: orelse`` (an ``elif`` is an ``If`` alone in ``orelse``)."""

    cond: Expr
    body: list
    orelse: list
    line: int


@dataclass(eq=False)
class For:
    """``for var in range(start, stop, step)``."""

    var: Var
    start: Expr
    stop: Expr
    step: Expr
    body: list
    line: int


@dataclass(eq=False)
class Return:
    """A bare ``return``: the thread ends."""

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
    distinct: bool = False  # the arrays never overlap (C's restrict): the compiler may reorder their reads and writes
    bounds: tuple[int, int] | None = None  # (threads per block, blocks per SM) for CUDA's __launch_bounds__

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
        return sum(math.prod(p.shape) * ITEMSIZE[p.type] for p in self.shared)

    @property
    def arguments(self) -> list[Param]:
        """The parameters a caller passes (everything but the index)."""
        return [p for p in self.params if p.kind != "index"]


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


def first_line(stmts: list, kind: type) -> int:
    """The line of the first ``kind`` statement (``Barrier``, ``Return``) in ``stmts``, nested ones too; 0 if none."""
    for s in stmts:
        if isinstance(s, kind):
            return s.line
        inner = s.body + s.orelse if isinstance(s, If) else s.body if isinstance(s, For) else []
        line = first_line(inner, kind)
        if line:
            return line
    return 0
