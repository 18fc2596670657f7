"""Barriers every thread of a block must reach: the check that refuses, at decoration, a barrier some might skip."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from .ir import Assign, Barrier, Builtin, Expr, For, If, Load, Return, Var, expr_children, first_line


class Divergence:
    """Refuses barriers that some threads of a block might not reach: under an ``if`` or in a loop whose condition or
    range depends on the thread (its index, ``local_id``, array contents, or locals computed from them), or after a
    ``return`` that only some threads take. A GPU hangs or computes garbage there; WGSL refuses it outright."""

    WHY = "every thread of a block must reach the same barriers"

    def __init__(self, fail_line: Callable[[int, str], NoReturn]) -> None:
        self.fail_line = fail_line  # raises CompileError pointing at a line of the kernel
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
                    self.fail_line(s.line, f"gw.barrier() {where[-1]} depends on the thread: {self.WHY}")
                if self.returned:
                    self.fail_line(
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
                if self.returned and not before and first_line(s.body, Barrier):  # the next iteration's barriers
                    self.fail_line(
                        first_line(s.body, Barrier),
                        f"gw.barrier() in a loop with a return that only some threads take (line {self.returned}): "
                        f"{self.WHY}; guard the work with if instead of returning",
                    )
