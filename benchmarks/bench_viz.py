"""Time building a 10^5-span timeline, and measure how much a live dashboard slows the traced work.

Targets (issue 3): the timeline builds in ≤ 1 s; a ``Live`` dashboard following a trace that receives 1 000 spans/s
slows the producer by ≤ 5 %. The producer is a loop on the CPU backend: one small traced op per iteration plus about
1 ms of pure-Python host work (the GIL-bound worst case for a background thread), traced in both runs.

Run from the repository root: ``python benchmarks/bench_viz.py [--kernel] [--seconds S] [--repeats N] [--json F]``. With
``--kernel`` the live measurement runs inside a real IPython kernel (started with jupyter_client), so every push
really leaves through IOPub as comm messages, as in a notebook, and the messages are counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench_common import write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))


def bench_timeline(n: int = 100_000, repeats: int = 5) -> dict[str, float]:
    """Print (and return) the time to build an ``n``-span timeline (best and median) and to serialise it with inline
    BokehJS."""
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
    return {
        "spans": n,
        "build_best_ms": min(times) * 1e3,
        "build_median_ms": statistics.median(times) * 1e3,
        "file_html_s": serialise,
        "file_html_mb": len(html) / 1e6,
    }


#: Zoom and pan steps of the browser benchmark: (fraction of the trace where the view starts, zoom factor).
BROWSER_VIEWS = [(0.31, 1), (0.31, 4), (0.31, 16), (0.31, 64), (0.31, 256), (0.31, 1024), (0.31, 4096)] + [
    (0.30 + 0.002 * k, 64) for k in range(8)
]

#: Sets each view on the timeline's range and waits for the second animation frame after it (Bokeh paints in the
#: first): the redraw time, the wait for the frame included. Also reads the view callback's own time.
_REDRAW_JS = """async (views) => {
  const doc = Bokeh.documents[0]
  const xr = doc.get_model_by_name('timeline x range')
  const memo = () => doc.get_model_by_name('name source').__gw || {}
  const lo = xr.start, T = xr.end - xr.start
  const frame = () => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))
  await frame()
  const out = []
  for (const [at, zoom] of views) {
    const a = lo + T * at, b = a + T / zoom
    const t0 = performance.now()
    xr.setv({start: a, end: b})
    await frame()
    out.push({zoom, ms: performance.now() - t0, callback_ms: memo().ms,
              spans: doc.get_model_by_name('span source').data.left.length,
              cells: doc.get_model_by_name('cell source').data.left.length})
  }
  return out
}"""


def bench_browser(n: int = 1_000_000, loads: int = 3) -> dict[str, float]:
    """Build an ``n``-span timeline view, write it with inline BokehJS, load it ``loads`` times in headless Chromium
    and time the loads (to BokehJS's "document idle") and zoom/pan redraws; prints and returns the figures."""
    import tempfile

    from bench_analysis import random_table
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    sys.path.insert(0, str(ROOT / "tests"))
    from lab_browser import CHROMIUM, CHROMIUM_FLAGS
    from playwright.sync_api import sync_playwright

    from gpuworkbench.viz import timeline_view

    table = random_table(n)
    start = time.perf_counter()
    view = timeline_view(table)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    html = file_html(view, INLINE)
    html_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "timeline.html"
        path.write_text(html)
        idle_ms, wall_s, redraws = [], [], []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            try:
                for _ in range(loads):
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    seen: list[str] = []
                    page.on("console", lambda m, seen=seen: seen.append(m.text) if "document idle" in m.text else None)
                    start = time.perf_counter()
                    page.goto(path.as_uri(), timeout=120_000)
                    while not seen and time.perf_counter() - start < 120:
                        page.wait_for_timeout(10)
                    wall_s.append(time.perf_counter() - start)
                    idle_ms.append(float(seen[0].split(" at ")[1].split()[0]) if seen else float("nan"))
                    redraws.append(page.evaluate(_REDRAW_JS, BROWSER_VIEWS))
                    page.close()
            finally:
                browser.close()
    times = [r["ms"] for run in redraws for r in run]
    cells = [r["ms"] for run in redraws for r in run if r["cells"]]
    spans = [r["ms"] for run in redraws for r in run if not r["cells"]]
    callback = [r["callback_ms"] for run in redraws for r in run if r["callback_ms"] is not None]
    result = {
        "build_s": build_s,
        "html_s": html_s,
        "html_mb": len(html) / 1e6,
        "idle_ms_median": statistics.median(idle_ms),
        "idle_ms_max": max(idle_ms),
        "load_wall_s_median": statistics.median(wall_s),
        "redraw_ms_median": statistics.median(times),
        "redraw_ms_p90": sorted(times)[int(0.9 * (len(times) - 1))],
        "redraw_ms_max": max(times),
        "redraw_cells_ms_median": statistics.median(cells) if cells else float("nan"),
        "redraw_spans_ms_median": statistics.median(spans) if spans else float("nan"),
        "callback_ms_median": statistics.median(callback) if callback else float("nan"),
    }
    print(
        f"timeline in headless Chromium, {n:,} spans: build {build_s:.2f} s, file_html {html_s:.2f} s, "
        f"{result['html_mb']:.1f} MB with inline BokehJS\n"
        f"  load: document idle at {result['idle_ms_median']:.0f} ms median (max {result['idle_ms_max']:.0f}) of "
        f"{loads} loads, {result['load_wall_s_median']:.2f} s wall from goto (target ≤ 3 s)\n"
        f"  zoom/pan redraw to the second frame after the change: median {result['redraw_ms_median']:.0f} ms, "
        f"p90 {result['redraw_ms_p90']:.0f}, max {result['redraw_ms_max']:.0f} ms (target ≤ 100 ms); zoomed out "
        f"(cells) {result['redraw_cells_ms_median']:.0f} ms, zoomed in (spans) "
        f"{result['redraw_spans_ms_median']:.0f} ms; the view callback itself {result['callback_ms_median']:.1f} ms"
    )
    return result


def _work(count: int) -> int:
    total = 0
    for i in range(count):
        total += i * i
    return total


class _Producer:
    """The traced work: one small CPU-backend op on alternating streams, then host work, ~1 ms per iteration."""

    def __init__(self, iteration_s: float = 0.001) -> None:
        import gpuworkbench as gw

        self.dev = gw.Device("cpu")
        self.streams = [self.dev.create_stream("producer-a"), self.dev.create_stream("producer-b")]
        self.kernel = gw.elementwise("float32 x, float32 y", "y = x + 1", name="inc")
        self.x, self.y = self.dev.alloc(256), self.dev.alloc(256)
        self.kernel(self.x, self.y, stream=self.streams[0]).wait()  # compile outside the timed loop
        count = 1000
        while True:
            start = time.perf_counter()
            _work(count)
            elapsed = time.perf_counter() - start
            if elapsed > 0.02:
                break
            count *= 2
        units_per_s = count / elapsed
        self.work = 0
        for _ in range(3):  # the op's own cost (and its threads' share of the GIL) is measured in the real loop
            per_iteration = self.run(300)[0] / 300
            overhead = per_iteration - self.work / units_per_s
            self.work = max(int((iteration_s - overhead) * units_per_s), 0)

    def run(self, iterations: int) -> tuple[float, float]:
        """(wall, process CPU) seconds for ``iterations`` iterations, streams drained at the end."""
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(iterations):
            self.kernel(self.x, self.y, stream=self.streams[i % 2])
            _work(self.work)
        for s in self.streams:
            s.synchronize()
        return time.perf_counter() - wall, time.process_time() - cpu


def bench_live(seconds: float = 3.0, repeats: int = 7, rate_hz: float = 10.0) -> dict[str, float]:
    """Producer wall time, traced, without and with a Live dashboard (interleaved runs); prints and returns medians."""
    import gpuworkbench as gw
    from gpuworkbench.viz.dashboard import Live

    producer = _Producer()
    iterations = int(seconds * 1000)
    producer.run(300)  # warm up
    runs: dict[str, list[float]] = {k: [] for k in ("plain", "live", "plain_cpu", "live_cpu", "pushes", "thread")}
    max_pushes = 0
    for repeat in range(repeats):
        for with_live in (False, True) if repeat % 2 == 0 else (True, False):  # ABBA order cancels slow drifts
            with gw.trace() as t:
                live = Live(t, rate_hz=rate_hz) if with_live else None
                lifetime = time.perf_counter()
                wall, cpu = producer.run(iterations)
                if live is not None:
                    live.stop()
                lifetime = time.perf_counter() - lifetime
            runs["live" if with_live else "plain"].append(wall)
            runs["live_cpu" if with_live else "plain_cpu"].append(cpu)
            if live is not None:
                runs["pushes"].append(live.pushes / lifetime)
                runs["thread"].append(live.cpu_s / lifetime)
                max_pushes = max(max_pushes, live.max_pushes_per_second())
                live.close()
    plain, live_times = runs["plain"], runs["live"]
    median = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "plain_s": median["plain"],
        "live_s": median["live"],
        "spans_per_s": iterations / median["live"],
        "slowdown_pct": 100 * (statistics.median(b / a for a, b in zip(plain, live_times)) - 1),
        "best_slowdown_pct": 100 * (min(live_times) / min(plain) - 1),
        "added_cpu_pct": 100 * (median["live_cpu"] - median["plain_cpu"]) / median["plain"],
        "pushes_per_s": median["pushes"],
        "max_pushes_in_1s": max_pushes,
        "dashboard_cpu_pct": 100 * median["thread"],
    }
    spread = f"{min(plain):.3f}–{max(plain):.3f} s and {min(live_times):.3f}–{max(live_times):.3f} s"
    print(
        f"live dashboard at {rate_hz:g} Hz, producer at {result['spans_per_s']:.0f} spans/s, {repeats} interleaved "
        f"pairs of {iterations} iterations: traced loop {result['plain_s']:.3f} s without, {result['live_s']:.3f} s "
        f"with the dashboard (medians; ranges {spread})\n"
        f"  slowdown: median of pairs {result['slowdown_pct']:+.1f} %, best-of {result['best_slowdown_pct']:+.1f} % "
        f"(target ≤ 5 %)\n  dashboard thread CPU {result['dashboard_cpu_pct']:.1f} % of its lifetime; process CPU "
        f"added {result['added_cpu_pct']:+.1f} % of the loop's wall time; {result['pushes_per_s']:.1f} pushes/s, "
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
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rate", type=float, default=10.0, help="dashboard pushes per second at most")
    parser.add_argument("--kernel", action="store_true", help="also measure inside a real IPython kernel")
    parser.add_argument("--json", help="also write the timeline and live-dashboard results here")
    parser.add_argument("--browser", action="store_true", help="only the 10^6-span timeline in headless Chromium")
    parser.add_argument("--browser-spans", type=int, default=1_000_000)
    args = parser.parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_cores": os.cpu_count()}
    if args.browser:
        results["browser"] = bench_browser(args.browser_spans)
        write_json(args.json, results)
        return
    results["timeline"] = bench_timeline(args.spans)
    results["live"] = bench_live(args.seconds, args.repeats, args.rate)
    results["live"].update(seconds=args.seconds, pairs=args.repeats, rate_hz=args.rate)
    write_json(args.json, results)
    if args.kernel:
        bench_live_in_kernel(args.seconds, args.repeats, args.rate)


if __name__ == "__main__":
    main()
