"""``gw.timeit``: a micro-benchmark whose device time comes from the trace's own spans, not from timing events.

Every sample is one call followed by a synchronize of the devices (as ``cupyx.profiler.benchmark`` does), inside one
trace (``others=True``: on CUDA, CUPTI sees CuPy's and PyTorch's kernels too; elsewhere the backends' own
timestamps). Span times are on the host's ``perf_counter_ns`` (``recorder.py``), so a span belongs to sample i when
its midpoint lies between the host clock read before call i and the one after its synchronize (widened by the
devices' clock alignment error, never into the next sample). A sample's device time is the union of its device spans
(kernels, copies, memsets); a kernel's is the sum of its spans' durations in the sample. Host time is
``perf_counter_ns`` around the call alone. Sampling stops once the median's distribution-free 95 % interval lies
within ± ``precision`` of it (after ``min_samples``), when the time budget is spent (after ``BUDGET_FLOOR``), or at
``max_samples``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from .._format import binary_bytes
from ..device import Device
from ..errors import InvalidArgument
from .recorder import Trace, new_trace
from .spans import KINDS
from .timeit_graph import DEVICE_KINDS, capture_graph, synchronizer
from .timeit_result import Distribution, OpTiming, Timing

_now = time.perf_counter_ns
#: The automatic warm-up: at least this many calls, and until this long has passed (at most ``WARMUP_MAX`` calls).
WARMUP_CALLS, WARMUP_S, WARMUP_MAX = 2, 0.1, 1000
#: The flush buffer where the device's L2 size is not known (OpenCL, WebGPU, ROCm, a host whose caches are unread).
FLUSH_FALLBACK = 64 << 20
#: The precision is checked when the sample count has grown by this factor since the last check.
CHECK_GROWTH = 1.25


def timeit(
    fn: Callable[..., Any],
    /,
    *args: Any,
    warmup: int | None = None,
    budget_s: float = 2.0,
    min_samples: int = 10,
    max_samples: int = 100_000,
    precision: float = 0.02,
    flush_l2: bool = False,
    graph: bool = False,
    device: Device | str | None = None,
    **kwargs: Any,
) -> Timing:
    """Time ``fn(*args, **kwargs)``: device time per call from the trace's spans, host time around the call alone.

    ``warmup``: calls before sampling (None: at least 2 and about 0.1 s). Sampling stops once the median's 95 %
    interval is within ± ``precision`` (2 %) of it after ``min_samples``, or ``budget_s`` is spent after 3, and at most
    ``max_samples``. ``flush_l2``: before each sample, outside it, write a device buffer twice the L2's size.
    ``graph``: capture one call as a graph and time its replays. ``device``: the one flushed or captured on (default:
    the device the warm-up used, else ``gw.Device()``); every open device is synchronized after each call. The
    keywords above are ``timeit``'s own: give ``fn`` arguments of those names through ``functools.partial``."""
    _check(fn, warmup, budget_s, min_samples, max_samples, precision, flush_l2, graph)
    call = (lambda: fn(*args, **kwargs)) if args or kwargs else fn
    dev = _device(device) if device is not None else None
    trace = new_trace(others=True)
    notes: list[str] = []
    with ExitStack() as cleanup:
        trace.start()
        cleanup.callback(trace.stop)
        warm = _warm_up(call, warmup)
        if dev is None and (flush_l2 or graph):
            dev = _used_device(trace)
        sync = synchronizer(dev)
        if graph:
            call, note, close = capture_graph(call, dev, trace, sync)
            cleanup.callback(close)
            notes.append(note)
            _warm_up(call, 1 if warmup is None else warmup, sync)  # a first replay instantiates and uploads
        flush, exclude = None, None
        if flush_l2:
            flush, exclude, note = _flusher(dev, trace, cleanup)
            notes.append(note)
        windows, host, stopped, elapsed = _sample(
            call, sync, flush, trace, budget_s, min_samples, max_samples, precision
        )
    trace.wait_pending(timeout_s=60.0)
    table = trace.table()
    device_ns, ops, outside, used = per_sample(table, windows, _tolerance(trace), exclude)
    result = Timing(
        statement=_describe(fn),
        device_ns=device_ns,
        host_ns=host,
        kernels={k: v for k, v in ops.items() if v.kind == "kernel"},
        copies={k: v for k, v in ops.items() if v.kind != "kernel"},
        warmup=warm,
        stopped=stopped,
        elapsed_s=elapsed,
        devices=[f"{c.key} ({c.name})" for n, c in sorted(trace.devices.items()) if n in used],
        trace=trace,
    )
    result.notes = _notes(result, trace, used, outside) + notes
    return result


