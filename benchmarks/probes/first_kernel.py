"""What the first traced launch of a kernel function costs, in the first traced cell of a fresh process (needs a CUDA
GPU, CuPy and cupti-python).

    python benchmarks/probes/first_kernel.py [--rounds 6]

Each round runs three fresh processes, in alternating order: ``%load_ext gpuworkbench`` in a real IPython shell, the
16 x 64 MiB pipeline's set-up (``bench_any_cuda.pipeline_setup``), then 1 s later a cell with the pipeline run inside
``gw.trace()``. ``plain``: nothing before that cell; ``other``: a traced cell before it launched another elementwise
kernel; ``same``: a traced cell before it ran one batch of the same pipeline (same kernel). An untraced cell between
lets CUPTI go. Prints, per variant, the median host time of the cell's first kernel launch and first H2D, and of all
its kernel launches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_any_cuda import time_calls  # noqa: E402

CELL = "with gw.trace() as _t:\n    pipe.run(inputs, outputs)"
BEFORE = {
    "other": "with gw.trace() as _w:\n    _other(_a, _b).wait()",
    "same": "with gw.trace() as _w:\n    pipe.run(inputs[:1], outputs[:1])",
}


def child(variant: str) -> None:
    from bench_notebook_cells import notebook

    from gpuworkbench import kernels
    from gpuworkbench.buffer import Buffer

    shell, _hooks, gw, _inputs = notebook()
    ns = shell.user_ns
    dev = gw.Device()
    a, b = dev.alloc(1024, "float32"), dev.alloc(1024, "float32")
    other = gw.elementwise("float32 x, float32 y", "y = x + 3", name="other_kernel")
    other(a, b).wait()
    ns.update(_a=a, _b=b, _other=other)
    if variant in BEFORE:
        shell.run_cell(BEFORE[variant], store_history=False).raise_error()
        ns["_w"].wait_pending()
        shell.run_cell("_untraced = 1", store_history=False).raise_error()  # the pre-run hook lets CUPTI go
    times: dict[str, list[float]] = {}
    time_calls(Buffer, "copy_from_host_async", "h2d", times)
    time_calls(kernels.ElementwiseKernel, "__call__", "kernel", times)
    time.sleep(1.0)
    shell.run_cell(CELL, store_history=False).raise_error()
    ns["_t"].wait_pending()
    out = {"kernel_first_ms": times["kernel"][0], "h2d_first_ms": times["h2d"][0]}
    print(json.dumps(out | {"kernels_total_ms": sum(times["kernel"])}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    variants = ["plain", "other", "same"]
    got: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for variant in variants if r % 2 == 0 else variants[::-1]:
            p = subprocess.run([sys.executable, __file__, "--child", variant], capture_output=True, text=True)
            try:
                got[variant].append(json.loads(p.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                raise SystemExit(f"{variant} child failed: {p.stderr[-2000:]}") from None
    for variant, rows in got.items():
        medians = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
        print(
            json.dumps(
                {"variant": variant, **medians, "kernel_first_all": [round(r["kernel_first_ms"], 3) for r in rows]}
            )
        )


if __name__ == "__main__":
    main()
