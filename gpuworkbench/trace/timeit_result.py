"""What ``gw.timeit`` measured: per-sample figures, their medians with a distribution-free 95 % interval and IQR, and
the tables that show them (text and HTML), each table in one unit chosen for all of its rows."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._format import duration_s

#: The units a table may be written in, largest first, with their size in ns.
UNITS: tuple[tuple[str, float], ...] = (("s", 1e9), ("ms", 1e6), ("µs", 1e3), ("ns", 1.0))
#: Below this many samples the order statistics cannot bound the median with 95 % confidence: the interval is the
#: whole range and says so.
MIN_FOR_INTERVAL = 6


def median_interval(values: Any, confidence: float = 0.95) -> tuple[float, float]:
    """The distribution-free interval of the median from order statistics: sorted ``x[j]``, ``x[k]`` such that the
    median lies between them with at least ``confidence`` (the binomial(n, 1/2) tails; its normal form past 300
    samples). With fewer than ``MIN_FOR_INTERVAL`` samples, (min, max); (nan, nan) with none."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n == 0:
        return math.nan, math.nan
    if n < MIN_FOR_INTERVAL:
        return float(x[0]), float(x[-1])
    tail = (1.0 - confidence) / 2
    if n <= 300:
        # the largest j (0-based) with P(B <= j) <= tail, B ~ binomial(n, 1/2): x[j] .. x[n-1-j] covers the median
        cumulative, j = 0.0, -1
        for i in range(n // 2):
            cumulative += math.comb(n, i) / 2.0**n
            if cumulative > tail:
                break
            j = i
        j = max(j, 0)
    else:
        z = 1.959963984540054 if confidence == 0.95 else _z(confidence)
        j = max(int(math.floor(n / 2 - z * math.sqrt(n) / 2)) - 1, 0)
    return float(x[j]), float(x[n - 1 - j])


def _z(confidence: float) -> float:
    """The two-sided normal quantile for ``confidence`` (bisection on erf; only other confidences than 95 %)."""
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid / math.sqrt(2)) < confidence else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Distribution:
    """One figure over the samples (ns): median, the median's 95 % interval (``low``, ``high``), the quartiles
    (``q1``, ``q3``: the IQR), min, max and the number of samples ``n``."""

    median: float
    low: float
    high: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Any) -> Distribution:
        """The figures of ``values`` (any numbers; NaN everywhere when empty)."""
        x = np.asarray(values, dtype=np.float64)
        if x.size == 0:
            return cls(*([math.nan] * 7), 0)
        low, high = median_interval(x)
        q1, median, q3 = np.percentile(x, [25, 50, 75])
        return cls(float(median), low, high, float(q1), float(q3), float(x.min()), float(x.max()), int(x.size))

    def within(self, relative: float) -> bool:
        """Whether the median's 95 % interval lies within ± ``relative`` of the median (False below 6 samples)."""
        if self.n < MIN_FOR_INTERVAL or not self.median > 0:
            return False
        return self.low >= self.median * (1 - relative) and self.high <= self.median * (1 + relative)


@dataclass
class OpTiming:
    """One kernel (or copy, memset) name's device time per call: ``per_sample_ns`` (0 in samples where it did not
    run), ``counts`` (how many ran in each sample) and their ``time`` distribution."""

    name: str
    kind: str
    per_sample_ns: np.ndarray
    counts: np.ndarray

    @property
    def time(self) -> Distribution:
        return Distribution.of(self.per_sample_ns)

    @property
    def median_ns(self) -> float:
        return self.time.median

    @property
    def per_call(self) -> float:
        """How many ran per call (the median over the samples)."""
        return float(np.median(self.counts)) if self.counts.size else 0.0