def _check(
    fn: Any, warmup: Any, budget_s: Any, min_samples: Any, max_samples: Any, precision: Any, flush: Any, graph: Any
) -> None:
    """Raise InvalidArgument naming the first argument that does not fit."""
    if not callable(fn):
        raise InvalidArgument(
            f"timeit calls a function, got {type(fn).__name__} {fn!r}: pass e.g. lambda: k(a, b) (a statement as text "
            "goes to %gpu timeit)"
        )
    if warmup is not None and (not _is_int(warmup) or warmup < 0):
        raise InvalidArgument(f"warmup is a number of calls (an int >= 0, or None for automatic), not {warmup!r}")
    if not isinstance(budget_s, (int, float)) or isinstance(budget_s, bool) or not (0 < budget_s < math.inf):
        raise InvalidArgument(f"budget_s is the sampling time in seconds, a number > 0, not {budget_s!r}")
    if not _is_int(min_samples) or min_samples < 1:
        raise InvalidArgument(f"min_samples must be an int >= 1, not {min_samples!r}")
    if not _is_int(max_samples) or max_samples < min_samples:
        raise InvalidArgument(f"max_samples must be an int >= min_samples ({min_samples}), not {max_samples!r}")
    if not isinstance(precision, (int, float)) or not 0 < precision < 1:
        raise InvalidArgument(f"precision is a fraction of the median between 0 and 1 (0.02: ± 2 %), not {precision!r}")
    for name, value in (("flush_l2", flush), ("graph", graph)):
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidArgument(f"{name} is True or False, not {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _device(device: Device | str | None) -> Device:
    """The device to flush or capture on: ``device``, a spec string, or ``gw.Device()``'s choice."""
    if device is None or isinstance(device, str):
        return Device(device)
    if not isinstance(device, Device):
        raise InvalidArgument(f"device is a gw.Device or a spec such as 'cuda:0', not {type(device).__name__}")
    device.check_open()
    return device


def _used_device(trace: Trace) -> Device:
    """The device to flush or capture on when none was given: the one gpuworkbench device the warm-up used, else
    ``gw.Device()``'s choice (another library's work: CuPy's on CUDA)."""
    used = [d for d in Device.open_devices() if trace.knows_device(d)]
    if len(used) > 1:
        names = ", ".join(d.spec for d in used)
        raise InvalidArgument(f"the call uses several devices ({names}): name the one to flush or capture, device=")
    return used[0] if used else Device()


def _describe(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{name}()"


def _warm_up(call: Callable[[], Any], warmup: int | None, sync: Callable[[], None] | None = None) -> int:
    """Run ``call`` (and synchronize) ``warmup`` times, or automatically: at least ``WARMUP_CALLS`` and ``WARMUP_S``."""
    calls, start = 0, time.perf_counter()
    while True:
        if warmup is not None and calls >= warmup:
            return calls
        spent = time.perf_counter() - start >= WARMUP_S or calls >= WARMUP_MAX
        if warmup is None and calls >= WARMUP_CALLS and spent:
            return calls
        call()
        (sync or synchronizer(None))()  # the devices open now: the first call may have opened one
        calls += 1


def _sample(
    call: Callable[[], Any],
    sync: Callable[[], None],
    flush: Callable[[int], None] | None,
    trace: Trace,
    budget_s: float,
    min_samples: int,
    max_samples: int,
    precision: float,
) -> tuple[np.ndarray, np.ndarray, str, float]:
    """Samples until precise, out of budget or at ``max_samples``: the windows (n × 2, host ns), host ns per call,
    why it stopped and the wall seconds it took."""
    starts: list[int] = []
    ends: list[int] = []
    host: list[int] = []
    begin = _now()
    deadline = begin + int(budget_s * 1e9)
    check_at = min_samples
    n = 0
    while True:
        if flush is not None:
            flush(n)
        t0 = _now()
        call()
        t1 = _now()
        sync()
        t2 = _now()
        starts.append(t0)
        host.append(t1 - t0)
        ends.append(t2)
        n += 1
        if n >= max_samples:
            stopped = f"max_samples ({max_samples}) reached"
            break
        if t2 >= deadline and n >= min(min_samples, BUDGET_FLOOR):  # a slow statement: the budget wins
            stopped = f"the time budget ({budget_s:g} s) was spent"
            break
        if n < min_samples:
            continue
        if n >= check_at:
            check_at = max(n + 1, math.ceil(n * CHECK_GROWTH))
            if _precise(trace, starts, ends, host, precision):
                stopped = f"the median's 95 % interval is within ± {precision * 100:g} %"
                break
    windows = np.column_stack([np.array(starts, np.int64), np.array(ends, np.int64)])
    return windows, np.array(host, np.int64), stopped, (_now() - begin) / 1e9


#: Samples taken whatever the budget: a median needs a few (a statement longer than the budget runs this often).
BUDGET_FLOOR = 3


def _precise(trace: Trace, starts: list[int], ends: list[int], host: list[int], precision: float) -> bool:
    """Whether the median of the samples so far is known within ``precision``: device time where the trace saw device
    work (spans harvested now), else host time."""
    trace.harvest(flush=True)
    windows = np.column_stack([np.array(starts, np.int64), np.array(ends, np.int64)])
    device_ns, _, _, _ = per_sample(trace.table(wait=False), windows, _tolerance(trace), None)
    values = device_ns if device_ns.any() else np.array(host, np.int64)
    return Distribution.of(values).within(precision)


def _tolerance(trace: Trace) -> int:
    """How far outside a sample's window its spans may start or end: the devices' clock alignment error (+ 1 µs)."""
    return 1000 + max((c.error_ns for c in trace.devices.values()), default=0)


def per_sample(
    table: dict[str, np.ndarray], windows: np.ndarray, tolerance: int = 0, exclude: tuple[int, int] | None = None
) -> tuple[np.ndarray, dict[str, OpTiming], int, set[int]]:
    """Charge each device span of ``table`` to the sample window (host ns, n × 2, in time order) holding its midpoint,
    each window widened by ``tolerance`` but never past half the gap to its neighbours; ``exclude``: a (device,
    stream) whose spans count nowhere (the L2 flush). Returns per sample the union of its spans' time, per name an
    ``OpTiming``, the device spans left outside every window, and the trace device numbers that ran sampled work."""
    n = len(windows)
    device_ns = np.zeros(n, np.int64)
    if n == 0 or len(table["kind"]) == 0:
        return device_ns, {}, 0, set()
    keep = DEVICE_KINDS[table["kind"]]
    if exclude is not None:
        keep &= ~((table["device"] == exclude[0]) & (table["stream"] == exclude[1]))
    start, end = table["start_ns"][keep], table["end_ns"][keep]
    names, kinds, devices = table["name"][keep], table["kind"][keep], table["device"][keep]
    lo, hi = windows[:, 0].copy(), windows[:, 1].copy()
    gaps = np.maximum(lo[1:] - hi[:-1], 0)
    lo[1:] -= np.minimum(tolerance, gaps // 2)
    hi[:-1] += np.minimum(tolerance, gaps - gaps // 2)
    lo[0] -= tolerance
    hi[-1] += tolerance
    mid = start + (end - start) // 2
    sample = np.searchsorted(lo, mid, side="right") - 1
    inside = (sample >= 0) & (mid <= hi[np.maximum(sample, 0)])
    outside = int((~inside & (sample >= 0)).sum())  # after sampling began: not the warm-up's or the capture's
    sample, start, end = sample[inside], start[inside], end[inside]
    names, kinds, devices = names[inside], kinds[inside], devices[inside]
    if sample.size == 0:
        return device_ns, {}, outside, set()
    device_ns = _union_per_sample(sample, start - windows[sample, 0], end - windows[sample, 0], n)
    ops: dict[str, OpTiming] = {}
    keys = np.array([f"{KINDS[k]}\0{name}" for k, name in zip(kinds, names)], dtype=object)
    unique, code = np.unique(keys, return_inverse=True)
    durations = end - start
    for i, key in enumerate(unique):
        kind, name = str(key).split("\0", 1)
        mine = code == i
        times = np.bincount(sample[mine], weights=durations[mine], minlength=n).astype(np.int64)
        counts = np.bincount(sample[mine], minlength=n)
        ops[name if name not in ops else f"{name} ({kind})"] = OpTiming(name, kind, times, counts)
    return device_ns, ops, outside, set(int(d) for d in np.unique(devices))


def _union_per_sample(sample: np.ndarray, start: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """The union length of each sample's intervals (times relative to its window's start): each sample is moved to
    a band of its own on one axis, then one sort and running maximum merges every sample's intervals at once."""
    band = int(max(end.max(), 0) - min(start.min(), 0)) + 1
    base = sample.astype(np.int64) * band - min(int(start.min()), 0)
    s, e = start + base, end + base
    order = np.lexsort((s, sample))
    s, e, group = s[order], e[order], sample[order]
    reach = np.maximum.accumulate(e)
    new_run = np.ones(s.size, bool)
    new_run[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_run)
    last = np.append(first[1:] - 1, s.size - 1)
    lengths = reach[last] - s[first]
    return np.bincount(group[first], weights=lengths, minlength=n).astype(np.int64)


def _flusher(device: Device, trace: Trace, cleanup: ExitStack) -> tuple[Callable[[int], None], tuple[int, int], str]:
    """A function that writes a buffer twice the device's L2 (or the fallback) on a stream of its own and waits for
    it; the (trace device, stream) its spans are on, excluded from every sample; and a note saying what it writes."""
    nbytes, why = flush_size(device)
    buffer = device.alloc(nbytes, "uint8")
    cleanup.callback(buffer.free)
    stream = device.create_stream("timeit L2 flush")
    cleanup.callback(stream.close)
    exclude = (trace.device_number(device), stream.id)

    def flush(i: int) -> None:
        buffer.fill_bytes(i & 0xFF, stream)
        stream.synchronize()

    return flush, exclude, f"L2 flushed before each sample, outside it: {binary_bytes(nbytes)} written ({why})"


def flush_size(device: Device) -> tuple[int, str]:
    """Bytes to write to push the device's last-level cache out, and where that size comes from: twice CUDA's
    ``L2CacheSize`` (CuPy's device attribute), twice the host's largest CPU cache on the CPU backend, else 64 MiB."""
    kind = device.backend_kind.value
    if kind == "cuda":
        cupy = sys.modules.get("cupy")
        try:
            l2 = int(cupy.cuda.Device(device.index).attributes["L2CacheSize"])
        except Exception:  # noqa: BLE001 - no CuPy or no attribute: the fallback below says so
            l2 = 0
        if l2 > 0:
            return 2 * l2, f"2 × the {binary_bytes(l2)} L2 (CUDA's L2CacheSize)"
    if kind == "cpu":
        cache = host_cache_bytes()
        if cache > 0:
            return 2 * cache, f"2 × the host's {binary_bytes(cache)} largest CPU cache"
    return FLUSH_FALLBACK, f"the L2 size of {device.spec} is not known here: {binary_bytes(FLUSH_FALLBACK)}"


def host_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The largest CPU cache of the host (Linux's sysfs), 0 where it cannot be read."""
    best = 0
    try:
        entries = [e for e in os.listdir(root) if e.startswith("index")]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "size")) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if scale > 1 else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best


def _notes(result: Timing, trace: Trace, used: set[int], outside: int) -> list[str]:
    """What the figures mean and what the trace says about their completeness."""
    sources = sorted({c.source for n, c in trace.devices.items() if n in used})
    notes = [
        "device time: the union of the device work each call enqueued (kernels, copies, memsets), from the trace's "
        f"spans ({', '.join(sources) or 'none seen'}); host time: the call alone, without the synchronize after it"
    ]
    if not result.device_ns.any():
        notes.append(
            "the trace saw no device work in any sample: device time is 0 (on CUDA, other libraries' kernels need "
            "CUPTI: install cupti-python)"
        )
    if outside:
        notes.append(f"{outside} device spans ran between or after the samples (another thread?) and are not counted")
    stats = trace.stats
    if stats.dropped:
        notes.append(f"the trace dropped {stats.dropped} spans (capacity): early samples may lack work")
    notes.extend(f"trace: {w}" for w in stats.warnings)
    return notes
