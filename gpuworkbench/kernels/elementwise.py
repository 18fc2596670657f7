"""``gw.elementwise``: one expression over every element, compiled for every backend from one definition.

``ElementwiseKernel`` parses the parameters and statements once, generates each backend's source (``elementwise_lang``)
per device and buffer mask, and launches through a raw ``Kernel`` with a cached launch plan, so that a call with the
same buffers on the same stream is a prepared repeat.
"""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buffer import Buffer
from ..errors import CompileError, InvalidArgument
from ..streams import Event, Stream
from .c_types import C_TYPES
from .elementwise_lang import FUNCS, WGSL_GROUP, ToC, ToNumPy, c_div, c_int, wgsl_source
from .raw import Kernel

if TYPE_CHECKING:
    from ..device import Device


class ElementwiseKernel:
    """One expression, every backend: ``f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1")``.

    Call it with buffers (and numbers for scalar parameters) in declared order: ``f(x, y, stream=s)``. Parameters
    assigned to are outputs. The language is C-like arithmetic in Python syntax: ``+ - * / %``, comparisons,
    ``&`` / ``|`` / ``~`` as logical and/or/not, ``where(c, a, b)``, and sin, cos, tan, tanh, exp, log, sqrt, floor,
    ceil, pow, abs, min, max. Float constants are single precision when no parameter is float64.
    """

    def __init__(self, params: str, body: str, name: str = "elementwise") -> None:
        self.name = name
        self.params = self._parse_params(params)
        self.body = body
        self.statements = self._parse_body(body)
        self.outputs = [target for target, _ in self.statements]
        self._cache: dict[tuple[int, tuple[bool, ...]], Any] = {}
        self._lock = threading.Lock()
        # (name, dtype, is an output) per parameter, and launch plans by (device, buffer mask, length, block): the
        # kernel, grid, block and trailing arguments, worked out once per signature (the checks still run per call)
        self._spec = [(n, dt, n in self.outputs) for n, dt in self.params]
        self._plans: dict[tuple[int, int, int, Any], tuple[Kernel, tuple, tuple, list]] = {}
        #: The last call whose arguments were all Buffers: their ids, its stream and block objects, ``Buffer.frees``
        #: then, and its plan. A call with the same objects while no buffer was freed needs none of the checks again
        #: (a Buffer's dtype, length and device never change).
        self._hot: tuple | None = None
        self.source("opencl")  # checks names, operators and functions here, for every backend (the CPU's too)

    @staticmethod
    def _parse_params(params: str) -> list[tuple[str, np.dtype]]:
        parsed = []
        for part in [p.strip() for p in params.split(",") if p.strip()]:
            pieces = part.split()
            if len(pieces) != 2 or not pieces[1].isidentifier():
                raise InvalidArgument(f"elementwise parameter {part!r} must read 'dtype name', e.g. 'float32 x'")
            try:
                dt = np.dtype(pieces[0])
            except TypeError:
                raise InvalidArgument(f"elementwise parameter {part!r}: {pieces[0]!r} is not a dtype") from None
            if dt.name not in C_TYPES["cuda"]:
                raise InvalidArgument(f"elementwise parameter {part!r}: dtype {dt} is not supported on devices")
            parsed.append((pieces[1], dt))
        if not parsed:
            raise InvalidArgument("elementwise needs at least one parameter")
        names = [n for n, _ in parsed]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"elementwise parameters repeat a name: {names}")
        return parsed

    def _parse_body(self, body: str) -> list[tuple[str, ast.expr]]:
        names = {n for n, _ in self.params}
        statements = []
        for text in [s.strip() for s in re.split(r"[;\n]", body) if s.strip()]:
            text = text.replace("&&", "&").replace("||", "|")
            try:
                tree = ast.parse(text, mode="exec")
            except SyntaxError as exc:
                raise InvalidArgument(f"elementwise statement {text!r} is not valid: {exc.msg}") from None
            stmt = tree.body[0] if len(tree.body) == 1 else None
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                raise InvalidArgument(f"elementwise statement {text!r} must read 'output = expression'")
            target = stmt.targets[0].id
            if target not in names:
                raise InvalidArgument(f"elementwise statement assigns {target!r}, which is not a declared parameter")
            statements.append((target, stmt.value))
        if not statements:
            raise InvalidArgument("elementwise body assigns nothing; write e.g. 'y = 2*x + 1'")
        return statements

    # ------------------------------------------------------------------ per-backend source
    def source(self, language: str, is_array: Sequence[bool] | None = None) -> str:
        """The generated CUDA C, OpenCL C or WGSL (``language`` "cuda", "opencl", "wgsl") for the array/scalar mask."""
        mask = tuple(is_array) if is_array is not None else (True,) * len(self.params)
        if language == "wgsl":
            return wgsl_source(self.name, self.params, self.statements, mask)
        arrays = {n for (n, _), a in zip(self.params, mask) if a}
        scalars = {n for (n, _), a in zip(self.params, mask) if not a}
        float_names = {n for n, dt in self.params if dt.kind == "f"}
        floats = bool(float_names)
        float32 = floats and not any(dt == np.float64 for _, dt in self.params)
        to_c = ToC(arrays, scalars, float32, floats, float_names)
        types = C_TYPES[language]
        lines = [f"{n}[gw_i] = ({types[dict(self.params)[n].name]})({to_c.visit(e)});" for n, e in self.statements]
        index_t = "long long" if language == "cuda" else "long"
        sig = []
        for (n, dt), a in zip(self.params, mask):
            const = "const " if n not in self.outputs else ""
            if language == "cuda":
                sig.append(f"{const}{types[dt.name]}* __restrict__ {n}" if a else f"const {types[dt.name]} {n}")
            else:
                sig.append(f"__global {const}{types[dt.name]}* restrict {n}" if a else f"const {types[dt.name]} {n}")
        sig.append(f"const {index_t} gw_n")  # gw_ names cannot clash with parameters like n or i
        body = "\n".join(f"        {line}" for line in lines)
        if language == "cuda":
            return (
                f'extern "C" __global__ void {self.name}({", ".join(sig)}) {{\n'
                f"    {index_t} gw_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                f"    if (gw_i < gw_n) {{\n{body}\n    }}\n}}\n"
            )
        prelude = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if "double" in " ".join(sig) else ""
        return (
            f"{prelude}__kernel void {self.name}({', '.join(sig)}) {{\n"
            f"    {index_t} gw_i = get_global_id(0);\n"
            f"    if (gw_i < gw_n) {{\n{body}\n    }}\n}}\n"
        )

    def _numpy_callable(self, mask: tuple[bool, ...]) -> Any:
        """The CPU kernel: one Python function whose body is the statements rewritten for NumPy (C's meaning), so a
        launch costs the worker a call and the NumPy operations, not a namespace copy and an eval per statement."""
        env = {f"_np_{k}": v[2] for k, v in FUNCS.items()} | {"_np_where": np.where, "_np_fmod": np.fmod}
        env |= {"_np_logical_and": np.logical_and, "_np_logical_or": np.logical_or, "_np_logical_not": np.logical_not}
        env |= {"_c_div": c_div, "_c_int": c_int, "_gw_errstate": np.errstate}
        dtypes = {f"_gw_t_{n}": dt.type for (n, dt), a in zip(self.params, mask) if not a}
        env |= dtypes
        lines = [f"    {n} = _gw_t_{n}({n})" for (n, _), a in zip(self.params, mask) if not a]
        lines.append("    with _gw_errstate(all='ignore'):")
        for target, expr in self.statements:
            rewritten = ToNumPy().visit(ast.parse(ast.unparse(expr), mode="eval").body)
            lines.append(f"        {target}[...] = {ast.unparse(ast.fix_missing_locations(rewritten))}")
        params = ", ".join(n for n, _ in self.params)
        source = f"def _gw_kernel({params}):\n" + "\n".join(lines) + "\n"
        exec(compile(source, f"<elementwise {self.name}>", "exec"), env)  # noqa: S102 - our own generated code
        return env["_gw_kernel"]

    def _kernel_for(self, device: Device, mask: tuple[bool, ...]) -> Any:
        key = (id(device), mask)
        with self._lock:
            kernel = self._cache.get(key)
            if kernel is None:
                language = device.caps.kernel_language
                if language == "python":
                    src: Any = self._numpy_callable(mask)
                elif language in ("cuda", "opencl", "wgsl"):
                    src = self.source(language, mask)
                else:
                    raise InvalidArgument(f"elementwise has no code generator for {language!r} kernels yet")
                try:
                    kernel = device.compile(src, self.name)
                except CompileError as exc:  # our generator produced bad code: show it, it is our bug
                    raise CompileError(self.name, f"generated code failed to compile: {exc.log}", exc.source) from None
                kernel.declared_shared = 0  # one thread per element, nothing shared
                self._cache[key] = kernel
            return kernel

    def __call__(self, *args: Any, stream: Stream | None = None, block: int = 256, name: str | None = None) -> Event:
        """Enqueue the expression over every element on ``stream`` (traced as ``name``, default the kernel's name).
        Non-blocking; returns an Event."""
        hot = self._hot
        if hot is not None and stream is hot[1] and block is hot[2] and hot[3] == Buffer.frees:
            if tuple(map(id, args)) == hot[0]:
                kernel, grid, block_t, tail = hot[4]
                return kernel(grid, block_t, [*args, *tail], stream, name)
        spec = self._spec
        if len(args) != len(spec):
            raise InvalidArgument(f"{self.name} takes {len(spec)} arguments ({self._sig()}), got {len(args)}")
        frees = Buffer.frees  # before the checks: a buffer freed after them must not pass as checked
        device: Any = None
        n = mask = 0
        bit = 1
        scalar_output = None
        values: list[Any] = []
        for a, (pname, dt, output) in zip(args, spec):
            if isinstance(a, Buffer):
                if a.dtype is not dt and a.dtype != dt:
                    raise InvalidArgument(f"{self.name}: parameter {pname!r} is {dt}, buffer holds {a.dtype}")
                if device is None:
                    device, n = a.device, a.length
                elif a.length != n:
                    raise InvalidArgument(f"{self.name}: buffers differ in length ({n} and {a.length} for {pname!r})")
                elif a.device is not device:
                    raise InvalidArgument(f"{self.name}: buffers are on different devices")
                mask |= bit
                values.append(a)
            elif output:
                scalar_output = scalar_output or (pname, a)
            else:
                try:
                    values.append(dt.type(a))
                except (TypeError, ValueError, OverflowError):
                    raise InvalidArgument(
                        f"{self.name}: parameter {pname!r} is {dt}, got {type(a).__name__} {a!r}"
                    ) from None
            bit <<= 1
        if device is None:
            raise InvalidArgument(f"{self.name} needs at least one buffer argument")
        if scalar_output is not None:
            pname, a = scalar_output
            raise InvalidArgument(f"{self.name}: output {pname!r} must be a Buffer, not {type(a).__name__}")
        given = stream
        if stream is None:
            stream = device.default_stream
        elif not isinstance(stream, Stream) or stream.device is not device:
            where = f"on {stream.device.spec}" if isinstance(stream, Stream) else f"a {type(stream).__name__}"
            raise InvalidArgument(f"{self.name}: stream must be a Stream of {device.spec}, got {where}")
        if n == 0:
            return stream.record()
        plan = self._plans.get((id(device), mask, n, block)) if type(block) is int else None
        if plan is None:
            plan = self._plan(device, mask, n, block)
        kernel, grid, block_t, tail = plan
        if mask == (1 << len(spec)) - 1:  # only Buffers: the next call with these needs no checks
            self._hot = (tuple(map(id, args)), given, block, frees, plan)
        if tail:
            values += tail
        # Through the Kernel's call: the plan's grid, block and tail are the same objects every time, so a call with
        # the same buffers and stream is a repeat, launched prepared (the checks it repeats are a few attribute reads)
        return kernel(grid, block_t, values, stream, name)

    def _plan(self, device: Device, mask: int, n: int, block: Any) -> tuple[Kernel, tuple, tuple, list]:
        """Compile (once per device and buffer mask) and work out the launch of ``n`` elements; cached."""
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
            raise InvalidArgument(f"{self.name}: block must be a positive int, got {block!r}")
        key = (id(device), mask, n, block)
        kernel = self._kernel_for(device, tuple(bool(mask >> i & 1) for i in range(len(self.params))))
        language = device.caps.kernel_language
        if language == "python":
            plan: tuple[Kernel, tuple, tuple, list] = (kernel, (1,), (1,), [])
        elif language == "wgsl":  # the count is a u32; the workgroup size is fixed in the source
            groups = -(-n // WGSL_GROUP)
            plan = (kernel, (min(groups, 65535), -(-groups // 65535)), (WGSL_GROUP,), [np.uint32(n)])
        else:
            block = int(block)
            plan = (kernel, ((n + block - 1) // block,), (block,), [np.int64(n)])
        if len(self._plans) >= 256:  # many sizes: start over rather than grow without bound
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def _sig(self) -> str:
        return ", ".join(f"{dt} {n}" for n, dt in self.params)

    def __repr__(self) -> str:
        return f"<elementwise {self.name}({self._sig()}): {self.body!r}>"


def elementwise(params: str, body: str, name: str = "elementwise") -> ElementwiseKernel:
    """One C-like expression compiled for CUDA and OpenCL and evaluated with NumPy on the CPU."""
    return ElementwiseKernel(params, body, name)
