"""The counter tracks' figure: a line per counter, an axis per unit (shares 0-100 % on the left, bytes on the right),
the timeline's x range when given, and an empty figure that says how to record counters."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("bokeh")

from bokeh.embed import json_item  # noqa: E402
from bokeh.models import CustomJSTickFormatter, DataRange1d, LinearAxis, Range1d  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench import viz  # noqa: E402
from gpuworkbench.trace.counter_sources import HOST_RATE_HZ  # noqa: E402
from gpuworkbench.trace.counters import FRESH, empty_counters_table  # noqa: E402
from gpuworkbench.viz import timeline_js  # noqa: E402
from gpuworkbench.viz.counters import EMPTY_NOTE, counters_figure, trace_counters_plot  # noqa: E402


def table(rows: list[tuple[int, int, str, str, float]]) -> dict[str, np.ndarray]:
    """A counters table of (time_ns, device, name, unit, value) rows."""
    t, d, n, u, v = zip(*rows)
    return {
        "time_ns": np.array(t, np.int64),
        "device": np.array(d, np.int16),
        "name": np.array(n, object),
        "unit": np.array(u, object),
        "value": np.array(v, np.float64),
    }


#: The host's CPU and memory, and a device's own share counter, at 1, 2 and 3 ms (the first share without a value).
ROWS = [
    (t, dev, name, unit, value)
    for t, cpu in ((1_000_000, float("nan")), (2_000_000, 40.0), (3_000_000, 60.0))
    for dev, name, unit, value in (
        (-1, "host CPU", "% of all cores", cpu),
        (-1, "host memory used", "bytes", 2.0 * 2**30 + t),
        (0, "SM busy", "% of all cores", 75.0),
    )
]


def test_a_line_per_counter_and_an_axis_per_unit():
    fig = counters_figure(table(ROWS), {0: "cuda:0"}, t0_ns=0)
    names = sorted(r.name for r in fig.renderers)
    assert names == ["counter:cuda:0: SM busy", "counter:host: host CPU", "counter:host: host memory used"]
    lines = {r.name: r for r in fig.renderers}
    cpu = lines["counter:host: host CPU"].data_source.data
    # each share across the interval it was measured over; the first (no interval) a gap, not a zero
    assert list(cpu["t_ms"]) == [1.0, 1.0, 2.0, 2.0, 3.0]
    assert np.isnan(cpu["value"][0]) and list(cpu["value"][1:]) == [40.0, 40.0, 60.0, 60.0]
    memory_points = lines["counter:host: host memory used"].data_source.data
    assert list(memory_points["t_ms"]) == [1.0, 2.0, 3.0]  # bytes: point to point
    assert isinstance(fig.y_range, Range1d) and (fig.y_range.start, fig.y_range.end) == (0, 105)
    assert list(fig.extra_y_ranges) == ["bytes"]
    memory = lines["counter:host: host memory used"]
    assert memory.y_range_name == "bytes"
    assert isinstance(fig.extra_y_ranges["bytes"], DataRange1d)
    assert fig.extra_y_ranges["bytes"].renderers == [memory]  # fitted to the bytes only, not to 0-100
    right = [a for a in fig.right if isinstance(a, LinearAxis)]
    assert [a.y_range_name for a in right] == ["bytes"]
    assert isinstance(right[0].formatter, CustomJSTickFormatter) and right[0].formatter.code == timeline_js.BYTE_TICKS
    labels = sorted(item.label["value"] for item in fig.legend[0].items)
    assert labels[0] == "cuda:0: SM busy (% of all cores)"
    json.dumps(json_item(fig))  # a whole Bokeh document: every model serialises


def test_units_of_a_gpu_source_each_get_an_axis_fitted_to_their_lines():
    rows = [
        (t, 0, name, unit, value)
        for t in (1_000_000, 2_000_000)
        for name, unit, value in (("power", "W", 150.0), ("SM clock", "MHz", 1980.0), ("PCIe TX", "bytes/s", 5e10))
    ]
    fig = counters_figure(table(rows), {0: "cuda:0"}, t0_ns=0)
    ranges = [fig.y_range, *fig.extra_y_ranges.values()]
    assert all(isinstance(r, DataRange1d) for r in ranges) and len(ranges) == 3
    assert sorted(fig.extra_y_ranges) == ["MHz", "bytes/s"]
    json.dumps(json_item(fig))  # every range validates and serialises


def test_a_shared_x_range_is_kept():
    shared = Range1d(0, 10)
    fig = counters_figure(table(ROWS), x_range=shared)
    assert fig.x_range is shared


def test_an_empty_table_says_how_to_record_counters():
    fig = counters_figure(empty_counters_table())
    assert fig.title.text == "counters: none recorded"
    assert [list(r.data_source.data["text"]) for r in fig.renderers] == [[EMPTY_NOTE]]
    json.dumps(json_item(fig))


@pytest.fixture(scope="module")
def recorded():
    dev = gw.Device("cpu")
    with gw.trace(counters=True) as t:
        dev.alloc(1 << 12, "float32").copy_from_host(np.ones(1 << 12, np.float32))
        time.sleep(0.5)  # the sampler's start (psutil's import, in a fresh process) and a few periods, on a busy box
    return t


def test_a_recorded_trace_is_drawn_on_its_timeline_axis(recorded):
    c = recorded.counters()
    fig = trace_counters_plot(recorded)
    assert sorted(r.name for r in fig.renderers) == sorted(f"counter:host: {n}" for n in set(c["name"].tolist()))
    for r in fig.renderers:
        t_ms = np.asarray(r.data_source.data["t_ms"])
        assert (t_ms >= 0).all()  # ms since the trace started, as the timeline and the memory plot count
        # the last sample at the stop, or, where a periodic one came just before it, that one
        stop_ms = (recorded.stopped_ns - recorded.started_ns) / 1e6
        assert stop_ms - FRESH * 1e3 / HOST_RATE_HZ <= t_ms.max() <= stop_ms + 1e-6
        assert t_ms.size >= 3  # the first sample, one on the way, the last (a share: as steps, more points)


def test_trace_counters_plot_reaches_the_figure(recorded):
    fig = recorded.counters_plot()
    assert len(fig.renderers) == len(set(recorded.counters()["name"].tolist()))


def test_a_trace_with_counters_shows_its_tracks_in_its_layout(recorded, monkeypatch):
    """``trace.show()``'s layout holds one more figure on the timeline's time axis where the trace has counters: the
    tracks, with a renderer per counter."""

    def on_time_axis(layout):
        timeline = next(c for c in layout.children if getattr(c, "name", "") == "timeline")
        return [c for c in layout.children if c is not timeline and getattr(c, "x_range", None) is timeline.x_range]

    with_tracks = on_time_axis(viz.trace_layout(recorded))
    monkeypatch.setattr(recorded, "counting", False)
    without = on_time_axis(viz.trace_layout(recorded))
    assert len(with_tracks) == len(without) + 1
    drawn = {r.name for f in with_tracks for r in f.renderers if (r.name or "").startswith("counter:")}
    assert drawn == {f"counter:host: {n}" for n in set(recorded.counters()["name"].tolist())}
