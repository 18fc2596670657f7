"""The kernel library's figures of several ``bench_library.py --json`` runs side by side, as Markdown tables.

``python benchmarks/library_table.py run1.json run2.json run3.json``: one row per op and dtype (per cent of the
device-to-device copy's bandwidth in each run, and whether each run met the target), then matmul's rows.
"""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> None:
    runs = [json.load(open(p)) for p in paths]
    names = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    print(f"| op | dtype | {names} | met in every run? |")
    print("|---|---|" + "---|" * len(runs) + "---|")
    first = runs[0]["memory_bound"]
    for dtype, ops in first.items():
        if not isinstance(ops, dict):
            continue
        for op, figures in ops.items():
            if not isinstance(figures, dict):
                continue
            found = [r["memory_bound"].get(dtype, {}).get(op) for r in runs]
            cells = " | ".join(f"{f['ratio'] * 100:.1f} %" if f else "—" for f in found)
            every = all(f and f["met"] for f in found)
            print(f"| {op} | {dtype} | {cells} | {'yes' if every else 'no'} |")
    print()
    print(f"| matmul 4096² | {names} | target |")
    print("|---|" + "---|" * len(runs) + "---|")
    for dtype in runs[0]["matmul"]:
        cells = " | ".join(
            f"{r['matmul'][dtype]['ours_gflops'] / 1e3:.1f} / {r['matmul'][dtype]['baseline_gflops'] / 1e3:.1f} "
            f"TFLOP/s = {r['matmul'][dtype]['ratio'] * 100:.1f} %"
            for r in runs
        )
        print(f"| {dtype}, ours / cuBLAS | {cells} | ≥ 50 % |")
    if "fp64_fma_peak" in runs[0]["matmul"].get("float64", {}):
        cells = " | ".join(f"{r['matmul']['float64']['fp64_fma_peak']['gflops'] / 1e3:.1f} TFLOP/s" for r in runs)
        print(f"| float64 multiply-adds on the CUDA cores (the rate any @gw.kernel can reach) | {cells} | — |")


if __name__ == "__main__":
    main(sys.argv[1:])
