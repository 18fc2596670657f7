"""What ``gw.crossover`` measured on one device: the table of times, the size from which the device wins, the points
the advice takes, and the figure, text and HTML that show them."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .._format import duration_s, op_size
from ..trace.analysis import CrossoverPoint

#: The table's columns, in order.
COLUMNS = (
    "op",
    "size",
    "bytes",
    "numpy_s",
    "device_s",
    "device_with_copies_s",
    "speedup",
    "speedup_with_copies",
)


class Crossing(NamedTuple):
    """The smallest size from which the device beats NumPy at every larger size measured (None: it never does at
    the largest): ``device`` with the data already there, ``with_copies`` counting the copies there and back."""

    device: int | None
    with_copies: int | None


def crossing(sizes: Sequence[int], baseline: Sequence[float], times: Sequence[float]) -> int | None:
    """The smallest of ``sizes`` (ascending) from which ``times`` stay below ``baseline``; None when the largest
    size's time is not below it."""
    found = None
    for size, base, t in zip(reversed(sizes), reversed(baseline), reversed(times)):
        if not t < base:
            break
        found = size
    return found


@dataclass
class CrossoverResult:
    """What ``gw.crossover`` measured on one device: ``.table`` (one row per op and size), ``.crossover`` (per op,
    a ``Crossing``), ``.figure()`` (log-log time against size per op, crossovers marked) and ``.points()`` (for
    the analysis). ``skipped`` names sizes not run and why; ``from_cache`` says which ops came from the cache."""

    device: str
    device_name: str
    backend: str
    version: str
    rows: list[dict[str, Any]]
    units: dict[str, str]
    kernels: dict[str, str]
    skipped: list[tuple[str, int, str]] = field(default_factory=list)
    from_cache: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    cache_file: str | None = None
    dtype: str = "float32"  # the inputs' dtype

    @property
    def ops(self) -> list[str]:
        """The ops measured, in the order asked for."""
        return list(self.units)

    def _rows_of(self, op: str) -> list[dict[str, Any]]:
        return sorted((r for r in self.rows if r["op"] == op), key=lambda r: r["size"])

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """The table as NumPy columns (``COLUMNS``), rows by op then size."""
        rows = [r for op in self.ops for r in self._rows_of(op)]
        out: dict[str, np.ndarray] = {}
        for col in COLUMNS:
            values = [r[col] for r in rows]
            if col == "op":
                out[col] = np.array(values, dtype=object)
            elif col in ("size", "bytes"):
                out[col] = np.array(values, dtype=np.int64)
            else:
                out[col] = np.array(values, dtype=np.float64)
        return out

    @property
    def table(self) -> Any:
        """A pandas DataFrame (``COLUMNS``) where pandas is installed, else the dict of NumPy columns."""
        columns = self.columns
        try:
            import pandas as pd
        except ImportError:
            return columns
        return pd.DataFrame(columns, columns=list(COLUMNS))

    @property
    def crossover(self) -> dict[str, Crossing]:
        """Per op: from which size the device beats NumPy, without and with the copies (None: not in the range)."""
        found = {}
        for op in self.ops:
            rows = self._rows_of(op)
            sizes = [r["size"] for r in rows]
            numpy_s = [r["numpy_s"] for r in rows]
            found[op] = Crossing(
                crossing(sizes, numpy_s, [r["device_s"] for r in rows]),
                crossing(sizes, numpy_s, [r["device_with_copies_s"] for r in rows]),
            )
        return found

    def points(self) -> dict[str, CrossoverPoint]:
        """The crossovers as the analysis takes them, by kernel span name (softmax's for row_softmax, which
        log_softmax shares, where both were measured)."""
        found: dict[str, CrossoverPoint] = {}
        crossover = self.crossover
        for op in sorted(self.ops, key=lambda o: o != "softmax"):  # softmax first: it claims row_softmax
            rows = self._rows_of(op)
            kernel = self.kernels[op]
            if not rows or kernel in found:
                continue
            size = crossover[op].device
            at = next((r for r in rows if r["size"] == size), None)
            threshold = at["bytes"] if at is not None else rows[-1]["bytes"] + 1
            found[kernel] = CrossoverPoint(
                op=op,
                kernel=kernel,
                bytes=int(threshold),
                size=size,
                unit=self.units[op],
                largest=int(rows[-1]["size"]),
                with_copies=crossover[op].with_copies,
            )
        return found

    def figure(self) -> Any:
        """A Bokeh layout: per op, seconds against size on log-log axes for NumPy, the device and the device with
        copies, each crossover marked by a vertical line and a star (``crossover_figure``)."""
        from .crossover_figure import crossover_figure

        return crossover_figure(self)

    def _summary_lines(self) -> list[str]:
        lines = []
        for op, c in self.crossover.items():
            unit = self.units[op]
            rows = self._rows_of(op)
            if not rows:
                lines.append(f"{op}: no size measured")
                continue
            largest = op_size(rows[-1]["size"], unit)
            if c.device is None and c.with_copies is None:
                lines.append(f"{op}: the device does not beat NumPy up to {largest}, with or without the copies")
                continue
            device = f"from {op_size(c.device, unit)}" if c.device is not None else f"at no size up to {largest}"
            copies = (
                f"from {op_size(c.with_copies, unit)}" if c.with_copies is not None else f"at no size up to {largest}"
            )
            lines.append(f"{op}: the device beats NumPy {device}; counting the copies, {copies}")
        return lines

    def _header(self) -> str:
        cached = [op for op, hit in self.from_cache.items() if hit]
        note = f"; cached: {', '.join(cached)} (refresh=True measures again)" if cached else ""
        return f"crossover on {self.device} ({self.device_name}), {self.dtype}{note}"

    def _cells(self) -> list[list[str]]:
        cells = []
        for op in self.ops:
            for r in self._rows_of(op):
                cells.append(
                    [
                        op,
                        op_size(r["size"], self.units[op]),
                        duration_s(r["numpy_s"]),
                        duration_s(r["device_s"]),
                        duration_s(r["device_with_copies_s"]),
                        f"{r['speedup']:.2f}×",
                        f"{r['speedup_with_copies']:.2f}×",
                    ]
                )
        return cells

    def __str__(self) -> str:
        headers = ["op", "size", "NumPy", "device", "with copies", "speedup", "with copies"]
        cells = [headers, *self._cells()]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        body = [
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in cells
        ]
        skipped = [f"skipped {op} {op_size(size, self.units[op])}: {why}" for op, size, why in self.skipped]
        return "\n".join([self._header(), *self._summary_lines(), *body, *skipped, *self.warnings])

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        headers = ["op", "size", "NumPy", "device", "with copies", "speedup", "speedup with copies"]
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self._cells())
        notes = [*self._summary_lines()]
        notes += [f"skipped {op} {op_size(size, self.units[op])}: {why}" for op, size, why in self.skipped]
        notes += self.warnings
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        return (
            f"<div class='gpuworkbench-crossover'><b>{html.escape(self._header())}</b><ul>{items}</ul>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )
