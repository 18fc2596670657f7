"""Formatting shared by every room: bytes, durations, percentages, sizes; and whether we run in a notebook kernel.

One home each, so a figure reads the same in an error message, a summary, a statistics table and a dashboard.
"""

from __future__ import annotations

import math
import sys


def binary_bytes(n: int | float | None) -> str:
    """Bytes in binary units, as memory is sized ("64.0 MiB"); "?" for None."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def decimal_bytes(n: int | float) -> str:
    """Bytes in decimal units, as bandwidths in GB/s are ("4.19 MB")."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def duration_ns(ns: float) -> str:
    """A duration in the unit that reads best ("1.23 ms"); "n/a" for NaN."""
    ns = float(ns)
    if math.isnan(ns):
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def duration_s(seconds: float) -> str:
    """Seconds with two decimals in s or ms, one in µs ("1.25 ms")."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def percent(value: float | None) -> str:
    """A percentage with one decimal; "n/a" for None or NaN."""
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f} %"


#: The units a counter's bytes (binary, as memory is sized) and bytes/s (decimal, as bandwidths are) are shown in.
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
RATE_UNITS = ("B/s", "kB/s", "MB/s", "GB/s", "TB/s")


def counter_scale(unit: str, magnitude: float | None) -> tuple[float, str]:
    """(divisor, unit shown) for a counter of ``unit`` whose values reach ``magnitude``: bytes in binary units, bytes/s
    in decimal ones, anything else as it is; one scale per counter, so that its mean and peak read alike."""
    if unit not in ("bytes", "bytes/s"):
        return 1.0, unit
    step, names = (1024.0, BINARY_UNITS) if unit == "bytes" else (1000.0, RATE_UNITS)
    scale, magnitude = 1.0, abs(magnitude or 0.0)
    for name in names[:-1]:
        if magnitude < step * scale:
            return scale, name
        scale *= step
    return scale, names[-1]


def counter_figure(value: float, percent: bool) -> str:
    """Three significant digits without an exponent; shares of 10 % and more without decimals ("38")."""
    magnitude = abs(value)
    if magnitude == 0 or magnitude >= 100 or (percent and magnitude >= 10):
        return f"{value:.0f}"
    if magnitude >= 10 or percent:
        return f"{value:.1f}"
    return f"{value:.2f}"


def counter_value(value: float, unit: str) -> str:
    """A counter's value in its unit, as a dashboard line shows it ("38 %", "1.20 GB/s", "1980 MHz"); "n/a" for NaN."""
    value = float(value)
    if math.isnan(value):
        return "n/a"
    scale, shown = counter_scale(unit, value)
    figure = counter_figure(value / scale, unit.startswith("%"))
    return f"{figure} {shown}" if shown else figure


def gbps(value: float) -> str:
    """A bandwidth in GB/s with three significant digits; "n/a" for NaN."""
    if math.isnan(value):
        return "n/a"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def op_size(size: int | None, unit: str) -> str:
    """A problem size in its op's unit: "n = 512" (an n × n matmul) or "65,536 elements"; "-" for None."""
    if size is None:
        return "-"
    return f"n = {size}" if unit == "n" else f"{size:,} elements"


def count(n: int, one: str, many: str) -> str:
    """ "1 kernel", "3 kernels"."""
    return f"{n} {one if n == 1 else many}"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (widgets and rich output display there), False in a script, a terminal IPython
    or a test shell. IPython is not imported here: without it loaded, no kernel runs."""
    ipython_module = sys.modules.get("IPython")
    if ipython_module is None:
        return False
    shell = ipython_module.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
