"""Which line did that, on a GPU: our lines against torch.profiler(with_stack=True)'s, and what attribution costs.

    python benchmarks/bench_lines.py proof [--steps 5] [--sites auto|cupti]  # kernels on the profiler's cell lines
    python benchmarks/bench_lines.py cost [--rounds 9]      # launch loops and a training cell, lines on / off
    python benchmarks/bench_lines.py profiler [--rounds 9]  # the same cell in torch.profiler(with_stack=True)
    python benchmarks/bench_lines.py all                    # each of those in a process of its own

``proof`` runs a small CNN's training steps as a notebook cell would (code compiled under a cell's name; forward,
loss, backward and optimizer on lines of their own), once in ``gw.trace(lines=True)`` with the cell as focus and once
in ``torch.profiler.profile(with_stack=True)``. The profiler's line of a kernel is the line of the innermost call the
cell made around its op (its Python tracer keeps the calling line of each call); ours is the span's location. Device
memsets count as kernels on both sides (the profiler lists them among an op's kernels). Kernels are matched by name:
per name, the lines each side gives are compared as multisets; the match is the share of the profiler's kernels we
charge to the same line. ``--sites`` picks how other libraries' call sites are found (``recorder_cupti.CALL_SITES``:
"auto" is Python's monitoring on 3.12+, "cupti" CUPTI's callbacks).

``cost`` interleaves rounds: an empty-kernel loop of our ``Kernel`` and of CuPy's ``RawKernel`` (µs per launch) in a
trace with lines off, on, on with CUPTI's callbacks for call sites, and on with no call sites; and the training cell
untraced, in ``gw.trace()`` and in ``gw.trace(lines=True)`` the same three ways (ms per cell, records waited for).
``profiler``: the cell untraced and in torch.profiler(with_stack=True), in a process of its own (after a profiler,
PyTorch keeps CUPTI's one callback subscriber). ``all`` runs them in processes of their own and puts the two costs
side by side, each over its own process's untraced cell. Each result is one JSON line; ratios are medians of the
interleaved pairs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import linecache
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

CELL_NAME = "<ipython-input-12-0a1b2c3d>"
CELL = """\
x = torch.randn(64, 3, 32, 32, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
for _ in range(steps):
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _cell():
    linecache.cache[CELL_NAME] = (len(CELL), None, CELL.splitlines(True), CELL_NAME)
    return compile(CELL, CELL_NAME, "exec")


def _model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 16, 10),
    ).cuda()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _innermost_cell_line(stack: list[str]) -> int | None:
    """The line of the innermost frame of the cell in a profiler stack ("file(line): function", innermost first)."""
    for entry in stack:
        if entry.startswith(CELL_NAME + "("):
            return int(entry[len(CELL_NAME) + 1 : entry.index(")", len(CELL_NAME))])
    return None


def proof(steps: int, sites: str = "auto") -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import gpuworkbench as gw

    code = _cell()
    model, opt = _model()
    env = {"torch": torch, "model": model, "opt": opt, "steps": 2}
    exec(code, env)  # warm: cuDNN's choices, the optimizer's state
    torch.cuda.synchronize()
    env["steps"] = steps

    with _sites_by(sites), gw.trace(lines=True) as t:
        t.lines.set_focus(CELL_NAME)
        exec(code, env)
        torch.cuda.synchronize()
    t.wait_pending()
    table = t.table()
    # torch.profiler lists device memsets among an op's kernels, as "Memset (Device)": so are ours here
    kernel = (table["kind"] == 4) | (table["kind"] == 3)
    names = np.where(table["kind"] == 3, "Memset (Device)", table["name"])
    ours: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unplaced = 0
    for name, loc in zip(names[kernel].tolist(), table["loc"][kernel].tolist()):
        where = t.locations[loc] if loc >= 0 else None
        line = where.line if where is not None and where.file == CELL_NAME else None
        unplaced += line is None
        ours[name][line] += 1

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        exec(code, env)
        torch.cuda.synchronize()
    theirs, no_stack = _profiler_lines(prof)
    total = sum(sum(c.values()) for c in theirs.values())
    with_line = sum(n for c in theirs.values() for line, n in c.items() if line is not None)
    matched = sum(
        min(n, ours.get(name, collections.Counter())[line])
        for name, c in theirs.items()
        for line, n in c.items()
        if line is not None
    )
    # Kernels the profiler gives no stack for (backward runs on the autograd engine's thread): where we put them.
    placed_without_stack = collections.Counter()
    for name, c in theirs.items():
        if c.get(None):
            for line, n in ours.get(name, {}).items():
                placed_without_stack[line] += n
    differ = [
        {"kernel": name[:80], "profiler": {str(k): v for k, v in c.items()},
         "ours": {str(k): v for k, v in ours.get(name, {}).items()}}
        for name, c in theirs.items()
        if dict(c) != dict(ours.get(name, {}))
    ]  # fmt: skip
    for row in differ[:12]:
        emit(differs=row)
    emit(
        proof="lines vs torch.profiler(with_stack=True)",
        sites=sites,
        steps=steps,
        our_kernels=int(kernel.sum()),
        our_kernels_without_cell_line=unplaced,
        profiler_kernels=total,
        profiler_kernels_with_stack=with_line,
        matched=matched,
        match_pct=round(100.0 * matched / with_line, 2) if with_line else None,
        profiler_kernels_without_stack=no_stack,
        ours_for_kernels_the_profiler_gives_no_stack={str(k): v for k, v in placed_without_stack.items()},
        our_lines={str(r["line"]): int(r["ops"]) for r in _rows(t.statistics().lines)},
        sites_by=None if t._sites is None else ("monitoring" if t._sites.watch else "cupti"),
        warnings=t.stats.warnings,
    )


