"""What ``gw.timeit`` needs around a call: a synchronize of every device the call may use, and ``graph=True``'s
capture (a gpuworkbench graph on the device's default stream, or, on CUDA, CuPy's stream capture)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..device import Device
from ..errors import InvalidArgument
from .recorder import Trace
from .spans import HOST_KINDS, KINDS

DEVICE_KINDS = np.array([name not in HOST_KINDS for name in KINDS])


def synchronizer(device: Device | None) -> Callable[[], None]:
    """A function that waits for all work of ``device`` and of every device open now (each stream of theirs) and,
    where CuPy or PyTorch is loaded, for the whole CUDA device (their streams too), as ``cupyx.profiler.benchmark``."""
    devices = Device.open_devices()
    if device is not None and device not in devices:
        devices.append(device)
    steps: list[Callable[[], None]] = [d.synchronize for d in devices]
    cuda = sorted({d.index for d in devices if d.backend_kind.value == "cuda"})
    cupy = sys.modules.get("cupy")
    torch = sys.modules.get("torch")
    if cupy is not None:
        try:
            current = cupy.cuda.runtime.getDevice()
            steps.extend(cupy.cuda.Device(i).synchronize for i in sorted({*cuda, current}))
        except Exception:  # noqa: BLE001 - CuPy without a usable CUDA device: nothing of it to wait for
            pass
    elif torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
        steps.append(torch.cuda.synchronize)
    if len(steps) == 1:
        return steps[0]

    def sync() -> None:
        for step in steps:
            step()

    return sync


def capture_graph(
    call: Callable[[], Any], device: Device, trace: Trace, sync: Callable[[], None]
) -> tuple[Callable[[], Any], str, Callable[[], None]]:
    """Capture one ``call`` and return (replay, a note on what a replay is, close). The call's gpuworkbench ops on
    ``device``'s default stream become a graph (``stream.capture()``); on CUDA, a call that enqueued none of those is
    captured again with CuPy's stream capture. Work that ran during the capture instead of being captured (another
    stream, another library) makes it an InvalidArgument: its replays would not be the statement."""
    stream = device.default_stream
    begin = time.perf_counter_ns()
    with stream.capture(name="timeit") as graph:
        call()
    sync()
    ran = _ran_during(trace, begin, time.perf_counter_ns())
    if graph.ops and not ran:
        if graph.kind == "native":
            note = f"graph: one capture of the call replayed per sample ({graph.ops} ops, one graph launch)"
        else:
            note = (
                f"graph: {device.spec} has no native graphs, so each replay re-issues the captured ops one by one "
                f"({graph.ops}: host time is not a graph launch's)"
            )
        return graph.launch, note, graph.close
    graph.close()
    if not graph.ops and device.backend_kind.value == "cuda" and "cupy" in sys.modules:  # CuPy's work, whether or
        # not its spans have come in yet (CUPTI hands over another library's records with their API calls)
        return _capture_cupy(call, device, trace, sync)
    if graph.ops:
        raise InvalidArgument(
            f"graph=True: the call ran {ran} device ops outside the capture of {device.spec}'s default stream (on "
            "other streams or through another library) beside the ones captured; a replay would leave them out"
        )
    raise InvalidArgument(
        f"graph=True captures the gpuworkbench ops a call enqueues on {device.spec}'s default stream (on CUDA, CuPy's "
        f"work too); this call enqueued none there{f' and ran {ran} device ops elsewhere' if ran else ''}"
    )


def _capture_cupy(
    call: Callable[[], Any], device: Device, trace: Trace, sync: Callable[[], None]
) -> tuple[Callable[[], Any], str, Callable[[], None]]:
    """CuPy's stream capture of one call on a stream of its own: what CuPy enqueues on its current stream is captured;
    anything that still ran (PyTorch, gpuworkbench ops, other streams) makes it an InvalidArgument."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device.index):
        stream = cupy.cuda.Stream(non_blocking=True)
        begin = time.perf_counter_ns()
        with stream:
            stream.begin_capture()
            try:
                call()
            finally:
                try:
                    graph = stream.end_capture()
                except Exception as exc:  # noqa: BLE001 - the driver's reason, in the user's terms
                    raise InvalidArgument(
                        f"graph=True: CuPy's stream capture failed ({exc}); a graph cannot allocate new memory, "
                        "synchronize or copy to pageable host memory: allocate outputs once and pass out="
                    ) from exc
        sync()
        ran = _ran_during(trace, begin, time.perf_counter_ns())
    if ran:
        raise InvalidArgument(
            f"graph=True: under CuPy's stream capture the call still ran {ran} device ops (PyTorch, gpuworkbench ops "
            "or other streams); a replay would leave them out"
        )

    def replay() -> None:
        graph.launch(stream)

    return replay, "graph: CuPy's stream capture of one call, replayed per sample (one graph launch)", lambda: None


def _ran_during(trace: Trace, begin: int, end: int) -> int:
    """How many device spans (kernels, copies, memsets) started and ended between two host times."""
    trace.harvest(flush=True)
    table = trace.table(wait=False)
    if not len(table["kind"]):
        return 0
    work = DEVICE_KINDS[table["kind"]]
    mid = table["start_ns"] + (table["end_ns"] - table["start_ns"]) // 2
    return int((work & (mid >= begin) & (mid <= end)).sum())
