"""Typed kernel tree → CUDA C or OpenCL C (the two dialects differ in qualifiers, type names and float functions).

The generator only spells what the tree says: every conversion is already explicit there. Python's meaning of ``//``
and ``%`` (floor, the sign of the divisor) comes from small helper functions written into the source where used.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..kernels import c_types
from . import ir as node
from .ktypes import FLOATS, HALVES, NUMPY_TYPES, SCALAR_TYPES
from .spelling import ARITH, bare, float_text

# 16-bit floats are held as their bits (an unsigned short) and converted to and from f32 by helpers written into the
# source: no header (NVRTC finds cuda_fp16.h only where the toolkit's headers are on its path), and OpenCL C needs no
# cl_khr_fp16 for vload_half / vstore_half.
C_TYPES = {
    lang: {t: c_types.C_TYPES[lang][NUMPY_TYPES[t]] for t in SCALAR_TYPES if t not in HALVES}
    | {"bool": "bool", "isize": c_types.C_TYPES[lang]["int64"]}
    | dict.fromkeys(HALVES, c_types.C_TYPES[lang]["uint16"])
    for lang in ("cuda", "opencl")
}
# (dialect, from, to) -> the helper's body; ``h`` is the 16-bit pattern, ``f`` the float
_HALF_HELPERS = {
    ("cuda", "f16", "f32"): 'float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;',
    ("cuda", "f32", "f16"): 'unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;',
    ("opencl", "f16", "f32"): "return vload_half(0, (const __private half*)&h);",
    ("opencl", "f32", "f16"): "ushort h; vstore_half_rte(f, 0, (__private half*)&h); return h;",
    ("cuda", "bf16", "f32"): "return __uint_as_float(((unsigned int)h) << 16);",
    ("opencl", "bf16", "f32"): "return as_float(((uint)h) << 16);",
    # round to nearest even; a NaN stays a (quiet) NaN
    # (sm_80 and later have the instruction; HIP and older GPUs take the arithmetic)
    ("cuda", "f32", "bf16"): "\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
    'unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;\n#else\n'
    "unsigned int u = __float_as_uint(f); return (unsigned short)((u & 0x7fffffffu) > "
    "0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n#endif\n",
    ("opencl", "f32", "bf16"): "uint u = as_uint(f); return (ushort)((u & 0x7fffffffu) > 0x7f800000u ? "
    "(u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);",
}
_CUDA_BUILTINS = {"local_id": "threadIdx", "group_id": "blockIdx", "group_size": "blockDim", "num_groups": "gridDim"}
_OPENCL_BUILTINS = {
    "local_id": "get_local_id",
    "group_id": "get_group_id",
    "group_size": "get_local_size",
    "num_groups": "get_num_groups",
}


def _simple(e: node.Expr) -> bool:
    """True for values that cannot change while a loop runs (literals, parameters, indices, outer loop variables)."""
    return isinstance(e, node.Const) or (isinstance(e, node.Var) and e.role != "local")


class CSource:
    """CUDA C or OpenCL C for one kernel; the two differ in qualifiers, type names and float function names."""

    def __init__(self, ir: node.KernelIR, dialect: str) -> None:
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
            text = float_text(value) + suffix
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

    def convert(self, x: node.Cast) -> str:
        """A conversion between f32 and a 16-bit float (its bits), through a helper written into the source."""
        src, dst = x.operand.type, x.type
        name = f"gw_{src}_to_{dst}"
        if ("convert", name) not in self.helpers:
            q = "static __device__ __forceinline__" if self.dialect == "cuda" else "static inline"
            param = f"{self.types[src]} {'h' if src in HALVES else 'f'}"
            body = _HALF_HELPERS[(self.dialect, src, dst)]
            self.helpers[("convert", name)] = f"{q} {self.types[dst]} {name}({param}) {{ {body} }}"
        return f"{name}({bare(self.e(x.operand))})"

    def divides_infix(self, x: node.Binary) -> bool:
        """Whether ``//`` or ``%`` is C's own operator here (unsigned: floor and truncation agree)."""
        return x.type == "u32"

    def infix(self, x: node.Expr) -> int:
        """The precedence ``e(x)`` prints at: 2 for * / %, 1 for + -, 0 for text that is already one operand."""
        if isinstance(x, node.Binary) and x.op in ARITH and (x.op not in ("//", "%") or self.divides_infix(x)):
            return ARITH[x.op]
        return 0

    def atom(self, x: node.Expr) -> str:
        text = self.e(x)
        return f"({text})" if self.infix(x) else text

    def arith(self, x: node.Binary, op: str) -> str:
        """``left op right`` with the parentheses precedence needs and evaluation order keeps (a - (b + c))."""
        p = self.infix(x)
        left, right = self.e(x.left), self.e(x.right)
        if 0 < self.infix(x.left) < p:
            left = f"({left})"
        if 0 < self.infix(x.right) <= p:
            right = f"({right})"
        return f"{left} {op} {right}"

    def e(self, x: node.Expr) -> str:
        if isinstance(x, node.Const):
            return self.const(x.value, x.type)
        if isinstance(x, node.Var):
            return x.name
        if isinstance(x, node.Load):
            return f"{x.array.cname}[{bare(self.e(x.index))}]"
        if isinstance(x, node.Unary):
            sign = {"neg": "-", "not": "!", "invert": "~"}[x.op]
            return f"({sign}{self.atom(x.operand)})"
        if isinstance(x, node.Binary):
            if x.op in ARITH and self.infix(x):
                return self.arith(x, "/" if x.op == "//" else x.op)
            if x.op in ("//", "%"):
                if x.op == "//" and x.type in FLOATS:
                    return f"{self.function('floor', x.type)}({self.arith(x, '/')})"
                kind = "floordiv" if x.op == "//" else "mod"
                return f"{self.helper(kind, x.type)}({bare(self.e(x.left))}, {bare(self.e(x.right))})"
            op = {"and": "&&", "or": "||"}.get(x.op, x.op)
            return f"({self.atom(x.left)} {op} {self.atom(x.right)})"
        if isinstance(x, node.Compare):
            return f"({self.e(x.left)} {x.op} {self.e(x.right)})"
        if isinstance(x, node.Select):
            return f"({bare(self.e(x.cond))} ? {self.e(x.a)} : {self.e(x.b)})"
        if isinstance(x, node.Call):
            return f"{self.function(x.func, x.type)}({', '.join(bare(self.e(a)) for a in x.args)})"
        if isinstance(x, node.Cast):
            if x.type in HALVES or x.operand.type in HALVES:
                return self.convert(x)
            return f"({self.types[x.type]}){self.atom(x.operand)}"
        if isinstance(x, node.Builtin):
            if self.dialect == "cuda":
                return f"((int){_CUDA_BUILTINS[x.name]}.{'xy'[x.axis]})"
            return f"((int){_OPENCL_BUILTINS[x.name]}({x.axis}))"
        raise AssertionError(x)

    # ------------------------------------------------------------------ statements
    def block(self, stmts: list, depth: int) -> list[str]:
        pad = "    " * depth
        out: list[str] = []
        for s in stmts:
            if isinstance(s, node.Assign):
                out.append(f"{pad}{s.var.name} = {bare(self.e(s.value))};")
            elif isinstance(s, node.Store):
                out.append(f"{pad}{s.array.cname}[{bare(self.e(s.index))}] = {bare(self.e(s.value))};")
            elif isinstance(s, node.Return):
                out.append(f"{pad}return;")
            elif isinstance(s, node.Barrier):
                out.append(pad + self.barrier())
            elif isinstance(s, node.If):
                out.append(f"{pad}if ({bare(self.e(s.cond))}) {{")
                out += self.block(s.body, depth + 1)
                orelse = s.orelse
                while len(orelse) == 1 and isinstance(orelse[0], node.If):  # elif
                    out.append(f"{pad}}} else if ({bare(self.e(orelse[0].cond))}) {{")
                    out += self.block(orelse[0].body, depth + 1)
                    orelse = orelse[0].orelse
                if orelse:
                    out.append(f"{pad}}} else {{")
                    out += self.block(orelse, depth + 1)
                out.append(f"{pad}}}")
            elif isinstance(s, node.For):
                out += self.loop(s, depth)
        return out

    def loop(self, s: node.For, depth: int) -> list[str]:
        """``for k in range(start, stop, step)``; stop and step are evaluated once, as range() does."""
        pad, k = "    " * depth, s.var.name
        temps, bounds = [], []
        for e, what in ((s.stop, "stop"), (s.step, "step")):
            if _simple(e):
                bounds.append(self.atom(e))
            else:
                name = f"gw_{what}{self.temps}"
                self.temps += 1
                temps.append(self.constant_decl(name, s.var.type, bare(self.e(e))))
                bounds.append(name)
        stop, step = bounds
        if isinstance(s.step, node.Const):
            cond = f"{k} {'<' if s.step.value > 0 else '>'} {stop}"
        else:
            cond = self.either(f"{step} > {self.const(0, s.var.type)}", f"{k} < {stop}", f"{k} > {stop}")
        head = f"for ({self.loop_decl(k, s.var.type)} = {bare(self.e(s.start))}; {cond}; {k} += {step}) {{"
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
                restrict = (" __restrict__" if cuda else " restrict") if ir.distinct else ""
                space = "" if cuda else "__global "
                params.append(f"{space}{const}{ct}*{restrict} {p.cname}")
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
        if cuda and ir.bounds is not None:  # HIP's second bound counts something else: bounded on CUDA alone
            head = f'extern "C" __global__ void GW_BOUNDS {ir.cname}'
            prelude += ["#if defined(__HIP__) || defined(__HIPCC__)", "#define GW_BOUNDS", "#else",
                        "#define GW_BOUNDS __launch_bounds__({}, {})".format(*ir.bounds), "#endif"]  # fmt: skip
        if not cuda and "f64" in ir.types_used:
            prelude.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        prelude += self.helpers.values()
        return "\n".join([*prelude, f"{head}({', '.join(params)}) {{", *lines, "}", ""])


def c_source(ir: node.KernelIR, dialect: str) -> str:
    """CUDA C (``dialect`` "cuda") or OpenCL C ("opencl") for the kernel."""
    return CSource(ir, dialect).source()
