"""What a CUPTI callback at each work-enqueuing driver call costs, with and without a walk to the user's frame; and
what torch.profiler(with_stack=True) records (needs a CUDA GPU, CuPy, cupti-python; PyTorch for the second part).

    python benchmarks/probes/line_sites.py [--rounds 7] [--out DIR]

Prints JSON lines: µs per empty launch (raw CuPy and ``gw.Kernel``) untraced, traced, traced with the callbacks on
and returning at once, and traced with the callbacks reading the call site; then how many callbacks a PyTorch step's
launches made on which threads, and (``--out``) writes torch.profiler's Kineto trace of a step run as a cell.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CELL = """\
import torch
x = torch.randn(64, 3, 32, 32, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
out = model(x)
loss = torch.nn.functional.cross_entropy(out, y)
loss.backward()
opt.step()
opt.zero_grad(set_to_none=True)
"""


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import cupy as cp

    import gpuworkbench as gw
    from gpuworkbench.trace.cupti import LIFECYCLE
    from gpuworkbench.trace.cupti import detach as detach_mod

    raw = cp.RawKernel('extern "C" __global__ void e() {}', "e")
    dev = gw.Device("cuda:0")
    k = dev.compile('extern "C" __global__ void e(float *b) {}', "e")
    b = dev.alloc(1, "float32")
    s = dev.create_stream("probe")

    def cupy_loop(n: int = 4000) -> float:
        t = time.perf_counter()
        for _ in range(n):
            raw((1,), (1,), ())
        cp.cuda.Device().synchronize()
        return (time.perf_counter() - t) / n * 1e6

    def gw_loop(n: int = 4000) -> float:
        t = time.perf_counter()
        for _ in range(n):
            k(1, 32, (b,), stream=s)
        s.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    seen: list = []
    here = os.path.dirname(gw.__file__)
    lib_dirs = (here, os.path.dirname(os.__file__))

    def hook_empty(cbid, data):
        return None

    def hook_walk(cbid, data):
        if ctypes.c_int.from_address(data).value != 0:
            return
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename.startswith(lib_dirs):
            f = f.f_back
        seen.append((threading.get_ident(), time.time_ns(), None if f is None else (f.f_code, f.f_lineno)))

    def enable(on: bool) -> int:
        det = LIFECYCLE.detach
        if det is None or not det.subscribed:
            return -1
        lib = LIFECYCLE.raw.lib
        lib.cuptiEnableCallback.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        table = LIFECYCLE.work_cbids
        bad = 0
        for cbid, mark in enumerate(table):
            if mark:
                bad += int(lib.cuptiEnableCallback(int(on), det._subscriber, 1, cbid) != 0)
        return bad

    modes = ["untraced", "traced", "traced+empty", "traced+walk"]
    res: dict = {(m, w): [] for m in modes for w in ("cupy", "gw")}
    for loop in (cupy_loop, gw_loop):
        loop(500)
    for r in range(args.rounds):
        for mode in modes:
            for which, loop in (("cupy", cupy_loop), ("gw", gw_loop)):
                if mode == "untraced":
                    gw.cupti.let_go()
                    time.sleep(0.3)
                    res[mode, which].append(loop())
                    continue
                with gw.trace() as t:
                    loop(50)
                    if mode != "traced":
                        detach_mod.HOOK = hook_empty if mode == "traced+empty" else hook_walk
                        bad = enable(True)
                    res[mode, which].append(loop())
                    if mode != "traced":
                        enable(False)
                        detach_mod.HOOK = None
                        if r == 0:
                            emit(mode=mode, which=which, enable_failures=bad, callbacks=len(seen))
                        seen.clear()
                t.wait_pending()
    for (mode, which), xs in res.items():
        emit(mode=mode, which=which, median_us=round(statistics.median(xs), 3), all=[round(x, 2) for x in xs])
    for which in ("cupy", "gw"):
        base = res["traced", which]
        for mode in ("traced+empty", "traced+walk"):
            ratios = [a / b for a, b in zip(res[mode, which], base)]
            emit(which=which, ratio=f"{mode}/traced", median=round(statistics.median(ratios), 3))

    try:
        import torch
    except ImportError:
        emit(torch="absent")
        return
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 32 * 32, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    code = compile(CELL, "<ipython-input-7-abcdef>", "exec")
    env = {"model": model, "opt": opt}
    for _ in range(3):
        exec(code, env)
    torch.cuda.synchronize()
    with gw.trace() as t:
        detach_mod.HOOK = hook_walk
        bad = enable(True)
        exec(code, env)
        torch.cuda.synchronize()
        enable(False)
        detach_mod.HOOK = None
    t.wait_pending()
    table = t.table()
    kinds = table["kind"]
    by_thread: dict = {}
    for ident, _, loc in seen:
        key = (ident == threading.get_ident(), None if loc is None else (loc[0].co_filename, loc[1]))
        by_thread[str(key)] = by_thread.get(str(key), 0) + 1
    emit(
        torch_step="gw+walk",
        enable_failures=bad,
        callbacks_enter=len(seen),
        kernels=int((kinds == 4).sum()),
        api=int((kinds == 8).sum()),
        by_thread_and_site=by_thread,
    )
    if args.out:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            exec(code, env)
            torch.cuda.synchronize()
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "torch_step_with_stack.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            doc = json.load(f)
        events = doc.get("traceEvents", [])
        py = [e for e in events if e.get("cat") == "python_function"]
        emit(events=len(events), python_function=len(py), names=[e["name"] for e in py[:40]])
        cell = [e["name"] for e in py if "ipython-input" in e["name"]]
        emit(cell_frames=cell[:40])
        emit(sample_args=[e.get("args") for e in py[:5]])


if __name__ == "__main__":
    main()
