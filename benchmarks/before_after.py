"""Two trees of the package measured in one run on one machine: the launch path, a fresh trace, notebook cells, import.

``python benchmarks/before_after.py BEFORE [--after .] [--repeats 2] [--imports 20] [--out DIR]``

BEFORE and AFTER are folders holding ``gpuworkbench/`` and ``benchmarks/`` (a ``git archive`` of another commit, say).
Each benchmark runs from its own tree (``PYTHONPATH`` set to it), the two trees alternating and the order flipping
every repeat, so that drift of the host hits both alike: ``bench_launch.py``, ``bench_trace_start.py`` and
``bench_notebook_cells.py`` (their full defaults, GPU figures on CUDA) and ``import gpuworkbench`` in fresh processes.
The table compares medians; ``noise`` is how far the same figure moved between repeats of one tree (the larger of
the two trees' spreads; for the import, the larger interquartile range), the bar a difference must clear to count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCHES = ("bench_launch", "bench_trace_start", "bench_notebook_cells")
IMPORT = "import time; t = time.perf_counter(); import gpuworkbench; print((time.perf_counter() - t) * 1e3)"


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_bench(tree: Path, bench: str, out: Path, tag: str) -> Any:
    """Run one benchmark of ``tree`` from that tree; its JSON (None where it failed, its output kept beside)."""
    path = out / f"{tag}-{bench}.json"
    log = out / f"{tag}-{bench}.txt"
    cmd = [sys.executable, str(tree / "benchmarks" / f"{bench}.py"), "--json", str(path)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, env=_env(tree), capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    print(f"{tag} {bench}: exit {done.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads(path.read_text()) if done.returncode == 0 and path.exists() else None


def import_ms(tree: Path) -> float:
    """Milliseconds of ``import gpuworkbench`` in a fresh process."""
    done = subprocess.run([sys.executable, "-c", IMPORT], cwd=tree, env=_env(tree), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"import failed in {tree}: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def figures(bench: str, result: Any) -> dict[str, float]:
    """The figures of one benchmark's JSON that the table compares (lower is better for each)."""
    found: dict[str, float] = {}
    if result is None:
        return found
    if bench == "bench_launch":
        for group, r in result["results"].items():
            if not isinstance(r, dict):  # the versions of CuPy and its calls, not figures
                continue
            for key, value in r.items():
                if key.endswith("_us") and isinstance(value, dict):
                    found[f"launch {group} {key}"] = value["median"]
            if "traced_over_untraced" in r:
                found[f"launch {group} traced/untraced"] = r["traced_over_untraced"]["median"]
            if "gw_over_cupy" in r:
                found[f"launch {group} gw/cupy"] = r["gw_over_cupy"]["median"]
    elif bench == "bench_trace_start":
        for row in result:
            if "delta_ms_median_of_rounds" in row:
                found[f"{row['what']} (Δ ms vs untraced)"] = row["delta_ms_median_of_rounds"]
            else:
                found[f"{row['what']} (ms)"] = row["ms_median"]
    elif bench == "bench_notebook_cells":
        for row in result:
            found[f"{row['what']} (cell ms)"] = row["cell_ms_median"]
    return found


def _iqr(values: list[float]) -> float:
    """The spread of ``values`` between their quartiles."""
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return quartiles[2] - quartiles[0]


def _row(figure: str, before: list[float], after: list[float], noise: float) -> dict[str, Any]:
    """One line of the table: medians of each tree, their difference and the noise it must clear."""
    b, a = statistics.median(before), statistics.median(after)
    return {"figure": figure, "before": b, "after": a, "change": a - b, "noise": noise, "before_all": before,
            "after_all": after}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--after", type=Path, default=Path("."))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--imports", type=int, default=20, help="fresh processes per tree for the import time")
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated benchmarks (default: all)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/before-after"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    seen: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    for rep in range(args.repeats):
        order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
        for bench in [b for b in args.only.split(",") if b]:
            for name in order:
                result = run_bench(trees[name], bench, args.out, f"{name}-{rep}")
                try:
                    found = figures(bench, result)
                except (KeyError, TypeError, AttributeError) as exc:  # a layout this reader does not know: say so
                    print(f"{name}-{rep} {bench}: figures not read ({exc!r})", flush=True)
                    found = {}
                for key, value in found.items():
                    seen[name].setdefault(key, []).append(value)
    imports: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(args.imports):
        for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
            imports[name].append(import_ms(trees[name]))
    rows = []
    for key in seen["after"]:
        b, a = seen["before"].get(key, []), seen["after"][key]
        if b:
            rows.append(_row(key, b, a, max(max(v) - min(v) for v in (a, b))))
    if args.imports:
        iqr = max(_iqr(v) for v in imports.values())
        rows.append(_row("import gpuworkbench (ms, fresh processes)", imports["before"], imports["after"], iqr))
    (args.out / "before_after.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        print(f"{r['figure']}: before {r['before']:.4g}, after {r['after']:.4g}, change {r['change']:+.3g}, "
              f"noise {r['noise']:.3g}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
