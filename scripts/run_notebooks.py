"""Run the tutorial notebooks' code cells in IPython, one fresh process per notebook, and report each cell that fails.

``python scripts/run_notebooks.py [NOTEBOOK ...] [--out DIR]``

For machines without a Jupyter kernel stack (the GPU machines have IPython but not nbval's kernel packages): each
notebook runs top to bottom in an ``InteractiveShell`` (magics, ``%load_ext gpuworkbench`` and ``%%gpu`` included)
from the notebooks folder, with the device the workbench finds (a GPU there). Widgets and Bokeh figures fall back to
their text forms, as outside a kernel. ``./run test`` runs the same notebooks through nbval, in a kernel.
Exit status: the number of notebooks with a failing cell.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
cells = json.load(open(sys.argv[1]))["cells"]
failed = []
for i, cell in enumerate(cells):
    if cell["cell_type"] != "code":
        continue
    source = "".join(cell["source"])
    t0 = time.perf_counter()
    result = shell.run_cell(source, store_history=True)
    took = time.perf_counter() - t0
    error = result.error_before_exec or result.error_in_exec
    print(f"[cell {i}] {'FAILED' if error else 'ok'} in {took:.2f} s", flush=True)
    if error is not None:
        failed.append((i, repr(error)))
print("RESULT " + json.dumps(failed), flush=True)
"""


def run(notebook: Path, out: Path | None) -> list:
    """The failing cells of ``notebook`` ((index, error) pairs), its output kept in ``out``."""
    env = dict(os.environ)
    env.setdefault("GPUWB_CACHE_DIR", tempfile.mkdtemp(prefix="gpuwb-cache-"))
    env.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(notebook)], cwd=notebook.parent, env=env, capture_output=True, text=True
    )
    text = done.stdout + done.stderr
    if out is not None:
        (out / f"{notebook.stem}.txt").write_text(text)
    result = next((line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    failed = json.loads(result) if result is not None else [(-1, f"the process ended with {done.returncode}")]
    state = "ok" if not failed else f"{len(failed)} failing cell(s): {failed}"
    print(f"{notebook.name}: {state} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, help="keep each notebook's output here")
    args = parser.parse_args()
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    bad = sum(1 for nb in notebooks if run(nb.resolve(), args.out))
    print(f"{len(notebooks) - bad} of {len(notebooks)} notebooks ran every cell")
    sys.exit(bad)


if __name__ == "__main__":
    main()
