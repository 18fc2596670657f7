"""``gw.crossover``: is the device worth it here? Each library op timed on the device, with and without the
host↔device copies, against NumPy on the host, from tiny sizes to large ones; the size from which the device wins.

Timing: every case runs once to warm up (compiles, first touches), then ``repeats`` times, NumPy, the device and the
device with copies interleaved, each timed with ``time.perf_counter_ns`` around the call and the wait for its work
(``stream.synchronize()``; a NumPy-in, NumPy-out call blocks on its own); the median counts. Sizes run smallest first
and stop before a size that would not fit half the device's free memory or the time budget (predicted from the last
size's steady cost, its medians without one-off costs such as a first compile, by the op's work: n³ for matmul, the
element count otherwise).

Each op runs on inputs of one dtype (float32 unless ``dtype=`` says otherwise); NumPy's side computes in that dtype
too. Results are cached per device (backend and name), library version and dtype in ``crossover.json`` in the user's
cache directory (``GPUWB_CACHE_DIR``, else platformdirs' user cache directory, else ``~/.cache/gpuworkbench``); a
cached op is reused unless ``refresh=True``. ``cached_crossovers(trace)`` reads them back for
``summarize(crossover=...)``, whose advice ``too-small-for-gpu`` names library ops that ran below their crossover.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._format import duration_s, in_notebook, op_size
from .._progress import Progress
from ..buffer import Buffer
from ..device import Device
from ..errors import InvalidArgument
from ..streams import Stream
from .crossover_cache import cache_path, device_key, library_version, op_key, read_cache, sizes_key, store
from .crossover_ops import OPS, CrossoverOp, check_dtype, check_ops, op_for, sizes_for
from .crossover_result import COLUMNS, CrossoverResult

MEMORY_SHARE = 0.5  # a size runs only if its buffers (resident and a copy call's) fit this share of free memory
DEFAULT_BUDGET_S = 20.0  # seconds per op; a size predicted to go past it is skipped, and every larger one
DEFAULT_REPEATS = 5


def _median_ns(samples: list[int]) -> float:
    return float(np.median(samples)) / 1e9


def _close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-2) -> bool:
    """Loose agreement (float32 sums in another order); a wrong kernel is far off."""
    got, want = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    scale = float(np.abs(want).max()) if want.size else 0.0
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=rtol / 10 * max(scale, 1.0)))


def _reference(spec: CrossoverOp, inputs: dict[str, np.ndarray], want: Any) -> tuple[Any, float]:
    """What the device's result is checked against, and how closely: NumPy's own answer, except for 16-bit floats,
    which NumPy may accumulate in their own precision: their answer in float64, within 2 %."""
    if spec.dtype not in ("float16", "bfloat16"):
        return want, 1e-2
    return spec.numpy({k: v.astype(np.float64) for k, v in inputs.items()}), 2e-2


def _measure(
    spec: CrossoverOp, size: int, dev: Device, stream: Stream, repeats: int, rng: np.random.Generator
) -> tuple[dict[str, Any], str | None]:
    """One size of one op: (its row, a warning or None)."""
    inputs = spec.inputs(size, rng)
    shape, dtype = spec.out(size)
    buffers: dict[str, Buffer] = {}
    out = dev.alloc(shape, dtype)
    try:
        for name, host in inputs.items():
            buffers[name] = dev.alloc(host.shape, host.dtype)
            buffers[name].copy_from_host(host.reshape(-1))

        def on_device() -> None:
            spec.call(**buffers, out=out, stream=stream)
            stream.synchronize()

        cases: list[Callable[[], Any]] = [
            lambda: spec.numpy(inputs),
            on_device,
            lambda: spec.call(**inputs, device=dev),
        ]
        want = cases[0]()
        on_device()
        got = cases[2]()
        warning = None
        if not _close(got, *_reference(spec, inputs, want)):
            warning = f"{spec.name} at {op_size(size, spec.unit)}: the device's result differs from NumPy's"
        samples: list[list[int]] = [[], [], []]
        for r in range(repeats):
            for i in range(3):
                j = (i + r) % 3  # each case first in turn: no case always follows the same one
                t0 = time.perf_counter_ns()
                cases[j]()
                samples[j].append(time.perf_counter_ns() - t0)
    finally:
        out.free()
        for buf in buffers.values():
            buf.free()
    numpy_s, device_s, copies_s = (_median_ns(s) for s in samples)
    row = {
        "op": spec.name,
        "size": size,
        "bytes": spec.nbytes(size),
        "numpy_s": numpy_s,
        "device_s": device_s,
        "device_with_copies_s": copies_s,
        "speedup": numpy_s / device_s if device_s > 0 else math.inf,
        "speedup_with_copies": numpy_s / copies_s if copies_s > 0 else math.inf,
    }
    return row, warning


def _resident_bytes(spec: CrossoverOp, size: int) -> int:
    """Device bytes one size needs at once: inputs and output held, and a copying call's own copies of both."""
    shape, dtype = spec.out(size)
    held = spec.nbytes(size) + int(np.prod(shape)) * np.dtype(dtype).itemsize
    return 2 * held


