"""What a traced notebook cell costs around one 16 x 64 MiB pipeline run, in a real IPython shell with
``%load_ext gpuworkbench`` (its pre- and post-run hooks), against the same cell untraced (needs a CUDA GPU, CuPy and
cupti-python).

    python benchmarks/bench_notebook_cells.py [--rounds 12] [--json out.json]

Per round, in alternating order, each mode runs its cells before (4 batches each) and then the timed cell, 0.2 s
apart as a user's cells are:
``untraced after an untraced cell`` (the baseline); ``traced after an untraced cell`` (CUPTI *ready*: the cell's
pre-run hook parks and primes a source for its trace); ``traced after traced cells`` (the last trace's source
lingers); ``untraced after a traced cell`` (the pre-run hook lets the lingering source go); ``traced after the linger
ran out`` (``cupti.LINGER_S`` 0.05 s for the cells before: let go, then *ready* again 0.1 s later).

``--first N``: instead, N fresh processes of each kind, alternating: ``%load_ext``, a setup cell, 1 s, then the
process's first traced cell, or the same cell untraced; paired medians of the body and the pre-run hooks.

Three more modes time a loop of 2000 empty CuPy launches the same way: untraced after an untraced cell (their
baseline), untraced after a traced cell, traced after traced cells.

``--shown``: instead, a ``%%gpu`` cell with its picture (timeline, memory, source view, summary) in a shell that
publishes rich output as a Jupyter kernel does, against ``%%gpu --no-show`` and the same code untraced, alternating,
``--rounds`` rounds after one warm-up round; medians of the body, the whole ``run_cell`` and "code returned ->
display published" (the browser's own render not counted) with its phases. The work: ten training steps of a small
CNN with PyTorch on CUDA (~1 000 spans), or without CUDA 250 rounds of copies and kernels on the CPU backend.

Each row gives the timed cell's body (its own clock, as ``%%time`` would), the whole ``run_cell`` (IPython's work
and every hook included), and our pre- and post-run hooks alone, as medians, and the body's paired difference to the
baseline of the same round; for traced cells also the trace's start (the cell's clock to the first line inside the
``with``) and its end (the last line inside to the cell's clock, IPython's step to the next statement included).
Traced cells are checked to hold all 16 kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_any_cuda import pipeline_setup  # noqa: E402

GAP_S = 0.2
PIPELINE = "pipe.run({inputs}, {outputs})"
LAUNCHES = "for _ in range({launches}):\n    _empty((1,), (1,), ())\n_sync()"
TRACED = (  # the last cell's trace is dropped before the clock starts, as the untraced cell drops it after its clock
    "_t = None\n_t0 = _clock()\nwith gw.trace() as _t:\n    _t1 = _clock()\n    {work}\n    _t2 = _clock()\n"
    "_t3 = _clock()\n_ms = (_t3 - _t0) / 1e6"
)
UNTRACED = "_t0 = _clock()\n{work}\n_ms = (_clock() - _t0) / 1e6\n_t = None"
LAUNCH_COUNT = 2000
#: mode: (the cells before it, the timed cell, its work); each work's first mode is the baseline of its rows
MODES = {
    "untraced after an untraced cell": (["untraced"], "untraced", "pipeline"),
    "untraced after an untraced cell, CUPTI let go (not left ready)": (["untraced"], "untraced", "pipeline"),
    "traced after an untraced cell": (["untraced"], "traced", "pipeline"),
    "traced after traced cells": (["traced", "traced"], "traced", "pipeline"),
    "untraced after a traced cell": (["traced"], "untraced", "pipeline"),
    "traced after the linger ran out": (["traced"], "traced", "pipeline"),
    "empty launches, untraced after an untraced cell": (["untraced"], "untraced", "launches"),
    "empty launches, untraced after an untraced cell, CUPTI let go (not left ready)": (
        ["untraced"],
        "untraced",
        "launches",
    ),
    "empty launches, untraced after a traced cell": (["traced"], "untraced", "launches"),
    "empty launches, traced after traced cells": (["traced", "traced"], "traced", "launches"),
}


class HookClock:
    """Times our hooks: one callback registered before ``%load_ext`` (first to run) and one after (last)."""

    def __init__(self) -> None:
        self.t0 = 0
        self.ms: dict[str, float] = {}

    def start(self, *_args) -> None:
        self.t0 = time.perf_counter_ns()

    def stop(self, event: str):
        def done(*_args) -> None:
            self.ms[event] = (time.perf_counter_ns() - self.t0) / 1e6

        return done


def cell(kind: str, batches: int | None, work: str = "pipeline") -> str:
    """A cell's source: ``work`` (all 16 pipeline batches, or ``batches`` of them; or the launch loop), traced or not,
    timed by its own clock into ``_ms``."""
    if work == "launches":
        body = LAUNCHES.format(launches=LAUNCH_COUNT if batches is None else 200)
    else:
        inputs, outputs = ("inputs", "outputs") if batches is None else (f"inputs[:{batches}]", f"outputs[:{batches}]")
        body = PIPELINE.format(inputs=inputs, outputs=outputs)
    if kind == "traced":
        return TRACED.format(work=body.replace("\n", "\n    "))
    return UNTRACED.format(work=body)


class IdleLoop:
    """A Jupyter kernel's event loop as far as the extension uses it: what a cell's end schedules (``call_later``)
    runs in the gap before the next cell (``idle``), as a kernel runs it once it has replied and waits."""

    def __init__(self) -> None:
        self.due: list = []
        self.ms: list[float] = []  # each idle's work, as the kernel spends it between cells

    def call_later(self, _delay: float, fn) -> None:
        self.due.append(fn)

    def add_callback(self, fn) -> None:
        self.due.append(fn)

    def idle(self, seconds: float) -> None:
        t0 = time.perf_counter()
        due, self.due = self.due, []
        for fn in due:
            fn()
        self.ms.append((time.perf_counter() - t0) * 1e3)
        time.sleep(max(0.0, seconds - (time.perf_counter() - t0)))


LOOP = IdleLoop()


def notebook(idle: bool = True):
    """A real IPython shell after ``%load_ext gpuworkbench`` and the pipeline's set-up: (shell, hook clock, gw,
    inputs). ``idle``: the shell has a kernel's event loop (``LOOP``), on which the extension readies CUPTI between
    cells; without it, as in a terminal, the pre-run hook does all of it."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    if idle:
        shell.kernel = type("Kernel", (), {"io_loop": LOOP})()
    hooks = HookClock()
    for event in ("pre_run_cell", "post_run_cell"):
        shell.events.register(event, hooks.start)
    shell.run_cell("%load_ext gpuworkbench", store_history=False).raise_error()
    for event in ("pre_run_cell", "post_run_cell"):
        shell.events.register(event, hooks.stop(event))
    gw, _dev, pipe, inputs, outputs = pipeline_setup()
    import cupy as cp

    empty = cp.RawKernel('extern "C" __global__ void e() {}', "e")
    shell.user_ns.update(gw=gw, pipe=pipe, inputs=inputs, outputs=outputs, _clock=time.perf_counter_ns)
    shell.user_ns.update(_empty=empty, _sync=cp.cuda.Device().synchronize)
    return shell, hooks, gw, inputs


