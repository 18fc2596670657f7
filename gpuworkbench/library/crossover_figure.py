"""The crossover figure (``CrossoverResult.figure``): per op, seconds against size on log-log axes, the legend below
the data, and ticks a reader can tell apart on any range: 1-2-5 per decade, written as durations and counts."""

from __future__ import annotations

from typing import Any

#: The browser's major ticks of a log axis (a ``CustomJSTicker``): powers of ten (every k-th decade where there are
#: many), else 1-3, 1-2-5, 1-2-3-5-7 or 1…9 per decade, the first set that puts 3 to 6 ticks on the range (2 where
#: none does); a range too narrow for any of them gets a few evenly spaced ticks. Bokeh's own log ticker spaces
#: ticks evenly in value below two decades, so that they crowd at the top of the axis.
LOG_TICKS = """
const lo = Math.min(cb_data.start, cb_data.end), hi = Math.max(cb_data.start, cb_data.end)
if (!(lo > 0) || !isFinite(hi) || !(hi > lo)) return []
const most = 6, first = Math.floor(Math.log10(lo)) - 1, last = Math.ceil(Math.log10(hi)) + 1
const within = (mantissas, every) => {
  const out = []
  for (let e = first; e <= last; e++) {
    if (((e % every) + every) % every) continue
    for (const m of mantissas) {
      const t = Number((m * 10 ** e).toPrecision(12))
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) out.push(t)
    }
  }
  return out
}
let every = 1
while (within([1], every).length > most) every++
const sets = [within([1], every), within([1, 3], 1), within([1, 2, 5], 1), within([1, 2, 3, 5, 7], 1),
  within([1, 2, 3, 4, 5, 6, 7, 8, 9], 1)]
const fits = sets.filter((ticks) => ticks.length <= most)
const good = fits.find((ticks) => ticks.length >= 3) ?? fits.filter((ticks) => ticks.length == 2).pop()
if (good) return good
const rough = (hi - lo) / 3, scale = 10 ** Math.floor(Math.log10(rough))
const step = [1, 2, 5, 10].map((m) => m * scale).find((s) => s >= rough * (1 - 1e-6))
const out = []
for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi * (1 + 1e-9); k++) out.push(Number((k * step).toPrecision(12)))
return out
"""

#: Tick labels (a ``CustomJSTickFormatter``) with the fewest significant digits that write every tick exactly and no
#: two alike; ``UNITS`` is replaced by the axis's units, largest first: [scale, suffix] pairs.
_SCALED = """
const units = UNITS
const label = (t, digits) => {
  const a = Math.abs(t)
  const [scale, suffix] = units.find(([s]) => a >= s * (1 - 1e-9)) ?? units[units.length - 1]
  const value = parseFloat((t / scale).toPrecision(digits))
  return [value * scale, `${value}${suffix}`]
}
for (let digits = 1; digits <= 6; digits++) {
  const labels = ticks.map((t) => label(t, digits))
  const exact = labels.every(([v], i) => Math.abs(v - ticks[i]) <= 1e-6 * Math.abs(ticks[i]))
  if (exact && new Set(labels.map(([, text]) => text)).size == ticks.length) return labels[index][1]
}
return label(tick, 6)[1]
"""

#: Seconds as durations: "20 µs", "1 ms", "1.5 s".
SECONDS = _SCALED.replace("UNITS", '[[1, " s"], [1e-3, " ms"], [1e-6, " µs"], [1e-9, " ns"]]')

#: Sizes as counts: "500", "2k", "10M".
COUNTS = _SCALED.replace("UNITS", '[[1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""]]')

#: What each line is: its column, label and colour.
LINES = (
    ("numpy_s", "NumPy (host)", "#4d4d4d"),
    ("device_s", "device", "#1f77b4"),
    ("device_with_copies_s", "device + copies", "#ff7f0e"),
)


def _log_axes(fig: Any) -> None:
    """Both axes: the 1-2-5 ticker, durations up the side and counts along the bottom."""
    from bokeh.models import CustomJSTicker, CustomJSTickFormatter

    for axis, code in ((fig.xaxis, COUNTS), (fig.yaxis, SECONDS)):
        ticker = CustomJSTicker(major_code=LOG_TICKS)
        axis.ticker = ticker
        axis.formatter = CustomJSTickFormatter(code=code)
    fig.xgrid.ticker = fig.xaxis[0].ticker
    fig.ygrid.ticker = fig.yaxis[0].ticker


def crossover_figure(result: Any) -> Any:
    """A Bokeh grid, one plot per op of ``result`` (a ``CrossoverResult``): seconds against size for NumPy, the device
    and the device with copies, each crossover marked by a dotted vertical line and a star, the legend below."""
    from bokeh.layouts import gridplot
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem, Span
    from bokeh.plotting import figure

    colors = {col: color for col, _, color in LINES}
    figures = []
    crossover = result.crossover
    for op in result.ops:
        rows = [r for r in result.rows if r["op"] == op]
        rows.sort(key=lambda r: r["size"])
        fig = figure(
            title=f"{op} on {result.device}",
            x_axis_type="log",
            y_axis_type="log",
            x_axis_label="n (n × n matrices)" if result.units[op] == "n" else "elements",
            y_axis_label="time (median)",
            width=420,
            height=360,
            tools="pan,wheel_zoom,box_zoom,reset,save",
            name=f"crossover-{op}",
        )
        _log_axes(fig)
        if rows:
            data = {c: [r[c] for r in rows] for c in ("size", *colors)}
            source = ColumnDataSource(data, name=f"times-{op}")
            items = []
            for col, label, color in LINES:
                dash = "dashed" if col == "numpy_s" else "solid"
                line = fig.line("size", col, source=source, color=color, line_dash=dash)
                dots = fig.scatter("size", col, source=source, color=color, size=5)
                items.append(LegendItem(label=label, renderers=[line, dots]))
            fig.add_tools(
                HoverTool(
                    tooltips=[
                        ("size", "@size"),
                        ("NumPy", "@numpy_s{0.000e} s"),
                        ("device", "@device_s{0.000e} s"),
                        ("with copies", "@device_with_copies_s{0.000e} s"),
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
            stars = fig.scatter(
                "size",
                "seconds",
                source=ColumnDataSource(marks, name=f"crossovers-{op}"),
                size=14,
                marker="star",
                color="#d62728",
            )
            if marks["size"]:  # an entry with nothing drawn beside it would only puzzle
                items.append(LegendItem(label="crossover", renderers=[stars]))
            legend = Legend(
                items=items,
                orientation="horizontal",
                ncols=2,
                location="center",
                click_policy="hide",
                label_text_font_size="8pt",
                glyph_width=16,
                spacing=4,
                padding=4,
                margin=4,
                border_line_alpha=0,
                name=f"legend-{op}",
            )
            fig.add_layout(legend, "below")
        figures.append(fig)
    return gridplot(figures, ncols=min(3, max(len(figures), 1)))
