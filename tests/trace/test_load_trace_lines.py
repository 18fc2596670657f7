"""Tests of trace/kineto_stacks.py: ``gw.load_trace`` charges the device work of a ``torch.profiler(with_stack=True)``
trace to the user lines on its Python stacks, read from the recorded CNN step (torch 2.11, H200) and small files."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.trace import lines
from gpuworkbench.trace.kineto_stacks import call_text, is_user_frame
from gpuworkbench.trace.spans import KIND_CODE

#: One training step of a small CNN recorded by torch.profiler(with_stack=True) on an H200 (notebook 09 loads it).
STACKED = Path(__file__).resolve().parents[2] / "notebooks" / "recorded" / "cnn-step-with-stack.json.gz"
CELL = "<ipython-input-7-abcdef>"
DEVICE_KINDS = [KIND_CODE[k] for k in ("kernel", "h2d", "d2h", "d2d", "memset")]


@pytest.fixture(scope="module")
def recorded():
    """The recorded file's events and the trace loaded from it."""
    with gzip.open(STACKED, "rt") as f:
        events = json.load(f)["traceEvents"]
    return events, gw.load_trace(STACKED)


def _python_event(events: list[dict], name: str) -> dict:
    (found,) = [e for e in events if e.get("cat") == "python_function" and e["name"] == name]
    return found


def _calls_within(events: list[dict], frame: dict) -> set[int]:
    """Correlations of the runtime calls on the frame's thread that run inside it."""
    return {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") == "cuda_runtime"
        and e["tid"] == frame["tid"]
        and frame["ts"] <= e["ts"] <= frame["ts"] + frame["dur"]
    }


def _locations_of(trace, correlations: set[int], kinds=DEVICE_KINDS) -> list:
    table = trace.table()
    rows = np.flatnonzero(np.isin(table["corr"], list(correlations)) & np.isin(table["kind"], kinds))
    return [trace.locations[i] if i >= 0 else None for i in table["loc"][rows].tolist()]


def test_the_forward_lines_kernels_are_charged_to_the_cell_calling_the_sequential_module(recorded):
    events, trace = recorded
    forward = _calls_within(events, _python_event(events, "nn.Module: Sequential_0"))
    located = _locations_of(trace, forward)
    assert len(located) >= 4  # conv, relu, linear ... each a kernel
    assert {(loc.file, loc.line, loc.function, loc.text) for loc in located} == {
        (CELL, 0, "<module>", "nn.Module: Sequential_0")
    }
    assert {(loc.site_file, loc.site_line, loc.site_function) for loc in located} == {(CELL, 0, "<module>")}


def test_backwards_kernels_on_the_autograd_thread_are_charged_to_the_cells_backward_call(recorded):
    events, trace = recorded
    autograd = {e["tid"] for e in events if e.get("ph") == "M" and "pt_autograd" in str(e.get("args", {}).get("name"))}
    assert len(autograd) == 1 and not [e for e in events if e.get("cat") == "python_function" and e["tid"] in autograd]
    backward = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime" and e["tid"] in autograd}
    located = _locations_of(trace, backward)
    assert len(located) == 10
    assert {(loc.file, loc.function, loc.text) for loc in located} == {(CELL, "<module>", "backward")}
    api = _locations_of(trace, backward, [KIND_CODE["api"]])  # the runtime calls themselves too
    assert {(loc.file, loc.text) for loc in api} == {(CELL, "backward")}


def test_the_optimizer_kernel_is_charged_to_the_cells_step_call(recorded):
    events, trace = recorded
    step = _calls_within(events, _python_event(events, "torch/optim/optimizer.py(512): wrapper"))
    located = _locations_of(trace, step)
    assert len(located) == 1 and (located[0].file, located[0].text) == (CELL, "wrapper")


def test_statistics_lines_have_one_row_per_call_of_the_cell_and_count_every_device_span(recorded):
    _, trace = recorded
    table = trace.table()
    device = int(np.isin(table["kind"], DEVICE_KINDS).sum())
    lines = trace.statistics().lines
    assert device == 21 and int(lines["ops"].sum()) == device
    assert set(lines["file"].tolist()) == {CELL}  # nothing unknown
    assert sorted(lines["source"].tolist()) == sorted(
        ["randn", "randint", "nn.Module: Sequential_0", "cross_entropy", "backward", "wrapper"]
    )
    by_call = dict(zip(lines["source"].tolist(), lines["ops"].tolist()))  # backward: 10 on autograd's thread, 1 here
    assert by_call["randn"] == 1 and by_call["backward"] == 11 and by_call["wrapper"] == 1
    assert lines["device_time_ns"].tolist() == sorted(lines["device_time_ns"].tolist(), reverse=True)


def test_a_trace_without_stacks_has_no_locations(recorded, tmp_path):
    events, _ = recorded
    plain = tmp_path / "no-stacks.json"
    plain.write_text(json.dumps(_doc([e for e in events if e.get("cat") != "python_function"])))
    trace = gw.load_trace(plain)
    assert int((trace.table()["kind"] == KIND_CODE["kernel"]).sum()) == 19  # the same work, without its stacks
    assert trace.locations == [] and trace.lines is None
    assert (trace.table()["loc"] == -1).all() and len(trace.statistics().lines["ops"]) == 0


