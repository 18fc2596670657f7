"""Links between CUDA devices: peer access, and which pairs are joined by NVLink or PCIe (for ``%gpu``'s listing)."""

from __future__ import annotations

from typing import Any

from .events import load_cupy


def enable_peer(rt: Any, device: int, peer: int) -> bool:
    """Let ``device`` reach ``peer``'s memory (``cudaDeviceEnablePeerAccess``); True once enabled (or already)."""
    rt.setDevice(device)
    try:
        rt.deviceEnablePeerAccess(peer)
    except rt.CUDARuntimeError as exc:
        if "AlreadyEnabled" not in str(exc):
            return False
    return True


def peer_links(count: int) -> dict[tuple[int, int], str]:
    """For each ordered pair of CUDA ordinals, the link the driver reports: "NVLink" or "PCIe" where peer access is
    possible and NVML (pynvml, where installed) tells which, else "peer" with the driver's performance rank where CuPy
    or cuda-python reads it ("peer, rank 0": lower is faster); "none" where peer access is not possible."""
    rt = load_cupy().cuda.runtime
    nvlink = _nvlink_pairs(count)
    links: dict[tuple[int, int], str] = {}
    for a in range(count):
        for b in range(count):
            if a == b:
                continue
            if not rt.deviceCanAccessPeer(a, b):
                links[a, b] = "none"
            elif nvlink is not None:
                links[a, b] = "NVLink" if (a, b) in nvlink else "PCIe"
            else:
                rank = _p2p_rank(a, b)
                links[a, b] = "peer" if rank is None else f"peer, rank {rank}"
    return links


def _p2p_rank(a: int, b: int) -> int | None:
    """cudaDevP2PAttrPerformanceRank of ``a`` → ``b`` through CuPy or cuda-python, whichever has the call; else None."""
    rank_attr = 1  # cudaDevP2PAttrPerformanceRank
    rt = load_cupy().cuda.runtime
    try:
        if hasattr(rt, "deviceGetP2PAttribute"):
            return int(rt.deviceGetP2PAttribute(rank_attr, a, b))
        from cuda.bindings import runtime as cudart  # cuda-python, when present (cupti-python brings it)

        err, value = cudart.cudaDeviceGetP2PAttribute(cudart.cudaDeviceP2PAttr(rank_attr), a, b)
        return int(value) if int(err) == 0 else None
    except Exception:  # noqa: BLE001 - neither library has it, or the driver refused
        return None


def _nvlink_pairs(count: int) -> set[tuple[int, int]] | None:
    """Ordered pairs of CUDA ordinals with NVLink peer-to-peer (NVML's P2P status, which also sees NVSwitch), from
    pynvml where it is installed; None without it or on any NVML failure. Devices are matched by PCI bus id, as NVML
    and CUDA may number them differently."""
    try:
        import pynvml
    except ImportError:
        return None
    rt = load_cupy().cuda.runtime
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML library or driver
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByPciBusId(rt.deviceGetPCIBusId(i)) for i in range(count)]
        ok = pynvml.NVML_P2P_STATUS_OK
        return {
            (a, b)
            for a in range(count)
            for b in range(count)
            if a != b and pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == ok
        }
    except Exception:  # noqa: BLE001 - an NVML or CuPy without these calls
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
