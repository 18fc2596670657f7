"""``gw.crossover``: is the device worth it here? Each library op timed on the device, with and without the
host↔device copies, against NumPy on the host, from tiny sizes to large ones; the size from which the device wins.

Timing: every case runs once to warm up (compiles, first touches), then ``repeats`` times, NumPy, the device and the
device with copies interleaved, each timed with ``time.perf_counter_ns`` around the call and the wait for its work
(``stream.synchronize()``; a NumPy-in, NumPy-out call blocks on its own); the median counts. Sizes run smallest first
and stop before a size that would not fit half the device's free memory or the time budget (predicted from the last
size's steady cost, its medians without one-off costs such as a first compile, by the op's work: n³ for matmul, the
element count otherwise).

Results are cached per device (backend and name) and library version in ``crossover.json`` in the user's cache
directory (``GPUWB_CACHE_DIR``, else platformdirs' user cache directory, else ``~/.cache/gpuworkbench``); a cached op
is reused unless ``refresh=True``. ``cached_crossovers(trace)`` reads them back for ``summarize(crossover=...)``, whose
advice ``too-small-for-gpu`` names library ops that ran below their crossover.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import library as lib
from ._progress import Progress, in_notebook
from .buffer import Buffer
from .device import Device
from .errors import InvalidArgument
from .library import _kernels as k
from .streams import Stream
from .trace.analysis import CrossoverPoint

CACHE_ENV = "GPUWB_CACHE_DIR"
CACHE_FILE = "crossover.json"
FORMAT = 1
ROW = 1024  # row length of the row operations' problems (shorter when the size does not divide by it)
MEMORY_SHARE = 0.5  # a size runs only if its buffers (resident and a copy call's) fit this share of free memory
DEFAULT_BUDGET_S = 20.0  # seconds per op; a size predicted to go past it is skipped, and every larger one
DEFAULT_REPEATS = 5
MAX_ELEMENTS = 2**31 - 1  # kernel extents are 32-bit


# --------------------------------------------------------------------------------------------------------- the ops
@dataclass(frozen=True)
class _Op:
    """One library op as a problem of one size: inputs, NumPy's answer, the device call, bytes and work."""

    name: str
    kernel: str  # the span name its launches get in a trace
    unit: str  # "n" (an n × n matmul) or "elements"
    defaults: tuple[int, ...]
    inputs: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    numpy: Callable[[dict[str, np.ndarray]], np.ndarray]
    call: Callable[..., Any]  # call(**inputs, device=dev) or call(**buffers, out=out, stream=s)
    out: Callable[[int], tuple[tuple[int, ...], Any]]  # the result's shape and dtype
    nbytes: Callable[[int], int]  # what the kernel reads and writes: the span's ``bytes`` (library.KERNEL_BYTES)
    work: Callable[[int], float]  # relative cost, to predict the next size's time


def _row_shape(size: int) -> tuple[int, int]:
    """(rows, cols) of a row op's problem of ``size`` elements: rows of ROW elements (fewer where ROW does not
    divide the size: the largest power of two that does)."""
    cols = math.gcd(size, ROW)
    return size // cols, cols


def _matrix(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a": rng.standard_normal((size, size), dtype=np.float32),
        "b": rng.standard_normal((size, size), dtype=np.float32),
    }


def _rows_input(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(_row_shape(size), dtype=np.float32)}


def _layer_norm_input(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    x = rng.standard_normal(_row_shape(size), dtype=np.float32)
    cols = x.shape[1]
    return {"x": x, "gamma": rng.standard_normal(cols, dtype=np.float32), "beta": np.zeros(cols, np.float32)}


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _np_layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + np.float32(1e-5)) * gamma + beta


_MATMUL_SIZES = tuple(2**p for p in range(3, 13))  # n = 8 .. 4096
_VECTOR_SIZES = tuple(2**p for p in range(8, 27, 2))  # 2^8 .. 2^26 elements


def _same(size: int) -> tuple[tuple[int, ...], Any]:
    return _row_shape(size), np.float32


def _per_row(dtype: Any) -> Callable[[int], tuple[tuple[int, ...], Any]]:
    return lambda size: ((_row_shape(size)[0],), dtype)


