"""Record the torch.profiler(with_stack=True) trace of one small training step run as a notebook cell would be: the
file ``notebooks/recorded/cnn-step-with-stack.json.gz`` (notebook 09 loads it; ``tests/trace/test_load_trace_lines.py``
checks the loader on it). Needs a CUDA GPU and PyTorch.

    python benchmarks/probes/line_sites.py --out DIR

The step's cell is compiled under an IPython cell's name, so that its frames look as a notebook's do in the profiler's
Python stacks. The committed file was recorded (H200) in a process that had run gpuworkbench traces first: their
idle threads' frames are in it too. What lines cost and how they compare with the profiler's:
``benchmarks/bench_lines.py``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the folder the trace is written to")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 32 * 32, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    code = compile(CELL, "<ipython-input-7-abcdef>", "exec")
    env = {"model": model, "opt": opt}
    for _ in range(3):  # warm: cuDNN's choices, the optimizer's state
        exec(code, env)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        exec(code, env)
        torch.cuda.synchronize()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cnn-step-with-stack.json")
    prof.export_chrome_trace(path)
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)
    print(f"wrote {path}.gz")


if __name__ == "__main__":
    main()