def child(kind: str) -> None:
    """One fresh process: its first cell after the set-up, traced or not, 1 s later."""
    shell, hooks, _gw, _inputs = notebook()
    LOOP.idle(1.0)
    shell.run_cell(cell(kind, None), store_history=False).raise_error()
    print(json.dumps({"body": shell.user_ns["_ms"], "pre": hooks.ms["pre_run_cell"]}), flush=True)


def first(count: int) -> list[dict]:
    import subprocess

    got: dict[str, list[dict]] = {"untraced": [], "traced": []}
    for r in range(count):
        for kind in ("untraced", "traced") if r % 2 == 0 else ("traced", "untraced"):
            p = subprocess.run([sys.executable, __file__, "--child", kind], capture_output=True, text=True)
            try:
                got[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                raise SystemExit(f"{kind} child failed: {p.stderr[-2000:]}") from None
    pairs = list(zip(got["traced"], got["untraced"]))
    out = {
        "what": "first cell of a process after %load_ext, traced against untraced (fresh processes)",
        "untraced_body_ms_median": round(statistics.median(u["body"] for u in got["untraced"]), 3),
        "traced_body_ms_median": round(statistics.median(t["body"] for t in got["traced"]), 3),
        "body_delta_ms_median_of_pairs": round(statistics.median(t["body"] - u["body"] for t, u in pairs), 3),
        "body_ratio_median_of_pairs": round(statistics.median(t["body"] / u["body"] for t, u in pairs), 4),
        "pre_run_hooks_ms_median": {k: round(statistics.median(x["pre"] for x in v), 3) for k, v in got.items()},
        "traced_all": [round(t["body"], 2) for t in got["traced"]],
        "untraced_all": [round(u["body"], 2) for u in got["untraced"]],
    }
    print(json.dumps(out), flush=True)
    return [out]


SHOWN_CPU_SETUP = """\
import numpy as np, gpuworkbench as gw
dev = gw.Device("cpu")
s = dev.create_stream("work")
x, y = dev.alloc(1 << 10), dev.alloc(1 << 10)
host = np.ones(1 << 10, np.float32); out = np.empty_like(host)
f = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
g = gw.elementwise("float32 x, float32 y", "y = x * x", name="square")
"""
#: ~1 000 spans on the CPU backend: 250 rounds of upload, two kernels, download.
SHOWN_CPU_WORK = """\
for i in range(250):
    x.copy_from_host_async(host, s)
    f(x, y, stream=s)
    g(y, x, stream=s)
    x.copy_to_host_async(out, s)
dev.synchronize()
"""
SHOWN_TORCH_SETUP = """\
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 7 * 7, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data, labels = torch.randn(64, 1, 28, 28, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
for _ in range(3):
    opt.zero_grad(); nn.functional.cross_entropy(model(data), labels).backward(); opt.step()
torch.cuda.synchronize()
"""
#: Ten training steps of a small CNN (conv-relu-pool x2, linear, SGD, batch 64 of 1x28x28): ~1 000 spans.
SHOWN_TORCH_WORK = """\
for _ in range(10):
    opt.zero_grad()
    nn.functional.cross_entropy(model(data), labels).backward()
    opt.step()
torch.cuda.synchronize()
"""


def shown_workload() -> tuple[str, str, str]:
    """(what, set-up cell, work): the CNN on CUDA with PyTorch where both are there, else the CPU loop."""
    try:
        import torch

        if torch.cuda.is_available():
            return "10 CNN training steps (PyTorch, CUDA)", SHOWN_TORCH_SETUP, SHOWN_TORCH_WORK
    except ImportError:
        pass
    return "250 rounds of copy, 2 kernels, copy (CPU backend)", SHOWN_CPU_SETUP, SHOWN_CPU_WORK


class ShownClock:
    """Marks taken in one ``%%gpu`` cell: the code returned (``Trace.stop``), the picture built, each display message
    published; and the phases of the magic after the code (``_summarise``, ``_show``, building, publishing)."""

    def __init__(self, shell) -> None:
        import gpuworkbench.viz as viz
        from gpuworkbench.notebook.magics import GpuMagics
        from gpuworkbench.trace.recorder import Trace
        from gpuworkbench.viz import notebook_doc, reuse

        self.marks: dict[str, list[int]] = {}
        self.ms: dict[str, float] = {}
        self._wrap(Trace, "stop", "code returned", mark_before=True)
        for owner, name, label in (
            (GpuMagics, "_summarise", "summary (wait, table, figures)"),
            (GpuMagics, "_show", "picture (build or refill, encode, publish)"),
            (viz, "trace_layout", "build the layout (first cell of its shape)"),
            (reuse, "_refill", "refill a kept layout"),
            (notebook_doc, "document_json", "encode the document"),
        ):
            self._wrap(owner, name, label)
        publisher = shell.display_pub
        publish = publisher.publish

        def published(*args, **kwargs):
            self.marks.setdefault("published", []).append(time.perf_counter_ns())
            return publish(*args, **kwargs)

        publisher.publish = published

    def _wrap(self, owner, name: str, label: str, mark_before: bool = False) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter_ns()
            if mark_before:
                self.marks.setdefault(label, []).append(t0)
            try:
                return original(*args, **kwargs)
            finally:
                if not mark_before:
                    self.ms[label] = self.ms.get(label, 0.0) + (time.perf_counter_ns() - t0) / 1e6

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.marks.clear()
        self.ms.clear()

    def to_screen_ms(self) -> float:
        """Code returned -> the last display message of the cell published."""
        return (self.marks["published"][-1] - self.marks["code returned"][-1]) / 1e6


def shown_shell() -> tuple[Any, str, str]:
    """(shell, what, work): an IPython shell that displays as a notebook kernel does, with ``%load_ext gpuworkbench``
    and ``shown_workload``'s set-up run in it."""
    from IPython.core.displaypub import CapturingDisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    # what in_notebook() looks for (rich output is published as in a Jupyter kernel), with its event loop
    shell.kernel = type("Kernel", (), {"io_loop": LOOP})()
    shell.display_pub = CapturingDisplayPublisher()
    shell.run_cell("%load_ext gpuworkbench", store_history=False).raise_error()
    what, setup, work = shown_workload()
    shell.run_cell(setup, store_history=False).raise_error()
    return shell, what, work


def shown(rounds: int) -> list[dict]:
    """``--shown``: a ``%%gpu`` cell with its picture, in a shell that displays as a notebook kernel does, against the
    same code untraced, alternating; medians of the body, the whole ``run_cell`` and code returned -> published."""
    shell, what, work = shown_shell()
    clock = ShownClock(shell)
    timed = "_t0 = _clock()\n{work}_ms = (_clock() - _t0) / 1e6\n"
    shell.user_ns["_clock"] = time.perf_counter_ns
    cells = {
        "untraced": timed.format(work=work),
        "%%gpu, shown": "%%gpu\n" + timed.format(work=work),
        "%%gpu --no-show": "%%gpu --no-show\n" + timed.format(work=work),
    }
    rows: dict[str, dict[str, list[float]]] = {k: {} for k in cells}
    names = list(cells)
    first_ms = float("nan")
    for r in range(rounds + 1):  # the first round warms up (its layouts are built, later ones refilled)
        for kind in names if r % 2 == 0 else names[::-1]:
            clock.reset()
            shell.display_pub.outputs.clear()
            LOOP.idle(GAP_S)
            t0 = time.perf_counter_ns()
            shell.run_cell(cells[kind], store_history=False).raise_error()
            total = (time.perf_counter_ns() - t0) / 1e6
            if r == 0:
                if kind == "%%gpu, shown":
                    first_ms = clock.to_screen_ms()  # the layout built: the first cell of its shape
                continue
            row = rows[kind]
            row.setdefault("body", []).append(shell.user_ns["_ms"])
            row.setdefault("cell", []).append(total)
            if kind == "%%gpu, shown":
                if not shell.display_pub.outputs:
                    raise SystemExit("the %%gpu cell published nothing")
                row.setdefault("code returned -> published", []).append(clock.to_screen_ms())
            for label, ms in clock.ms.items():
                row.setdefault(label, []).append(ms)
    from gpuworkbench.notebook.history import history

    spans = len(history[-1].trace)
    results = []
    for kind, row in rows.items():
        out = {"what": f"{what}, {spans} spans: {kind}"}
        out.update({f"{k} ms median": round(statistics.median(v), 3) for k, v in row.items()})
        if kind == "%%gpu, shown":
            out["first cell (its layout built): code returned -> published ms"] = round(first_ms, 3)
        results.append(out)
        print(json.dumps(out), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--first", type=int, default=0, help="fresh processes of each kind instead (see above)")
    parser.add_argument("--child", choices=("traced", "untraced"), help=argparse.SUPPRESS)
    parser.add_argument("--no-idle", action="store_true", help="no kernel event loop: CUPTI readied in the hooks alone")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--shown", action="store_true", help="a %%%%gpu cell with its picture instead (see above)")
    args = parser.parse_args()
    if args.shown:
        _write(args.json, shown(args.rounds))
        return
    if args.child:
        child(args.child)
        return
    if args.first:
        _write(args.json, first(args.first))
        return
    from gpuworkbench.trace.spans import KIND_CODE

    shell, hooks, gw, inputs = notebook(idle=not args.no_idle)
    from gpuworkbench.notebook import cell_hooks

    cupti = gw.cupti
    linger_s = cupti.LINGER_S
    rows: dict[str, dict[str, list[float]]] = {
        m: {"body": [], "cell": [], "pre": [], "post": [], "enter": [], "exit": [], "idle": []} for m in MODES
    }
    states: dict[str, dict[str, int]] = {m: {} for m in MODES}
    names = list(MODES)
    for r in range(args.rounds):
        for mode in names if r % 2 == 0 else names[::-1]:
            before, timed, work = MODES[mode]
            if mode == "traced after the linger ran out":
                cupti.LINGER_S = 0.05
            idles = len(LOOP.ms)
            cell_hooks.LET_GO_READY = "let go" in mode  # the pre-run hook lets go a CUPTI only ready
            for kind in before:
                result = shell.run_cell(cell(kind, 4, work), store_history=False)
                result.raise_error()
                if shell.user_ns["_t"] is not None:
                    shell.user_ns["_t"].wait_pending()  # its harvester parks the source as it ends
                LOOP.idle(0.05)
            cupti.LINGER_S = linger_s
            LOOP.idle(GAP_S + (0.3 if mode == "traced after the linger ran out" else 0.0))
            rows[mode]["idle"].append(LOOP.ms[-1] + LOOP.ms[-2] if len(LOOP.ms) - idles >= 2 else LOOP.ms[-1])
            state = cupti.state().split(":")[0]
            states[mode][state] = states[mode].get(state, 0) + 1
            t0 = time.perf_counter_ns()
            result = shell.run_cell(cell(timed, None, work), store_history=False)
            total = (time.perf_counter_ns() - t0) / 1e6
            result.raise_error()
            trace = shell.user_ns["_t"]
            if trace is not None:
                trace.wait_pending()
                kernels = int((trace.table()["kind"] == KIND_CODE["kernel"]).sum()) if len(trace) else 0
                launched = len(inputs) if work == "pipeline" else LAUNCH_COUNT
                if kernels < launched:
                    raise SystemExit(f"{mode}: the trace holds {kernels} kernels, {launched} launched")
            row = rows[mode]
            row["body"].append(shell.user_ns["_ms"])
            row["cell"].append(total)
            row["pre"].append(hooks.ms["pre_run_cell"])
            row["post"].append(hooks.ms["post_run_cell"])
            if trace is not None:
                ns = shell.user_ns
                row["enter"].append((ns["_t1"] - ns["_t0"]) / 1e6)
                row["exit"].append((ns["_t3"] - ns["_t2"]) / 1e6)
    results = []
    for mode in MODES:
        row = rows[mode]
        base = rows[next(m for m in MODES if MODES[m][2] == MODES[mode][2])]

        def paired(key: str, op, row=row, base=base) -> float:
            return round(statistics.median(op(a, b) for a, b in zip(row[key], base[key])), 4)

        out = {
            "what": f"cell around {'pipeline 16x64MiB' if MODES[mode][2] == 'pipeline' else '2000 launches'}: {mode}",
            "body_ms_median": round(statistics.median(row["body"]), 3),
            "body_delta_ms_median_of_rounds": paired("body", lambda a, b: a - b),
            "body_ratio_median_of_rounds": paired("body", lambda a, b: a / b),
            "cell_ms_median": round(statistics.median(row["cell"]), 3),
            "cell_delta_ms_median_of_rounds": paired("cell", lambda a, b: a - b),
            "pre_run_hooks_ms_median": round(statistics.median(row["pre"]), 3),
            "post_run_hooks_ms_median": round(statistics.median(row["post"]), 3),
            "idle_before_ms_median": round(statistics.median(row["idle"]), 3),  # after the last cell before it
            "cupti_state_before": states[mode],
            **(
                {
                    "trace_enter_ms_median": round(statistics.median(row["enter"]), 3),
                    "trace_exit_ms_median": round(statistics.median(row["exit"]), 3),
                }
                if row["enter"]
                else {}
            ),
            "body_all": [round(x, 2) for x in row["body"]],
            **(
                {"us_per_launch_median": round(statistics.median(row["body"]) * 1e3 / LAUNCH_COUNT, 3)}
                if MODES[mode][2] == "launches"
                else {}
            ),
        }
        results.append(out)
        print(json.dumps(out), flush=True)
    _write(args.json, results)


def _write(path: str | None, results: list[dict]) -> None:
    """The results as one JSON file, where ``--json`` asks for it."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
