"""The timeline tooltip's launch row: a kernel's grid, block, registers, shared memory and theoretical occupancy (with
the limit that binds), in real Bokeh documents of hand-built traces; what a span without a known launch shows."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("bokeh")

from bokeh.core.json_encoder import serialize_json  # noqa: E402
from bokeh.document import Document  # noqa: E402
from bokeh.models import ColumnDataSource, HoverTool  # noqa: E402

from gpuworkbench.trace.columns import DeviceClock  # noqa: E402
from gpuworkbench.trace.device_limits import DeviceLimits  # noqa: E402
from gpuworkbench.trace.recorder import Trace  # noqa: E402
from gpuworkbench.viz import timeline_figure  # noqa: E402
from gpuworkbench.viz.timeline_launch import launch_text  # noqa: E402

US = 1_000
H100 = DeviceLimits(9, 0, 132, 32, 1024, 2048, 32, 65536, 65536, 233472, 232448, 1024)
RECORDS = [
    {"kind": "kernel", "stream": 0, "start_ns": 0, "end_ns": 50 * US, "name": "gemm", "grid": (128, 1, 1),
     "block": (256, 1, 1), "registers": 202, "shared_bytes": 49152},
    {"kind": "kernel", "stream": 0, "start_ns": 60 * US, "end_ns": 70 * US, "name": "copy", "grid": (64, 2, 1),
     "block": (16, 16, 2), "registers": 32, "shared_bytes": 2064},
    {"kind": "kernel", "stream": 0, "start_ns": 80 * US, "end_ns": 90 * US, "name": "opencl", "grid": (4, 1, 1),
     "block": (64, 1, 1), "shared_bytes": 256},
    {"kind": "kernel", "stream": 0, "start_ns": 95 * US, "end_ns": 99 * US, "name": "unknown"},
    {"kind": "h2d", "stream": 1, "start_ns": 0, "end_ns": 40 * US, "bytes": 4096, "name": "upload"},
]  # fmt: skip
GEMM = "grid 128×1×1 · block 256×1×1 · 202 registers · 48.0 KiB shared · occupancy 12.5 % (registers)"


def hand_trace(limits: DeviceLimits | None = H100) -> Trace:
    t = Trace.from_records(RECORDS)
    t._devices[0] = DeviceClock(key="cuda:0", name="H100", source="cupti", limits=limits)
    return t


def spans_of(layout) -> ColumnDataSource:
    fig = layout.children[0] if hasattr(layout, "children") else layout
    return fig.select_one({"name": "span source", "type": ColumnDataSource})


def launch_by_name(source: ColumnDataSource) -> dict[str, str]:
    return dict(zip(source.data["name"], source.data["launch"]))


def test_a_traces_timeline_tooltip_says_how_each_kernel_was_launched_in_its_document():
    layout = hand_trace().timeline()
    doc = Document()
    doc.add_root(layout)
    launch = launch_by_name(spans_of(layout))
    assert launch["gemm"] == GEMM
    assert launch["copy"] == "grid 64×2×1 · block 16×16×2 · 32 registers · 2.0 KiB shared · occupancy 100.0 %"
    assert launch["opencl"] == "grid 4×1×1 · block 64×1×1 · 256 B shared"  # no registers: no occupancy
    assert launch["unknown"] == "" and launch["upload"] == ""  # the hover prints "—" for these
    hover = layout.children[0].select_one({"name": "span hover", "type": HoverTool})
    assert ("launch", "@launch{custom}") in hover.tooltips and "—" in hover.formatters["@launch"].code
    assert json.dumps(GEMM)[1:-1] in serialize_json(doc.to_json())  # what the browser gets


def test_without_the_devices_limits_the_tooltip_gives_the_shape_without_occupancy():
    launch = launch_by_name(spans_of(hand_trace(limits=None).timeline()))
    assert launch["gemm"] == "grid 128×1×1 · block 256×1×1 · 202 registers · 48.0 KiB shared"
    assert launch_by_name(spans_of(timeline_figure(hand_trace().table())))["gemm"].endswith("48.0 KiB shared")


def test_launch_text_writes_each_distinct_shape_once_and_spares_other_spans():
    table = hand_trace().table()
    many = {c: np.tile(v, 1000) for c, v in table.items()}
    text = launch_text(many, {0: H100})
    assert text.shape == (5000,) and text[0] == GEMM and text[-1] == ""
    assert text.dtype == object and len({id(t) for t in text[::5]}) == 1  # one string object for one shape
    assert launch_text({"kind": table["kind"]}).tolist() == [""] * 5  # a table without launch columns


def test_a_shown_cells_refilled_layout_gets_the_new_traces_launches(monkeypatch):
    from gpuworkbench.viz import reuse, trace_layout

    shown: list[dict[str, str]] = []

    def capture(root, cache):
        shown.append(launch_by_name(root.select_one({"name": "span source", "type": ColumnDataSource})))

    monkeypatch.setattr(reuse, "publish", capture)
    monkeypatch.setattr(reuse, "_kept", {})
    reuse.show_trace_reused(hand_trace(limits=None), None, None, trace_layout)
    reuse.show_trace_reused(hand_trace(), None, None, trace_layout)
    assert len(reuse._kept) == 1  # the second was a refill of the first's layout
    assert shown[0]["gemm"].endswith("48.0 KiB shared") and shown[1]["gemm"] == GEMM
