"""``PythonKernel``: a translated function compiled per device on first launch, and ``kernel``, its decorator.

Launching checks the arguments against the signature, picks the grid for the launch shape, and runs the compiled
``Kernel`` (see the package's docstring for the language itself).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buffer import Buffer
from ..errors import CompileError, InvalidArgument
from ..kernels.raw import Kernel, launch_dims
from ..streams import Event, Stream
from .emit_c import c_source
from .emit_numpy import numpy_source
from .emit_wgsl import wgsl_source
from .ir import KernelIR, Param
from .ktypes import NUMPY_TYPES, numpy_dtype
from .statements import translate

if TYPE_CHECKING:
    from ..device import Device

_BLOCK = {1: (256,), 2: (16, 16)}  # threads per block (workgroup) when launch() chooses
_WGSL_MAX_GROUPS = 65535  # WebGPU's guaranteed workgroups per grid dimension; 1-D grids spill into y
_LANGUAGES = {"cuda": "cuda", "rocm": "cuda", "opencl": "opencl", "wgsl": "wgsl", "numpy": "python", "python": "python"}


class PythonKernel:
    """A Python function compiled for whichever device its buffers live on: ``k.launch(shape, *args)``.

    Compiles lazily, once per device (and per workgroup size on WebGPU), through ``Device.compile``; launches appear
    in traces under the function's name."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        block: Sequence[int] | int | None = None,
        distinct: bool = False,
        min_blocks: int | None = None,
    ) -> None:
        self.ir: KernelIR = translate(fn, name)
        self.ir.distinct = distinct
        functools.update_wrapper(self, fn)  # __name__, __doc__, __wrapped__ as the function's
        self.name = self.ir.name
        self.cooperative = self.ir.cooperative  # shared arrays, barriers or block indices: launches cover whole blocks
        self.block: tuple[int, ...] = _BLOCK[self.ir.ndim]
        self.block = self._block(block)  # the block launches use unless given one
        if min_blocks is not None:
            if type(min_blocks) is not int or min_blocks < 1:
                raise InvalidArgument(f"{self.name}: min_blocks must be a positive int, not {min_blocks!r}")
            self.ir.bounds = (math.prod(self.block), min_blocks)
        self._numpy, vectorised, reason = numpy_source(self.ir)
        self.cpu_strategy = "vectorised" if vectorised else "loop"
        self.cpu_strategy_reason = reason  # why the CPU backend loops over the index ("" when vectorised)
        self._cache: dict[tuple[int, tuple[int, ...] | None], Kernel] = {}
        self._launches: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # launches seen, for repeats (see launch)
        self._fits: set[tuple[Any, ...]] = set()  # (id(device), its kind, block) found to fit the device
        self._grids: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[int, ...], list[np.int32]]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ source and compilation
    def source(self, language: str = "cuda", block: Sequence[int] | int | None = None) -> str:
        """The generated source: "cuda" (ROCm's HIP too), "opencl", "wgsl" (for workgroup size ``block``) or "numpy".

        Pure text generation: compiles nothing and needs no device."""
        lang = _LANGUAGES.get(language)
        if lang is None:
            raise InvalidArgument(f"source language {language!r} is not one of {', '.join(_LANGUAGES)}")
        if lang == "python":
            return self._numpy
        if lang == "wgsl":
            return wgsl_source(self.ir, self._block(block))
        return c_source(self.ir, lang)

    def compile(self, device: Device, block: Sequence[int] | int | None = None) -> Kernel:
        """The kernel built for ``device`` (cached; on WebGPU one per workgroup size). Blocks while compiling."""
        language = device.caps.kernel_language
        key = (id(device), self._block(block) if language == "wgsl" else None)
        with self._lock:
            kernel = self._cache.get(key)
            if kernel is not None and kernel.device is device and not device.closed:
                return kernel
            check_types(device, self.ir.types_used, self.name)
            if language == "python":
                src = self._numpy
            elif language == "wgsl":
                src = wgsl_source(self.ir, key[1] or self.block)
            elif language in ("cuda", "opencl"):
                src = c_source(self.ir, language)
            else:
                raise InvalidArgument(f"@gw.kernel has no code generator for {language!r} kernels")
            try:
                kernel = device.compile(src, self.ir.cname)
            except CompileError as exc:  # our generator wrote code the compiler refuses: our bug, shown with the code
                raise CompileError(self.name, f"generated code failed to compile: {exc.log}", exc.source) from None
            kernel.declared_shared = self.ir.shared_bytes  # what traces report where the backend does not say
            self._cache[key] = kernel
            return kernel

    def _block(self, block: Sequence[int] | int | None) -> tuple[int, ...]:
        if block is None:
            return self.block
        dims = launch_dims(block, "block")
        if len(dims) != self.ir.ndim:
            raise InvalidArgument(
                f"{self.name} is a {self.ir.ndim}-D kernel; block {block!r} must have "
                f"{self.ir.ndim} dimension{'s' if self.ir.ndim > 1 else ''}"
            )
        return dims

    # ------------------------------------------------------------------ launching
    def launch(
        self,
        shape: int | Sequence[int],
        *args: Any,
        stream: Stream | None = None,
        block: Sequence[int] | int | None = None,
        nbytes: int = 0,
    ) -> Event:
        """Run the body once per index of ``shape`` (``n``, or NumPy's ``(rows, cols)`` for 2-D) on ``stream``.

        ``block`` (threads per block, x first) defaults to the kernel's; a cooperative kernel's ``shape`` must be a
        multiple of it; ``nbytes`` (what the launch reads and writes, where known) goes to the trace's ``bytes``.
        Non-blocking; returns an Event."""
        # A launch like an earlier one (the same shape, block, stream, buffers and scalar values) skips the checks and
        # goes straight to the compiled Kernel with the arguments it converted then. Buffers are not kept: the entry
        # holds while Buffer.frees is unchanged (a Buffer dies only through free, which counts), as Kernel's own do.
        try:
            key = (shape if type(shape) is int else tuple(shape), id(stream), block if block is None or type(block)
                   is int else tuple(block), *[id(a) if type(a) is Buffer else (type(a), a) for a in args])  # fmt: skip
            hit = self._launches.get(key)
        except TypeError:  # an unhashable argument: the full path says what is wrong
            key = hit = None
        if hit is not None and hit[0] == Buffer.frees:
            _, on, kernel, grid, threads, template, positions = hit
            values = template.copy()
            for i in positions:
                values[i] = args[i]
            return kernel(grid, threads, values, stream=on, name=self.name, nbytes=nbytes)
        frees = Buffer.frees  # before the checks: a buffer freed during them makes the entry stale
        dims = _shape(shape, self.ir.ndim, self.name)
        nx, ny = (dims[0], 1) if self.ir.ndim == 1 else (dims[1], dims[0])
        threads = self._block(block)
        if self.cooperative and (nx % threads[0] or (self.ir.ndim == 2 and ny % threads[1])):
            spell = f"{nx}" if self.ir.ndim == 1 else f"{ny} × {nx} (rows × cols)"
            block_spell = f"{threads[0]}" if self.ir.ndim == 1 else f"{threads[1]} × {threads[0]}"
            up = f"{-(-nx // threads[0]) * threads[0]}"
            if self.ir.ndim == 2:
                up = f"({-(-ny // threads[1]) * threads[1]}, {up})"
            raise InvalidArgument(
                f"{self.name} is a cooperative kernel (shared arrays, barriers or block indices): its launch shape "
                f"{spell} must be a multiple of the block {block_spell}; launch {up} and guard the extra threads "
                f"with if"
            )
        device, stream, values = self._prepare(args, stream, nx, ny)
        if nx * ny == 0:
            return stream.record()
        language = device.caps.kernel_language
        shape_key = (nx, ny, threads, language)
        found = self._grids.get(shape_key)
        if found is None:  # kept, so that a repeated launch passes the same grid and extents objects: Kernel.__call__
            # then knows it for a repeat and skips its checks
            if language == "python":
                grid: tuple[int, ...] = (1,) * self.ir.ndim
            elif self.ir.ndim == 1:
                groups = -(-nx // threads[0])
                grid = (groups,)
                if language == "wgsl" and groups > _WGSL_MAX_GROUPS:
                    grid = (_WGSL_MAX_GROUPS, -(-groups // _WGSL_MAX_GROUPS))
            else:
                grid = (-(-nx // threads[0]), -(-ny // threads[1]))
            if len(self._grids) >= 256:
                self._grids.clear()
            found = self._grids[shape_key] = (grid, threads, [np.int32(nx), np.int32(ny)][: self.ir.ndim])
        grid, threads, extents = found
        event = self._run(device, stream, grid, threads, values, extents, nbytes)
        if key is not None and stream.capturing is None:
            if len(self._launches) >= 256:
                self._launches.clear()
            positions = tuple(i for i, a in enumerate(values) if type(a) is Buffer)
            template = [None if type(a) is Buffer else a for a in values] + extents
            self._launches[key] = (frees, stream, self.compile(device, threads), grid, threads, template, positions)
        return event

    def __call__(
        self, grid: Sequence[int] | int, block: Sequence[int] | int, args: Sequence[Any], stream: Stream | None = None
    ) -> Event:
        """Run with an explicit ``grid`` of ``block``-sized blocks (x first): the index runs over grid × block.

        On WebGPU ``block`` is the workgroup size (built once per size). Non-blocking; returns an Event."""
        if not isinstance(args, (tuple, list)):
            raise InvalidArgument(f"{self.name}: args must be a tuple or list")
        grid_t, block_t = launch_dims(grid, "grid"), self._block(block)
        if len(grid_t) != self.ir.ndim:
            raise InvalidArgument(
                f"{self.name} is a {self.ir.ndim}-D kernel; grid {grid!r} must have "
                f"{self.ir.ndim} dimension{'s' if self.ir.ndim > 1 else ''}"
            )
        nx = grid_t[0] * block_t[0]
        ny = grid_t[1] * block_t[1] if self.ir.ndim == 2 else 1
        device, stream, values = self._prepare(args, stream, nx, ny)
        return self._run(device, stream, grid_t, block_t, values, [np.int32(nx), np.int32(ny)][: self.ir.ndim])

    def _run(
        self,
        device: Device,
        stream: Stream,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        values: list[Any],
        extents: list[np.int32],
        nbytes: int = 0,
    ) -> Event:
        self._check_block(device, block)
        kernel = self.compile(device, block)
        return kernel(grid, block, [*values, *extents], stream=stream, name=self.name, nbytes=nbytes)

    def _check_block(self, device: Device, block: tuple[int, ...]) -> None:
        """InvalidArgument for a block larger than ``device`` runs: threads in all, per axis, shared bytes. A block
        that fits is remembered per device: the launch path checks it once."""
        key = (id(device), device.backend_kind, block)  # the kind too: a later device may reuse a closed one's id
        if key in self._fits:
            return
        limits = device.backend_device.kernel_limits()
        threads = math.prod(block)
        where = f"{device.spec} ({device.name})"
        if self.ir.bounds is not None and threads > self.ir.bounds[0]:
            raise InvalidArgument(
                f"{self.name}: block {block} has {threads} threads; the kernel is built for blocks of at most "
                f"{self.ir.bounds[0]} (min_blocks={self.ir.bounds[1]} bounds its registers for its own block)"
            )
        if threads > limits.threads:
            raise InvalidArgument(
                f"{self.name}: block {block} has {threads} threads; {where} runs at most {limits.threads} per block"
            )
        for axis, (b, most) in enumerate(zip(block, limits.dims)):
            if b > most:
                raise InvalidArgument(
                    f"{self.name}: block {block} has {b} threads along {'xyz'[axis]}; {where} runs at most {most}"
                )
        if self.ir.shared_bytes > limits.shared_bytes:
            raise InvalidArgument(
                f"{self.name}: its shared arrays take {self.ir.shared_bytes} B per block; {where} has "
                f"{limits.shared_bytes} B of shared memory per block"
            )
        if len(self._fits) >= 256:
            self._fits.clear()
        self._fits.add(key)

    def _prepare(
        self, args: Sequence[Any], stream: Stream | None, nx: int, ny: int
    ) -> tuple[Device, Stream, list[Any]]:
        """Check the arguments against the signature; the device, the stream and the values to pass."""
        params = self.ir.arguments
        if len(args) != len(params):
            raise InvalidArgument(f"{self.name} takes {len(params)} arguments ({self._signature()}), got {len(args)}")
        if max(nx, ny) >= 2**31:
            raise InvalidArgument(f"{self.name}: {nx} × {ny} indices; each extent must be below 2**31")
        values: list[Any] = []
        device = None
        for p, a in zip(params, args):
            if p.kind == "array":
                if not isinstance(a, Buffer):
                    raise InvalidArgument(
                        f"{self.name}: argument {p.name!r} is an array ({p.annotation!r}); pass a Buffer, "
                        f"not {type(a).__name__}"
                    )
                if a.dtype != numpy_dtype(p.type):
                    raise InvalidArgument(f"{self.name}: {p.name!r} is {p.annotation!r}, the buffer holds {a.dtype}")
                if device is None:
                    device = a.device
                elif a.device is not device:
                    raise InvalidArgument(
                        f"{self.name}: buffers are on different devices ({device.spec}, {a.device.spec} for {p.name!r})"
                    )
                if p.ndim == 2 and p.width is None and len(a) < nx * ny:
                    raise InvalidArgument(
                        f"{self.name}: {p.name!r} has the launch shape {ny} × {nx} but holds {len(a)} elements"
                    )
                for q, b in zip(params, values):
                    if b is a and self.ir.distinct:
                        raise InvalidArgument(
                            f"{self.name} takes distinct arrays (@gw.kernel(distinct=True)); {q.name!r} and "
                            f"{p.name!r} are the same buffer"
                        )
                    if b is a and (p.written or q.written) and a.device.caps.kernel_language == "wgsl":
                        raise InvalidArgument(
                            f"{self.name}: {q.name!r} and {p.name!r} are the same buffer, which the kernel writes; "
                            f"WebGPU cannot bind a written buffer twice in one dispatch: pass a copy"
                        )
                values.append(a)
            else:
                values.append(_scalar(a, p, self.name))
        if device is None:
            if not isinstance(stream, Stream):
                raise InvalidArgument(f"{self.name} has no buffer arguments: pass stream= to say which device runs it")
            device = stream.device
        stream = device.default_stream if stream is None else stream
        return device, stream, values

    def _signature(self) -> str:
        return ", ".join(f"{p.name}: {p.annotation!r}" for p in self.ir.arguments)

    def __repr__(self) -> str:
        return f"<gw.kernel {self.name}({self._signature()}) at {self.ir.where}, CPU: {self.cpu_strategy}>"


def check_types(device: Device, types: set[str], what: str) -> None:
    """InvalidArgument naming ``device`` and what it lacks where its kernels cannot hold one of ``types``."""
    for t in sorted(types):
        name = NUMPY_TYPES.get(t)
        why = device.backend_device.lacks_type(name) if name and t not in ("bool", "isize") else ""
        if why:
            raise InvalidArgument(f"{what}: {device.spec} ({device.name}) has no {name}: {why}")
        if t == "bf16" and device.caps.kernel_language == "python":
            numpy_dtype(t)  # the CPU computes bfloat16 with ml_dtypes: a clear error without it


def _shape(shape: Any, ndim: int, name: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if len(dims) != ndim or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        spell = "n" if ndim == 1 else "(rows, cols)"
        raise InvalidArgument(
            f"{name} is a {ndim}-D kernel: launch it with a shape {spell} of non-negative ints, not {shape!r}"
        )
    return tuple(int(d) for d in dims)


@functools.cache
def _int_range(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _scalar(value: Any, p: Param, name: str) -> Any:
    """``value`` as the parameter's NumPy type; refuses what would change it (2.5 for an i32, 2**40 for a u32)."""
    dtype = numpy_dtype(p.type)
    if isinstance(value, Buffer) or not isinstance(value, (int, float, np.number, np.bool_)):
        raise InvalidArgument(
            f"{name}: argument {p.name!r} is a scalar {p.annotation!r}; pass a number, not {type(value).__name__}"
        )
    if dtype.kind in "iu":
        if float(value) != int(value):
            raise InvalidArgument(f"{name}: argument {p.name!r} is {p.annotation!r}; {value!r} is not a whole number")
        low, high = _int_range(dtype)
        if not low <= int(value) <= high:
            raise InvalidArgument(f"{name}: argument {p.name!r} is {p.annotation!r}; {value!r} does not fit")
        return dtype.type(int(value))
    return dtype.type(value)


def kernel(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    block: Sequence[int] | int | None = None,
    distinct: bool = False,
    min_blocks: int | None = None,
) -> Any:
    """Decorate a typed Python function to run it on every backend: ``@gw.kernel``, ``@gw.kernel(name="k")``, or
    ``@gw.kernel(block=(16, 16))`` (the block its launches use unless given one). ``distinct=True`` promises that its
    arrays never overlap (C's ``restrict``), so that the compiler may reorder their reads and writes (loads issued
    together ahead of stores); a launch passing one buffer twice then raises InvalidArgument. ``min_blocks=k`` asks
    the CUDA compiler to keep registers low enough that k blocks of the kernel's block share a multiprocessor
    (``__launch_bounds__``: more threads in flight hide latency, at the cost of spills where it asks too much);
    launches may then use no larger block. Other backends compile as without it.

    Translates (and checks) the function now; compiles per device on first launch."""
    if fn is None:
        return lambda f: PythonKernel(f, name, block, distinct, min_blocks)
    return PythonKernel(fn, name, block, distinct, min_blocks)
