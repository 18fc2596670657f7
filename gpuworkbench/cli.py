"""The ``gpuworkbench`` command: ``info`` (backends and devices), ``demo`` (a traced pipeline)."""

from __future__ import annotations

import argparse
import sys

from ._format import binary_bytes
from .errors import GpuError


def _info() -> int:
    from .device import Device, backend_status, devices

    for name, why in backend_status().items():
        print(f"{name:7s} {'available' if not why else 'unavailable: ' + why}")
    print()
    for info in devices():
        kind = "GPU" if info.is_gpu else "CPU"
        line = f"{info.backend}:{info.index:<3d} {kind}  {info.name}  ({info.detail})"
        try:
            free, total = Device(info.index, backend=info.backend).memory_info()
            line += f"  memory {binary_bytes(free)} free of {binary_bytes(total)}"
        except GpuError as exc:
            line += f"  (cannot open: {exc})"
        print(line)
    print(f"\nauto-selected: {Device().spec}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import describe, run_demo
    from .device import Device

    dev = Device(args.device) if args.device else Device()
    result = run_demo(dev, batches=args.batches, depth=args.depth, trace_path=args.trace)
    print(describe(result))
    summary = result.trace.summary()
    for advice in getattr(summary, "advice", []):
        print(f"advice           [{advice.code}] {advice.message}")
    print(f"trace            {args.trace} (open it in https://ui.perfetto.dev)")
    return 0 if result.correct else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuworkbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="list every backend and device found, with memory")
    demo = sub.add_parser("demo", help="run a traced double-buffered pipeline on the best device found")
    demo.add_argument("--device", help="BACKEND[:INDEX], e.g. opencl:0 (default: the best device found)")
    demo.add_argument("--batches", type=int, default=None)
    demo.add_argument("--depth", type=int, default=2)
    demo.add_argument("--trace", default="gpuworkbench-demo.json", help="where to write the Chrome-trace JSON")
    args = parser.parse_args(argv)
    try:
        return _info() if args.command == "info" else _demo(args)
    except GpuError as exc:
        print(f"gpuworkbench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