def _row_op(name: str, kernel: Any, numpy: Callable[..., np.ndarray], call: Callable[..., Any], **kw: Any) -> _Op:
    return _Op(
        name=name,
        kernel=kernel.name,
        unit="elements",
        defaults=_VECTOR_SIZES,
        inputs=kw.pop("inputs", _rows_input),
        numpy=lambda a: numpy(**a),
        call=call,
        out=kw.pop("out", _same),
        nbytes=kw.pop("nbytes", lambda s: 8 * s),
        work=lambda s: float(s),
    )


def _reduction(x: np.ndarray) -> int:
    return 4 * x.size


OPS: dict[str, _Op] = {
    op.name: op
    for op in (
        _Op(
            name="matmul",
            kernel=k.matmul_tiled.name,
            unit="n",
            defaults=_MATMUL_SIZES,
            inputs=_matrix,
            numpy=lambda a: a["a"] @ a["b"],
            call=lambda **kw: lib.matmul(**kw, method="tiled"),
            out=lambda n: ((n, n), np.float32),
            nbytes=lambda n: 12 * n * n,
            work=lambda n: float(n) ** 3,
        ),
        _row_op(
            "transpose",
            k.transpose,
            lambda x: np.ascontiguousarray(x.T),
            lib.transpose,
            out=lambda s: (_row_shape(s)[::-1], np.float32),
        ),
        _row_op("softmax", k.row_softmax, _np_softmax, lib.softmax),
        _row_op("log_softmax", k.row_softmax, _np_log_softmax, lib.log_softmax),
        _row_op(
            "layer_norm",
            k.row_layer_norm,
            _np_layer_norm,
            lib.layer_norm,
            inputs=_layer_norm_input,
            nbytes=lambda s: 8 * s + 8 * _row_shape(s)[1],
        ),
        _row_op(
            "sum",
            k.row_sum,
            lambda x: x.sum(axis=-1),
            lambda **kw: lib.sum(**kw, axis=-1),
            out=_per_row(np.float32),
            nbytes=lambda s: 4 * s + 4 * _row_shape(s)[0],
        ),
        _row_op(
            "max",
            k.row_max,
            lambda x: x.max(axis=-1),
            lambda **kw: lib.max(**kw, axis=-1),
            out=_per_row(np.float32),
            nbytes=lambda s: 4 * s + 4 * _row_shape(s)[0],
        ),
        _row_op(
            "argmax",
            k.row_argmax,
            lambda x: x.argmax(axis=-1),
            lambda **kw: lib.argmax(**kw, axis=-1),
            out=_per_row(np.int32),
            nbytes=lambda s: 4 * s + 4 * _row_shape(s)[0],
        ),
        _row_op("cumsum", k.row_cumsum, lambda x: np.cumsum(x, axis=-1), lambda **kw: lib.cumsum(**kw, axis=-1)),
    )
}

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


# -------------------------------------------------------------------------------------------------------- the cache
def cache_dir() -> Path:
    """Where results are cached: ``$GPUWB_CACHE_DIR``, else platformdirs' user cache dir, else ~/.cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "gpuworkbench"
    return Path(platformdirs.user_cache_dir("gpuworkbench", appauthor=False))


def cache_path() -> Path:
    """The cache file (it may not exist yet)."""
    return cache_dir() / CACHE_FILE


_VERSION: str | None = None


def library_version() -> str:
    """The package version and a hash of ``gw.library``'s source: a change to a kernel makes old results stale."""
    global _VERSION
    if _VERSION is None:
        try:
            from importlib.metadata import version

            package = version("gpuworkbench")
        except Exception:  # noqa: BLE001  (running from a checkout that is not installed)
            package = "0"
        digest = hashlib.sha1()
        for path in sorted(Path(lib.__file__).parent.glob("*.py")):
            digest.update(path.read_bytes())
        _VERSION = f"{package}+{digest.hexdigest()[:12]}"
    return _VERSION