@dataclass
class Timing:
    """``gw.timeit``'s result: device and host time per call (medians over ``samples``, with their spread), per
    kernel and per copy name, the raw per-sample arrays (ns) and how the run went. ``trace`` holds every span."""

    statement: str
    device_ns: np.ndarray  # per sample: the union of its device work
    host_ns: np.ndarray  # per sample: the call alone (perf_counter_ns around it, without the synchronize)
    kernels: dict[str, OpTiming]
    copies: dict[str, OpTiming]  # copies and memsets, by name
    warmup: int
    stopped: str  # why sampling stopped, in words
    elapsed_s: float  # the sampling's wall time (warm-up excluded)
    devices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trace: Any = None

    @property
    def samples(self) -> int:
        return int(self.device_ns.size)

    @property
    def device(self) -> Distribution:
        return Distribution.of(self.device_ns)

    @property
    def host(self) -> Distribution:
        return Distribution.of(self.host_ns)

    @property
    def device_time_ns(self) -> float:
        """The median device time per call (ns)."""
        return self.device.median

    @property
    def host_time_ns(self) -> float:
        """The median host time per call (ns): the call alone, not the synchronize after it."""
        return self.host.median

    # ------------------------------------------------------------------ tables
    def sections(self) -> list[Any]:
        """The two tables (``statistics.Section``): per call (device, host) and per kernel / copy name, each in one
        unit. The statistics module is imported here, on first display, not with ``import gpuworkbench``."""
        from .statistics import Section

        figures = [("device time", self.device), ("host time", self.host)]
        unit = table_unit([d for _, d in figures])
        rows = [[label, *_cells(d, unit)] for label, d in figures]
        headers = ["per call", "median", "95 % interval of the median", "IQR (25–75 %)", "min", "samples"]
        first = Section("time per call", headers, rows)
        ops = sorted([*self.kernels.values(), *self.copies.values()], key=lambda op: -op.median_ns)
        dists = [op.time for op in ops]
        unit = table_unit(dists)
        rows = [[op.name, op.kind, f"{op.per_call:g}", *_cells(d, unit)] for op, d in zip(ops, dists)]
        headers = ["name", "kind", "per call", "median", "95 % interval of the median", "IQR (25–75 %)", "min"]
        headers.append("samples")
        second = Section("device work per call, by name", headers, rows, "no device work: no kernels or copies")
        return [first, second]

    def headline(self) -> str:
        """One line: what ran, how many samples and why sampling stopped."""
        where = f" on {', '.join(self.devices)}" if self.devices else ""
        return (
            f"timeit {self.statement}{where}: {self.samples} samples in {duration_s(self.elapsed_s)} after "
            f"{self.warmup} warm-up calls; stopped: {self.stopped}"
        )

    def __str__(self) -> str:
        parts = [self.headline(), *(s.text() for s in self.sections())]
        return "\n\n".join(parts) + "".join(f"\n{note}" for note in self.notes)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        notes = "".join(f"<p style='margin:0.2em 0'>{html.escape(n)}</p>" for n in self.notes)
        tables = "".join(s.html() for s in self.sections())
        head = f"<p style='margin:0.2em 0'><b>{html.escape(self.headline())}</b></p>"
        return f"<div class='gpuworkbench-timeit'>{head}{tables}{notes}</div>"


def table_unit(dists: list[Distribution]) -> tuple[str, float, int]:
    """One unit for a whole table (name, ns per unit, decimals): the largest unit in which the largest median reads
    at least 1, with decimals enough for the smallest positive figure to show three significant digits (at most 4)."""
    medians = [d.median for d in dists if d.median > 0]
    if not medians:
        return "ns", 1.0, 0
    largest = max(medians)
    name, scale = next(((n, s) for n, s in UNITS if largest >= s), UNITS[-1])
    figures = [v for d in dists for v in (d.median, d.low, d.q1, d.min) if v > 0 and not math.isnan(v)]
    smallest = min(figures, default=largest) / scale
    decimals = 0 if scale == 1.0 else min(4, max(1, 2 - math.floor(math.log10(smallest))))
    return name, scale, decimals


def _fmt(value: float, unit: tuple[str, float, int]) -> str:
    name, scale, decimals = unit
    return "n/a" if math.isnan(value) else f"{value / scale:.{decimals}f} {name}"


def _cells(d: Distribution, unit: tuple[str, float, int]) -> list[str]:
    """Median, its interval, the IQR, min and the number of samples: every figure in ``unit``."""
    return [
        _fmt(d.median, unit),
        f"{_fmt(d.low, unit)} – {_fmt(d.high, unit)}",
        f"{_fmt(d.q1, unit)} – {_fmt(d.q3, unit)}",
        _fmt(d.min, unit),
        str(d.n),
    ]
