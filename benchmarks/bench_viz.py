"""Time building a 10^5-span timeline, and measure how much a live dashboard slows the traced work.

Targets (issue 3): the timeline builds in ≤ 1 s; a ``Live`` dashboard following a trace that receives 1 000 spans/s
slows the producer by ≤ 5 %. The producer is a loop on the CPU backend: one small traced op per iteration plus about
1 ms of pure-Python host work (the GIL-bound worst case for a background thread), traced in both runs.

Run from the repository root: ``python benchmarks/bench_viz.py [--kernel] [--seconds S] [--repeats N]``. With
``--kernel`` the live measurement runs inside a real IPython kernel (started with jupyter_client), so every push
really leaves through IOPub as comm messages, as in a notebook, and the messages are counted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))


def bench_timeline(n: int = 100_000, repeats: int = 5) -> None:
    """Print the time to build an ``n``-span timeline (best and median) and to serialise it with inline BokehJS."""
    from bench_analysis import random_table
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    from gpuworkbench.viz import timeline_figure

    table = random_table(n)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fig = timeline_figure(table)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    html = file_html(fig, INLINE)
    serialise = time.perf_counter() - start
    print(
        f"timeline, {n:,} spans ({len(fig.y_range.factors)} rows, {fig.output_backend}): build best "
        f"{min(times) * 1e3:.0f} ms, median {statistics.median(times) * 1e3:.0f} ms (target ≤ 1000 ms); "
        f"file_html with inline BokehJS {serialise:.2f} s, {len(html) / 1e6:.1f} MB"
    )


def _calibrate_work(target_s: float = 0.001) -> int:
    """Loop count of ``_work`` that takes about ``target_s``."""
    count = 1000
    while True:
        start = time.perf_counter()
        _work(count)
        elapsed = time.perf_counter() - start
        if elapsed > 0.02:
            return max(int(count * target_s / elapsed), 1)
        count *= 2


def _work(count: int) -> int:
    total = 0
    for i in range(count):
        total += i * i
    return total


def _producer(seconds: float, work: int) -> tuple[float, int]:
    """Run the op loop for about ``seconds`` (a fixed iteration count); returns (wall seconds, iterations)."""
    import gpuworkbench as gw

    dev = gw.Device("cpu")
    streams = [dev.create_stream("producer-a"), dev.create_stream("producer-b")]
    kernel = gw.elementwise("float32 x, float32 y", "y = x + 1", name="inc")
    x, y = dev.alloc(256), dev.alloc(256)
    kernel(x, y, stream=streams[0]).wait()  # compile outside the timed loop
    iterations = int(seconds * 1000)
    start = time.perf_counter()
    for i in range(iterations):
        kernel(x, y, stream=streams[i % 2])
        _work(work)
    for s in streams:
        s.synchronize()
    wall = time.perf_counter() - start
    x.free()
    y.free()
    return wall, iterations


def bench_live(seconds: float = 3.0, repeats: int = 5, rate_hz: float = 10.0) -> dict[str, float]:
    """Producer wall time traced without and with a Live dashboard (interleaved runs); prints and returns medians."""
    import gpuworkbench as gw
    from gpuworkbench.viz.dashboard import Live

    work = _calibrate_work()
    _producer(0.3, work)  # warm up
    plain, live_times, spans_per_s, pushes_per_s, max_pushes = [], [], [], [], []
    for _ in range(repeats):
        with gw.trace() as t:
            wall, iterations = _producer(seconds, work)
        plain.append(wall)
        with gw.trace() as t:
            live = Live(t, rate_hz=rate_hz)
            wall, iterations = _producer(seconds, work)
            live.stop()
        live_times.append(wall)
        spans_per_s.append(iterations / wall)
        pushes_per_s.append(live.pushes / wall)
        max_pushes.append(live.max_pushes_per_second())
        live.close()
    result = {
        "plain_s": statistics.median(plain),
        "live_s": statistics.median(live_times),
        "spans_per_s": statistics.median(spans_per_s),
        "pushes_per_s": statistics.median(pushes_per_s),
        "max_pushes_in_1s": max(max_pushes),
    }
    result["slowdown_pct"] = 100 * (result["live_s"] / result["plain_s"] - 1)
    print(
        f"live dashboard at {rate_hz:g} Hz, producer at {result['spans_per_s']:.0f} spans/s: traced loop "
        f"{result['plain_s']:.3f} s without, {result['live_s']:.3f} s with the dashboard (medians of {repeats}) → "
        f"slowdown {result['slowdown_pct']:+.1f} % (target ≤ 5 %); {result['pushes_per_s']:.1f} pushes/s, "
        f"at most {result['max_pushes_in_1s']:.0f} in any second"
    )
    return result


def bench_live_in_kernel(seconds: float, repeats: int, rate_hz: float) -> None:
    """Run ``bench_live`` inside a fresh IPython kernel, draining IOPub and counting the comm messages it sends."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        code = (
            f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'benchmarks')!r}]\n"
            f"import bench_viz; bench_viz.bench_live({seconds}, {repeats}, {rate_hz})\n"
        )
        msg_id = kc.execute(code)
        comm_msgs, first, last, output = 0, None, None, []
        while True:
            msg = kc.get_iopub_msg(timeout=600)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "comm_msg":
                comm_msgs += 1
                now = time.monotonic()
                first = first or now
                last = now
            elif kind == "stream":
                output.append(msg["content"]["text"])
            elif kind == "error":
                output.append("\n".join(msg["content"]["traceback"]))
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        print("in a real kernel: " + "".join(output).strip())
        span = (last - first) if first and last else 0.0
        print(f"  {comm_msgs} comm messages reached the client on IOPub during the busy cell (over {span:.1f} s)")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one producer run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", type=float, default=10.0, help="dashboard pushes per second at most")
    parser.add_argument("--kernel", action="store_true", help="also measure inside a real IPython kernel")
    args = parser.parse_args()
    bench_timeline(args.spans)
    bench_live(args.seconds, args.repeats, args.rate)
    if args.kernel:
        bench_live_in_kernel(args.seconds, args.repeats, args.rate)


if __name__ == "__main__":
    main()
