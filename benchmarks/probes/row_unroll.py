"""Which unroll (loads per thread and step) the row kernels run fastest with, per element type, on one GPU: each
kernel ABBA against the device-to-device copy of the same bytes. ``python benchmarks/probes/row_unroll.py``."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_library import abba, lib_dtype, repeat  # noqa: E402

import gpuworkbench as gw  # noqa: E402
from gpuworkbench.library import _row_kernels as rk  # noqa: E402
from gpuworkbench.pykernel.ktypes import kernel_type  # noqa: E402

dev = gw.Device("cuda:0")
stream = dev.create_stream("probe")
for name in sys.argv[1:] or ("float32", "float16", "float64", "int32"):
    t = kernel_type(np.dtype(lib_dtype(name)))
    s = np.dtype(lib_dtype(name)).itemsize
    rows, cols = 16384, 4096 * 4 // s
    x, y, cp = (dev.alloc((rows, cols), lib_dtype(name)) for _ in range(3))
    sums = dev.alloc(rows, "int64" if name.startswith("int") else lib_dtype(name))
    g, b = dev.alloc(cols, lib_dtype(name)), dev.alloc(cols, lib_dtype(name))
    idx = dev.alloc(rows, "int64")
    x.copy_from_host(np.ones((rows, cols), lib_dtype(name)).reshape(-1))
    copier = repeat(lambda cp=cp, x=x: cp.copy_from(x, stream), 5, stream.synchronize)
    for u in (2, 4, 8, 16):
        kernels = {
            "sum": (rk.row_sum(t, u), (sums, x, cols), s * rows * cols),
            "cumsum": (rk.row_cumsum(t), (y, x, cols), 2 * s * rows * cols),  # 8 per thread, fixed
            "argmax": (rk.row_argmax(t, "i64", u), (idx, x, cols), s * rows * cols),
        }
        if not name.startswith("int"):
            kernels["softmax"] = (rk.row_softmax(t, u), (y, x, cols, 0), 2 * s * rows * cols)
            kernels["layer_norm"] = (rk.row_layer_norm(t, u), (y, x, g, b, cols, 1e-5), 2 * s * rows * cols)
        for op, (k, args, nbytes) in kernels.items():
            if op == "cumsum" and (name.startswith("int") or u != rk.SCAN_UNROLL):
                continue
            run = repeat(lambda k=k, a=args, n=rows: k.launch(n * rk.ROW, *a, stream=stream), 5, stream.synchronize)
            run()
            ours, copy = abba(run, copier, 6, 5)
            print(
                f"{name:8s} {op:8s} u={u:2d}: {nbytes / ours / 1e9:6.0f} GB/s = "
                f"{nbytes / ours / (2 * s * rows * cols / copy):.3f} of the copy",
                flush=True,
            )
    for buf in (x, y, cp, sums, g, b, idx):
        buf.free()
