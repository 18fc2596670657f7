"""What ``%gpu`` and ``%gpu mem`` print: every backend and device with its memory, the links between CUDA GPUs, and
what gpuworkbench holds on the current device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._format import binary_bytes
from ..device import Device, auto_spec, backend_status, devices
from ..errors import GpuError
from .output import Table


def device_table(chosen: Device | None) -> Table:
    """A table of every backend and device, with memory; the current device (``chosen`` with ``%gpu use``, else the
    one ``gw.Device()`` picks) marked."""
    current = chosen.spec if chosen is not None and not chosen.closed else None
    if current is None:
        try:
            current = "{}:{}".format(*auto_spec())
        except GpuError:
            current = ""
    rows = []
    found = devices()
    for info in found:
        spec = f"{info.backend}:{info.index}"
        try:
            free, total = Device(info.index, backend=info.backend).memory_info()
            memory = f"{binary_bytes(free)} free of {binary_bytes(total)}"
        except GpuError as exc:
            memory = f"cannot open: {exc}"
        mark = "→" if spec == current else ""
        rows.append([mark, spec, "GPU" if info.is_gpu else "CPU", info.name, memory])
    notes = link_notes(found) + [f"{name}: {why}" for name, why in backend_status().items() if why]
    if chosen is None:
        notes.append("current device: chosen automatically (%gpu use BACKEND[:N] to choose)")
    return Table(["", "device", "type", "name", "memory"], rows, notes)


def link_notes(found: Sequence[Any]) -> list[str]:
    """One line per pair of CUDA GPUs: the link the driver reports (``backends.cuda.peer_links``: NVLink, PCIe, peer
    access with its rank, or none); nothing with fewer than two GPUs or when the driver cannot say."""
    count = sum(1 for info in found if info.backend == "cuda")
    if count < 2:
        return []
    try:
        from ..backends.cuda import peer_links

        links = peer_links(count)
    except Exception:  # noqa: BLE001 - a listing never fails on the links
        return []
    notes = []
    for a in range(count):
        for b in range(a + 1, count):
            ab, ba = links.get((a, b), "unknown"), links.get((b, a), "unknown")
            link = ab if ab == ba else f"{ab} (cuda:{a} → cuda:{b}), {ba} (cuda:{b} → cuda:{a})"
            if link == "none":
                link = "no peer access: copies between them go through the host"
            notes.append(f"link cuda:{a} ↔ cuda:{b}: {link}")
    return notes


def memory_lines(dev: Device) -> list[str]:
    """Free and total memory of ``dev``, and what gpuworkbench holds there (raises GpuError when it cannot tell)."""
    free, total = dev.memory_info()
    estimated = "" if dev.caps.memory_free_known else " (estimated: the backend cannot tell free memory)"
    return [
        f"{dev.spec} {dev.name}",
        f"  device memory  {binary_bytes(free)} free of {binary_bytes(total)}{estimated}",
        f"  gpuworkbench   holds {binary_bytes(dev.held_bytes)} in {len(dev.live_buffers)} live buffer(s)",
    ]
