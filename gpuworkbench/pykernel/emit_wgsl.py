"""Typed kernel tree → WGSL for WebGPU: the C generator's walk, with WGSL's words, types and explicit conversions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .emit_c import CSource
from .ir import Binary, Builtin, Call, Cast, Expr, KernelIR, Load, Select, Unary, Var, walk_exprs
from .ktypes import FLOATS
from .spelling import bare, float_text

WGSL_TYPES = {"f32": "f32", "f16": "f16", "i32": "i32", "u32": "u32", "bool": "bool", "isize": "i32"}


class WgslSource(CSource):
    """WGSL for one kernel: buffers bound to group 0 in argument order, scalars in one uniform struct after them."""

    def __init__(self, ir: KernelIR, block: tuple[int, ...]) -> None:
        wide = sorted({"f64", "i64", "bf16"} & ir.types_used)
        if wide:
            raise InvalidArgument(
                f"kernel {ir.name!r} uses {' and '.join(wide)}; WebGPU (WGSL) has f32, i32, u32 and (where the "
                "adapter has shader-f16) f16 only"
            )
        self.ir, self.block_shape, self.types = ir, block, WGSL_TYPES
        self.helpers, self.temps, self.dialect = {}, 0, "wgsl"

    def const(self, value: Any, t: str) -> str:
        if t == "bool":
            return "true" if value else "false"
        if t == "f16":  # only a local's starting zero: other 16-bit values are conversions from f32
            return "0.0h"
        if t == "f32":
            if math.isnan(value) or math.isinf(value):
                bits = "0x7fc00000u" if math.isnan(value) else "0xff800000u" if value < 0 else "0x7f800000u"
                return f"bitcast<f32>({bits})"
            text = float_text(value) + "f"
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
            right = self.atom(x.right) if x.right.type == "u32" else f"u32({bare(self.e(x.right))})"
            return f"({self.atom(x.left)} {x.op} {right})"
        if isinstance(x, Select):  # comparisons keep their parentheses: f(a < b, c > d) would read as a template
            return f"select({self.e(x.b)}, {self.e(x.a)}, {self.e(x.cond)})"
        if isinstance(x, Call) and x.func == "log10":
            return f"(log({bare(self.e(x.args[0]))}) * 0.4342944819032518f)"
        if isinstance(x, Builtin):
            return self.builtin(x)
        if isinstance(x, Cast):
            if self.types[x.type] == self.types[x.operand.type]:  # isize is i32 here: no cast, but still one operand
                return self.atom(x.operand)
            return f"{self.types[x.type]}({bare(self.e(x.operand))})"
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
                *(["enable f16;"] if "f16" in ir.types_used else []),
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
    return WgslSource(ir, block).source()
