"""Other libraries' CUDA work in a trace, on a real GPU: plain CuPy and PyTorch code inside ``gw.trace()``.

Marked ``gpu``; skipped cleanly where CuPy, PyTorch, cupti-python or a GPU is missing.
``benchmarks/bench_any_cuda.py proof`` compares the same kind of capture with torch.profiler's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from support import cupy_with_cupti

import gpuworkbench as gw
from gpuworkbench.trace import cupti as cupti_source
from gpuworkbench.trace.cupti.foreign import FOREIGN_STREAM_BASE
from gpuworkbench.trace.spans import KIND_CODE, unpack_dim3

pytestmark = [pytest.mark.gpu, pytest.mark.cupti]


@pytest.fixture(scope="module")
def cp():
    return cupy_with_cupti()


def foreign(table: dict, kind: str) -> np.ndarray:
    return (table["kind"] == KIND_CODE[kind]) & (table["stream"] >= FOREIGN_STREAM_BASE)


def test_plain_cupy_work_is_traced_with_names_bytes_pinning_and_launches(cp):
    import cupyx

    host = np.arange(1 << 20, dtype=np.float32)
    pinned = cupyx.empty_pinned(host.shape, np.float32)
    pinned[:] = host
    scale = cp.ElementwiseKernel("float32 x", "float32 y", "y = 2 * x + 1", "scale_by_two_plus_one")
    x = cp.empty(host.shape, cp.float32)
    scale(x, x)  # compiled outside the trace
    cp.cuda.Device().synchronize()
    with gw.trace(others=True) as t:
        x.set(pinned)
        y = cp.empty_like(x)
        y.set(host)  # pageable (cp.asarray would stage it through CuPy's pinned pool)
        scale(x, y)
        back = y.get()
    table = t.table()
    assert np.allclose(back, 2 * host + 1)
    kernels = foreign(table, "kernel")
    assert any("scale_by_two_plus_one" in n for n in table["name"][kernels])
    h2d = foreign(table, "h2d")
    assert sorted(table["pinned"][h2d].tolist()) == [0, 1] and set(table["bytes"][h2d].tolist()) == {host.nbytes}
    d2h = foreign(table, "d2h")
    assert table["bytes"][d2h].tolist() == [host.nbytes] and table["pinned"][d2h].tolist() == [0]
    # Every device span is linked to the host call that enqueued it, which starts before it.
    device_rows = np.flatnonzero(kernels | h2d | d2h)
    api = table["kind"] == KIND_CODE["api"]
    for i in device_rows.tolist():
        corr = table["corr"][i]
        assert corr >= 0, table["name"][i]
        calls = np.flatnonzero(api & (table["corr"] == corr))
        assert calls.size == 1, (table["name"][calls].tolist(), table["stream"][calls].tolist(), t.stats)
        (call,) = calls
        assert table["start_ns"][call] <= table["start_ns"][i] and table["enqueue_ns"][i] == table["start_ns"][call]
        assert table["stream"][call] <= -2  # a host thread's row
    grid = [unpack_dim3(g) for g in table["grid"][kernels]]
    assert all(g is not None and g[0] > 0 for g in grid)
    labels = t.stream_labels
    streams = {int(s) for s in table["stream"][kernels]}
    assert all(labels.get((0, s), "").endswith(f"stream {s - FOREIGN_STREAM_BASE}") for s in streams)
    assert t.devices[0].source == "cupti" and t.stats.lost == 0


def test_torch_work_its_streams_allocations_and_nvtx_ranges(cp):
    torch = pytest.importorskip("torch")
    a = torch.randn(1024, 1024, device="cuda")
    (a @ a).sum().item()
    side = torch.cuda.Stream()
    with gw.trace(others=True) as t:
        with gw.range("step"):
            with torch.cuda.stream(side):
                b = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB from the caching allocator
                torch.cuda.nvtx.range_push("matmul")
                c = a @ a
                torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
    table = t.table()
    kernels = foreign(table, "kernel")
    assert kernels.sum() >= 1
    labels = {
        t.stream_labels.get((int(d), int(s)), "") for d, s in zip(table["device"][kernels], table["stream"][kernels])
    }
    assert any(label.startswith(("torch stream", "CUDA stream")) for label in labels)
    ranges = table["name"][table["kind"] == KIND_CODE["range"]].tolist()
    assert "step" in ranges
    if os.environ.get("NVTX_INJECTION64_PATH"):  # NVTX reaches CUPTI only where it was pointed at it before use
        assert "matmul" in ranges
    del b, c
    if "MEMORY2" in cupti_source.kinds.OPTIONAL_KINDS:  # on unless GPUWB_CUPTI_OPTIONAL leaves allocations out
        allocs = table["kind"] == KIND_CODE["alloc"]
        assert table["bytes"][allocs].sum() >= 64 << 20
        assert t.memory_table()["other_bytes"].max() >= 64 << 20


def test_our_ops_keep_their_names_beside_other_libraries_launches_on_one_thread(cp):
    dev = gw.Device("cuda:0")
    f = gw.elementwise("float32 x, float32 y", "y = x + 1", name="ours_plus_one")
    buf, out = dev.alloc(1 << 16, "float32"), dev.alloc(1 << 16, "float32")
    z = cp.zeros(1 << 16, cp.float32)
    f(buf, out)
    (z + 1).sum()
    dev.synchronize()
    with gw.trace(others=True) as t:
        for _ in range(5):
            f(buf, out)
            z += 1
    dev.synchronize()
    table = t.table()
    ours = (table["kind"] == KIND_CODE["kernel"]) & (table["stream"] < FOREIGN_STREAM_BASE)
    assert table["name"][ours].tolist() == ["ours_plus_one"] * 5
    why = f"{t.stats}; clocks: {[(c.source, c.note[:80]) for c in t.devices.values()]}"  # seen once: 0 foreign
    assert foreign(table, "kernel").sum() == 5 and t.stats.lost == 0, why
    assert not (table["kind"] == KIND_CODE["alloc"])[table["bytes"] == (1 << 16) * 4].any()  # ours: none in trace


def test_torch_profiler_inside_and_after_a_trace_still_records_its_kernels(cp):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(512, 512, device="cuda")

    def work():
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()

    def kernels(prof) -> int:
        path = tempfile.mktemp(suffix=".json")
        prof.export_chrome_trace(path)
        try:
            return sum(1 for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel")
        finally:
            os.unlink(path)

    work()
    with gw.trace(others=True) as t:
        work()
        with profile(activities=[ProfilerActivity.CUDA]) as inside:
            work()
        work()
    assert kernels(inside) >= 3
    assert t.wait_pending(30)
    assert any("torch.profiler" in w for w in t.stats.warnings)
    with profile(activities=[ProfilerActivity.CUDA]) as after:
        work()
    assert kernels(after) >= 3
    with gw.trace(others=True) as again:  # CUPTI is ours again once the profiler is done
        work()
    assert foreign(again.table(), "kernel").sum() >= 3 and not again.stats.warnings


def test_a_lingering_cupti_is_taken_over_without_the_work_launched_between_the_traces(cp, monkeypatch):
    """A trace within ``LINGER_S`` of the last takes its source over: work launched between the two traces (recorded
    by CUPTI meanwhile) is not in it."""
    marker = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 3", "between_the_traces")
    inside = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 5", "inside_the_trace")
    x = cp.ones(1 << 16, cp.float32)
    marker(x, x), inside(x, x)  # compiled before any trace
    cp.cuda.Device().synchronize()
    monkeypatch.setattr(cupti_source.LIFECYCLE, "linger_s", 30.0)
    monkeypatch.setattr(cupti_source.LIFECYCLE, "watch_untraced", False)  # else the work between the traces: let go
    with gw.trace(others=True) as first:
        inside(x, x)
    first.wait_pending()
    assert cupti_source.lingering() and not cupti_source.detached()
    for _ in range(3):
        marker(x, x)  # CUPTI records these while parked
    cp.cuda.Device().synchronize()
    with gw.trace(others=True) as second:
        for _ in range(2):
            inside(x, x)
        cp.cuda.Device().synchronize()
    names = second.table()["name"][foreign(second.table(), "kernel")].tolist()
    assert sum("inside_the_trace" in n for n in names) == 2
    assert not any("between_the_traces" in n for n in names)


def test_the_primers_work_is_in_no_trace_and_a_parked_source_primes(cp, monkeypatch):
    """The primer's (``cupti/prime.py``) 4-byte copy and memset, recorded while a trace records, are dropped by their
    stream and its calls by their thread (a 4-byte copy of CuPy's beside them is kept, with its call); back-to-back
    traces, each taking over the source the last one parked and primed, hold none of them either."""
    from gpuworkbench.trace.cupti.prime import PRIMER

    monkeypatch.setattr(cupti_source.LIFECYCLE, "watch_untraced", False)
    monkeypatch.setattr(PRIMER, "threads", PRIMER.threads)  # the thread below dies: its id must not stay named
    x = cp.ones(1 << 16, cp.float32)
    y = cp.empty(1, cp.float32)
    host = np.ones(1, np.float32)

    primed = []

    def prime() -> None:  # on a thread of its own, as the lifecycle does: that thread's API calls are dropped too
        raw = cupti_source.LIFECYCLE.raw
        with PRIMER.lock:
            primed.append(PRIMER.prime(raw.lib if raw is not None else None))

    with gw.trace(others=True) as t:
        primer = threading.Thread(target=prime)
        primer.start()
        primer.join()
        y.set(host)
        cp.cuda.Device().synchronize()  # waits for the primer's stream too
    t.wait_pending()
    assert primed[0] >= 1 and PRIMER.streams, PRIMER.error
    table = t.table()
    tiny = (table["bytes"] == 4) & np.isin(table["kind"], [KIND_CODE["h2d"], KIND_CODE["memset"]])
    assert int(tiny.sum()) == 1 and int(table["kind"][tiny][0]) == KIND_CODE["h2d"]
    calls = table["name"][table["kind"] == KIND_CODE["api"]].tolist()
    assert any("emcpy" in c for c in calls) and not any("cuMemsetD32" in c for c in calls), calls
    for _ in range(3):
        rounds = PRIMER.rounds
        with gw.trace(others=True) as t:
            x += 1
            cp.cuda.Device().synchronize()
        t.wait_pending()
        table = t.table()
        assert int(foreign(table, "kernel").sum()) == 1
        assert not ((table["bytes"] == 4) & (table["kind"] == KIND_CODE["memset"])).any()
        assert not ((table["bytes"] == 4) & (table["kind"] == KIND_CODE["alloc"])).any()
        deadline = time.monotonic() + 5
        while PRIMER.rounds == rounds and time.monotonic() < deadline:
            time.sleep(0.001)  # the park primes on its own thread; the next trace takes the primed source over
        with PRIMER.lock:  # held for the whole prime: its count is final once it is free
            assert PRIMER.rounds > rounds and PRIMER.primed >= 1, PRIMER.error


_LET_GO = """
import time
import cupy as cp
import gpuworkbench as gw
from gpuworkbench.trace import cupti
from gpuworkbench.trace.spans import KIND_CODE
try:
    import torch
except ImportError:
    torch = None
inside = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 5", "inside_the_trace")
x = cp.ones(1 << 16, cp.float32)
inside(x, x)
cp.cuda.Device().synchronize()
cupti.REATTACH_S = 0.05


def traced_kernels():
    with gw.trace() as t:
        for _ in range(4):
            inside(x, x)
        cp.cuda.Device().synchronize()
    t.wait_pending()
    table = t.table()
    kernels = table["name"][table["kind"] == KIND_CODE["kernel"]].tolist()
    return sum("inside_the_trace" in n for n in kernels), len(t.stats.warnings)


def until(what, work):
    deadline = time.monotonic() + 10
    while not what() and time.monotonic() < deadline:
        work()
        time.sleep(0.005)
    return what()


# the linger runs out: let go at a CUDA call's exit, then initialized again with no kind on
cupti.WATCH_UNTRACED, cupti.LINGER_S = False, 0.3
traced_kernels()
lingering = cupti.lingering()
detached = until(cupti.detached, lambda: inside(x, x))
cupti.settle(5)
print("linger", lingering, detached, cupti.detach_refused, cupti.state().split(":")[0], *traced_kernels())
# untraced work of another library ends the linger at once
cupti.WATCH_UNTRACED, cupti.LINGER_S = True, 30.0
traced_kernels()
lingering = cupti.lingering()
if torch is not None:
    a = torch.ones(1 << 16, device="cuda")
    work = lambda: torch.add(a, 1)
else:
    work = lambda: cp.add(x, 1)
t0 = time.monotonic()
work()
detached = until(cupti.detached, work)
took = time.monotonic() - t0
cupti.settle(5)
print("watch", lingering, detached, took < 5, cupti.state().split(":")[0], *traced_kernels())
"""


def test_cupti_is_let_go_after_the_linger_or_at_untraced_work_and_initialized_again_for_the_next_trace(cp):
    """In a fresh process (torch.profiler, run by other tests here, keeps CUPTI's one callback subscriber, and the
    detach is then refused): after the linger, or at the first untraced work (PyTorch's where it is installed),
    CUPTI is finalized at a CUDA call's exit, initialized again with no kind on, and the next trace sees every
    kernel."""
    out = subprocess.run([sys.executable, "-c", _LET_GO], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "linger True True 0 ready 4 0", out.stdout
    assert lines[-1] == "watch True True True ready 4 0", out.stdout


_FIRST_TRACE_IMPORTS = """
import sys
import cupy as cp
import gpuworkbench as gw
x = cp.arange(1 << 20, dtype=cp.float32)
(x * 2).sum().get()
gw._prepare_tracing()  # what %load_ext does
before = set(sys.modules)
with gw.trace() as t:
    (x * 3).sum().get()
t.wait_pending()
t._thread.join(10)
print(sorted(set(sys.modules) - before), len(t.table()["kind"]) > 0)
"""


def test_the_first_trace_after_load_ext_imports_nothing(cp):
    """An import in the first trace's harvest holds the GIL while the user's cell runs (numpy.ma, imported by the first
    ``np.unique``, took 77 ms on an H100 host): ``%load_ext`` imports what a harvest needs."""
    out = subprocess.run([sys.executable, "-c", _FIRST_TRACE_IMPORTS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[] True", out.stdout


_NOTEBOOK_CELLS = """
import json
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
def run(source):
    result = shell.run_cell(source, store_history=False)
    result.raise_error()
run("%load_ext gpuworkbench")
run('''
import cupy as cp
import numpy as np
import gpuworkbench as gw
from gpuworkbench.trace.spans import KIND_CODE
inside = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 7", "inside_the_cell")
x = cp.ones(1 << 16, cp.float32)
inside(x, x)
cp.cuda.Device().synchronize()
found = []
untraced = []
''')
TRACED = '''
state = gw.cupti.state().split(":")[0]
with gw.trace(others=True) as t:
    inside(x, x)
    host = cp.asnumpy(x)
t.wait_pending()
table = t.table()
names = table["name"][table["kind"] == KIND_CODE["kernel"]].tolist()
calls = table["name"][table["kind"] == KIND_CODE["api"]].tolist()
tiny = int(((table["bytes"] == 4) & np.isin(table["kind"], [KIND_CODE["h2d"], KIND_CODE["memset"]])).sum())
found.append([state, names, int((table["kind"] == KIND_CODE["d2h"]).sum()), tiny, [c for c in calls if "Memset" in c]])
'''
for _ in range(3):
    run("untraced.append(gw.cupti.state().split(':')[0])\\ny = x * 2\\ncp.cuda.Device().synchronize()")
    run(TRACED)
run(TRACED)  # after a traced cell
print(json.dumps(shell.user_ns["untraced"]))
print(json.dumps(shell.user_ns["found"]))
"""


def test_a_traced_cell_after_an_untraced_one_takes_over_a_source_readied_before_it_ran(cp):
    """In IPython with ``%load_ext`` (a fresh process): before each cell that does not trace, the pre-run hook lets
    CUPTI go (the one ``%load_ext`` parked, or the last trace's); before each cell that traces, it attaches CUPTI,
    parks a source and primes it on the kernel's thread, so the cell's trace takes it over; the trace holds the
    cell's kernel and copy, and none of the prime's work or calls."""
    pytest.importorskip("IPython")
    out = subprocess.run([sys.executable, "-c", _NOTEBOOK_CELLS], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    untraced, found = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert untraced == ["not attached"] * 3, untraced
    assert [f[0] for f in found] == ["lingering"] * 4, found
    for _state, names, d2h, tiny, memsets in found:
        assert sum("inside_the_cell" in n for n in names) == 1 and d2h == 1, found
        assert tiny == 0 and memsets == [], found


_NOTEBOOK_AFTER_TORCH = """
import json
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
def run(source):
    shell.run_cell(source, store_history=False).raise_error()
run("%load_ext gpuworkbench")
run('''
import json, os, tempfile
import torch
import gpuworkbench as gw
from torch.profiler import ProfilerActivity, profile
a = torch.randn(512, 512, device="cuda")
def work():
    for _ in range(3):
        (a @ a).relu_()
    torch.cuda.synchronize()
def kernels(prof):
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    n = sum(1 for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel")
    os.unlink(path)
    return n
work()
seen = []
''')
PROFILED = "with profile(activities=[ProfilerActivity.CUDA]) as p:\\n    work()\\nseen.append(kernels(p))"
run(PROFILED)
run("seen.append(gw.cupti.state().split(':')[0])\\nwork()")  # untraced, after torch.profiler
run(PROFILED)  # torch.profiler again, after CUPTI was let go
run("with gw.trace() as t:\\n    work()\\nt.wait_pending()\\nseen.append(int((t.table()['kind'] == 4).sum()))")
run(PROFILED)
print(json.dumps(shell.user_ns["seen"]))
"""


def test_an_untraced_cell_after_torch_profiler_runs_with_cupti_let_go_and_the_profiler_still_works(cp):
    """In IPython with ``%load_ext`` (a fresh process): torch.profiler leaves CUPTI attached (an empty launch 1.7 ×
    on an H100); the next untraced cell's pre-run hook lets it go, and torch.profiler and our traces after it still
    record every kernel."""
    pytest.importorskip("torch")
    pytest.importorskip("IPython")
    out = subprocess.run([sys.executable, "-c", _NOTEBOOK_AFTER_TORCH], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen[1] == "not attached" and seen[0] > 0 and seen[0] == seen[2] == seen[3] == seen[4], seen
