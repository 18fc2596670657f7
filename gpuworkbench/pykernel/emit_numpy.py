"""Typed kernel tree → Python + NumPy for the CPU backend: vectorised over the index where the body allows.

Vectorised, each statement runs once for every index; otherwise (a loop whose range differs between indices, a return
inside a loop) the source loops over the indices, and cooperative kernels run block by block, each thread a generator
stepped from barrier to barrier. The generated source calls ``cpu_runtime``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .ir import (
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
    first_line,
)
from .ktypes import FLOATS, NUMPY_TYPES
from .names import NUMPY_NAMES
from .spelling import ARITH, bare, float_text

_NUMPY_BUILTINS = {"local_id": "gw_l", "group_id": "gw_g", "group_size": "gw_b", "num_groups": "gw_ng"}


def _np_type(t: str) -> str:
    if t == "bf16":  # NumPy has none: ml_dtypes' (cpu_runtime.bfloat16)
        return "gw_rt.bfloat16"
    return "np.bool_" if t == "bool" else f"np.{NUMPY_TYPES[t]}"


def _tail(stmts: list) -> list:
    """``stmts`` (which nothing follows) with each return folded into if/else: what follows a return moves into the
    other branch. Raises _LoopReturn for a return inside a loop, which no branch can express."""
    out: list = []
    for k, s in enumerate(stmts):
        rest = stmts[k + 1 :]
        if isinstance(s, Return):
            return out
        if isinstance(s, If) and first_line([s], Return):
            return [*out, If(s.cond, _tail(s.body + rest), _tail(s.orelse + rest), s.line)]
        if isinstance(s, For) and first_line(s.body, Return):
            raise _LoopReturn(first_line(s.body, Return))
        out.append(s)
    return out


class _LoopReturn(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class NumpySource:
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
        return f"{_np_type(t)}({float_text(value) if t in FLOATS else value})"

    def infix(self, x: Expr) -> int:
        if isinstance(x, Binary) and x.op in ARITH and not (x.op == "//" and x.type in FLOATS):
            return ARITH[x.op]
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
            index = bare(self.e(x.index, lanes, spec))
            if self.vector and x.array.kind == "shared":
                index = self.shared_index(x.array, x.index, lanes, spec)
            if self.vector and spec:  # a where branch reads for every lane: keep the reads inside the array
                return f"{x.array.cname}.take({index}, mode='clip')"
            return f"{x.array.cname}[{index}]"
        if isinstance(x, Unary):
            o = self.atom(x.operand, lanes, spec)
            if x.op == "not":
                return f"np.logical_not({bare(o)})" if vec else f"(not {o})"
            return f"({'-' if x.op == 'neg' else '~'}{o})"
        if isinstance(x, Binary):
            if x.op in ("and", "or"):
                left, right = self.e(x.left, lanes, spec), self.e(x.right, lanes, True if vec else spec)
                return f"np.logical_{x.op}({bare(left)}, {bare(right)})" if vec else f"({left} {x.op} {right})"
            p = self.infix(x)
            left, right = self.e(x.left, lanes, spec), self.e(x.right, lanes, spec)
            if x.op not in ARITH:
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
            cond = bare(self.e(x.cond, lanes, spec))
            if vec:
                a, b = bare(self.e(x.a, lanes, True)), bare(self.e(x.b, lanes, True))
                return f"np.where({cond}, {a}, {b})"
            return f"({self.e(x.a, lanes, spec)} if {cond} else {self.e(x.b, lanes, spec)})"
        if isinstance(x, Call):
            args = ", ".join(bare(self.e(a, lanes, spec)) for a in x.args)
            floats = x.type in FLOATS
            name = {"min": "fmin" if floats else "minimum", "max": "fmax" if floats else "maximum", "clamp": "clip"}
            return f"np.{name.get(x.func, NUMPY_NAMES.get(x.func, x.func))}({args})"
        if isinstance(x, Cast):
            return f"{_np_type(x.type)}({bare(self.e(x.operand, lanes, spec))})"
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
                out.append(f"{pad}{s.array.cname}[{index}] = {bare(self.e(s.value, lanes))}")
            elif isinstance(s, Assign):
                value = bare(self.e(s.value, lanes))
                if self.vector and s.var.name not in self.uniform_locals:
                    out.append(f"{pad}{s.var.name}[{lanes or ':'}] = {value}")
                else:
                    out.append(f"{pad}{s.var.name} = {value}")
            elif isinstance(s, Store):
                target = f"{s.array.cname}[{bare(self.e(s.index, lanes))}]"
                value = bare(self.e(s.value, lanes))
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
                start, stop, step = (bare(self.e(e, lanes)) for e in (s.start, s.stop, s.step))
                out.append(
                    f"{pad}for {s.var.name} in np.arange({start}, {stop}, {step}, dtype={_np_type(s.var.type)}):"
                )
                out += self.block(s.body, depth + 1, lanes) or [f"{pad}    pass"]
        return [line for line in out if line]

    def branch(self, s: If, depth: int, lanes: str | None) -> list[str]:
        pad = "    " * depth
        if not self.vector or self.uniform(s.cond):
            out = [
                f"{pad}if {bare(self.e(s.cond, lanes))}:",
                *(self.block(s.body, depth + 1, lanes) or [f"{pad}    pass"]),
            ]
            if s.orelse:
                out += [f"{pad}else:", *(self.block(s.orelse, depth + 1, lanes) or [f"{pad}    pass"])]
            return out
        n = self.temps
        self.temps += 1
        out = [f"{pad}gw_c{n} = {bare(self.e(s.cond, lanes))}"]
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
            "from gpuworkbench.pykernel import cpu_runtime as gw_rt",
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
    generator = NumpySource(ir)
    return generator.source(), generator.vector, generator.reason