def device_key(backend: str, name: str, version: str | None = None) -> str:
    """The cache key of a device's results: backend, device name and library version."""
    return f"{backend}|{name}|{version or library_version()}"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"format": FORMAT, "devices": {}}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("devices"), dict):
        return {"format": FORMAT, "devices": {}}
    return data


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Merge ``entry`` into the file under ``key`` (read again first: another process may have written) and drop
    the same device's results of other library versions. Written to a temporary file, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(path)
    device = key.rsplit("|", 1)[0] + "|"
    devices = {k: v for k, v in data["devices"].items() if not k.startswith(device) or k == key}
    devices[key] = entry
    data["devices"] = devices
    fd, tmp = tempfile.mkstemp(prefix=".crossover-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sizes_key(sizes: Sequence[int] | None) -> str:
    return "default" if sizes is None else ",".join(map(str, sizes))


# ------------------------------------------------------------------------------------------------------- the result
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
        copies, each crossover marked by a vertical line and a marker where the device's time crosses."""
        from bokeh.layouts import gridplot
        from bokeh.models import ColumnDataSource, HoverTool, Span
        from bokeh.plotting import figure

        colors = {"numpy_s": "#4d4d4d", "device_s": "#1f77b4", "device_with_copies_s": "#ff7f0e"}
        labels = {"numpy_s": "NumPy (host)", "device_s": "device", "device_with_copies_s": "device + copies"}
        figures = []
        crossover = self.crossover
        for op in self.ops:
            rows = self._rows_of(op)
            unit = "n (n × n matrices)" if self.units[op] == "n" else "elements"
            fig = figure(
                title=f"{op} on {self.device}",
                x_axis_type="log",
                y_axis_type="log",
                x_axis_label=unit,
                y_axis_label="seconds (median)",
                width=420,
                height=300,
                tools="pan,wheel_zoom,box_zoom,reset,save",
                name=f"crossover-{op}",
            )
            if rows:
                data = {c: [r[c] for r in rows] for c in ("size", *colors)}
                source = ColumnDataSource(data, name=f"times-{op}")
                for col, color in colors.items():
                    dash = "dashed" if col == "numpy_s" else "solid"
                    fig.line("size", col, source=source, color=color, line_dash=dash, legend_label=labels[col])
                    fig.scatter("size", col, source=source, color=color, size=5, legend_label=labels[col])
                fig.add_tools(
                    HoverTool(
                        tooltips=[
                            ("size", "@size"),
                            ("NumPy", "@numpy_s{0.000e}"),
                            ("device", "@device_s{0.000e}"),
                            ("with copies", "@device_with_copies_s{0.000e}"),
                        ]
                    )
                )
                marks: dict[str, list[Any]] = {"size": [], "seconds": [], "which": []}
                for which, size, col in (
                    ("device", crossover[op].device, "device_s"),
                    ("with copies", crossover[op].with_copies, "device_with_copies_s"),
                ):
                    if size is None:
                        continue
                    row = next(r for r in rows if r["size"] == size)
                    marks["size"].append(size)
                    marks["seconds"].append(row[col])
                    marks["which"].append(which)
                    fig.add_layout(
                        Span(
                            location=size,
                            dimension="height",
                            line_color=colors[col],
                            line_width=2,
                            line_dash="dotted",
                            name=f"crossover-{op}-{which}",
                        )
                    )
                fig.scatter(
                    "size",
                    "seconds",
                    source=ColumnDataSource(marks, name=f"crossovers-{op}"),
                    size=14,
                    marker="star",
                    color="#d62728",
                    legend_label="crossover",
                )
                fig.legend.location = "top_left"
                fig.legend.click_policy = "hide"
                fig.legend.label_text_font_size = "8pt"
            figures.append(fig)
        return gridplot(figures, ncols=min(3, max(len(figures), 1)))

    def _summary_lines(self) -> list[str]:
        lines = []
        for op, c in self.crossover.items():
            unit = self.units[op]
            rows = self._rows_of(op)
            if not rows:
                lines.append(f"{op}: no size measured")
                continue
            largest = _fmt_size(rows[-1]["size"], unit)
            if c.device is None and c.with_copies is None:
                lines.append(f"{op}: the device does not beat NumPy up to {largest}, with or without the copies")
                continue
            device = f"from {_fmt_size(c.device, unit)}" if c.device is not None else f"at no size up to {largest}"
            copies = (
                f"from {_fmt_size(c.with_copies, unit)}" if c.with_copies is not None else f"at no size up to {largest}"
            )
            lines.append(f"{op}: the device beats NumPy {device}; counting the copies, {copies}")
        return lines

    def _header(self) -> str:
        cached = [op for op, hit in self.from_cache.items() if hit]
        note = f"; cached: {', '.join(cached)} (refresh=True measures again)" if cached else ""
        return f"crossover on {self.device} ({self.device_name}){note}"

    def _cells(self) -> list[list[str]]:
        cells = []
        for op in self.ops:
            for r in self._rows_of(op):
                cells.append(
                    [
                        op,
                        _fmt_size(r["size"], self.units[op]),
                        _fmt_s(r["numpy_s"]),
                        _fmt_s(r["device_s"]),
                        _fmt_s(r["device_with_copies_s"]),
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
        skipped = [f"skipped {op} {_fmt_size(size, self.units[op])}: {why}" for op, size, why in self.skipped]
        return "\n".join([self._header(), *self._summary_lines(), *body, *skipped, *self.warnings])

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        headers = ["op", "size", "NumPy", "device", "with copies", "speedup", "speedup with copies"]
        head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self._cells())
        notes = [*self._summary_lines()]
        notes += [f"skipped {op} {_fmt_size(size, self.units[op])}: {why}" for op, size, why in self.skipped]
        notes += self.warnings
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        return (
            f"<div class='gpuworkbench-crossover'><b>{html.escape(self._header())}</b><ul>{items}</ul>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )


def _fmt_size(size: int | None, unit: str) -> str:
    if size is None:
        return "-"
    return f"n = {size}" if unit == "n" else f"{size:,} elements"


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


# ------------------------------------------------------------------------------------------------- the measurement
def _check_ops(op: str | Iterable[str] | None) -> list[str]:
    if op is None or op == "all":
        return list(OPS)
    names = [op] if isinstance(op, str) else list(op)
    if not names:
        raise InvalidArgument(f"crossover: no op given; name one or more of {', '.join(OPS)} (or 'all')")
    for name in names:
        if not isinstance(name, str) or name not in OPS:
            raise InvalidArgument(f"crossover: unknown op {name!r}; the library's ops are {', '.join(OPS)} (or 'all')")
    return list(dict.fromkeys(names))


def _check_sizes(op: str, sizes: Any) -> list[int] | None:
    """The sizes asked for ``op``, sorted and without repeats; None: the op's defaults."""
    if sizes is None:
        return None
    if isinstance(sizes, (int, np.integer)) or not isinstance(sizes, Iterable):
        raise InvalidArgument(f"crossover: sizes must be a list of positive ints, not {sizes!r}")
    found = []
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise InvalidArgument(f"crossover: size {size!r} for {op} is not a positive int")
        elements = int(size) ** 2 if OPS[op].unit == "n" else int(size)
        if elements > MAX_ELEMENTS:
            raise InvalidArgument(
                f"crossover: size {size} for {op} is {elements:,} elements; kernels take at most {MAX_ELEMENTS:,}"
            )
        found.append(int(size))
    if not found:
        raise InvalidArgument(f"crossover: no sizes given for {op}")
    return sorted(set(found))


def _sizes_for(ops: list[str], sizes: Any) -> dict[str, list[int] | None]:
    if isinstance(sizes, Mapping):
        unknown = [name for name in sizes if name not in ops]
        if unknown:
            raise InvalidArgument(
                f"crossover: sizes given for {', '.join(map(str, unknown))}, not among the ops asked "
                f"for ({', '.join(ops)})"
            )
        return {op: _check_sizes(op, sizes.get(op)) for op in ops}
    return {op: _check_sizes(op, sizes) for op in ops}


def _median_ns(samples: list[int]) -> float:
    return float(np.median(samples)) / 1e9


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    """Loose agreement (float32 sums in another order); a wrong kernel is far off."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.abs(want).max()) if want.size else 0.0
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-2, atol=1e-3 * max(scale, 1.0)))


def _measure(
    spec: _Op, size: int, dev: Device, stream: Stream, repeats: int, rng: np.random.Generator
) -> tuple[dict[str, Any], str | None]:
    """One size of one op: (its row, a warning or None)."""
    inputs = spec.inputs(size, rng)
    shape, dtype = spec.out(size)
    buffers: dict[str, Buffer] = {}
    out = dev.alloc(shape, dtype)
    try:
        for name, host in inputs.items():
            buffers[name] = dev.alloc(host.shape)
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
        if not _close(got, want):
            warning = f"{spec.name} at {_fmt_size(size, spec.unit)}: the device's result differs from NumPy's"
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


def _resident_bytes(spec: _Op, size: int) -> int:
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
) -> CrossoverResult:
    """Time library ops on ``device`` (default ``gw.Device()``), with and without copies, against NumPy on the
    host over ``sizes`` (default per op: matmul n = 8..4096, the others 2^8..2^26 elements in steps of 4×).

    ``op``: a library op's name, several, or None / "all" (matmul, transpose, softmax, log_softmax, layer_norm,
    sum, max, argmax, cumsum); ``sizes``: one list for every op or a dict per op; ``repeats``: timed runs per case
    (median); ``budget_s``: seconds per op before larger sizes are skipped; ``refresh``: measure even where cached;
    ``progress``: a bar in a notebook (None: only there), lines of text elsewhere when True.
    """
    ops = _check_ops(op)
    asked = _sizes_for(ops, sizes)
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise InvalidArgument(f"crossover: repeats must be a positive int, not {repeats!r}")
    if not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise InvalidArgument(f"crossover: budget_s must be a positive number of seconds, not {budget_s!r}")
    dev = Device(device) if isinstance(device, str) or device is None else device
    if not isinstance(dev, Device):
        raise InvalidArgument(f"crossover: device must be a gw.Device or a spec such as 'opencl:0', not {device!r}")
    version = library_version()
    key = device_key(dev.backend_kind.value, dev.name, version)
    path = cache_path()
    cached_ops = _read_cache(path)["devices"].get(key, {}).get("ops", {})

    result = CrossoverResult(
        device=dev.spec,
        device_name=dev.name,
        backend=dev.backend_kind.value,
        version=version,
        rows=[],
        units={name: OPS[name].unit for name in ops},
        kernels={name: OPS[name].kernel for name in ops},
        cache_file=str(path),
    )
    todo = []
    for name in ops:
        hit = None if refresh else cached_ops.get(name, {}).get(_sizes_key(asked[name]))
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
            spec, rows, skipped = OPS[name], [], []
            spent, last = 0.0, None  # seconds this op took so far; (size, seconds) of the last size measured
            for size in plan[name]:
                what = f"{name} {_fmt_size(size, spec.unit)}"
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
                    f"{what}: NumPy {_fmt_s(row['numpy_s'])}, device {_fmt_s(row['device_s'])}, "
                    f"with copies {_fmt_s(row['device_with_copies_s'])}"
                )
            result.rows += rows
            result.skipped += [(name, size, why) for size, why in skipped]
            measured[name] = {
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
    _store(path, key, dev, measured)
    result.rows.sort(key=lambda r: (ops.index(r["op"]), r["size"]))
    return result


def _store(path: Path, key: str, dev: Device, measured: dict[str, dict[str, Any]]) -> None:
    entry = _read_cache(path)["devices"].get(key) or {"device": dev.spec, "name": dev.name, "ops": {}}
    for name, found in measured.items():
        entry["ops"].setdefault(name, {})[_sizes_key(found["sizes"])] = found
    _write_cache(path, key, entry)


# ---------------------------------------------------------------------------------------------- reading back for traces
def cached_result(device: Device | str, ops: str | Sequence[str] | None = None) -> CrossoverResult | None:
    """The cached measurements of ``device`` (the default sizes' where several were measured, else the widest
    range), without measuring anything; None when none is cached for this library version."""
    dev = Device(device) if isinstance(device, str) else device
    return _cached(dev.backend_kind.value, dev.name, dev.spec, _check_ops(ops))


def _cached(backend: str, name: str, spec: str, ops: list[str]) -> CrossoverResult | None:
    entry = _read_cache(cache_path())["devices"].get(device_key(backend, name))
    if not entry:
        return None
    result = CrossoverResult(
        device=spec,
        device_name=name,
        backend=backend,
        version=library_version(),
        rows=[],
        units={},
        kernels={},
        cache_file=str(cache_path()),
    )
    for op in ops:
        runs = entry.get("ops", {}).get(op)
        if not runs:
            continue
        best = runs.get("default") or max(
            runs.values(), key=lambda run: max((r["size"] for r in run["rows"]), default=0)
        )
        result.units[op], result.kernels[op], result.from_cache[op] = OPS[op].unit, OPS[op].kernel, True
        result.rows += [dict(r, op=op) for r in best["rows"]]
    return result if result.rows else None


def cached_crossovers(trace: Any) -> dict[int, dict[str, CrossoverPoint]]:
    """Per device number of ``trace`` (anything with ``.devices``: number → ``key`` "backend:N" and ``name``), the
    cached crossover of every library kernel: what ``summarize(table, crossover=...)`` takes. Reads the cache file."""
    found = {}
    for number, clock in getattr(trace, "devices", {}).items():
        backend = str(clock.key).split(":", 1)[0]
        result = _cached(backend, clock.name, clock.key, list(OPS))
        if result is not None:
            found[int(number)] = result.points()
    return found
