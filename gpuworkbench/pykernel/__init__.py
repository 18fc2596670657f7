"""``@gw.kernel``: a small typed Python function translated to CUDA C, OpenCL C and WGSL, and run with NumPy on the CPU.

One definition, every backend, the same results::

    @gw.kernel
    def saxpy(i: gw.index, y: gw.f32[:], x: gw.f32[:], a: gw.f32, n: gw.i32):
        if i < n:
            y[i] = a * x[i] + y[i]

    saxpy.launch(n, y, x, 2.0, n, stream=s)          # n indices; grid and block chosen for the device
    saxpy(grid, block, (y, x, 2.0, n), stream=s)     # or grid × block indices, as for any Kernel
    print(saxpy.source("cuda"))                      # also "opencl", "wgsl", "numpy"

**Parameters** (each annotated): first the thread index, ``i: gw.index`` (1-D) or ``x: gw.index, y: gw.index`` (2-D,
x along a row); then arrays ``gw.f32[:]``, 2-D arrays ``gw.f32[:, :]`` (the launch shape) or ``gw.f32[:, gw.width.w]``
(rows of ``w`` elements, ``w`` an integer parameter), and scalars ``gw.f32``. Element types: f32, f64, i32, u32,
i64, and the 16-bit floats f16 and bf16 (WebGPU has f32, i32, u32, and f16 where the adapter has shader-f16; f64 needs
cl_khr_fp64 on OpenCL). f16 and bf16 are storage: arrays, shared arrays and locals (``t: gw.f16 = 0``) hold them, a
value read from one computes as f32, and a store rounds to the nearest (``gw.f16(x)`` rounds too); scalar parameters
are never 16-bit. bfloat16 arrays need ``ml_dtypes`` (NumPy has no bfloat16). 2-D arrays are indexed
``a[row, col]``, i.e. ``a[y, x]``; a 2-D launch takes NumPy's shape ``(rows, cols)``, so ``k.launch(img.shape, ...)``
runs x over columns and y over rows.

**The body**: arithmetic, comparisons, ``and or not``, ``a if c else b``, ``if/elif/else``, ``for k in range(...)``,
array reads and writes (``a[i]``, ``a[y, x]``, ``a[i] += v``), locals (typed by their first assignment, or declared as
``t: gw.f32 = 0``; they start at zero, as in C), a bare ``return``, numbers from outside (read once, at decoration),
and math: sqrt exp exp2 log log2 log10 sin cos tan asin acos atan atan2 sinh cosh tanh floor ceil trunc pow abs min max
(as ``math.sqrt``, ``np.sqrt`` or plain ``sqrt``), with casts ``int()``, ``float()``, ``gw.f32()`` and friends.
Python's meaning is kept where C's differs: ``/`` is true division, ``//`` floors, ``%`` takes the divisor's sign.
Types follow C's arithmetic conversions (i32 op u32 → u32, int op f32 → f32); literals take the other operand's type;
``float()`` and ``/`` of integers give f32 (f64 when a parameter is f64). Array accesses are not bounds-checked, lanes
that write the same element race as on a GPU, and what C leaves undefined stays so (integer division by zero, a float
out of an integer's range converted to it): backends differ there.

**Arrays that never overlap**: ``@gw.kernel(distinct=True)`` promises it (C's ``restrict`` in CUDA and OpenCL C), so
that the compiler may issue loads ahead of stores; a launch passing one buffer twice raises InvalidArgument.

**Occupancy**: ``@gw.kernel(block=256, min_blocks=6)`` asks the CUDA compiler to keep registers low enough that 6
blocks of the kernel's block share a multiprocessor (``__launch_bounds__``); launches may then use no larger block.
Other backends compile as without it.

**Stencils**: ``a.at(dx, dy)`` reads the neighbour at an offset from the thread's own ``(x, y)`` in an array of the
launch shape, clamped to the edges (the edge value repeats outwards, so any halo width works); ``a.at(dx)`` in 1-D.

**Cooperative kernels** (tiled algorithms): the threads of a block (a workgroup) share arrays and wait for each
other::

    @gw.kernel(block=256)
    def block_sum(i: gw.index, out: gw.f32[:], x: gw.f32[:], n: gw.i32):
        part = gw.shared(256, gw.f32)            # one array per block, declared at the top of the body
        lid = gw.local_id(0)
        part[lid] = x[i] if i < n else 0.0
        gw.barrier()                              # every thread of the block waits here
        stride = 128
        for k in range(8):
            if lid < stride:
                part[lid] += part[lid + stride]
            gw.barrier()
            stride //= 2
        if lid == 0:
            out[gw.group_id(0)] = part[0]

    block_sum.launch(n_rounded_up_to_256, out, x, n)   # the launch covers whole blocks: a multiple of the block

``gw.shared(shape, type)`` (shape: 1 or 2 constant ints, ``a[row, col]`` for 2-D; type ``gw.f32`` or a NumPy name)
is CUDA's ``__shared__``, OpenCL's ``__local``, WGSL's ``var<workgroup>``; its contents start undefined (zero on the
CPU and WebGPU). ``gw.barrier()`` is ``__syncthreads()`` / ``barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)`` /
``workgroupBarrier()``: what the block wrote before it (shared and global) is what its threads read after it.
``gw.local_id(axis)``, ``gw.group_id(axis)``, ``gw.group_size(axis)``, ``gw.num_groups(axis)`` give the thread's
place (axis 0 is x, along a row, as the index ``x``; 1 is y): ``x == group_id(0) * group_size(0) + local_id(0)``.
A kernel using any of them is *cooperative*: its launch shape must be a multiple of the block (each extent; the block
comes from ``launch(block=)``, else ``@gw.kernel(block=)``, else 256 or 16 × 16), no thread is cut off by a bounds
check of ours (guard the work with ``if`` yourself), and every thread of a block must reach the same barriers: a
barrier under an ``if`` or in a loop whose condition or range depends on the thread (its index, ``local_id``, array
contents), or after a ``return`` only some threads take, is refused at decoration. Blocks larger than the device runs
(threads, or shared bytes) raise InvalidArgument before launching.

**On the CPU** the body runs vectorised over the index (every statement once for all indices; an ``if`` splits them)
unless a loop's range differs between indices or a return sits inside a loop: then it loops over the indices, slower.
``k.cpu_strategy`` says which ("vectorised" or "loop") and ``k.cpu_strategy_reason`` why. Cooperative kernels
vectorised run every statement for every thread of every block before the next (barriers have nothing left to wait
for; shared arrays hold one copy per block); in a loop they run block by block, each thread a generator stepped from
barrier to barrier, so every thread of a block finishes a phase before any starts the next.

Anything else (while, break, try, with, comprehensions, lambdas, calls to other functions, names that are not numbers)
is refused when the function is decorated, with the file, line and source line. Annotations written as strings (``from
__future__ import annotations``) are read in the function's module and closure.

The package: ``reader``, ``expressions`` and ``statements`` translate a function into the typed tree of ``ir``
(``divergence`` checks its barriers); ``emit_c``, ``emit_wgsl`` and ``emit_numpy`` spell the tree for each target; and
``kernel`` compiles it per device and launches it.
"""

from __future__ import annotations

from .kernel import PythonKernel, kernel
from .ktypes import ArrayType, IndexType, ScalarType, bf16, f16, f32, f64, i32, i64, index, u32, width
from .words import barrier, group_id, group_size, local_id, num_groups, shared

# grouped as the guide above reads: the decorator, the signature's types, the words of cooperative kernels
__all__ = [
    "kernel",
    "PythonKernel",
    "index",
    "width",
    "f32",
    "f64",
    "f16",
    "bf16",
    "i32",
    "u32",
    "i64",
    "ScalarType",
    "ArrayType",
    "IndexType",
    "shared",
    "barrier",
    "local_id",
    "group_id",
    "group_size",
    "num_groups",
]
