"""The three ways a large trace loads, interleaved round by round, one load each in a fresh process: with a forked
helper (a script), a spawned one (``--threaded``: another thread runs, as in a notebook kernel) and none
(``--alone``). ``python benchmarks/probes/load_modes.py FILE.json FILE.json.gz [--rounds 4]``: the files
``bench_load_trace.py --keep DIR`` writes."""

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_load_trace as bench  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("plain")
parser.add_argument("packed")
parser.add_argument("--rounds", type=int, default=4)
opts = parser.parse_args()
mb = os.path.getsize(opts.plain) / 1e6
found: dict[tuple[str, str], list[dict]] = {}
for r in range(opts.rounds):
    ways = ["", "threaded", "alone"]
    for way in ways if r % 2 == 0 else ways[::-1]:
        for label, path in (("json", opts.plain), ("json.gz", opts.packed)):
            found.setdefault((way or "forked", label), []).append(bench.measure(path, views=False, repeat=1, cores=way))
for (way, label), runs in found.items():
    times = [run["load_s"] for run in runs]
    median = statistics.median(times)
    print(
        f"{way:8} {label:7} median {median:.2f} s = {mb / median:.0f} MB/s (runs {' '.join(f'{t:.2f}' for t in times)}"
        f"; peak RSS {max(run['peak_rss_mb'] for run in runs):.0f} MB, helper "
        f"{max(run['helper_peak_rss_mb'] for run in runs):.0f} MB)"
    )
