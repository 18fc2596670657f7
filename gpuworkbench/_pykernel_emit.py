"""Typed kernel tree → CUDA C, OpenCL C, WGSL and NumPy source, plus the two helpers the NumPy source calls.

Each generator only spells what the tree says: every conversion is already explicit there, so the four agree. Python's
meaning of ``//`` and ``%`` (floor, sign of the divisor) comes from small helper functions in C and WGSL.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._pykernel_translate import (
    FLOATS,
    NUMPY_NAMES,
    NUMPY_TYPES,
    Assign,
    Barrier,
    Binary,
    Builtin,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    If,
    KernelIR,
    Load,
    Return,
    Select,
    Store,
    Unary,
    Var,
    expr_children,
    walk_exprs,
)
from .errors import GpuError, InvalidArgument
from .kernels import _C_TYPES

_NAMES = {"f32": "float32", "f64": "float64", "i32": "int32", "u32": "uint32", "i64": "int64"}
C_TYPES = {
    lang: {t: _C_TYPES[lang][n] for t, n in _NAMES.items()} | {"bool": "bool", "isize": _C_TYPES[lang]["int64"]}
    for lang in ("cuda", "opencl")
}
WGSL_TYPES = {"f32": "f32", "i32": "i32", "u32": "u32", "bool": "bool", "isize": "i32"}
_CUDA_BUILTINS = {"local_id": "threadIdx", "group_id": "blockIdx", "group_size": "blockDim", "num_groups": "gridDim"}
_OPENCL_BUILTINS = {
    "local_id": "get_local_id",
    "group_id": "get_group_id",
    "group_size": "get_local_size",
    "num_groups": "get_num_groups",
}


def _float_text(value: float) -> str:
    text = repr(float(value))
    return text if "e" in text or "." in text else text + ".0"


def _bare(text: str) -> str:
    """``text`` without one pair of parentheses around all of it (where it has them)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(text) - 1:
            return text
    return text[1:-1]


_ARITH = {"*": 2, "/": 2, "//": 2, "%": 2, "+": 1, "-": 1}


def _simple(e: Expr) -> bool:
    """True for values that cannot change while a loop runs (literals, parameters, indices, outer loop variables)."""
    return isinstance(e, Const) or (isinstance(e, Var) and e.role != "local")


