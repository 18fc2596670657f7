"""The one place an op is enqueued: call the backend, track the completion on its stream, hand it to active traces."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from . import listeners

if TYPE_CHECKING:
    from .streams import Stream


def enqueue(
    stream: Stream,
    kind: str,
    nbytes: int,
    name: str,
    pinned: int,
    call: Callable[[bool], Any],
    keep: Any = None,
    many: bool = False,
    launch: Any = None,
) -> Any:
    """Run ``call(timed)`` (which enqueues one backend op) and return its completion.

    ``keep`` (a host array, say) is held alive by the stream until the op is done; ``many`` says the op may run as
    several device activities (a graph launch), which a CUPTI trace then gathers into one span; ``launch``: a
    kernel's (grid, block, registers, shared bytes), which a trace that times it by events keeps with its span.
    When no trace is recording this costs one list check; when one is, the op is timed by the device (or by CUPTI)
    and recorded without any sync.
    """
    capture = stream.capturing
    if capture is not None:  # inside ``with stream.capture()``: the graph records the op instead of running it
        return capture.add(stream, kind, nbytes, name, pinned, call, keep)
    traces = listeners.RECORDING
    if not traces:
        completion = call(False)
        stream.track(completion, keep)
        return completion
    if len(traces) == 1:
        return traces[0].record_op(stream, kind, nbytes, name, pinned, call, keep, many, launch)
    device = stream.device
    numbered = [(t, t.device_number(device)) for t in list(traces)]
    timed = any(not t.uses_cupti(n, kind, nbytes, name) for t, n in numbered)
    ids = [t.op_id() for t, _ in numbered]
    enqueue_ns = time.perf_counter_ns()
    t0 = time.time_ns()  # a CUPTI trace claims the CUDA calls this thread makes until t1
    completion = call(timed)
    t1 = time.time_ns()
    stream.track(completion, keep)
    for (t, n), op_id in zip(numbered, ids):
        t.op_end(op_id, n, stream.id, kind, nbytes, name, pinned, enqueue_ns, completion, many, (t0, t1), launch)
    return completion


def enqueue_call(
    stream: Stream,
    kind: str,
    nbytes: int,
    name: str,
    pinned: int,
    fn: Callable[..., Any],
    args: tuple,
    keep: Any,
    launch: Any = None,
) -> Any:
    """``enqueue`` of the op ``fn(*args, timed)``: when nothing traces or captures, it is called at once with
    ``timed=False`` and no closure is made (the launch path); otherwise it goes through ``enqueue``."""
    if stream.capturing is None and not listeners.RECORDING:
        completion = fn(*args, False)
        stream.track(completion, keep)
        return completion
    return enqueue(stream, kind, nbytes, name, pinned, partial(fn, *args), keep, launch=launch)


def host_event(device: Any, kind: str, nbytes: int, name: str, start_ns: int, address: int = 0) -> None:
    """Record an allocation or free (host-side, already finished) and a memory sample in every active trace;
    ``address`` (a device pointer) tells a CUPTI trace that this allocation is the workbench's own."""
    traces = listeners.RECORDING
    if not traces:
        return
    end_ns = time.perf_counter_ns()
    used = device.used_bytes()
    for t in list(traces):
        n = t.device_number(device)
        t.host_event(n, kind, nbytes, name, start_ns, end_ns, address)
        t.memory_sample(n, device.held_bytes, used)
