"""Tests of pipeline.py: N-deep buffered upload → compute → download, its results, spans, staging and errors."""

from __future__ import annotations

import numpy as np
import pytest
from support import sample

import gpuworkbench as gw

AFFINE = gw.elementwise("float32 x, float32 y", "y = 2 * x + 1", name="affine")
WIDEN = gw.elementwise("int32 x, float64 y", "y = x / 4.0", name="widen")


def affine(in_buf: gw.Buffer, out_buf: gw.Buffer, stream: gw.Stream) -> None:
    AFFINE(in_buf, out_buf, stream=stream)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_results_for_every_batch(device, depth):
    inputs = [sample(1000, "float32", seed=i) for i in range(7)]
    outputs = [np.empty(1000, np.float32) for _ in inputs]
    with gw.Pipeline(device, affine, depth=depth) as pipe:
        run = pipe.run(inputs, outputs)
        assert device.held_bytes == 2 * depth * 4000  # depth input and depth output slots
    assert device.held_bytes == 0 and pipe.upload.closed
    for a, b in zip(inputs, outputs):
        assert np.array_equal(b, 2 * a + 1)
    assert (run.batches, run.bytes_in, run.bytes_out) == (7, 7 * 4000, 7 * 4000) and run.wall_s > 0
    pageable = 7 if device.caps.pinned_memory else 0  # pageable arrays are staged only where pinned memory exists
    assert (run.staged_inputs, run.staged_outputs) == (pageable, pageable)


def test_pinned_batches_are_not_staged(device):
    inputs = [device.empty_pinned(512, "float32") for _ in range(4)]
    outputs = [device.empty_pinned(512, "float32") for _ in range(4)]
    for i, a in enumerate(inputs):
        a[:] = sample(512, "float32", seed=i)
    with gw.Pipeline(device, affine) as pipe:
        run = pipe.run(inputs, outputs)
    assert (run.staged_inputs, run.staged_outputs) == (0, 0)
    assert all(np.array_equal(b, 2 * a + 1) for a, b in zip(inputs, outputs))


def test_input_and_output_may_differ_in_dtype_and_shape(device):
    inputs = [sample(600, "int32", seed=i).reshape(20, 30) for i in range(3)]
    outputs = [np.empty((20, 30), np.float64) for _ in inputs]
    with gw.Pipeline(device, lambda i, o, s: WIDEN(i, o, stream=s), depth=2) as pipe:
        pipe.run(inputs, outputs)
        again = [np.empty((20, 30), np.float64) for _ in inputs]
        pipe.run(inputs[::-1], again)  # same layout: the slots are reused
    assert all(np.array_equal(o, i / 4.0) for i, o in zip(inputs, outputs))
    assert all(np.array_equal(o, i / 4.0) for i, o in zip(inputs[::-1], again))


def test_a_new_layout_reallocates_the_slots(device):
    with gw.Pipeline(device, affine, depth=2) as pipe:
        pipe.run([np.ones(10, np.float32)], [np.empty(10, np.float32)])
        assert device.held_bytes == 4 * 40
        out = [np.empty(100, np.float32)]
        pipe.run([np.ones(100, np.float32)], out)
        assert device.held_bytes == 4 * 400 and (out[0] == 3).all()
    assert device.held_bytes == 0


def test_spans_follow_each_batch_through_three_streams(device):
    inputs = [sample(20_000, "float32", seed=i) for i in range(5)]
    outputs = [np.empty(20_000, np.float32) for _ in inputs]
    with gw.Pipeline(device, affine, depth=2, label="pipe") as pipe, gw.trace() as t:
        pipe.run(inputs, outputs)
    err = t.devices[0].error_ns
    spans = t.spans
    by_kind = {
        k: sorted((sp for sp in spans if sp.kind == k), key=lambda sp: sp.start_ns) for k in ("h2d", "kernel", "d2h")
    }
    assert [len(v) for v in by_kind.values()] == [5, 5, 5]
    assert {sp.stream for sp in by_kind["h2d"]} == {pipe.upload.id}
    assert {sp.stream for sp in by_kind["kernel"]} == {pipe.compute.id}
    assert {sp.stream for sp in by_kind["d2h"]} == {pipe.download.id}
    assert t.stream_labels[(0, pipe.compute.id)] == "pipe-compute"
    for up, kernel, down in zip(by_kind["h2d"], by_kind["kernel"], by_kind["d2h"]):
        assert up.end_ns <= kernel.start_ns + 2 * err and kernel.end_ns <= down.start_ns + 2 * err
    for i in range(2, 5):  # a slot is refilled only after its previous batch was computed
        assert by_kind["kernel"][i - 2].end_ns <= by_kind["h2d"][i].start_ns + 2 * err
    assert all(np.array_equal(b, 2 * a + 1) for a, b in zip(inputs, outputs))


def test_empty_run(device):
    with gw.Pipeline(device, affine) as pipe:
        assert pipe.run([], []) == gw.PipelineRun(0, 0, 0, 0.0, 0, 0)
        assert device.held_bytes == 0


def test_bad_arguments(device):
    with pytest.raises(gw.InvalidArgument, match="callable"):
        gw.Pipeline(device, "affine")
    with pytest.raises(gw.InvalidArgument, match="depth"):
        gw.Pipeline(device, affine, depth=0)
    a = np.ones(8, np.float32)
    with gw.Pipeline(device, affine) as pipe:
        with pytest.raises(gw.InvalidArgument, match="2 inputs but 1 outputs"):
            pipe.run([a, a], [np.empty(8, np.float32)])
        with pytest.raises(gw.InvalidArgument, match="batch 1: input is 9 float32"):
            pipe.run([a, np.ones(9, np.float32)], [np.empty(8, np.float32)] * 2)
        with pytest.raises(gw.InvalidArgument, match="batch 0: outputs must be writable"):
            ro = np.empty(8, np.float32)
            ro.flags.writeable = False
            pipe.run([a], [ro])
        with pytest.raises(gw.InvalidArgument, match="NumPy arrays"):
            pipe.run([[1.0] * 8], [np.empty(8, np.float32)])
        assert device.held_bytes == 0  # checked before anything is allocated
        out = [np.empty(8, np.float32)]
        pipe.run([a], out)  # and the pipeline still works
        assert (out[0] == 3).all()


def test_a_failing_process_leaves_nothing_behind(device):
    def broken(in_buf, out_buf, stream):
        raise RuntimeError("process failed")

    pipe = gw.Pipeline(device, broken)
    with pytest.raises(RuntimeError, match="process failed"):
        pipe.run([np.ones(64, np.float32)] * 3, [np.empty(64, np.float32) for _ in range(3)])
    pipe.close()
    assert device.held_bytes == 0 and device.live_buffers == []
    with gw.Pipeline(device, affine) as good:
        out = [np.empty(64, np.float32)]
        good.run([np.ones(64, np.float32)], out)
        assert (out[0] == 3).all()
