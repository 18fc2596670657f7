"""What each device of a trace offers as counters: its own source (NVML for CUDA), or a statement of why it has none.

``Sampler`` (``counters.py``) asks once per device, at the device's first op. The CPU backend runs on the host's cores,
whose counters the host's source samples; PyOpenCL and wgpu-py expose no utilization or memory counter; a CUDA device
has NVML's (``counter_nvml.py``; pynvml is imported only when a CUDA device is asked); ROCm has none in this build.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BackendUnavailable
from .counter_nvml import open_source
from .counter_sources import CounterSource


@dataclass(frozen=True)
class Offer:
    """What a device offers: its own source (None: none), what ``Trace.counter_sources`` says of it, and a note for
    the trace's warnings ("" where none is due)."""

    source: CounterSource | None
    says: str
    note: str = ""


def offer(number: int, key: str, name: str, host: str) -> Offer:
    """What the trace's device ``number`` (``key`` "opencl:0", named ``name``) offers, a source of its own sampling
    it as ``number``; ``host``: what the host's source is, as its ``describe`` says it."""
    backend = key.partition(":")[0]
    if backend == "cpu":
        return Offer(None, f"the host's counters ({host}): the CPU backend runs on the host's cores")
    if backend in ("opencl", "webgpu"):
        library = "PyOpenCL" if backend == "opencl" else "wgpu-py"
        on_host = _runs_on_host(name)
        says = f"none ({library} exposes no utilization or memory counter)"
        if on_host:
            says += f"; it runs on the host's cores, whose counters are sampled ({host})"
        note = f"counters: {key} ({_short(name)}) offers none; the host's CPU and memory are sampled instead"
        return Offer(None, says, note + (" (this device runs on them)" if on_host else ""))
    if backend == "cuda":
        try:
            source = open_source(number, int(key.partition(":")[2] or 0))
        except BackendUnavailable as exc:
            why = str(exc)
            return Offer(
                None,
                f"none: {why}",
                f"counters: {key} ({_short(name)}) has none: {why}; the host's CPU and memory are sampled instead",
            )
        return Offer(source, source.describe())
    return Offer(
        None,
        "none: no source for this device in this build",
        f"counters: no source for {key} in this build; the host's CPU and memory are sampled instead",
    )


def _runs_on_host(name: str) -> bool:
    """Whether a device is a CPU implementation on the host (PoCL's pthread device, Mesa's llvmpipe)."""
    lowered = name.lower()
    return any(word in lowered for word in ("portable computing language", "pthread", "llvmpipe", "(cpu)"))


def _short(name: str) -> str:
    """A device's name as a note shows it: PoCL for the Portable Computing Language, else the name up to 40 chars."""
    if "portable computing language" in name.lower():
        return "PoCL"
    return name if len(name) <= 40 else name[:39] + "…"