def _kernel_locations(tmp_path, events: list[dict]) -> tuple:
    """The trace ``load_trace`` reads from a file of ``events``, and its kernels' location codes by correlation."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_doc(events)))
    trace = gw.load_trace(path)
    table = trace.table()
    kernels = table["kind"] == KIND_CODE["kernel"]
    return trace, dict(zip(table["corr"][kernels].tolist(), table["loc"][kernels].tolist()))


def _doc(events: list[dict]) -> dict:
    return {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "GPU"}]}


def _frame(name: str, ts: float, dur: float, tid: int = 1, pid: int = 1) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def _launch(ts: float, corr: int, tid: int = 1, pid: int = 1) -> list[dict]:
    """A launch at ``ts`` and its kernel."""
    return [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": ts, "dur": 1.0,
         "args": {"correlation": corr}},
        {"ph": "X", "cat": "kernel", "name": f"k{corr}", "pid": 0, "tid": 7, "ts": ts + 5, "dur": 2.0,
         "args": {"device": 0, "stream": 7, "correlation": corr}},
    ]  # fmt: skip


def test_nesting_is_read_from_intervals_and_a_call_after_a_finished_child_climbs_out_of_it(tmp_path):
    """No Python ids: train.py's step calls helper (user code) which calls torch; a launch in torch code, one in
    helper itself after its torch call returned, one in a thread of another process (not charged to this one)."""
    events = [
        _frame("train.py(10): <module>", 0, 100),
        _frame("train.py(3): step", 5, 90),
        _frame("helper.py(7): prepare", 10, 50),
        _frame("torch/nn/functional.py(1712): relu", 12, 10),
        _frame("<built-in method relu of type object at 0x7f00>", 13, 8),
        _frame("threading.py(359): wait", 23, 2),
        *_launch(14, 1),  # inside relu: helper.prepare is the innermost user frame
        *_launch(30, 2),  # in prepare itself, after its children ended
        *_launch(70, 3),  # in step itself, after prepare returned: no call to name
        *_launch(40, 4, tid=9, pid=2),  # another process, no python events there
    ]
    trace, by_corr = _kernel_locations(tmp_path, events)
    where = {c: (trace.locations[i].file, trace.locations[i].line, trace.locations[i].text) for c, i in by_corr.items()
             if i >= 0}  # fmt: skip
    assert where == {1: ("helper.py", 7, "relu"), 2: ("helper.py", 7, ""), 3: ("train.py", 3, "")}
    assert by_corr[4] == -1


def test_a_call_that_starts_as_its_sibling_ends_is_not_nested_in_it(tmp_path):
    events = [
        _frame("train.py(3): step", 0, 100),
        _frame("torch/nn/functional.py(1712): relu", 10, 10),
        _frame("torch/nn/functional.py(3421): cross_entropy", 20, 10),
        *_launch(15, 1),
        *_launch(25, 2),
    ]
    trace, by_corr = _kernel_locations(tmp_path, events)
    texts = {c: trace.locations[i].text for c, i in by_corr.items()}
    assert texts == {1: "relu", 2: "cross_entropy"}


def test_python_events_around_no_runtime_call_give_no_locations(tmp_path):
    events = [_frame("train.py(3): step", 0, 10), _frame("train.py(9): log", 50, 10), *_launch(20, 1)]
    trace, _ = _kernel_locations(tmp_path, events)
    assert trace.locations == [] and trace.lines is None and (trace.table()["loc"] == -1).all()


@pytest.mark.parametrize(
    ("name", "user"),
    [
        (f"{CELL}(0): <module>", True),
        ("/tmp/ipykernel_533/2810412.py(4): f", True),  # ipykernel's file of a cell
        ("train.py(12): step", True),
        ("torch/nn/modules/module.py(1775): _call_impl", False),  # known by name, installed or not
        ("threading.py(1010): run", False),  # the standard library
        ("logging/__init__.py(1776): getEffectiveLevel", False),
        ("gpuworkbench/trace/cupti/detach.py(262): _run", False),
        ("numpy/core/numeric.py(1): ones", False),
        ("<frozen os>(779): getenv", False),
        ("<built-in method randn of type object at 0x7fd8b4b3e180>", False),
        ("nn.Module: Sequential_0", False),
        ("nn.Optimizer: SGD_0", False),
    ],
)
def test_which_frames_are_user_code(name, user):
    assert is_user_frame(name) is user


def test_a_library_is_found_by_where_it_is_installed(tmp_path, monkeypatch):
    """A package importable from a folder in LIBRARIES (site-packages) is a library; the same name from a user's
    folder is user code; an absolute path is judged by its prefix."""
    (tmp_path / "mylib_for_test").mkdir()
    (tmp_path / "mylib_for_test" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_user_frame("mylib_for_test/layers.py(3): forward")
    monkeypatch.setattr(lines, "LIBRARIES", [*lines.LIBRARIES, str(tmp_path) + os.sep])
    assert not is_user_frame("mylib_for_test/layers.py(3): forward")
    assert not is_user_frame(f"{tmp_path}/mylib_for_test/layers.py(3): forward")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("torch/nn/functional.py(3421): cross_entropy", "cross_entropy"),
        ("<built-in method randn of type object at 0x7fd8b4b3e180>", "randn"),
        ("<built-in function linear>", "linear"),
        ("nn.Module: Sequential_0", "nn.Module: Sequential_0"),
    ],
)
def test_a_call_is_named_as_a_reader_wants_it(name, text):
    assert call_text(name) == text
