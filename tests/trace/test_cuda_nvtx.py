"""Every library's NVTX ranges in a trace, on a real GPU: ``import gpuworkbench`` points NVTX at the libcupti that
cupti-python loads, so PyTorch's ranges arrive without any setup by the user, nested as pushed, and name for name
the ``record_function`` ranges torch.profiler records for the same step. Marked ``gpu``; skipped without PyTorch."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support import cupy_with_cupti

import gpuworkbench as gw
from gpuworkbench.trace.cupti import nvtx
from gpuworkbench.trace.range_stats import plain_range_name
from gpuworkbench.trace.spans import KIND_CODE

pytestmark = [pytest.mark.gpu, pytest.mark.cupti]
STEP_NAMES = ("step", "forward", "backward")


@pytest.fixture(scope="module")
def torch():
    cupy_with_cupti()
    return pytest.importorskip("torch")


def _parents(names: list[str], starts: list[int], ends: list[int], rows: list[int]) -> dict[str, str]:
    """Each range's innermost enclosing range on the same row (its parent), by name; "" for the outermost."""
    order = sorted(range(len(names)), key=lambda i: (rows[i], starts[i], -ends[i]))
    parents: dict[str, str] = {}
    stack: list[int] = []
    for i in order:
        while stack and (rows[stack[-1]] != rows[i] or ends[stack[-1]] < ends[i]):
            stack.pop()
        parents.setdefault(names[i], names[stack[-1]] if stack else "")
        stack.append(i)
    return parents


def test_nvtx_points_at_the_libcupti_cupti_python_loads(torch):
    assert os.environ.get(nvtx.ENV), nvtx.STATE["said"]
    with gw.trace() as t:
        torch.ones(4, device="cuda").sum().item()
    assert not any("NVTX ranges of other libraries cannot reach" in w for w in t.stats.warnings)


def test_torch_ranges_arrive_nested_and_agree_with_torch_profiler(torch, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    x = torch.randn(64, 256, device="cuda")

    def step() -> None:
        with torch.autograd.profiler.record_function("step"):
            with torch.autograd.profiler.record_function("forward"):
                loss = model(x).square().mean()
            with torch.autograd.profiler.record_function("backward"):
                loss.backward()

    step()
    torch.cuda.synchronize()
    with gw.trace(others=True) as t:
        torch.cuda.nvtx.range_push("outer")
        torch.cuda.nvtx.range_push("inner")
        (x @ x.T).sum()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
        with torch.autograd.profiler.emit_nvtx():
            step()
        torch.cuda.synchronize()
    table = t.table()
    ranges = np.flatnonzero(table["kind"] == KIND_CODE["range"])
    names = [plain_range_name(str(table["name"][i])) for i in ranges]
    ours = _parents(
        names, table["start_ns"][ranges].tolist(), table["end_ns"][ranges].tolist(), table["stream"][ranges].tolist()
    )
    assert ours["inner"] == "outer" and ours["outer"] == ""

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    path = tmp_path / "kineto.json"
    prof.export_chrome_trace(str(path))
    events = [
        e
        for e in json.loads(path.read_text())["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op")
    ]
    theirs = _parents(
        [e["name"] for e in events],
        [int(e["ts"] * 1000) for e in events],
        [int((e["ts"] + e["dur"]) * 1000) for e in events],
        [e["tid"] for e in events],
    )
    for name in STEP_NAMES:
        assert name in ours and name in theirs, (name, sorted(ours)[:20], sorted(theirs)[:20])
        assert ours[name] == theirs[name], (name, ours[name], theirs[name])
    assert ours["forward"] == ours["backward"] == "step"
    # the aten ops torch.profiler saw directly under "forward" are ours too, with the same parent
    under = {n for n, p in theirs.items() if p == "forward"}
    assert under and under <= {n for n, p in ours.items() if p == "forward"}, (under, ours)
    stats = t.statistics().ranges
    by_name = dict(zip(stats["name"], stats["kernels"]))
    assert by_name.get("inner", 0) >= 1 and by_name.get("outer", 0) >= by_name["inner"]
