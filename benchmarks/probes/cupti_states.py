"""What CUPTI costs one 16 x 64 MiB pipeline run and an empty-kernel launch, per CUPTI state, with no trace recording
(needs a CUDA GPU, CuPy and cupti-python; torch optional).

    python benchmarks/probes/cupti_states.py [--rounds 8] [--states detached,reattached]

States, set up untimed before each run, in alternating order: ``detached`` (CUPTI let go: as if never traced),
``reattached`` (let go, then initialized again: buffer callbacks and the API filter set, no kind ever enabled;
``reattached-nofilter``: without the filter),
``attached`` (attached, every kind off), ``kernels`` / ``copies`` / ``api`` (attached with only those kinds on),
``all`` (a parked source: what the process runs with while CUPTI lingers). Then, where torch is installed, a fresh
``torch.profiler.profile(activities=[CUDA])`` around the run against untraced runs with CUPTI let go (after one
untimed session: the first of a process took 4.7–6.6 s on an H200, with or without gpuworkbench).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_any_cuda import empty_launches, pipeline_setup  # noqa: E402

KINDS = {
    "kernels": ("CONCURRENT_KERNEL",),
    "copies": ("MEMCPY", "MEMSET"),
    "api": ("DRIVER", "RUNTIME", "EXTERNAL_CORRELATION"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--states", default="", help="comma-separated subset of the states (default: all)")
    args = parser.parse_args()
    from cupti import cupti

    from gpuworkbench.trace import cupti as source_mod

    life = source_mod.LIFECYCLE

    gw, _dev, pipe, inputs, outputs = pipeline_setup()
    launches = empty_launches()
    source_mod.WATCH_UNTRACED = False  # a parked source stays parked through the untraced runs measured here

    def state(name: str) -> None:
        source_mod.let_go()
        if name == "detached":
            return
        if name.startswith("reattached"):
            life.raw_for(cupti).register()
            life.attached = True  # so that the next state's let_go finalizes it
            if name == "reattached":
                life.api_filter.apply(cupti, True)
            return
        source = source_mod.new_source()
        source.start()
        source.stop()  # parks: every kind stays on
        if name == "all":
            return
        with life.lock:
            life.unpark()  # attached, every kind off
        for kind in KINDS.get(name, ()):
            cupti.activity_enable(cupti.ActivityKind[kind])

    def pipeline_ms() -> float:
        t = time.perf_counter()
        pipe.run(inputs, outputs)
        return (time.perf_counter() - t) * 1e3

    names = (
        args.states.split(",")
        if args.states
        else ["detached", "reattached", "attached", "kernels", "copies", "api", "all"]
    )
    if names[0] != "detached":
        raise SystemExit("the first state must be 'detached', the baseline")
    ms: dict[str, list[float]] = {n: [] for n in names}
    us: dict[str, list[float]] = {n: [] for n in names}
    launches(500)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            state(name)
            time.sleep(0.1)
            ms[name].append(pipeline_ms())
            us[name].append(launches(3000))
    source_mod.let_go()
    for name in names:
        row = {
            "state": name,
            "pipeline_ms": round(statistics.median(ms[name]), 3),
            "pipeline_delta_ms": round(statistics.median(a - b for a, b in zip(ms[name], ms["detached"])), 3),
            "launch_us": round(statistics.median(us[name]), 3),
            "launch_ratio": round(statistics.median(a / b for a, b in zip(us[name], us["detached"])), 3),
        }
        print(json.dumps(row), flush=True)
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return
    if args.states:
        return
    torch.zeros(1, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]):  # a process's first session sets Kineto up: seconds, untimed
        pipe.run(inputs, outputs)
    pairs: list[tuple[float, float]] = []
    for r in range(args.rounds):
        pair = {}
        for which in ("untraced", "profiled") if r % 2 == 0 else ("profiled", "untraced"):
            source_mod.let_go()
            time.sleep(0.1)
            t = time.perf_counter()
            if which == "profiled":
                with profile(activities=[ProfilerActivity.CUDA]):
                    pipe.run(inputs, outputs)
            else:
                pipe.run(inputs, outputs)
            pair[which] = (time.perf_counter() - t) * 1e3
        pairs.append((pair["untraced"], pair["profiled"]))
    print(
        json.dumps(
            {
                "what": "torch.profiler.profile(activities=[CUDA]) around the pipeline run, fresh each time",
                "untraced_ms": round(statistics.median(u for u, _ in pairs), 3),
                "profiled_ms": round(statistics.median(p for _, p in pairs), 3),
                "delta_ms": round(statistics.median(p - u for u, p in pairs), 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
