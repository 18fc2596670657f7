"""Every library's NVTX ranges into a CUPTI trace: point NVTX at the libcupti that cupti-python loads.

NVTX (header-only, one copy in each library that uses it: PyTorch, the ``nvtx`` package ...) looks for a tool once,
at the first NVTX call of that copy, in ``NVTX_INJECTION64_PATH``; without one it drops every range for good. So the
variable must name libcupti before the process's first NVTX call, and it must name the very libcupti that cupti-python
loads: a second copy (the CUDA toolkit's, say) takes the ranges and our subscriber never sees them (measured on an
H200: the toolkit's copy gave no range, the wheel's gave every ``emit_nvtx`` range). ``import gpuworkbench`` sets it
(``point_nvtx_at_cupti``), on the importing thread, before any thread of ours starts; a user's own setting is kept,
and ``GPUWB_NVTX=0`` leaves the variable alone.
"""

from __future__ import annotations

import glob
import importlib.util
import os

ENV = "NVTX_INJECTION64_PATH"
#: Where nvidia's wheels put libcupti, under each directory of the ``nvidia`` namespace package (newest first), as
#: cuda-pathfinder searches them before any system copy.
WHEEL_GLOBS = ("cu13/lib/libcupti.so*", "cu12/lib/libcupti.so*", "cuda_cupti/lib/libcupti.so*")
#: What ``point_nvtx_at_cupti`` did: "" (not yet), or a line a trace's note can show.
STATE = {"said": ""}


def wheel_libcupti() -> str:
    """The libcupti of nvidia's wheels that cupti-python would load ("" where there is none), found without loading
    it (cuda-pathfinder's own lookup loads the library, or starts a process)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return ""
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        for pattern in WHEEL_GLOBS:
            found = sorted(glob.glob(os.path.join(root, pattern)), key=len)
            if found:
                return os.path.realpath(found[0])
    return ""


def point_nvtx_at_cupti() -> str:
    """Set ``NVTX_INJECTION64_PATH`` to the wheel's libcupti where cupti-python is installed and nothing is set yet;
    returns what was done, in words."""
    if os.environ.get("GPUWB_NVTX", "1") == "0":
        said = "GPUWB_NVTX=0: NVTX_INJECTION64_PATH left alone"
    elif os.environ.get(ENV):
        said = f"NVTX_INJECTION64_PATH was set already ({os.environ[ENV]})"
    elif importlib.util.find_spec("cupti") is None:
        said = "cupti-python is not installed: NVTX left alone"
    else:
        path = wheel_libcupti()
        if path:
            os.environ[ENV] = path
            said = f"NVTX_INJECTION64_PATH set to {path}"
        else:
            said = "no libcupti of nvidia's wheels found: NVTX ranges reach a trace only where NVTX_INJECTION64_PATH "
            said += "names the libcupti cupti-python loads"
    STATE["said"] = said
    return said


def mismatch(loaded: str) -> str:
    """A warning where NVTX was pointed at another libcupti than the one loaded (``loaded``), else ""."""
    named = os.environ.get(ENV, "")
    if not named or not loaded:
        return ""
    if os.path.realpath(named) == os.path.realpath(loaded):
        return ""
    return (
        f"NVTX ranges of other libraries cannot reach this trace: NVTX_INJECTION64_PATH names {named}, but CUPTI was "
        f"loaded from {loaded}; point it at the latter before the process's first NVTX call"
    )
