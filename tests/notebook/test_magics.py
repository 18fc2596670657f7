"""Tests of the ``%gpu`` and ``%%gpu`` magics driven through IPython's InteractiveShell on the CPU and PoCL backends."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.notebook import cell_hooks, history, magics  # noqa: E402

#: A cell that uploads on one stream, computes on a second after waiting for the upload, and reads back.
TRACED_CELL = """\
import numpy as np
import gpuworkbench as gw
dev = gw.Device("cpu")
up, compute = dev.create_stream("up"), dev.create_stream("compute")
x, y = dev.alloc(1 << 16), dev.alloc(1 << 16)
host = np.ones(1 << 16, np.float32)
out = np.empty_like(host)
compute.wait_event(x.copy_from_host_async(host, up))
gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")(x, y, stream=compute)
y.copy_to_host_async(out, compute).wait()
"""


def gpu_magics(ip: InteractiveShell) -> magics.GpuMagics:
    return ip.magics_manager.registry["GpuMagics"]


def pocl_spec() -> str | None:
    """The spec of the PoCL OpenCL device, found by name (another OpenCL platform may come first)."""
    for info in gw.devices():
        if info.backend == "opencl" and ("Portable Computing Language" in info.name or "pocl" in info.detail.lower()):
            return f"opencl:{info.index}"
    return None


def test_load_ext_registers_line_and_cell_magic(shell):
    assert "gpu" in shell.magics_manager.magics["line"]
    assert "gpu" in shell.magics_manager.magics["cell"]
    assert "gpu_timeit" not in shell.magics_manager.magics["line"]


def test_gpu_lists_devices_with_memory(shell, capsys):
    shell.run_line_magic("gpu", "")
    out = capsys.readouterr().out
    cpu_line = next(line for line in out.splitlines() if "cpu:0" in line)
    assert "free of" in cpu_line
    assert "chosen automatically" in out
    if pocl_spec():
        assert pocl_spec() in out


def test_gpu_use_selects_the_pocl_device(shell, capsys):
    spec = pocl_spec()
    if spec is None:
        pytest.skip("no PoCL OpenCL device here")
    shell.run_line_magic("gpu", f"use {spec}")
    assert f"current device: {spec}" in capsys.readouterr().out
    assert gpu_magics(shell).device.spec == spec
    assert gw.Device() is gpu_magics(shell).device  # later gw.Device() calls get it too
    shell.run_line_magic("gpu", "")
    marked = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("→"))
    assert spec in marked


@pytest.mark.parametrize(("spec", "message"), [("nope:3", "unknown backend 'nope'"), ("cpu:9", "has no device 9")])
def test_gpu_use_bad_spec_prints_one_line(shell, capsys, spec, message):
    shell.run_line_magic("gpu", f"use {spec}")
    captured = capsys.readouterr()
    assert message in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert "Traceback" not in captured.out + captured.err
    assert gpu_magics(shell).device is None and "GPUWB_DEVICE" not in os.environ


def test_gpu_mem_reports_device_memory_and_live_buffers(shell, capsys):
    shell.run_line_magic("gpu", "use cpu")
    buf = gw.Device("cpu").alloc(1 << 20, "float32")
    try:
        shell.run_line_magic("gpu", "mem")
        out = capsys.readouterr().out
    finally:
        buf.free()
    assert "free of" in out
    assert "holds 4.0 MiB in 1 live buffer" in out


def test_cell_magic_stores_a_trace_of_the_cell(shell, capsys):
    result = shell.run_cell(f"%%gpu -o t --no-show\n{TRACED_CELL}")
    result.raise_error()
    trace = shell.user_ns["t"]
    assert isinstance(trace, gw.Trace) and not trace.recording
    spans = [s for s in trace.spans if s.kind in ("h2d", "kernel", "d2h")]
    assert [s.kind for s in sorted(spans, key=lambda s: s.start_ns)] == ["h2d", "kernel", "d2h"]
    assert len({s.stream for s in spans}) == 2
    assert next(s for s in spans if s.kind == "kernel").name == "scale_add"
    record = history.history[-1]
    assert record.trace is trace and record.name == "t" and record.error is None
    assert record.wall_s > 0 and record.idle_pct is not None and record.efficiency is not None
    start, end = record.window_ns
    assert start <= min(s.start_ns for s in spans) and max(s.end_ns for s in spans) <= end
    assert trace.summary(window=record.window_ns).window_source == "cell"
    assert capsys.readouterr().out == ""  # --no-show


def test_cell_magic_shows_the_summary_as_text_outside_a_notebook(shell, capsys):
    shell.run_cell(f"%%gpu\n{TRACED_CELL}").raise_error()
    out = capsys.readouterr().out
    assert "overlap %" in out and "(from cell)" in out


def test_cell_magic_returns_the_last_expression(shell):
    result = shell.run_cell("%%gpu --no-show\n6 * 7")
    assert result.result == 42


def test_cell_error_propagates_and_the_trace_stops(shell, capsys):
    cell = 'import gpuworkbench as gw\nb = gw.Device("cpu").alloc(16)\nb.fill_bytes(0).wait()\nraise KeyError("boom")'
    result = shell.run_cell(f"%%gpu -o failed --no-show\n{cell}")
    assert isinstance(result.error_in_exec, KeyError)
    assert "KeyError" in capsys.readouterr().out  # IPython showed the cell's traceback
    trace = shell.user_ns["failed"]
    assert not trace.recording
    assert trace.wait_pending(5) and "memset" in [s.kind for s in trace.spans]
    assert history.history[-1].error == "KeyError('boom')"
    shell.user_ns["b"].free()


@pytest.mark.parametrize("options", ["--nope", "-o", "-o 1x", "extra words", "--device nope:1"])
def test_bad_option_prints_usage_not_a_traceback(shell, capsys, options):
    result = shell.run_cell(f"%%gpu {options}\nran = True")
    captured = capsys.readouterr()
    assert result.success
    assert "ran" not in shell.user_ns
    assert "Traceback" not in captured.out + captured.err
    assert "usage: %%gpu" in captured.err or "unknown backend" in captured.err


def test_unknown_command_prints_usage(shell, capsys):
    shell.run_line_magic("gpu", "frobnicate")
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "%gpu bench" in err


def test_export_writes_the_last_cell_trace(shell, capsys, tmp_path):
    shell.run_line_magic("gpu", f"export {tmp_path / 'none.json'}")
    assert "nothing to export" in capsys.readouterr().err
    shell.run_cell(f"%%gpu --no-show\n{TRACED_CELL}").raise_error()
    path = tmp_path / "run.json"
    shell.run_line_magic("gpu", f"export {path}")
    assert str(path) in capsys.readouterr().out
    doc = json.loads(path.read_text())
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert [e["name"] for e in kernels] == ["scale_add"]


@pytest.mark.parametrize("bench", ["copy", "launch", "pipeline"])
def test_bench_runs_on_the_cpu_backend(shell, capsys, bench):
    shell.run_line_magic("gpu", "use cpu")
    shell.run_line_magic("gpu", f"bench {bench}")
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err and captured.err == ""
    assert f"{bench} [1/" in captured.out  # progress, as text outside a notebook
    results = gpu_magics(shell).last_bench
    assert results["device"] == "cpu:0"
    if bench == "copy":
        assert all(results[k] > 0 for k in ("pinned H2D", "pinned D2H", "pageable H2D", "pageable D2H"))
        assert "GB/s" in captured.out
    elif bench == "launch":
        assert all(results[k] > 0 for k in ("enqueue_s", "per_kernel_s", "round_trip_s"))
    else:
        assert results["correct"] and "overlap %" in captured.out


def test_live_starts_stops_and_exports(shell, capsys, tmp_path):
    pytest.importorskip("jupyter_bokeh")
    shell.run_line_magic("gpu", "live")
    live = gpu_magics(shell).live
    assert live is not None and live.trace.recording
    shell.run_line_magic("gpu", "live stop")
    assert "stopped" in capsys.readouterr().out
    assert not live.trace.recording
    shell.run_line_magic("gpu", f"export --live {tmp_path / 'live.json'}")
    assert "live dashboard" in capsys.readouterr().out
    assert json.loads((tmp_path / "live.json").read_text())["traceEvents"] is not None


def test_gpu_cupti_says_where_cupti_stands_and_releases_it(shell, capsys):
    """Without CUDA nothing attaches CUPTI: the state says so and a release has nothing to let go. The lingering and
    let-go states are unit-tested with a fake libcupti (tests/trace/cupti/test_cupti_linger.py)."""
    from gpuworkbench.trace import cupti

    shell.run_line_magic("gpu", "cupti")
    out = capsys.readouterr().out
    assert out.startswith("CUPTI: ") and cupti.state() in out
    if cupti.detached():
        assert "not attached" in out
    shell.run_line_magic("gpu", "cupti release")
    assert "CUPTI: " in capsys.readouterr().out
    shell.run_line_magic("gpu", "cupti now")
    assert "unknown argument 'now'" in capsys.readouterr().err


def test_a_cell_that_does_not_trace_lets_cupti_go_first_and_one_that_traces_gets_it_ready(shell, monkeypatch, capsys):
    """CUPTI lingers after a trace for the next to start free, but slows every CUDA call meanwhile: a cell that does
    not trace lets an attached CUPTI go before it runs; a cell that traces gets a source readied for its trace before
    it runs; a cell asking about CUPTI leaves it as it is. Nothing is re-initialized on a timer."""
    from gpuworkbench.trace import cupti

    calls: list[str] = []
    monkeypatch.setattr(cupti, "detached", lambda: False)
    monkeypatch.setattr(cupti, "let_go", lambda: calls.append("let go") or True)
    monkeypatch.setattr(cupti, "warm_for_cell", lambda: calls.append("warm") or True)
    notebook: list[bool] = []
    monkeypatch.setattr(cupti, "set_notebook", notebook.append)
    monkeypatch.setattr(cell_hooks, "last_done", None)
    magics.register(shell)  # what %load_ext's first load did (the hooks are registered once)
    assert notebook == [True]  # CUPTI told it serves a notebook: attached for the cells that trace, not on a timer
    shell.run_cell("plain = 1 + 1")
    assert calls == ["let go"]
    assert cell_hooks.last_done[0] == "let CUPTI go for the untraced cell" and cell_hooks.last_done[1] >= 0
    shell.run_cell("%%gpu --no-show\nx = 2")
    shell.run_cell("import gpuworkbench as gw\nwith gw.trace():\n    pass")
    assert calls == ["let go", "warm", "warm"]
    assert cell_hooks.last_done[0].endswith("for the cell's trace")
    shell.run_line_magic("gpu", "cupti")
    assert "for the cell's trace, in " in capsys.readouterr().out
    shell.run_cell("loaded = None  # gw.load_trace(path)")  # reads a file: nothing to ready, CUPTI kept
    shell.run_cell("client = None  # with gw.dask.trace(client) as t:")  # traces on the workers: CUPTI kept
    shell.run_cell("%gpu cupti")  # asking where CUPTI stands does not change it
    assert calls == ["let go", "warm", "warm"]
    monkeypatch.setattr(cupti, "detached", lambda: True)
    shell.run_cell("plain = 3")
    assert calls == ["let go", "warm", "warm"]  # not attached: nothing to let go


def test_a_kernel_readies_cupti_on_its_event_loop_after_each_cell_not_inside_one(shell, monkeypatch) -> None:
    """With a Jupyter kernel's event loop, each cell's end schedules ``cupti.between_cells`` on it (it runs once the
    kernel is idle, outside every cell's time); registering again adds no second schedule."""
    from gpuworkbench.trace import cupti

    class Loop:
        def __init__(self) -> None:
            self.later: list = []

        def call_later(self, delay: float, fn) -> None:
            self.later.append((delay, fn))

    loop = Loop()
    monkeypatch.setattr(shell, "kernel", type("Kernel", (), {"io_loop": loop})(), raising=False)
    monkeypatch.setattr(cupti, "between_cells", lambda: "let go, ready")
    monkeypatch.setattr(cell_hooks, "last_between", None)
    before = list(shell.events.callbacks["post_run_cell"])
    try:
        magics.register(shell)
        magics.register(shell)
        shell.run_cell("plain = 1 + 1")
        assert len(loop.later) == 1 and loop.later[0][0] == cell_hooks.IDLE_AFTER_S
        assert cell_hooks.last_between is None  # not inside the cell
        loop.later[0][1]()  # the kernel, idle
        assert cell_hooks.last_between[0] == "let go, ready" and cell_hooks.last_between[1] >= 0
    finally:
        for callback in [c for c in shell.events.callbacks["post_run_cell"] if c not in before]:
            shell.events.unregister("post_run_cell", callback)


def test_a_kernel_warms_the_pictures_up_once_on_its_event_loop_after_load_ext(shell, monkeypatch) -> None:
    """In a Jupyter kernel ``%load_ext`` leaves Bokeh's first layout to the event loop (once per process), and the
    warm-up never raises: without Bokeh, or failing, the first shown cell pays instead."""

    class Loop:
        def __init__(self) -> None:
            self.soon: list = []

        def add_callback(self, fn) -> None:
            self.soon.append(fn)

    loop = Loop()
    monkeypatch.setattr(shell, "kernel", type("Kernel", (), {"io_loop": loop})(), raising=False)
    monkeypatch.setattr(magics, "_warming", [])
    before = list(shell.events.callbacks["post_run_cell"])
    warmed: list[bool] = []
    monkeypatch.setattr("gpuworkbench.viz.warm_up", lambda: warmed.append(True))
    try:
        magics.register(shell)
        magics.register(shell)
        assert loop.soon == [magics.warm_up] and not warmed  # scheduled once, not run inside %load_ext
        loop.soon[0]()
        assert warmed == [True]
        monkeypatch.setattr("gpuworkbench.viz.warm_up", lambda: 1 / 0)
        magics.warm_up()  # a failing warm-up is swallowed
    finally:
        for callback in [c for c in shell.events.callbacks["post_run_cell"] if c not in before]:
            shell.events.unregister("post_run_cell", callback)


def test_a_traced_cell_says_what_its_trace_noted(shell, capsys):
    """The trace's notes (here: an OpenCL device that offers no counters, its host's sampled instead) are printed
    under the cell, as ``%%gpu note:`` lines, not left in ``trace.stats``."""
    spec = pocl_spec()
    if spec is None:
        pytest.skip("no PoCL OpenCL device here")
    cell = "import numpy as np\nb = gw.Device().alloc(256, 'float32')\nb.copy_from_host(np.ones(256, np.float32))\n"
    shell.run_cell("import gpuworkbench as gw")
    shell.run_cell_magic("gpu", f"--no-show --counters -o noted --device {spec}", cell)
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("%%gpu note: ")]
    assert notes and any("offers none" in n for n in notes), out
    assert [f"%%gpu note: {w}" for w in shell.user_ns["noted"].stats.warnings] == notes
    shell.run_cell("b.free()")
