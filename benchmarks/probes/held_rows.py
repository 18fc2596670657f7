"""Softmax, log_softmax and layer norm with the row held in shared memory (``_held_rows``) against the online
kernels (``_row_kernels``), each ABBA against the device-to-device copy of the same bytes, per float type, on rows
of 16 KiB and at a few other lengths. ``python benchmarks/probes/held_rows.py [dtype ...]``."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_library import abba, lib_dtype, repeat  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.library import _held_rows as hr  # noqa: E402
from gpuworkbench.library import _row_kernels as rk  # noqa: E402
from gpuworkbench.pykernel.ktypes import kernel_type  # noqa: E402

dev = gw.Device("cuda:0")
stream = dev.create_stream("probe")
for name in sys.argv[1:] or ("float32", "float16", "bfloat16", "float64"):
    t = kernel_type(np.dtype(lib_dtype(name)))
    s = np.dtype(lib_dtype(name)).itemsize
    total = 16384 * 4096 * 4 // s  # the elements of bench_library's arrays
    for cols in sorted({4096 * 4 // s, 1024, 4096 // s * 2}):
        rows = total // cols
        hold = hr.hold_bytes(t, cols)
        if not hold:
            continue
        x, y, cp = (dev.alloc((rows, cols), lib_dtype(name)) for _ in range(3))
        g, b = dev.alloc(cols, lib_dtype(name)), dev.alloc(cols, lib_dtype(name))
        x.copy_from_host(np.random.default_rng(0).normal(0, 1, (rows, cols)).astype(lib_dtype(name)).reshape(-1))
        copier = repeat(lambda cp=cp, x=x: cp.copy_from(x, stream), 5, stream.synchronize)
        nbytes = 2 * s * rows * cols
        kernels = {
            "softmax online": (rk.row_softmax(t), (y, x, cols, 0)),
            "softmax held": (hr.row_softmax_held(t, hold), (y, x, cols, 0)),
            "log_softmax online": (rk.row_softmax(t), (y, x, cols, 1)),
            "log_softmax held": (hr.row_softmax_held(t, hold), (y, x, cols, 1)),
            "layer_norm online": (rk.row_layer_norm(t), (y, x, g, b, cols, 1e-5)),
            "layer_norm held": (hr.row_layer_norm_held(t, hold), (y, x, g, b, cols, 1e-5)),
        }
        if cols == 4096 * 4 // s:
            kernels["cumsum"] = (rk.row_cumsum(t), (y, x, cols))
        for op, (k, args) in kernels.items():
            run = repeat(lambda k=k, a=args, n=rows: k.launch(n * rk.ROW, *a, stream=stream), 5, stream.synchronize)
            run()
            ours, copy = abba(run, copier, 6, 5)
            print(f"{name:8s} cols={cols:5d} {op:18s}: {nbytes / ours / 1e9:6.0f} GB/s = "
                  f"{nbytes / ours / (nbytes / copy):.3f} of the copy", flush=True)  # fmt: skip
        for buf in (x, y, cp, g, b):
            buf.free()
