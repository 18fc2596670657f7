"""A trace's counters in a few figures, as the JupyterLab panel shows them under the trace's headline figures: per
device, each counter's mean and peak over the trace in one unit, and what sampled it (``Trace.counter_sources``).

A share (a unit starting with "%") or a rate (a unit ending in "/s") covers the interval since the sample before (the
first has none): its mean weighs each value by that interval, so it is the share over the sampled time. Any other
value (bytes, W, MHz) is a level read at its sample: its mean is the samples' mean. Samples without a value (NaN) are
left out. Bytes read in binary units and rates in decimal ones, as the live dashboard shows them; each counter's unit
is chosen once, from its peak, so that its mean and peak read alike ("310 MiB (peak 1.20 GiB)" never mixes scales).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._format import counter_figure, counter_scale
from ..errors import InvalidArgument
from ..trace.counter_sources import HOST

#: The key of the host's counters in ``Trace.counter_sources`` and in the rows.
HOST_KEY = "host"
#: ``Trace.counters()``'s columns that a summary reads.
NEEDED = ("time_ns", "device", "name", "unit", "value")


def summarize(
    table: Mapping[str, Any], sources: Mapping[str, str], device_keys: Mapping[int, str] | None = None
) -> list[dict[str, Any]]:
    """Per device (the host first, then the trace's devices by number, then those that only say what they offer):
    ``{"device", "source", "sampler", "counters": [{"name", "unit", "mean", "peak", "samples", "text"}]}``.

    ``table``: ``Trace.counters()``'s columns; ``sources``: ``Trace.counter_sources``; ``device_keys``: the trace's
    device number → its key ("cuda:0"). ``mean`` and ``peak`` are in ``unit`` (None where no sample has a value),
    ``samples`` counts those with one, ``text`` reads "GPU busy 38 % (peak 99 %)"; ``sampler`` is ``source`` up to
    its first aside ("NVML GPM, 10 Hz"). Plain JSON types throughout. InvalidArgument on a malformed table.
    """
    columns = _columns(table)
    keys = dict(device_keys or {})
    time_ns, devices, values = columns["time_ns"], columns["device"], columns["value"]
    order = np.argsort(time_ns, kind="stable")
    per_device: dict[int, list[dict[str, Any]]] = {}
    where, names, units = devices[order], columns["name"][order], columns["unit"][order]
    for device, name, unit in dict.fromkeys(zip(where.tolist(), names.tolist(), units.tolist())):
        rows = order[(where == device) & (names == name) & (units == unit)]
        row = summarize_counter(str(name), str(unit), time_ns[rows], values[rows])
        per_device.setdefault(int(device), []).append(row)
    out = []
    for device in sorted(per_device):  # HOST (-1) first
        key = HOST_KEY if device == HOST else keys.get(device, f"device {device}")
        out.append(_device_row(key, sources.get(key, ""), per_device[device]))
    shown = {row["device"] for row in out}
    out += [_device_row(key, text, []) for key, text in sources.items() if key not in shown]
    return out


def summarize_counter(name: str, unit: str, time_ns: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    """One counter's row (see :func:`summarize`) from its samples, in time order."""
    t = np.asarray(time_ns, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    known = np.isfinite(v)
    peak = float(v[known].max()) if known.any() else None
    mean = None
    if peak is not None:
        mean = float(v[known].mean())
        if _over_intervals(unit) and v.size > 1:
            weights = np.diff(t)
            take = known[1:] & (weights > 0)
            if take.any():  # else (samples at one instant): the plain mean stands
                mean = float(np.average(v[1:][take], weights=weights[take]))
    scale, shown = counter_scale(unit, peak)
    mean = None if mean is None else mean / scale
    peak = None if peak is None else peak / scale
    return {
        "name": name,
        "unit": shown,
        "mean": mean,
        "peak": peak,
        "samples": int(known.sum()),
        "text": _text(name, shown, mean, peak),
    }


def summarize_trace(trace: Any) -> list[dict[str, Any]]:
    """:func:`summarize` of a ``Trace``'s counters; [] for a trace recorded without them."""
    if not getattr(trace, "counting", False):
        return []
    sources = trace.counter_sources
    keys = {number: clock.key for number, clock in trace.devices.items()}
    return summarize(trace.counters(), sources, keys)


def _columns(table: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if not isinstance(table, Mapping):
        raise InvalidArgument(f"counters table must be a mapping of columns, not {type(table).__name__}")
    missing = [c for c in NEEDED if c not in table]
    if missing:
        raise InvalidArgument(f"counters table lacks column(s) {', '.join(missing)} (it needs {', '.join(NEEDED)})")
    columns = {c: np.asarray(table[c]) for c in NEEDED}
    lengths = {c: len(columns[c]) for c in NEEDED}
    if len(set(lengths.values())) > 1:
        raise InvalidArgument(f"counters table columns differ in length: {lengths}")
    try:
        columns["time_ns"] = columns["time_ns"].astype(np.int64)
        columns["device"] = columns["device"].astype(np.int64)
        columns["value"] = columns["value"].astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"counters table holds a non-number in time_ns, device or value ({exc})") from None
    columns["name"] = columns["name"].astype(object)
    columns["unit"] = columns["unit"].astype(object)
    return columns


def _device_row(key: str, source: str, counters: list[dict[str, Any]]) -> dict[str, Any]:
    return {"device": key, "source": source, "sampler": _first_clause(source), "counters": counters}


def _first_clause(source: str) -> str:
    """``source`` up to its first aside: "NVML GPM, 10 Hz (CUPTI PM sampling: ...)" → "NVML GPM, 10 Hz"."""
    cut = min((i for i in (source.find(" ("), source.find(";")) if i >= 0), default=len(source))
    return source[:cut].strip()


def _over_intervals(unit: str) -> bool:
    """Whether a value of ``unit`` covers the time since the sample before (a share or a rate), not an instant."""
    return unit.startswith("%") or unit.endswith("/s")


def _text(name: str, unit: str, mean: float | None, peak: float | None) -> str:
    """ "GPU busy 38 % (peak 99 %)", "host CPU 12 % of all cores (peak 40 %)", "process RSS 310 MiB (peak 320 MiB)"."""
    if mean is None or peak is None or not (math.isfinite(mean) and math.isfinite(peak)):
        return f"{name} n/a"
    percent = unit.startswith("%")
    short = "%" if percent else unit
    return f"{name} {_with(counter_figure(mean, percent), unit)} (peak {_with(counter_figure(peak, percent), short)})"


def _with(figure: str, unit: str) -> str:
    return f"{figure} {unit}" if unit else figure
