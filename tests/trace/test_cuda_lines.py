"""Which line did that, on a real GPU: our ops and CuPy's / PyTorch's launches each charged to the cell line that
issued them (``benchmarks/bench_lines.py proof`` compares with torch.profiler's stacks).

Marked ``gpu``; skipped cleanly where CuPy, cupti-python or a GPU is missing.
"""

from __future__ import annotations

import linecache
import threading

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.trace.cupti.foreign import FOREIGN_STREAM_BASE
from gpuworkbench.trace.spans import KIND_CODE

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy")
    ok, why = gw.backends.get("cuda").available()
    if not ok:
        pytest.skip(f"no CUDA device: {why}")
    available, why = gw.cupti.CuptiSource.available()
    if not available:
        pytest.skip(why)
    return cupy


def _run_cell(name: str, source: str, env: dict) -> gw.Trace:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    code = compile(source, name, "exec")
    with gw.trace(lines=True) as t:
        t.lines.set_focus(name)
        exec(code, env)
    t.wait_pending()
    return t


def _why(t: gw.Trace) -> str:
    """What a failed check should print: the trace's warnings and its call-site log."""
    sites = t._sites
    return f"warnings={t.stats.warnings} sites={None if sites is None else (sites.calls, len(sites.log))}"


def _lines_of(t: gw.Trace, rows: np.ndarray) -> list[int]:
    return [t.locations[i].line if i >= 0 else -1 for i in t.table()["loc"][rows].tolist()]


def test_cupy_and_our_kernels_are_charged_to_their_lines(cp) -> None:
    dev = gw.Device("cuda:0")
    k = dev.compile('extern "C" __global__ void mark(float *b) { b[0] = 1; }', "mark")
    buf = dev.alloc(1, "float32")
    s = dev.create_stream("lines")
    x = cp.arange(1 << 16, dtype=cp.float32)
    cell = "y = x * 2\nfor _ in range(3):\n    k(1, 1, (buf,), stream=s)\nz = cp.sqrt(y)\ns.synchronize()\n"
    t = _run_cell("<cuda-cell-1>", cell, {"x": x, "cp": cp, "k": k, "buf": buf, "s": s})
    table = t.table()
    kernels = np.flatnonzero(table["kind"] == KIND_CODE["kernel"])
    names = table["name"][kernels].tolist()
    lines = dict(zip(range(len(names)), _lines_of(t, kernels)))
    by_name = {}
    for i, name in enumerate(names):
        by_name.setdefault(name, set()).add(lines[i])
    assert by_name["mark"] == {3}
    theirs = [i for i, n in enumerate(names) if n != "mark"]
    assert len(theirs) >= 2 and {lines[i] for i in theirs} == {1, 4}, _why(t)
    foreign = table["stream"][kernels] >= FOREIGN_STREAM_BASE
    assert foreign.sum() == len(theirs)
    api = np.flatnonzero(table["kind"] == KIND_CODE["api"])
    assert set(_lines_of(t, api)) <= {1, 4}  # each launch call on its host row carries its line too
    stats = t.statistics().lines
    assert {int(n): int(o) for n, o in zip(stats["line"], stats["ops"])}[3] == 3


def test_work_from_two_threads_keeps_each_threads_line(cp) -> None:
    go = threading.Barrier(2)
    source = "def left():\n    go.wait()\n    a = cp.ones(1 << 12)\n    return a * 3\ndef right():\n    go.wait()\n" \
             "    return cp.zeros(1 << 12) + 5\nths = [threading.Thread(target=f) for f in (left, right)]\n" \
             "[th.start() for th in ths]\n[th.join() for th in ths]\n"  # fmt: skip
    t = _run_cell("<cuda-threads>", source, {"cp": cp, "go": go, "threading": threading})
    table = t.table()
    kernels = np.flatnonzero(table["kind"] == KIND_CODE["kernel"])
    where = {(t.locations[i].function, t.locations[i].line) for i in table["loc"][kernels].tolist() if i >= 0}
    assert ("left", 4) in where and ("right", 7) in where, _why(t)
    assert all(i >= 0 for i in table["loc"][kernels].tolist())


def test_pytorch_backward_is_charged_to_the_backward_line(cp) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(64, 8).cuda()
    x = torch.randn(32, 64, device="cuda")
    source = "out = model(x)\nloss = out.square().mean()\nloss.backward()\ntorch.cuda.synchronize()\n"
    env = {"model": model, "x": x, "torch": torch}
    exec(compile(source, "<warm>", "exec"), env)
    t = _run_cell("<torch-cell>", source, env)
    table = t.table()
    kernels = np.flatnonzero(table["kind"] == KIND_CODE["kernel"])
    lines = _lines_of(t, kernels)
    assert -1 not in lines, _why(t)
    assert {1, 2, 3} <= set(lines)  # forward, loss, and backward (launched from the autograd engine's thread)