def _profiler_lines(prof: Any) -> tuple[dict[str, collections.Counter], int]:
    """Per kernel name, the cell lines torch.profiler(with_stack=True) gives its kernels, and how many kernels it gives
    no line for. Its Python tracer names each frame by the line where the frame was entered (a cell's module frame
    shows line 0), so a frame's current line is read where the profiler keeps it: the ``caller`` of each Python call
    event (the calling frame's line at the call). An op's line is that of the innermost call made from the cell."""
    tree = prof.profiler.kineto_results.experimental_event_tree()
    op_lines: dict[str, list[tuple[int, int | None]]] = collections.defaultdict(list)  # aten op -> (start, line)
    stack = [(node, None) for node in tree]
    while stack:
        node, line = stack.pop()
        fields = getattr(node, "extra_fields", None)
        caller = getattr(fields, "caller", None)
        if caller is not None and str(getattr(caller, "file_name", "")) == CELL_NAME:
            line = int(caller.line_number)  # a call made from the cell: every op under it is this line's
        if str(getattr(node, "tag", "")).endswith("TorchOp"):
            op_lines[node.name].append((int(node.start_time_ns), line))
        stack.extend((child, line) for child in node.children)
    for values in op_lines.values():
        values.sort()
    taken: dict[str, int] = collections.Counter()
    theirs: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    no_line = 0
    line_of: dict[int, int | None] = {}
    for event in sorted(prof.events(), key=lambda e: (e.time_range.start, -e.time_range.end)):
        # ops come in the order of the tree's op events of the same name; other events (a runtime call holding
        # kernels) take their parent op's line. The autograd engine's ops have no Python caller: no line.
        if event.name in op_lines:
            queue, i = op_lines[event.name], taken[event.name]
            taken[event.name] += 1
            line = queue[i][1] if i < len(queue) else None
        else:
            parent = getattr(event, "cpu_parent", None)
            line = line_of.get(id(parent)) if parent is not None else None
        line_of[id(event)] = line
        for k in getattr(event, "kernels", None) or []:
            no_line += line is None
            theirs[k.name][line] += 1
    return theirs, no_line


def _rows(frame: Any) -> list[dict[str, Any]]:
    columns = {c: list(frame[c]) for c in ("line", "ops")}
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _loops(gw: Any) -> dict[str, Any]:
    """Empty-kernel launch loops, µs per launch: our ``Kernel`` and CuPy's ``RawKernel``."""
    import cupy as cp

    dev = gw.Device("cuda:0")
    k = dev.compile('extern "C" __global__ void e(float *b) {}', "e")
    b = dev.alloc(1, "float32")
    s = dev.create_stream("bench-lines")
    raw = cp.RawKernel('extern "C" __global__ void e() {}', "e")
    n = 4000

    def gw_loop() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            k(1, 32, (b,), stream=s)
        s.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    def cupy_loop() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            raw((1,), (1,), ())
        cp.cuda.Device().synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    return {"gw": gw_loop, "cupy": cupy_loop}


