"""What an idle process pays for CUPTI: an empty-kernel launch loop (raw CuPy) in fresh processes, after each of
several CUPTI steps, against processes that never touched CUPTI (needs a CUDA GPU, CuPy and cupti-python).

    python benchmarks/probes/cupti_idle.py [--rounds 5]

Steps: ``attach`` (buffer callbacks registered), ``en:KIND`` (one activity kind enabled, 200 launches, disabled),
``prepare`` (what ``%load_ext`` does), ``trace`` (one trace of other libraries' work, then stopped), ``linger-over``
(the same, after the source's linger ran out and CUPTI was let go), ``finalize`` (``cuptiFinalize`` called directly),
``let_go`` (``cupti.let_go()``), ``filter`` (the API filter set, no kind on), ``ready`` (``cupti.reattach_soon``:
initialized again with no kind on).
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
from bench_any_cuda import empty_launches  # noqa: E402


def child(mode: str) -> None:
    from cupti import cupti

    import gpuworkbench as gw
    from gpuworkbench.trace import cupti as source_mod

    loop = empty_launches()
    loop(500)
    for step in mode.split("+"):
        if step == "attach":
            source_mod.LIFECYCLE.raw_for(cupti).register()
        elif step.startswith("en:"):
            kind = cupti.ActivityKind[step[3:]]
            cupti.activity_enable(kind)
            loop(200)
            cupti.activity_disable(kind)
            cupti.activity_flush_all(1)
        elif step == "prepare":
            source_mod.prepare()
        elif step == "trace":
            with gw.trace() as t:
                loop(500)
            t.wait_pending()
        elif step == "linger-over":
            source_mod.LINGER_S = 0.05
            with gw.trace() as t:
                loop(500)
            t.wait_pending()
            deadline = time.monotonic() + 5
            while not source_mod.detached() and time.monotonic() < deadline:
                loop(10)  # the detach waits for a CUDA call's exit
        elif step == "finalize":
            cupti.finalize()
        elif step == "let_go":
            if not source_mod.let_go():
                raise SystemExit("CUPTI could not be let go")
        elif step == "ready":
            source_mod.reattach_soon(0.0)
            source_mod.settle(5)
            assert source_mod.state().startswith("ready"), source_mod.state()
        elif step == "filter":
            source = source_mod.new_source()
            source._cupti = cupti
            source._filter_api(True)
    print(json.dumps({"us": statistics.median(loop() for _ in range(9)), "detached": source_mod.detached()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--modes",
        default="never,attach,attach+en:CONCURRENT_KERNEL,attach+en:DRIVER,"
        "attach+en:EXTERNAL_CORRELATION,prepare,trace,linger-over,trace+finalize",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    out: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes if r % 2 == 0 else modes[::-1]:
            p = subprocess.run([sys.executable, __file__, "child", m], capture_output=True, text=True)
            try:
                out[m].append(json.loads(p.stdout.strip().splitlines()[-1])["us"])
            except (IndexError, ValueError, KeyError):
                print(json.dumps({"child_failed": m, "stderr": p.stderr[-800:]}), flush=True)
    base = statistics.median(out[modes[0]])
    for m, v in out.items():
        if v:
            row = {
                "mode": m,
                "us_median": round(statistics.median(v), 3),
                "ratio": round(statistics.median(v) / base, 3),
            }
            print(json.dumps(row | {"all": [round(x, 2) for x in v]}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(sys.argv[2])
    else:
        main()