# ---------------------------------------------------------------------------------------------------------- C dialects
class _CSource:
    """CUDA C or OpenCL C for one kernel; the two differ in qualifiers, type names and float function names."""

    def __init__(self, ir: KernelIR, dialect: str) -> None:
        self.ir, self.dialect, self.types = ir, dialect, C_TYPES[dialect]
        self.helpers: dict[tuple[str, str], str] = {}
        self.temps = 0

    # ------------------------------------------------------------------ expressions
    def const(self, value: Any, t: str) -> str:
        if t == "bool":
            return "true" if value else "false"
        suffix = "f" if t == "f32" else ""
        if t in FLOATS:
            if math.isnan(value):
                return f"(0.0{suffix} / 0.0{suffix})"
            if math.isinf(value):
                return f"({'-' if value < 0 else ''}1.0{suffix} / 0.0{suffix})"
            text = _float_text(value) + suffix
            return f"({text})" if value < 0 else text
        wide = t in ("i64", "isize")
        suffix = "u" if t == "u32" else ("LL" if self.dialect == "cuda" else "L") if wide else ""
        lowest = -(2**63) if wide else -(2**31)
        if value == lowest:  # the literal 2147483648 does not fit: build the lowest value from one above it
            return f"({value + 1}{suffix} - 1{suffix})"
        return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"

    def function(self, name: str, t: str) -> str:
        if t not in FLOATS:
            return self.helper(name, t)
        base = {"abs": "fabs", "min": "fmin", "max": "fmax"}.get(name, name)
        return base + "f" if self.dialect == "cuda" and t == "f32" else base

    def helper(self, kind: str, t: str) -> str:
        name = f"gw_{kind}_{t}"
        if (kind, t) not in self.helpers:
            self.helpers[(kind, t)] = self.helper_source(kind, t, name)
        return name

    def helper_source(self, kind: str, t: str, name: str) -> str:
        q = "static __device__ __forceinline__" if self.dialect == "cuda" else "static inline"
        ct = self.types[t]
        zero = self.const(0.0 if t in FLOATS else 0, t)
        body = {
            "floordiv": f"{ct} q = a / b; return (q * b != a && ((a < {zero}) != (b < {zero}))) ? q - 1 : q;",
            "mod": f"{ct} r = {self.function('fmod', t) + '(a, b)' if t in FLOATS else 'a % b'}; "
            f"return (r != {zero} && ((r < {zero}) != (b < {zero}))) ? r + b : r;",
            "min": "return a < b ? a : b;",
            "max": "return a > b ? a : b;",
            "abs": f"return a < {zero} ? -a : a;",
            "clamp": "return a < lo ? lo : (a > hi ? hi : a);",
        }[kind]
        params = {"abs": f"{ct} a", "clamp": f"{ct} a, {ct} lo, {ct} hi"}.get(kind, f"{ct} a, {ct} b")
        return f"{q} {ct} {name}({params}) {{ {body} }}"

    def divides_infix(self, x: Binary) -> bool:
        """Whether ``//`` or ``%`` is C's own operator here (unsigned: floor and truncation agree)."""
        return x.type == "u32"

    def infix(self, x: Expr) -> int:
        """The precedence ``e(x)`` prints at: 2 for * / %, 1 for + -, 0 for text that is already one operand."""
        if isinstance(x, Binary) and x.op in _ARITH and (x.op not in ("//", "%") or self.divides_infix(x)):
            return _ARITH[x.op]
        return 0

    def atom(self, x: Expr) -> str:
        text = self.e(x)
        return f"({text})" if self.infix(x) else text

    def arith(self, x: Binary, op: str) -> str:
        """``left op right`` with the parentheses precedence needs and evaluation order keeps (a - (b + c))."""
        p = self.infix(x)
        left, right = self.e(x.left), self.e(x.right)
        if 0 < self.infix(x.left) < p:
            left = f"({left})"
        if 0 < self.infix(x.right) <= p:
            right = f"({right})"
        return f"{left} {op} {right}"

    def e(self, x: Expr) -> str:
        if isinstance(x, Const):
            return self.const(x.value, x.type)
        if isinstance(x, Var):
            return x.name
        if isinstance(x, Load):
            return f"{x.array.cname}[{_bare(self.e(x.index))}]"
        if isinstance(x, Unary):
            sign = {"neg": "-", "not": "!", "invert": "~"}[x.op]
            return f"({sign}{self.atom(x.operand)})"
        if isinstance(x, Binary):
            if x.op in _ARITH and self.infix(x):
                return self.arith(x, "/" if x.op == "//" else x.op)
            if x.op in ("//", "%"):
                if x.op == "//" and x.type in FLOATS:
                    return f"{self.function('floor', x.type)}({self.arith(x, '/')})"
                kind = "floordiv" if x.op == "//" else "mod"
                return f"{self.helper(kind, x.type)}({_bare(self.e(x.left))}, {_bare(self.e(x.right))})"
            op = {"and": "&&", "or": "||"}.get(x.op, x.op)
            return f"({self.atom(x.left)} {op} {self.atom(x.right)})"
        if isinstance(x, Compare):
            return f"({self.e(x.left)} {x.op} {self.e(x.right)})"
        if isinstance(x, Select):
            return f"({_bare(self.e(x.cond))} ? {self.e(x.a)} : {self.e(x.b)})"
        if isinstance(x, Call):
            return f"{self.function(x.func, x.type)}({', '.join(_bare(self.e(a)) for a in x.args)})"
        if isinstance(x, Cast):
            return f"({self.types[x.type]}){self.atom(x.operand)}"
        if isinstance(x, Builtin):
            if self.dialect == "cuda":
                return f"((int){_CUDA_BUILTINS[x.name]}.{'xy'[x.axis]})"
            return f"((int){_OPENCL_BUILTINS[x.name]}({x.axis}))"
        raise AssertionError(x)

    # ------------------------------------------------------------------ statements
    def block(self, stmts: list, depth: int) -> list[str]:
        pad = "    " * depth
        out: list[str] = []
        for s in stmts:
            if isinstance(s, Assign):
                out.append(f"{pad}{s.var.name} = {_bare(self.e(s.value))};")
            elif isinstance(s, Store):
                out.append(f"{pad}{s.array.cname}[{_bare(self.e(s.index))}] = {_bare(self.e(s.value))};")
            elif isinstance(s, Return):
                out.append(f"{pad}return;")
            elif isinstance(s, Barrier):
                out.append(pad + self.barrier())
            elif isinstance(s, If):
                out.append(f"{pad}if ({_bare(self.e(s.cond))}) {{")
                out += self.block(s.body, depth + 1)
                orelse = s.orelse
                while len(orelse) == 1 and isinstance(orelse[0], If):  # elif
                    out.append(f"{pad}}} else if ({_bare(self.e(orelse[0].cond))}) {{")
                    out += self.block(orelse[0].body, depth + 1)
                    orelse = orelse[0].orelse
                if orelse:
                    out.append(f"{pad}}} else {{")
                    out += self.block(orelse, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(s, For):
                out += self.loop(s, depth)
        return out

    def loop(self, s: For, depth: int) -> list[str]:
        """``for k in range(start, stop, step)``; stop and step are evaluated once, as range() does."""
        pad, k = "    " * depth, s.var.name
        temps, bounds = [], []
        for e, what in ((s.stop, "stop"), (s.step, "step")):
            if _simple(e):
                bounds.append(self.atom(e))
            else:
                name = f"gw_{what}{self.temps}"
                self.temps += 1
                temps.append(self.constant_decl(name, s.var.type, _bare(self.e(e))))
                bounds.append(name)
        stop, step = bounds
        if isinstance(s.step, Const):
            cond = f"{k} {'<' if s.step.value > 0 else '>'} {stop}"
        else:
            cond = self.either(f"{step} > {self.const(0, s.var.type)}", f"{k} < {stop}", f"{k} > {stop}")
        head = f"for ({self.loop_decl(k, s.var.type)} = {_bare(self.e(s.start))}; {cond}; {k} += {step}) {{"
        if not temps:
            return [pad + head, *self.block(s.body, depth + 1), f"{pad}}}"]
        inner = "    " * (depth + 1)  # a block keeps the evaluated bounds local to the loop
        body = self.block(s.body, depth + 2)
        return [f"{pad}{{", *(inner + t for t in temps), inner + head, *body, inner + "}", f"{pad}}}"]

    def constant_decl(self, name: str, t: str, value: str) -> str:
        return f"const {self.types[t]} {name} = {value};"

    def barrier(self) -> str:
        """Every thread of the block waits; shared and global writes before it are visible to the block after it."""
        return "__syncthreads();" if self.dialect == "cuda" else "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);"

    def loop_decl(self, name: str, t: str) -> str:
        return f"{self.types[t]} {name}"

    def either(self, cond: str, a: str, b: str) -> str:
        return f"({cond} ? {a} : {b})"

    # ------------------------------------------------------------------ the kernel
    def source(self) -> str:
        ir, cuda = self.ir, self.dialect == "cuda"
        params = []
        for p in ir.arguments:
            ct = self.types[p.type]
            if p.kind == "array":
                const = "" if p.written else "const "
                params.append(f"{const}{ct}* {p.cname}" if cuda else f"__global {const}{ct}* {p.cname}")
            else:
                params.append(f"const {ct} {p.cname}")
        params += [f"const int {d.name}" for d in ir.domain]
        lines = []
        for p in ir.shared:  # at the kernel's outermost scope, as OpenCL C requires of __local variables
            size = int(np.prod(p.shape))
            lines.append(f"    {'__shared__' if cuda else '__local'} {self.types[p.type]} {p.cname}[{size}];")
        axes = "xyz"
        for axis, index in enumerate(ir.indices):
            where = (
                f"blockIdx.{axes[axis]} * blockDim.{axes[axis]} + threadIdx.{axes[axis]}"
                if cuda
                else f"get_global_id({axis})"
            )
            lines.append(f"    const int {index.name} = (int)({where});")
        if not ir.cooperative:  # cooperative launches cover whole blocks exactly: every thread must reach the barriers
            guard = " || ".join(f"{i.name} >= {d.name}" for i, d in zip(ir.indices, ir.domain))
            lines.append(f"    if ({guard}) return;")
        for v in ir.locals:
            lines.append(f"    {self.types[v.type]} {v.name} = {self.const(0.0 if v.type in FLOATS else 0, v.type)};")
        lines += self.block(ir.body, 1)
        head = f'extern "C" __global__ void {ir.cname}' if cuda else f"__kernel void {ir.cname}"
        prelude = [f"// {ir.name}: generated by gpuworkbench from the Python kernel at {ir.where}"]
        if not cuda and "f64" in ir.types_used:
            prelude.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        prelude += self.helpers.values()
        return "\n".join([*prelude, f"{head}({', '.join(params)}) {{", *lines, "}", ""])


def c_source(ir: KernelIR, dialect: str) -> str:
    """CUDA C (``dialect`` "cuda") or OpenCL C ("opencl") for the kernel."""
    return _CSource(ir, dialect).source()


# --------------------------------------------------------------------------------------------------------------- WGSL
class _WgslSource(_CSource):
    """WGSL for one kernel: buffers bound to group 0 in argument order, scalars in one uniform struct after them."""

    def __init__(self, ir: KernelIR, block: tuple[int, ...]) -> None:
        wide = sorted({"f64", "i64"} & ir.types_used)
        if wide:
            raise InvalidArgument(
                f"kernel {ir.name!r} uses {' and '.join(wide)}; WebGPU (WGSL) has 32-bit types only: f32, i32, u32"
            )
        self.ir, self.block_shape, self.types = ir, block, WGSL_TYPES
        self.helpers, self.temps, self.dialect = {}, 0, "wgsl"

    def const(self, value: Any, t: str) -> str:
        if t == "bool":
            return "true" if value else "false"
        if t == "f32":
            if math.isnan(value) or math.isinf(value):
                bits = "0x7fc00000u" if math.isnan(value) else "0xff800000u" if value < 0 else "0x7f800000u"
                return f"bitcast<f32>({bits})"
            text = _float_text(value) + "f"
            return f"({text})" if value < 0 else text
        suffix = "u" if t == "u32" else "i"
        if value == -(2**31):
            return "(-2147483647i - 1i)"
        return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"

    def function(self, name: str, t: str) -> str:
        return name

    def helper_source(self, kind: str, t: str, name: str) -> str:
        wt = self.types[t]
        zero = self.const(0.0 if t in FLOATS else 0, t)
        signs_differ = f"(({'a' if kind == 'floordiv' else 'r'} < {zero}) != (b < {zero}))"
        body = {
            "floordiv": f"let q = a / b; if (q * b != a && {signs_differ}) {{ return q - 1; }} return q;",
            "mod": f"let r = a % b; if (r != {zero} && {signs_differ}) {{ return r + b; }} return r;",
        }[kind]
        return f"fn {name}(a: {wt}, b: {wt}) -> {wt} {{ {body} }}"

    def e(self, x: Expr) -> str:
        if isinstance(x, Var) and x.role in ("scalar", "domain"):
            return f"gw_args.{x.name}"
        if isinstance(x, Unary) and x.op == "neg" and x.type == "u32":
            return f"(0u - {self.e(x.operand)})"
        if isinstance(x, Binary) and x.op in ("<<", ">>"):
            right = self.atom(x.right) if x.right.type == "u32" else f"u32({_bare(self.e(x.right))})"
            return f"({self.atom(x.left)} {x.op} {right})"
        if isinstance(x, Select):  # comparisons keep their parentheses: f(a < b, c > d) would read as a template
            return f"select({self.e(x.b)}, {self.e(x.a)}, {self.e(x.cond)})"
        if isinstance(x, Call) and x.func == "log10":
            return f"(log({_bare(self.e(x.args[0]))}) * 0.4342944819032518f)"
        if isinstance(x, Builtin):
            return self.builtin(x)
        if isinstance(x, Cast):
            if self.types[x.type] == self.types[x.operand.type]:  # isize is i32 here: no cast, but still one operand
                return self.atom(x.operand)
            return f"{self.types[x.type]}({_bare(self.e(x.operand))})"
        return super().e(x)

    def builtin(self, x: Builtin) -> str:
        axis, size = "xy"[x.axis], self.block_shape[x.axis]
        if x.name == "local_id":
            return f"i32(gw_lid.{axis})"
        if x.name == "group_size":
            return f"{size}i"
        if x.name == "num_groups":  # the launch's blocks (a 1-D grid may hold more, spilled into y: they return)
            return f"(gw_args.{self.ir.domain[x.axis].name} / {size}i)"
        if self.ir.ndim == 1:
            return "i32(gw_wid.x + gw_wid.y * gw_groups.x)"
        return f"i32(gw_wid.{axis})"

    def barrier(self) -> str:
        return "storageBarrier(); workgroupBarrier();"

    def constant_decl(self, name: str, t: str, value: str) -> str:
        return f"let {name} = {value};"

    def loop_decl(self, name: str, t: str) -> str:
        return f"var {name}: {self.types[t]}"

    def either(self, cond: str, a: str, b: str) -> str:
        return f"select(({b}), ({a}), ({cond}))"

    def source(self) -> str:
        ir = self.ir
        arrays = [p for p in ir.arguments if p.kind == "array"]
        scalars = [p for p in ir.arguments if p.kind == "scalar"]
        fields = [f"{p.cname}: {self.types[p.type]}" for p in scalars] + [f"{d.name}: i32" for d in ir.domain]
        decls = [
            f"@group(0) @binding({b}) var<storage, {'read_write' if p.written else 'read'}> {p.cname}: "
            f"array<{self.types[p.type]}>;"
            for b, p in enumerate(arrays)
        ]
        decls.append(f"@group(0) @binding({len(arrays)}) var<uniform> gw_args: GwArgs;")
        decls += [f"var<workgroup> {p.cname}: array<{self.types[p.type]}, {int(np.prod(p.shape))}>;" for p in ir.shared]
        size = ", ".join(str(b) for b in self.block_shape)
        lines = []
        if ir.ndim == 1:
            lines.append(
                f"    let {ir.indices[0].name} = i32(gw_id.x + gw_id.y * gw_groups.x * {self.block_shape[0]}u);"
            )
        else:
            lines += [f"    let {ir.indices[a].name} = i32(gw_id.{'xy'[a]});" for a in range(2)]
        if not ir.cooperative:
            guard = " || ".join(f"{i.name} >= gw_args.{d.name}" for i, d in zip(ir.indices, ir.domain))
            lines.append(f"    if ({guard}) {{ return; }}")
        elif ir.ndim == 1:  # whole workgroups past the launch (a grid spilled into y) leave together: uniform
            group = self.builtin(Builtin("group_id", 0))
            lines.append(f"    if ({group} * {self.block_shape[0]}i >= gw_args.gw_nx) {{ return; }}")
        used = {x.array.cname for x in walk_exprs(ir.body) if isinstance(x, Load)}
        used |= {p.cname for p in arrays if p.written}
        lines += [f"    _ = arrayLength(&{p.cname});" for p in arrays if p.cname not in used]  # keep it in the layout
        for v in ir.locals:
            lines.append(
                f"    var {v.name}: {self.types[v.type]} = {self.const(0.0 if v.type in FLOATS else 0, v.type)};"
            )
        lines += self.block(ir.body, 1)
        block_ids = ""
        if ir.cooperative:
            block_ids = ", @builtin(local_invocation_id) gw_lid: vec3<u32>, @builtin(workgroup_id) gw_wid: vec3<u32>"
        return "\n".join(
            [
                f"// {ir.name}: generated by gpuworkbench from the Python kernel at {ir.where}",
                f"struct GwArgs {{ {', '.join(fields)} }}",
                *decls,
                *self.helpers.values(),
                "",
                f"@compute @workgroup_size({size})",
                f"fn {ir.cname}(@builtin(global_invocation_id) gw_id: vec3<u32>, "
                f"@builtin(num_workgroups) gw_groups: vec3<u32>{block_ids}) {{",
                *lines,
                "}",
                "",
            ]
        )


def wgsl_source(ir: KernelIR, block: tuple[int, ...]) -> str:
    """WGSL for the kernel with ``@workgroup_size(block)``; InvalidArgument where it needs f64 or i64."""
    return _WgslSource(ir, block).source()


# -------------------------------------------------------------------------------------------------------------- NumPy
def narrow(lanes: np.ndarray | None, cond: Any) -> np.ndarray:
    """The lanes (indices into the launch) of ``lanes`` (all when None) where ``cond`` holds."""
    cond = np.asarray(cond, dtype=bool)
    return np.flatnonzero(cond) if lanes is None else lanes[cond]


def last(value: Any) -> Any:
    """The value the last lane stores when every lane writes one element: on a GPU some lane wins; here the last."""
    value = np.asarray(value)
    return value[-1] if value.ndim else value[()]


_NUMPY_BUILTINS = {"local_id": "gw_l", "group_id": "gw_g", "group_size": "gw_b", "num_groups": "gw_ng"}


def _np_type(t: str) -> str:
    return "np.bool_" if t == "bool" else f"np.{NUMPY_TYPES[t]}"


def _tail(stmts: list) -> list:
    """``stmts`` (which nothing follows) with each return folded into if/else: what follows a return moves into the
    other branch. Raises _LoopReturn for a return inside a loop, which no branch can express."""
    out: list = []
    for k, s in enumerate(stmts):
        rest = stmts[k + 1 :]
        if isinstance(s, Return):
            return out
        if isinstance(s, If) and _first_return([s]):
            return [*out, If(s.cond, _tail(s.body + rest), _tail(s.orelse + rest), s.line)]
        if isinstance(s, For) and _first_return(s.body):
            raise _LoopReturn(_first_return(s.body))
        out.append(s)
    return out


class _LoopReturn(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


def run_block(threads: list) -> None:
    """Run one block's threads (generators) phase by phase: each runs up to its next ``gw.barrier()`` (a ``yield``)
    before any runs on, so what the block wrote before a barrier is what every thread reads after it."""
    live = threads
    while live:
        waiting = []
        for thread in live:
            try:
                next(thread)
            except StopIteration:
                continue
            waiting.append(thread)
        if waiting and len(waiting) != len(live):
            raise GpuError(
                f"{len(live) - len(waiting)} of {len(live)} threads of a block ended while the others wait at a "
                "gw.barrier(): every thread of a block must reach the same barriers"
            )
        live = waiting


def _first_return(stmts: list) -> int:
    """The line of the first return in ``stmts`` (0 when there is none)."""
    for s in stmts:
        if isinstance(s, Return):
            return s.line
        inner = s.body + s.orelse if isinstance(s, If) else s.body if isinstance(s, For) else []
        line = _first_return(inner)
        if line:
            return line
    return 0


class _NumpySource:
    """Python + NumPy for the CPU backend: vectorised over the index where the body allows, else one index at a time.

    Vectorised: each statement runs once for every index at the same time; an ``if`` whose condition differs between
    indices runs its branches on the indices it selects (``narrow``); loops must have the same bounds for every index.
    """

    def __init__(self, ir: KernelIR) -> None:
        self.ir = ir
        self.coop = ir.cooperative  # run block by block: builtins, shared arrays (one per block), barriers
        self.temps = 0
        self.uniform_locals: set[str] = set()
        self.vector = True
        self.reason = ""
        try:
            self.body = _tail(ir.body)
        except _LoopReturn as stuck:
            self.vector, self.reason = False, f"a return inside a loop (line {stuck.line})"
            self.body = ir.body
        if self.vector:
            self.find_uniform_locals()
            line = self.varying_loop(self.body)
            if line:
                self.vector, self.reason = False, f"a loop whose range differs between indices (line {line})"

    # ------------------------------------------------------------------ uniformity
    def uniform(self, x: Expr) -> bool:
        """True when ``x`` has one value for every index (it reads no index, no per-index local)."""
        if isinstance(x, Var):
            return x.role in ("scalar", "domain", "loop") or (x.role == "local" and x.name in self.uniform_locals)
        if isinstance(x, Builtin):
            return x.name in ("group_size", "num_groups")
        if isinstance(x, Load) and x.array.kind == "shared":
            return False  # one array per block
        return all(self.uniform(c) for c in expr_children(x))

    def find_uniform_locals(self) -> None:
        self.uniform_locals = {v.name for v in self.ir.locals}
        changed = True
        while changed:
            changed = False

            def visit(stmts: list, same: bool) -> None:
                nonlocal changed
                for s in stmts:
                    if isinstance(s, Assign) and s.var.name in self.uniform_locals:
                        if not (same and self.uniform(s.value)):
                            self.uniform_locals.discard(s.var.name)
                            changed = True
                    elif isinstance(s, If):
                        visit(s.body, same and self.uniform(s.cond))
                        visit(s.orelse, same and self.uniform(s.cond))
                    elif isinstance(s, For):
                        visit(s.body, same)

            visit(self.body, True)

    def varying_loop(self, stmts: list) -> int:
        for s in stmts:
            if isinstance(s, For):
                if not all(self.uniform(e) for e in (s.start, s.stop, s.step)):
                    return s.line
                line = self.varying_loop(s.body)
            elif isinstance(s, If):
                line = self.varying_loop(s.body) or self.varying_loop(s.orelse)
            else:
                line = 0
            if line:
                return line
        return 0

    # ------------------------------------------------------------------ expressions
    def const(self, value: Any, t: str) -> str:
        if t == "bool":
            return "True" if value else "False"
        if t in FLOATS and (math.isnan(value) or math.isinf(value)):
            return f'{_np_type(t)}("{value}")'
        return f"{_np_type(t)}({_float_text(value) if t in FLOATS else value})"

    def infix(self, x: Expr) -> int:
        if isinstance(x, Binary) and x.op in _ARITH and not (x.op == "//" and x.type in FLOATS):
            return _ARITH[x.op]
        return 0

    def atom(self, x: Expr, lanes: str | None, spec: bool) -> str:
        text = self.e(x, lanes, spec)
        return f"({text})" if self.infix(x) else text

    def e(self, x: Expr, lanes: str | None, spec: bool = False) -> str:
        """``x`` over ``lanes`` (None: all); ``spec``: evaluated for lanes that may not need it (a where branch)."""
        vec = self.vector and not self.uniform(x)
        if isinstance(x, Const):
            return self.const(x.value, x.type)
        if isinstance(x, Var):
            lane_var = self.vector and x.role in ("index", "local") and x.name not in self.uniform_locals
            return f"{x.name}[{lanes}]" if lane_var and lanes else x.name
        if isinstance(x, Builtin):
            name = _NUMPY_BUILTINS[x.name] + "xy"[x.axis]
            return f"{name}[{lanes}]" if self.vector and lanes and x.name in ("local_id", "group_id") else name
        if isinstance(x, Load):
            index = _bare(self.e(x.index, lanes, spec))
            if self.vector and x.array.kind == "shared":
                index = self.shared_index(x.array, x.index, lanes, spec)
            if self.vector and spec:  # a where branch reads for every lane: keep the reads inside the array
                return f"{x.array.cname}.take({index}, mode='clip')"
            return f"{x.array.cname}[{index}]"
        if isinstance(x, Unary):
            o = self.atom(x.operand, lanes, spec)
            if x.op == "not":
                return f"np.logical_not({_bare(o)})" if vec else f"(not {o})"
            return f"({'-' if x.op == 'neg' else '~'}{o})"
        if isinstance(x, Binary):
            if x.op in ("and", "or"):
                left, right = self.e(x.left, lanes, spec), self.e(x.right, lanes, True if vec else spec)
                return f"np.logical_{x.op}({_bare(left)}, {_bare(right)})" if vec else f"({left} {x.op} {right})"
            p = self.infix(x)
            left, right = self.e(x.left, lanes, spec), self.e(x.right, lanes, spec)
            if x.op not in _ARITH:
                return f"({self.atom(x.left, lanes, spec)} {x.op} {self.atom(x.right, lanes, spec)})"
            q = p or 2
            if 0 < self.infix(x.left) < q:
                left = f"({left})"
            if 0 < self.infix(x.right) <= q:
                right = f"({right})"
            if not p:  # float //: floor of the true quotient, as C and WGSL compute it
                return f"np.floor({left} / {right})"
            return f"{left} {x.op} {right}"
        if isinstance(x, Compare):
            return f"({self.e(x.left, lanes, spec)} {x.op} {self.e(x.right, lanes, spec)})"
        if isinstance(x, Select):
            cond = _bare(self.e(x.cond, lanes, spec))
            if vec:
                a, b = _bare(self.e(x.a, lanes, True)), _bare(self.e(x.b, lanes, True))
                return f"np.where({cond}, {a}, {b})"
            return f"({self.e(x.a, lanes, spec)} if {cond} else {self.e(x.b, lanes, spec)})"
        if isinstance(x, Call):
            args = ", ".join(_bare(self.e(a, lanes, spec)) for a in x.args)
            floats = x.type in FLOATS
            name = {"min": "fmin" if floats else "minimum", "max": "fmax" if floats else "maximum", "clamp": "clip"}
            return f"np.{name.get(x.func, NUMPY_NAMES.get(x.func, x.func))}({args})"
        if isinstance(x, Cast):
            return f"{_np_type(x.type)}({_bare(self.e(x.operand, lanes, spec))})"
        raise AssertionError(x)

    def shared_index(self, array: Any, index: Expr, lanes: str | None, spec: bool) -> str:
        """The element of each lane's own block's copy of a shared array (they lie one after another)."""
        block = f"gw_blk[{lanes}]" if lanes else "gw_blk"
        text = self.e(index, lanes, spec)
        return f"{block} * {int(np.prod(array.shape))} + {f'({text})' if self.infix(index) else text}"

    # ------------------------------------------------------------------ statements
    def block(self, stmts: list, depth: int, lanes: str | None) -> list[str]:
        pad = "    " * depth
        out: list[str] = []
        for s in stmts:
            if isinstance(s, Barrier):  # vectorised, every lane has run every statement above: nothing to wait for
                out.append(f"{pad}{'pass  # gw.barrier()' if self.vector else 'yield  # gw.barrier()'}")
            elif isinstance(s, Store) and self.vector and s.array.kind == "shared":
                index = self.shared_index(s.array, s.index, lanes, False)
                out.append(f"{pad}{s.array.cname}[{index}] = {_bare(self.e(s.value, lanes))}")
            elif isinstance(s, Assign):
                value = _bare(self.e(s.value, lanes))
                if self.vector and s.var.name not in self.uniform_locals:
                    out.append(f"{pad}{s.var.name}[{lanes or ':'}] = {value}")
                else:
                    out.append(f"{pad}{s.var.name} = {value}")
            elif isinstance(s, Store):
                target = f"{s.array.cname}[{_bare(self.e(s.index, lanes))}]"
                value = _bare(self.e(s.value, lanes))
                if not self.vector or not self.uniform(s.index):
                    out.append(f"{pad}{target} = {value}")
                else:  # every lane writes the same element: store once, and only if some lane is here
                    value = value if self.uniform(s.value) else f"gw_rt.last({value})"
                    out.append(f"{pad}if {lanes}.size:" if lanes else "")
                    out.append(f"{pad}{'    ' if lanes else ''}{target} = {value}")
            elif isinstance(s, Return):
                out.append(f"{pad}return")
            elif isinstance(s, If):
                out += self.branch(s, depth, lanes)
            elif isinstance(s, For):
                start, stop, step = (_bare(self.e(e, lanes)) for e in (s.start, s.stop, s.step))
                out.append(
                    f"{pad}for {s.var.name} in np.arange({start}, {stop}, {step}, dtype={_np_type(s.var.type)}):"
                )
                out += self.block(s.body, depth + 1, lanes) or [f"{pad}    pass"]
        return [line for line in out if line]

    def branch(self, s: If, depth: int, lanes: str | None) -> list[str]:
        pad = "    " * depth
        if not self.vector or self.uniform(s.cond):
            out = [
                f"{pad}if {_bare(self.e(s.cond, lanes))}:",
                *(self.block(s.body, depth + 1, lanes) or [f"{pad}    pass"]),
            ]
            if s.orelse:
                out += [f"{pad}else:", *(self.block(s.orelse, depth + 1, lanes) or [f"{pad}    pass"])]
            return out
        n = self.temps
        self.temps += 1
        out = [f"{pad}gw_c{n} = {_bare(self.e(s.cond, lanes))}"]
        if s.body:
            out.append(f"{pad}gw_then{n} = gw_rt.narrow({lanes}, gw_c{n})")
            out += self.block(s.body, depth, f"gw_then{n}")
        if s.orelse:
            out.append(f"{pad}gw_else{n} = gw_rt.narrow({lanes}, np.logical_not(gw_c{n}))")
            out += self.block(s.orelse, depth, f"gw_else{n}")
        return out

    # ------------------------------------------------------------------ the function
    def source(self) -> str:
        ir = self.ir
        names = [p.cname for p in ir.arguments] + [d.name for d in ir.domain] + (["block"] if self.coop else [])
        zero = {v.name: self.const(0.0 if v.type in FLOATS else 0, v.type) for v in ir.locals}
        head = [
            f"# {ir.name}: generated by gpuworkbench from the Python kernel at {ir.where}",
            f"# CPU strategy: {self.strategy}",
            "import numpy as np",
            "from gpuworkbench import _pykernel_emit as gw_rt",
            "",
            "",
            f"def {ir.cname}({', '.join(names)}):",
        ]
        indices = [i.name for i in ir.indices]
        axes = "xy"[: ir.ndim]
        blocks = [
            f"    gw_b{a}, gw_ng{a} = np.int32(block[{k}]), np.int32({d.name} // block[{k}])"
            for k, (a, d) in enumerate(zip(axes, ir.domain))
        ]
        if self.vector:
            lines = ["    with np.errstate(all='ignore'):"]
            if ir.ndim == 1:
                lines.append(f"        {indices[0]} = np.arange(gw_nx, dtype=np.int32)")
            else:
                lines.append(
                    f"        {indices[1]}, {indices[0]} = np.indices((gw_ny, gw_nx), dtype=np.int32).reshape(2, -1)"
                )
            if self.coop:  # every lane's block and place in it; shared arrays hold one copy per block
                lines += ["    " + b for b in blocks]
                lines += [f"        gw_l{a}, gw_g{a} = {i} % gw_b{a}, {i} // gw_b{a}" for a, i in zip(axes, indices)]
                if ir.ndim == 1:
                    lines += ["        gw_blk = gw_gx.astype(np.int64)", "        gw_nblk = int(gw_ngx)"]
                else:
                    lines += [
                        "        gw_blk = gw_gy.astype(np.int64) * int(gw_ngx) + gw_gx",
                        "        gw_nblk = int(gw_ngx) * int(gw_ngy)",
                    ]
                lines += [
                    f"        {p.cname} = np.zeros(gw_nblk * {int(np.prod(p.shape))}, dtype={_np_type(p.type)})"
                    for p in ir.shared
                ]
            for v in ir.locals:
                if v.name in self.uniform_locals:
                    lines.append(f"        {v.name} = {zero[v.name]}")
                else:
                    lines.append(f"        {v.name} = np.zeros({indices[0]}.size, dtype={_np_type(v.type)})")
            lines += self.block(self.body, 2, None) or ["        pass"]
            return "\n".join([*head, *lines, ""])
        if self.coop:
            return "\n".join([*head, *blocks, *self.block_loop(zero, indices, axes), ""])
        lines = [f"    def gw_thread({', '.join(indices)}):"]
        lines += [f"        {v.name} = {zero[v.name]}" for v in ir.locals]
        lines += self.block(self.body, 2, None) or ["        pass"]
        lines.append("    with np.errstate(all='ignore'):")
        if ir.ndim == 1:
            lines += ["        for gw_x in range(gw_nx):", "            gw_thread(np.int32(gw_x))"]
        else:
            lines += [
                "        for gw_y in range(gw_ny):",
                "            for gw_x in range(gw_nx):",
                "                gw_thread(np.int32(gw_x), np.int32(gw_y))",
            ]
        return "\n".join([*head, *lines, ""])

    def block_loop(self, zero: dict[str, str], indices: list[str], axes: str) -> list[str]:
        """Blocks one after another; in each, its threads as generators stepped from barrier to barrier."""
        ir = self.ir
        shared = [p.cname for p in ir.shared]
        params = [*indices, *(f"gw_l{a}" for a in axes), *(f"gw_g{a}" for a in axes), *shared]
        lines = [f"    def gw_thread({', '.join(params)}):"]
        lines += [f"        {v.name} = {zero[v.name]}" for v in ir.locals]
        lines += self.block(self.body, 2, None)
        lines += ["        return", "        yield  # a generator: each gw.barrier() is a yield"]
        lines.append("    with np.errstate(all='ignore'):")
        pad = "        "
        for a in reversed(axes):  # y outside x
            lines.append(f"{pad}for gw_p{a} in range(int(gw_ng{a})):")
            pad += "    "
        lines += [f"{pad}{p.cname} = np.zeros({int(np.prod(p.shape))}, dtype={_np_type(p.type)})" for p in ir.shared]
        args = [
            *(f"np.int32(gw_p{a} * gw_b{a} + gw_t{a})" for a in axes),
            *(f"np.int32(gw_t{a})" for a in axes),
            *(f"np.int32(gw_p{a})" for a in axes),
            *shared,
        ]
        loops = " ".join(f"for gw_t{a} in range(int(gw_b{a}))" for a in reversed(axes))
        lines.append(f"{pad}gw_rt.run_block([gw_thread({', '.join(args)}) {loops}])")
        return lines

    @property
    def strategy(self) -> str:
        if self.vector:
            return "vectorised: each statement runs for every index at once"
        if self.coop:
            return f"loop: block by block, each thread up to each barrier in turn, because of {self.reason}"
        return f"loop: one index at a time, because of {self.reason}"


def numpy_source(ir: KernelIR) -> tuple[str, bool, str]:
    """(Python source for the CPU backend, whether it is vectorised, why not when it is not)."""
    generator = _NumpySource(ir)
    return generator.source(), generator.vector, generator.reason
