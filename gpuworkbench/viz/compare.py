"""The picture of a comparison (``gw.compare(a, b).figure()``): both runs' timelines on one shared time axis.

Each run's time counts from its own first span, so that two runs line up however far apart they were recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.layouts import column
from bokeh.models import Range1d

from gpuworkbench._format import duration_ns

from .timeline import device_names, timeline_figure


def comparison_figure(
    traces: Sequence[Any],
    tables: Sequence[Mapping[str, np.ndarray]],
    labels: Sequence[str],
    width: int = 1000,
    row_px: int = 26,
) -> Any:
    """The timelines of ``traces`` (their span ``tables``, titled by ``labels``) one above the other (Bokeh
    ``column``) on one shared x range, each in ms from its own first span; panning or zooming one moves both."""
    figures, ends = [], []
    for trace, table, label in zip(traces, tables, labels):
        starts = np.asarray(table["start_ns"], np.int64)
        t0 = int(starts.min()) if starts.size else 0
        ends.append((int(np.max(table["end_ns"])) - t0) / 1e6 if starts.size else 0.0)
        title = f"{label}: {duration_ns(ends[-1] * 1e6)} from first span to last"
        fig = timeline_figure(
            table, device_names(trace), trace.stream_labels, t0_ns=t0, title=title, width=width, row_px=row_px
        )
        fig.xaxis.axis_label = "time since the trace's first span (ms)"
        figures.append(fig)
    shared = Range1d(start=0.0, end=max(max(ends), 1e-3) * 1.02, name="compare x range")
    for fig in figures:
        fig.x_range = shared
    return column(*figures, sizing_mode="stretch_width", name="comparison")