def _cell_runner(gw: Any) -> Any:
    """``cell(how)``: ms of ten training steps run as the cell, untraced, traced (with lines or not, with CUPTI's
    call-site callbacks or not) or in torch.profiler(with_stack=True), records waited for."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    code = _cell()
    model, opt = _model()
    env = {"torch": torch, "model": model, "opt": opt, "steps": 10}
    exec(code, env)
    torch.cuda.synchronize()

    def cell(how: str) -> float:
        # Every variant starts from the same CUPTI state, whatever ran before it: untraced with CUPTI let go (as in
        # a process that never traced), traced with CUPTI attached by a trace just before (a trace after untraced
        # work attaches it again, ~10 ms: that cost is not the variant's).
        if how in ("untraced", "profiler"):
            gw.cupti.let_go()
        else:
            with gw.trace():
                pass
        t0 = time.perf_counter()
        if how == "untraced":
            exec(code, env)
            torch.cuda.synchronize()
        elif how == "profiler":
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True):
                exec(code, env)
                torch.cuda.synchronize()
        else:
            with _sites_by(SITES_OF.get(how, "auto")), gw.trace(lines=how != "trace") as t:
                if t.lines is not None:
                    t.lines.set_focus(CELL_NAME)
                exec(code, env)
                torch.cuda.synchronize()
            t.wait_pending()
            _sites_on(t, how in ("lines", "lines-cupti"))
        return (time.perf_counter() - t0) * 1e3

    return cell


def _sites_on(t: Any, expected: bool) -> None:
    """Stop where call sites were not logged as the variant says (another tool holding CUPTI's subscriber, say)."""
    sites = t._sites
    on = sites is not None and (sites.calls > 0 or sites.watch is not None)
    if on != expected:
        raise SystemExit(f"call sites {'off' if expected else 'on'} where they should not be: {t.stats.warnings}")


#: How each variant finds other libraries' call sites (``recorder_cupti.CALL_SITES``): "auto" is Python's
#: monitoring on 3.12+.
SITES_OF = {"lines-cupti": "cupti", "lines-no-sites": "off", "on-cupti": "cupti", "on-no-sites": "off"}


@contextlib.contextmanager
def _sites_by(by: str):
    from gpuworkbench.trace import recorder_cupti

    old, recorder_cupti.CALL_SITES.by = recorder_cupti.CALL_SITES.by, by
    try:
        yield
    finally:
        recorder_cupti.CALL_SITES.by = old


def _pairs(results: dict[str, list[float]], a: str, b: str) -> list[float]:
    return [x / y for x, y in zip(results[a], results[b])]


def cost(rounds: int) -> None:
    """Launch loops and the training cell with lines off and on, in a process where no torch.profiler ran (after one,
    PyTorch's Kineto keeps CUPTI's one callback subscriber, and a trace's call sites are off)."""
    import gpuworkbench as gw

    loops = _loops(gw)
    cell = _cell_runner(gw)
    results: dict[str, list[float]] = collections.defaultdict(list)
    for loop in loops.values():
        loop()
    for r in range(rounds):
        order = ("off", "on", "on-cupti", "on-no-sites")
        for which, loop in loops.items():
            for lines in order if r % 2 == 0 else reversed(order):
                with _sites_by(SITES_OF.get(lines, "auto")), gw.trace(lines=lines != "off") as t:
                    loop()  # warm: the trace's first launches
                    results[f"{which} {lines}"].append(loop())
                t.wait_pending()
                if which == "cupy" and lines != "off":
                    _sites_on(t, lines in ("on", "on-cupti"))
        hows = ["untraced", "trace", "lines", "lines-cupti", "lines-no-sites"]
        for how in hows if r % 2 == 0 else reversed(hows):
            results[f"cell {how}"].append(cell(how))
    for key, values in results.items():
        emit(measure=key, median=round(statistics.median(values), 3), values=[round(v, 3) for v in values])
    for which in loops:
        for on in ("on", "on-cupti", "on-no-sites"):
            pairs = _pairs(results, f"{which} {on}", f"{which} off")
            emit(ratio=f"{which} launch, lines {on} / off", median=round(statistics.median(pairs), 3),
                 pairs=[round(p, 3) for p in pairs])  # fmt: skip
    for how in ("trace", "lines", "lines-cupti", "lines-no-sites"):
        emit(ratio=f"cell {how} / untraced", median=round(statistics.median(_pairs(results, f"cell {how}",
             "cell untraced")), 3))  # fmt: skip
    emit(ratio="cell lines / trace", median=round(statistics.median(_pairs(results, "cell lines", "cell trace")), 3))


def profiler(rounds: int) -> None:
    """The training cell untraced and in torch.profiler(with_stack=True), in a process of its own."""
    import gpuworkbench as gw

    cell = _cell_runner(gw)
    results: dict[str, list[float]] = collections.defaultdict(list)
    for r in range(rounds):
        for how in ("untraced", "profiler") if r % 2 == 0 else ("profiler", "untraced"):
            results[f"cell {how}"].append(cell(how))
    for key, values in results.items():
        emit(measure=key, median=round(statistics.median(values), 3), values=[round(v, 3) for v in values])
    emit(ratio="cell profiler / untraced", median=round(statistics.median(_pairs(results, "cell profiler",
         "cell untraced")), 3))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("proof", "cost", "profiler", "all"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--sites", default="auto", help="how call sites are found: auto, monitoring, cupti")
    args = ap.parse_args()
    if args.mode != "all":
        emit(python=sys.version.split()[0], mode=args.mode)
        {"proof": lambda: proof(args.steps, args.sites), "cost": lambda: cost(args.rounds),
         "profiler": lambda: profiler(args.rounds)}[args.mode]()  # fmt: skip
        return
    ratios = {}
    runs = [("proof", ["--steps", str(args.steps)]), ("proof", ["--steps", str(args.steps), "--sites", "cupti"])]
    runs += [(mode, ["--rounds", str(args.rounds)]) for mode in ("cost", "profiler")]
    for mode, extra in runs:  # each in a process of its own: see ``cost``
        out = subprocess.run([sys.executable, __file__, mode, *extra], capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            print(line, flush=True)
            if line.startswith("{"):
                row = json.loads(line)
                if "ratio" in row:
                    ratios[row["ratio"]] = row["median"]
    lines, prof = ratios.get("cell lines / untraced"), ratios.get("cell profiler / untraced")
    if lines and prof:
        emit(ratio="cell lines / cell profiler(with_stack), each over its process's untraced cell",
             median=round(lines / prof, 3))  # fmt: skip


if __name__ == "__main__":
    main()
