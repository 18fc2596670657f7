"""Graphs (``gpuworkbench/graphs.py``) on every backend: capture runs nothing, replays give NumPy's results, ``update``
feeds new inputs, replays appear in traces, and a failed capture leaves the stream as it was. Native CUDA graphs on
the GPU (marked ``gpu``), recorded replays elsewhere."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from support import WITH_WEBGPU, sample

import gpuworkbench as gw
from gpuworkbench import ops

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))  # Mesa's loader wants one
pytestmark = pytest.mark.parametrize("device", WITH_WEBGPU, indirect=True)

TWICE_PLUS_ONE = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="twice_plus_one")
MINUS_THREE = gw.elementwise("float32 x, float32 y", "y = x - 3", name="minus_three")
INCREMENT = gw.elementwise("float32 y", "y = y + 1", name="increment")


def test_caps_say_which_kind(device):
    expected = "native" if device.backend_kind is gw.BackendKind.CUDA else "recorded"
    assert device.caps.graphs == expected
    s = device.create_stream()
    with s.capture() as g:
        pass
    assert g.kind == expected and g.ops == 0
    g.launch().wait()  # an empty graph replays too


def test_op_graph_replays_and_updates(device):
    s = device.create_stream("graph")
    x, y, z = (sample(5000, "float32", seed=i) for i in range(3))
    held = device.held_bytes
    op = ops.upload(x, device=device).then(TWICE_PLUS_ONE).then(MINUS_THREE).then(ops.download())
    g = op.graph_on(s, name="affine")
    assert g.name == "affine" and g.ops == 4 and g.launches == 0
    assert len(g.inputs) == 1 and len(g.outputs) == 1
    for _ in range(3):
        assert np.array_equal(g.sync(), 2 * x - 2)
    g.update(y)
    assert np.array_equal(g.sync(), 2 * y - 2)
    g.update(ops.upload(z, device=device).then(TWICE_PLUS_ONE).then(MINUS_THREE).then(ops.download()))
    assert np.array_equal(g.sync(), 2 * z - 2)
    assert g.launches == 5
    g.close()
    assert device.held_bytes == held
    with pytest.raises(gw.InvalidArgument, match="closed"):
        g.launch()


def test_capture_runs_nothing_until_launched(device):
    s = device.create_stream("capture")
    with device.alloc(1000, "float32") as buf:
        buf.copy_from_host(np.zeros(1000, np.float32))
        with s.capture() as g:
            INCREMENT(buf, stream=s)
            INCREMENT(buf, stream=s)
        assert g.ops == 2
        assert np.array_equal(buf.copy_to_host(), np.zeros(1000, np.float32))
        for _ in range(3):
            g.launch()
        assert np.array_equal(buf.copy_to_host(), np.full(1000, 6, np.float32))  # waits for the replays
        g.close()


def test_capture_with_copies_and_update(device):
    n = 4096
    s = device.create_stream("copies")
    host_in, host_out = device.empty_pinned(n, "float32"), device.empty_pinned(n, "float32")
    host_in[:] = sample(n, "float32")
    with device.alloc(n, "float32") as a, device.alloc(n, "float32") as b:
        with s.capture() as g:
            a.copy_from_host_async(host_in, s)
            TWICE_PLUS_ONE(a, b, stream=s)
            b.copy_to_host_async(host_out, s)
        assert g.inputs[0] is host_in and g.outputs[0] is host_out
        g.launch().wait()
        assert np.array_equal(host_out, 2 * host_in + 1)
        fresh = sample(n, "float32", seed=9)
        g.update(fresh)
        g.launch().wait()
        assert np.array_equal(host_out, 2 * fresh + 1)
        with pytest.raises(gw.InvalidArgument, match="holds 4096 float32"):
            g.update(np.zeros(3, np.float32))
        g.close()


def test_launch_on_another_stream(device):
    capture_stream, other = device.create_stream("cap"), device.create_stream("other")
    x = sample(2048, "float32")
    g = ops.upload(x, device=device).then(TWICE_PLUS_ONE).then(ops.download()).graph_on(capture_stream)
    assert np.array_equal(g.sync(other), 2 * x + 1)
    g.close()


def test_replays_appear_in_traces(device):
    s = device.create_stream("traced")
    x = sample(1024, "float32")
    g = ops.upload(x, device=device).then(TWICE_PLUS_ONE, name="step").then(ops.download()).graph_on(s, name="g1")
    with gw.trace() as t:
        g.launch()
        g.launch().wait()
    names = [span.name for span in t.spans if span.kind not in ("alloc", "free")]
    if g.kind == "native":
        assert names.count("graph g1") == 2  # one span per replay (from CUPTI: the graph's kernels merged)
    else:
        assert names.count("g1/step") == 2 and len([n for n in names if n.startswith("g1/")]) == 6
    g.close()


def test_capturing_while_tracing_records_no_spans(device):
    s = device.create_stream("quiet")
    with gw.trace() as t:
        g = ops.upload(sample(64, "float32"), device=device, name="in").then(ops.download()).graph_on(s)
    assert not [span for span in t.spans if span.name == "in"]
    g.close()


def test_host_steps_cannot_be_captured(device):
    s = device.create_stream("host")
    held = device.held_bytes
    with pytest.raises(gw.InvalidArgument, match="host"):
        ops.upload(sample(8, "float32"), device=device).then(ops.download()).map(np.sum).graph_on(s)
    with pytest.raises(gw.InvalidArgument, match="waits on the host"):
        ops.upload(sample(8, "float32"), device=device).then(ops.download()).then(ops.upload()).graph_on(s)
    assert s.capturing is None and device.held_bytes == held
    assert np.array_equal(ops.upload(np.ones(8, np.float32), device=device).then(ops.download()).sync_on(s), np.ones(8))


def test_failed_capture_leaves_the_stream_usable(device):
    s = device.create_stream("fails")
    with device.alloc(16, "float32") as buf:
        with pytest.raises(RuntimeError, match="oops"):
            with s.capture() as g:
                INCREMENT(buf, stream=s)
                raise RuntimeError("oops")
        with pytest.raises(gw.InvalidArgument, match="failed to capture"):
            g.launch()
        buf.copy_from_host(np.zeros(16, np.float32))
        INCREMENT(buf, stream=s).wait()
        assert np.array_equal(buf.copy_to_host(), np.ones(16, np.float32))
        with s.capture() as again:
            with pytest.raises(gw.InvalidArgument, match="already"):
                with s.capture():
                    pass
        again.close()


def test_shared_op_is_captured_once(device):
    s = device.create_stream("shared")
    x = sample(512, "float32")
    base = ops.upload(x, device=device).shared()
    op = ops.zip(base.then(TWICE_PLUS_ONE).then(ops.download()), base.then(MINUS_THREE).then(ops.download()))
    g = op.graph_on(s)
    assert len(g.inputs) == 1 and base.runs == 0  # a capture keeps its own copy, not the shared op's
    a, b = g.sync()
    assert np.array_equal(a, 2 * x + 1) and np.array_equal(b, x - 3)
    g.update(x + 1)
    a, b = g.sync()
    assert np.array_equal(a, 2 * x + 3) and np.array_equal(b, x - 2)
    g.close()


def test_native_capture_needs_page_locked_host_memory(device):
    if device.caps.graphs != "native":
        pytest.skip("recorded graphs copy from any host array")
    s = device.create_stream("pageable")
    with device.alloc(8, "float32") as buf:
        with pytest.raises(gw.InvalidArgument, match="page-locked"):
            with s.capture():
                buf.copy_from_host_async(np.zeros(8, np.float32), s)
        INCREMENT(buf, stream=s).wait()  # the stream still works