def crossover(
    op: str | Sequence[str] | None = None,
    device: Device | str | None = None,
    sizes: Sequence[int] | Mapping[str, Sequence[int]] | None = None,
    repeats: int = DEFAULT_REPEATS,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    refresh: bool = False,
    progress: bool | None = None,
    seed: int = 0,
    dtype: Any = "float32",
) -> CrossoverResult:
    """Time library ops on ``device`` (default ``gw.Device()``), with and without copies, against NumPy on the
    host over ``sizes`` (default per op: matmul n = 8..4096, the others 2^8..2^26 elements in steps of 4×).

    ``op``: a library op's name, several, or None / "all" (matmul, transpose, softmax, log_softmax, layer_norm,
    sum, max, argmax, cumsum); ``sizes``: one list for every op or a dict per op; ``repeats``: timed runs per case
    (median); ``budget_s``: seconds per op before larger sizes are skipped; ``refresh``: measure even where cached;
    ``progress``: a bar in a notebook (None: only there), lines of text elsewhere when True; ``dtype``: the inputs'
    dtype (float16, bfloat16, float32, float64; int32 and int64 for sum, max, argmax, cumsum and transpose), cached
    apart from the others'.
    """
    ops = check_ops(op)
    dtype = check_dtype(ops, dtype)
    asked = sizes_for(ops, sizes)
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise InvalidArgument(f"crossover: repeats must be a positive int, not {repeats!r}")
    if not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise InvalidArgument(f"crossover: budget_s must be a positive number of seconds, not {budget_s!r}")
    dev = Device(device) if isinstance(device, str) or device is None else device
    if not isinstance(dev, Device):
        raise InvalidArgument(f"crossover: device must be a gw.Device or a spec such as 'opencl:0', not {device!r}")
    index = "i32" if dev.backend_device.lacks_type("int64") else "i64"  # argmax's indices there
    specs = {name: op_for(name, dtype, index) for name in ops}
    for name in ops:  # the inputs' dtype and the result's (the int64 sum of int32)
        for held in dict.fromkeys((dtype, np.dtype(specs[name].out(1)[1]).name)):
            why = dev.backend_device.lacks_type(held)
            if why:
                raise InvalidArgument(f"crossover: {name} of {dtype}: {dev.spec} ({dev.name}) has no {held}: {why}")
    version = library_version()
    key = device_key(dev.backend_kind.value, dev.name, version)
    path = cache_path()
    cached_ops = read_cache(path)["devices"].get(key, {}).get("ops", {})

    result = CrossoverResult(
        device=dev.spec,
        device_name=dev.name,
        backend=dev.backend_kind.value,
        version=version,
        rows=[],
        units={name: OPS[name].unit for name in ops},
        kernels={name: specs[name].kernel for name in ops},
        cache_file=str(path),
        dtype=dtype,
    )
    todo = []
    for name in ops:
        hit = None if refresh else cached_ops.get(op_key(name, dtype), {}).get(sizes_key(asked[name]))
        result.from_cache[name] = hit is not None
        if hit is not None:
            result.rows += [dict(r, op=name) for r in hit["rows"]]
            result.skipped += [(name, int(s), why) for s, why in hit.get("skipped", [])]
        else:
            todo.append(name)
    if not todo:
        return result

    notebook = in_notebook()
    quiet = not (progress or (progress is None and notebook))
    plan = {name: asked[name] or list(OPS[name].defaults) for name in todo}
    bar = Progress("crossover", sum(len(s) for s in plan.values()), notebook, quiet=quiet)
    rng = np.random.default_rng(seed)
    stream = dev.create_stream("crossover")
    measured: dict[str, dict[str, Any]] = {}
    try:
        for name in todo:
            spec, rows, skipped = specs[name], [], []
            spent, last = 0.0, None  # seconds this op took so far; (size, seconds) of the last size measured
            for size in plan[name]:
                what = f"{name} {op_size(size, spec.unit)}"
                reason = None
                free, _ = dev.memory_info()
                if _resident_bytes(spec, size) > MEMORY_SHARE * free:
                    reason = f"needs {_resident_bytes(spec, size):,} B of device memory; {free:,} B free"
                elif skipped and skipped[-1][1].startswith("time budget"):
                    reason = skipped[-1][1]
                elif last is not None:
                    predicted = last[1] * spec.work(size) / spec.work(last[0])
                    if spent + predicted > budget_s:
                        reason = f"time budget ({budget_s:g} s per op) would be exceeded"
                if reason is not None:
                    skipped.append((size, reason))
                    bar.step(f"{what}: skipped")
                    continue
                t0 = time.perf_counter()
                row, warning = _measure(spec, size, dev, stream, repeats, rng)
                took = time.perf_counter() - t0
                # The next size is predicted from this one's steady cost (its medians, once per round and for the
                # warm-up), not its wall time: that includes one-off costs (a kernel's first compile took seconds
                # on PoCL with 2 cores, and a 8x larger prediction of it skipped the next tiny size).
                steady = (repeats + 1) * (row["numpy_s"] + row["device_s"] + row["device_with_copies_s"])
                spent, last = spent + took, (size, min(took, steady))
                rows.append(row)
                if warning:
                    result.warnings.append(warning)
                bar.step(
                    f"{what}: NumPy {duration_s(row['numpy_s'])}, device {duration_s(row['device_s'])}, "
                    f"with copies {duration_s(row['device_with_copies_s'])}"
                )
            result.rows += rows
            result.skipped += [(name, size, why) for size, why in skipped]
            measured[op_key(name, dtype)] = {
                "sizes": asked[name],
                "repeats": int(repeats),
                "budget_s": float(budget_s),
                "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "rows": [{c: r[c] for c in COLUMNS if c != "op"} for r in rows],
                "skipped": [[size, why] for size, why in skipped],
            }
    finally:
        bar.close()
        stream.close()
    store(path, key, dev, measured)
    result.rows.sort(key=lambda r: (ops.index(r["op"]), r["size"]))
    return result
