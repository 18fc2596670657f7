"""Names: the math functions a kernel may call (and how NumPy spells them), and the names generated code avoids."""

from __future__ import annotations

import builtins
import math

import numpy as np

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


KNOWN = _known_functions()

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
