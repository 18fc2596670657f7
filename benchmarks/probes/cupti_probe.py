"""Diagnostic for gpuworkbench.trace.cupti on a CUDA machine with CuPy and cupti-python.

Runs spin kernels of known length, pinned and pageable H2D copies, a D2H, a D2D and a memset on two non-blocking
streams, tags each with an external id, polls ``flush()`` from a background thread without synchronizing, then
prints every record and checks durations, overlap, pinned flags and id joins. Also: launch cost untraced / traced /
traced while flushing, the cost of one flush of 4 000 kernel records, the record layouts (cupti-python dtypes against
CUPTI's own walk), and kernel names read after their module is released. Usage: python benchmarks/probes/cupti_probe.py
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np

from gpuworkbench.trace import cupti as cupti_mod  # (gpuworkbench.trace is also a function: no `import a.b.c as`)
from gpuworkbench.trace.cupti import CuptiSource, CuptiUnavailable

SPIN_SRC = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void empty_kernel() {}
"""
MIB = 1 << 20


class Poller(threading.Thread):
    """Calls ``flush()`` every few ms; keeps the records and the time each flush took."""

    def __init__(self, src: CuptiSource, period_s: float, fn: Any = None) -> None:
        super().__init__(daemon=True)
        self.src, self.period_s = src, period_s
        self.fn = fn or src.flush
        self.stop_event = threading.Event()
        self.records: list[dict[str, Any]] = []
        self.flushes: list[tuple[float, int]] = []  # (seconds, records returned)

    def run(self) -> None:
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            recs = self.fn()
            self.flushes.append((time.perf_counter() - t0, len(recs)))
            self.records.extend(recs)
            time.sleep(self.period_s)


class CallbackTimer:
    """Wraps the source's buffer-completed body and its decoder: when, how long, how many bytes, on which thread."""

    def __init__(self, src: CuptiSource, keep_bytes: int = 256 << 20) -> None:
        self.entries: list[tuple[int, int, int, str]] = []  # (entry ns, ns in callback, bytes, thread name)
        self.decodes: list[tuple[int, int]] = []  # (ns in decode, span records out)
        self.buffers: list[bytes] = []  # copies of what CUPTI handed back, for the walk check (up to keep_bytes)
        self._keep = keep_bytes
        self._orig, self._orig_decode = src.ingest, src.decoder.decode
        src.ingest = self  # type: ignore[method-assign]
        src.decoder.decode = self._decode  # type: ignore[method-assign]

    def __call__(self, data: Any) -> None:
        t0 = time.perf_counter_ns()
        self._orig(data)
        self.entries.append((t0, time.perf_counter_ns() - t0, len(data), threading.current_thread().name))
        if self._keep >= len(data):
            self._keep -= len(data)
            self.buffers.append(bytes(data))  # a copy: CUPTI reuses the buffer once the callback returns

    def _decode(self, raw: Any, blob: bytearray, ends: list[int], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = self._orig_decode(raw, blob, ends, *args, **kwargs)
        self.decodes.append((time.perf_counter_ns() - t0, 0 if out[0] is None else out[0]["start"].size))
        return out

    def report(self) -> None:
        n = sum(e[2] for e in self.entries)
        t = sum(e[1] for e in self.entries)
        threads = sorted({e[3] for e in self.entries})
        dec_ns = sum(d[0] for d in self.decodes)
        dec_n = sum(d[1] for d in self.decodes)
        print(
            f"buffer callbacks: {len(self.entries)} with {n / 1e3:.1f} kB, {t / 1e3:.1f} us in our callback body "
            f"(after the copy), threads {threads}; decoding in flush(): {dec_ns / 1e6:.2f} ms for {dec_n} span "
            f"records ({dec_ns / max(dec_n, 1) / 1e3:.2f} us/record, API and external-correlation records included)"
        )


def layout_report(src: CuptiSource) -> None:
    """cupti-python's record dtypes, the sizes CUPTI's own walk showed, and what we read where."""
    from cupti import cupti

    raw = cupti_mod.LIFECYCLE.raw
    for name in (
        "activity_kernel10_dtype",
        "activity_memcpy6_dtype",
        "activity_memset4_dtype",
        "activity_external_correlation_dtype",
        "activity_api_dtype",
    ):
        dt = getattr(cupti, name, None)
        if dt is None:
            print(f"  {name}: missing")
            continue
        fields = sorted((off, f, sub.str) for f, (sub, off, *_) in (dt.fields or {}).items())
        print(f"  {name}: itemsize {dt.itemsize}; " + ", ".join(f"{f}@{off}:{t}" for off, f, t in fields))
    print(f"  fields read: {src.decoder.tables.fields}")
    print(f"  layout notes: {src.layout_notes or 'none (cupti-python dtypes agree with cupti.h offsets)'}")
    if raw is not None:
        learned = {k: v * 4 for k, v in enumerate(raw.size_words) if v != cupti_mod.walk.UNVERIFIED}
        kinds = {int(k): k.name for k in cupti.ActivityKind}
        print(
            f"  libcupti {raw.path}; sizes verified by cuptiActivityGetNextRecord "
            f"{ {kinds.get(k, k): v for k, v in learned.items()} }; expected from dtypes "
            f"{ {kinds.get(k, k): v for k, v in raw.expected_bytes.items()} }; mismatches {raw.size_mismatch}; "
            f"buffers walked by CUPTI: {raw.buffers_walked_by_cupti}"
        )


def walk_check(diag: CallbackTimer) -> None:
    """Every kept buffer walked by our learned sizes and by cuptiActivityGetNextRecord: offsets must be equal."""
    raw = cupti_mod.LIFECYCLE.raw
    assert raw is not None
    bad = records = 0
    for data in diag.buffers:
        mine = raw.walk(data)
        theirs = raw.walk_cupti(data)
        records += len(theirs)
        bad += mine.tolist() != theirs
    print(
        f"walk check: {len(diag.buffers)} buffers, {records} records: our walk == cuptiActivityGetNextRecord in "
        f"{len(diag.buffers) - bad}/{len(diag.buffers)} buffers -> ok: {bad == 0}"
    )


def launch_study(src: CuptiSource, diag: CallbackTimer, empty: Any, stream: Any, n: int, poll_s: float) -> None:
    """Launch cost per empty kernel with nobody flushing and with each way of flushing, and where the stalls are."""
    raw = cupti_mod.LIFECYCLE.raw
    assert raw is not None
    plain_flush_all = raw.flush_all
    flush_all_times: list[int] = []

    def timed_flush_all(flag: int) -> int:
        t0 = time.perf_counter_ns()
        status = plain_flush_all(flag)
        flush_all_times.append(time.perf_counter_ns() - t0)
        return status

    def cupti_flush_only() -> list[Any]:
        raw.flush_all(0)
        src._take_incoming()
        return []

    def loop(tag: bool) -> np.ndarray:
        ts = [0] * (n + 1)
        perf = time.perf_counter_ns
        with stream:
            ts[0] = perf()
            for i in range(n):
                if tag:
                    src.push_external_id(3_000_000 + i)
                empty((1,), (1,), ())
                if tag:
                    src.pop_external_id()
                ts[i + 1] = perf()
        stream.synchronize()
        return np.diff(np.array(ts)) / 1e3

    raw.flush_all = timed_flush_all
    print(f"\nlaunch study ({n} empty kernels a loop, 3 loops a mode, poll every {poll_s * 1e3:.0f} ms):")
    for label, fn, tag in (
        ("CUPTI on, nobody flushing", None, False),
        ("flush() by a poller", "flush", False),
        ("flush() by a poller, + push/pop", "flush", True),
        ("cuptiActivityFlushAll(0) only, nothing decoded", cupti_flush_only, False),
    ):
        src.flush()
        poller = Poller(src, poll_s, src.flush if fn == "flush" else fn) if fn else None
        flush_all_times.clear()
        n_decodes = len(diag.decodes)
        if poller:
            poller.start()
        gaps = np.concatenate([loop(tag) for _ in range(3)])
        if poller:
            poller.stop_event.set()
            poller.join()
        p50 = float(np.median(gaps))
        stalls = gaps[gaps > max(10 * p50, 50)]
        fa = np.array(flush_all_times or [0]) / 1e3
        dec = np.array([d[0] for d in diag.decodes[n_decodes:]] or [0]) / 1e3
        print(
            f"  {label:<50} {gaps.mean():6.2f} us/launch (median {p50:.2f}, p99 {np.percentile(gaps, 99):.1f}, max "
            f"{gaps.max() / 1e3:.2f} ms; {stalls.size} stalls > 10x median = {stalls.sum() / 1e3:.1f} ms of "
            f"{gaps.sum() / 1e3:.1f} ms); cuptiActivityFlushAll: {len(flush_all_times)} calls, median "
            f"{np.median(fa):.0f} us, max {fa.max():.0f} us; decodes: {len(dec)}, median {np.median(dec):.0f} us, "
            f"max {dec.max():.0f} us"
        )
    raw.flush_all = plain_flush_all
    for _ in range(cupti_mod.source.HOLD_FLUSHES + 1):  # held records too: the checks after this count what is left
        src.flush()


def overlap_us(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Overlap of two records in µs (negative: the gap between them)."""
    return (min(a["end_ns"], b["end_ns"]) - max(a["start_ns"], b["start_ns"])) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spin-us", type=float, default=80.0)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--poll-ms", type=float, default=10.0, help="the harvester polls every 10 ms")
    ap.add_argument("--launches", type=int, default=2000, help="empty kernels for the launch-overhead figure")
    ap.add_argument("--gate-ms", type=float, default=10.0, help="spin that holds both streams before paired ops")
    ap.add_argument("--no-carriers", action="store_true", help="no DRIVER/RUNTIME records (no external ids)")
    ap.add_argument("--no-api-filter", action="store_true", help="carrier records for every API call")
    ap.add_argument("--quiet", action="store_true", help="summary only, no record table")
    ap.add_argument("--study", type=int, default=4000, help="launches a loop in the launch study (0: skip it)")
    args = ap.parse_args()

    ok, why = CuptiSource.available()
    print(f"available: {ok} ({why})")
    if args.no_carriers:
        cupti_mod.kinds.API_CARRIER_KINDS = ()
    if args.no_api_filter:
        cupti_mod.kinds.API_FILTER = False
    kinds = cupti_mod.kinds
    print(f"config: carriers {kinds.API_CARRIER_KINDS}, api filter {kinds.API_FILTER}, poll {args.poll_ms} ms")

    import cupy as cp

    dev = cp.cuda.Device(0)
    print(
        f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, CuPy {cp.__version__}, "
        f"driver {cp.cuda.runtime.driverGetVersion()}, runtime {cp.cuda.runtime.runtimeGetVersion()}"
    )
    mod = cp.RawModule(code=SPIN_SRC)
    spin, empty = mod.get_function("spin_ns"), mod.get_function("empty_kernel")
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    n = args.mib * MIB
    h2d_kind, d2h_kind, d2d_kind = (
        cp.cuda.runtime.memcpyHostToDevice,
        cp.cuda.runtime.memcpyDeviceToHost,
        cp.cuda.runtime.memcpyDeviceToDevice,
    )
    pin_a, pin_b, pin_c = (cp.cuda.alloc_pinned_memory(n) for _ in range(3))
    pageable = np.ones(n, dtype=np.uint8)
    d_a, d_b, d_c, d_d = (cp.empty(n, dtype=cp.uint8) for _ in range(4))
    spin_ns = int(args.spin_us * 1000)

    # Warm-up (before tracing): compile, first launches, first copies.
    with s1:
        spin((1,), (1,), (np.uint64(1000),))
        empty((1,), (1,), ())
    cp.cuda.runtime.memcpyAsync(d_a.data.ptr, pin_a.ptr, n, h2d_kind, s1.ptr)
    dev.synchronize()

    def launch_cost_us(tag: bool) -> float:
        t0 = time.perf_counter_ns()
        with s1:
            for i in range(args.launches):
                if tag:
                    src.push_external_id(1_000_000 + i)
                empty((1,), (1,), ())
                if tag:
                    src.pop_external_id()
        t = (time.perf_counter_ns() - t0) / args.launches / 1e3
        s1.synchronize()
        return t

    src = cupti_mod.new_source()
    base_launch = launch_cost_us(False)

    try:
        src.start()
    except CuptiUnavailable as exc:
        print(f"CuptiUnavailable: {exc}")
        return 1
    print(f"started; api_filtered={src.api_filtered}")
    diag = CallbackTimer(src)
    try:
        cupti_mod.new_source().start()
        print("second start: NOT refused (unexpected)")
    except CuptiUnavailable as exc:
        print(f"second start refused as designed: {exc}")

    # Warm-up: a few launches, a copy and a memset, one flush: CUPTI's own walk shows each record size once.
    with s1:
        for i in range(10):
            src.push_external_id(900_000 + i)
            empty((1,), (1,), ())
            src.pop_external_id()
            empty((1,), (1,), ())
    cp.cuda.runtime.memcpyAsync(d_a.data.ptr, pin_a.ptr, MIB, h2d_kind, s1.ptr)
    cp.cuda.runtime.memsetAsync(d_a.data.ptr, 0, MIB, s1.ptr)
    s1.synchronize()
    time.sleep(0.01)
    t0 = time.perf_counter_ns()
    warm = src.flush()
    warm_us = (time.perf_counter_ns() - t0) / 1e3
    raw = cupti_mod.LIFECYCLE.raw
    print(
        f"warm-up flush: {len(warm)} records ({sum(r['external_id'] >= 900_000 for r in warm)}/10 tagged joined) in "
        f"{warm_us:.1f} us; buffers walked by cuptiActivityGetNextRecord so far: "
        f"{raw.buffers_walked_by_cupti if raw else '?'}"
    )

    # Launch cost with CUPTI on and nobody flushing, then one uncontended flush of all those records.
    quiet_launch = launch_cost_us(False)
    quiet_tagged = launch_cost_us(True)
    time.sleep(0.01)
    quiet_t0 = time.perf_counter_ns()
    n_decodes = len(diag.decodes)
    quiet_recs = src.flush()
    quiet_end = time.perf_counter_ns()
    quiet_flush_us = (quiet_end - quiet_t0) / 1e3
    quiet_cb = [e for e in diag.entries if quiet_t0 <= e[0] <= quiet_end]
    quiet_decode_us = sum(d[0] for d in diag.decodes[n_decodes:]) / 1e3
    t0 = time.perf_counter_ns()
    quiet_recs += src.flush()
    quiet_flush2_us = (time.perf_counter_ns() - t0) / 1e3
    t0 = time.perf_counter_ns()
    quiet_recs += src.flush()
    quiet_flush3_us = (time.perf_counter_ns() - t0) / 1e3
    quiet_joined = sum(1 for r in quiet_recs if r["external_id"] >= 1_000_000)

    poller = Poller(src, args.poll_ms / 1e3)
    poller.start()
    host_t0 = time.perf_counter_ns()

    expected: dict[int, str] = {}
    enqueue_at: dict[int, int] = {}

    def tagged(ext_id: int, what: str, fn: Any) -> None:
        expected[ext_id] = what
        enqueue_at[ext_id] = time.perf_counter_ns()
        src.push_external_id(ext_id)
        try:
            fn()
        finally:
            src.pop_external_id()

    def spin_on(stream: Any, ns: int) -> Any:
        def go() -> None:
            with stream:
                spin((1,), (1,), (np.uint64(ns),))

        return go

    def gate() -> None:
        """Hold s1 and s2 behind one long spin so that the next pair of ops becomes ready together."""
        spin_on(s1, int(args.gate_ms * 1e6))()
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s1)
        s2.wait_event(ev)

    gate()
    tagged(1, f"spin {spin_ns / 1e3:.0f}us s1", spin_on(s1, spin_ns))
    tagged(2, f"spin {spin_ns / 1e3:.0f}us s2", spin_on(s2, spin_ns))
    gate()
    tagged(3, "pinned H2D s1", lambda: cp.cuda.runtime.memcpyAsync(d_a.data.ptr, pin_a.ptr, n, h2d_kind, s1.ptr))
    tagged(4, "pinned H2D s2", lambda: cp.cuda.runtime.memcpyAsync(d_b.data.ptr, pin_b.ptr, n, h2d_kind, s2.ptr))
    tagged(5, "pinned D2H s1", lambda: cp.cuda.runtime.memcpyAsync(pin_c.ptr, d_a.data.ptr, n, d2h_kind, s1.ptr))
    tagged(6, "memset s2", lambda: cp.cuda.runtime.memsetAsync(d_b.data.ptr, 7, n, s2.ptr))
    tagged(
        7,
        "pageable H2D s1",
        lambda: cp.cuda.runtime.memcpyAsync(d_c.data.ptr, pageable.ctypes.data, n, h2d_kind, s1.ptr),
    )
    tagged(8, "D2D s2", lambda: cp.cuda.runtime.memcpyAsync(d_d.data.ptr, d_b.data.ptr, n, d2d_kind, s2.ptr))
    spin_reqs = {1: spin_ns, 2: spin_ns}
    for ext_id, us in ((10, 20), (11, 80), (12, 200), (13, 1000)):
        tagged(ext_id, f"spin {us}us s1", spin_on(s1, us * 1000))
        spin_reqs[ext_id] = us * 1000
    enqueue_done = time.perf_counter_ns()

    time.sleep(0.05)  # no synchronization: the poller should already see records
    seen_before_sync = len(poller.records)
    seen_ids_before_sync = {r["external_id"] for r in poller.records}

    tagged_launch = launch_cost_us(True)
    traced_launch = launch_cost_us(False)

    dev.synchronize()
    time.sleep(0.02)
    poller.stop_event.set()
    poller.join()
    records = poller.records

    # Kernel names are read at flush time: one kernel whose module is released before that flush, one loaded after.
    mod_a = cp.RawModule(code='extern "C" __global__ void name_probe_released() {}')
    fn_a = mod_a.get_function("name_probe_released")
    with s1:
        fn_a((1,), (1,), ())
    s1.synchronize()
    del fn_a, mod_a
    gc.collect()
    mod_b = cp.RawModule(code='extern "C" __global__ void name_probe_loaded_after() {}')
    fn_b = mod_b.get_function("name_probe_loaded_after")
    with s1:
        fn_b((1,), (1,), ())
    s1.synchronize()
    time.sleep(0.01)

    t0 = time.perf_counter_ns()
    more = src.flush()
    one_flush_us = (time.perf_counter_ns() - t0) / 1e3
    records += more
    for _ in range(cupti_mod.source.HOLD_FLUSHES):  # records held for their external id come out now, not in the study
        records += src.flush()
    if args.study:
        launch_study(src, diag, empty, s1, args.study, args.poll_ms / 1e3)
    src.stop()
    src.stop()  # idempotent
    records += src.flush()
    after_stop = src.flush()

    clocks = [src.clock_sample() for _ in range(200)]
    errs = sorted(c[2] for c in clocks)
    offsets = [c[0] - c[1] for c in clocks]
    print(
        f"\nclock_sample error_ns: min {errs[0]}, median {errs[len(errs) // 2]}, max {errs[-1]}; "
        f"cupti-host offset spread over 200 samples: {max(offsets) - min(offsets)} ns"
    )
    c, _, _ = src.clock_sample()
    print(
        f"cupti clock minus time.time_ns(): {(c - time.time_ns()) / 1e6:.3f} ms; "
        f"minus time.monotonic_ns(): {(c - time.monotonic_ns()) / 1e9:.3f} s"
    )

    flush_times = sorted(f[0] * 1e6 for f in poller.flushes)
    busiest = max(poller.flushes, key=lambda f: f[1])
    print(
        f"poller: {len(poller.flushes)} flushes every {args.poll_ms} ms, flush time median "
        f"{statistics.median(flush_times):.1f} us, max {flush_times[-1]:.1f} us; busiest flush returned "
        f"{busiest[1]} records in {busiest[0] * 1e6:.1f} us"
    )
    probe_names = sorted(r["name"] for r in records if r["name"].startswith("name_probe"))
    print(
        f"kernel names read at flush time: {probe_names} -> name of a kernel whose module was released before the "
        f"flush intact: {'name_probe_released' in probe_names}"
    )
    print(
        f"final flush in main thread (after sync): {len(more)} records in {one_flush_us:.1f} us; after stop: "
        f"{len(after_stop)} records; incomplete dropped {src.incomplete_records}; callback errors "
        f"{src.callback_errors} {src.last_callback_error}"
    )
    print(
        f"launch cost per empty kernel ({args.launches} launches): untraced {base_launch:.2f} us; CUPTI on, no "
        f"flushing: {quiet_launch:.2f} us, + push/pop {quiet_tagged:.2f} us; CUPTI on while the poller flushes: "
        f"{traced_launch:.2f} us, + push/pop {tagged_launch:.2f} us"
    )
    print(
        f"uncontended flushes after those {2 * args.launches} launches: {len(quiet_recs)} records "
        f"({quiet_joined} with their external id) in {quiet_flush_us:.1f} + {quiet_flush2_us:.1f} + "
        f"{quiet_flush3_us:.1f} us"
    )
    if quiet_cb:
        gap_us = (quiet_cb[0][0] - quiet_t0) / 1e3
        print(
            f"  of that first flush: CUPTI before our callback {gap_us:.1f} us, in our callback body "
            f"{sum(e[1] for e in quiet_cb) / 1e3:.1f} us for {sum(e[2] for e in quiet_cb) / 1e3:.1f} kB in "
            f"{len(quiet_cb)} buffer(s), thread {quiet_cb[0][3]}; decoding (walk, NumPy, dicts) "
            f"{quiet_decode_us:.1f} us"
        )
    diag.report()
    print(
        f"host enqueue gap between spin ext 1 and ext 2: {(enqueue_at[2] - enqueue_at[1]) / 1e3:.1f} us; "
        f"between H2D ext 3 and ext 4: {(enqueue_at[4] - enqueue_at[3]) / 1e3:.1f} us"
    )
    print(
        f"records seen by the poller before any synchronize: {seen_before_sync} "
        f"(tagged ops enqueued {(enqueue_done - host_t0) / 1e6:.2f} ms after start; ids seen: "
        f"{sorted(i for i in seen_ids_before_sync if 0 <= i < 100)})"
    )

    print("record layout:")
    layout_report(src)
    walk_check(diag)
    kinds: dict[str, int] = {}
    for r in records:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"total records: {len(records)} by kind {kinds}")

    main_recs = sorted((r for r in records if r["external_id"] in expected), key=lambda r: r["start_ns"])
    untagged = [r for r in records if r["external_id"] == -1]
    by_id: dict[int, list[dict[str, Any]]] = {}
    for r in main_recs:
        by_id.setdefault(r["external_id"], []).append(r)
    t_base = min(r["start_ns"] for r in main_recs) if main_recs else 0
    if not args.quiet:
        print(
            f"\n{'ext':>4} {'what':<18} {'kind':<7} {'dev':>3} {'strm':>4} {'start_us':>10} {'dur_us':>10} "
            f"{'bytes':>10} {'GB/s':>7} {'pin':>3} name"
        )
        for r in main_recs:
            dur = (r["end_ns"] - r["start_ns"]) / 1e3
            gbs = f"{r['bytes'] / (dur * 1e3):.1f}" if r["bytes"] and dur > 0 else ""
            print(
                f"{r['external_id']:>4} {expected[r['external_id']]:<18} {r['kind']:<7} {r['device']:>3} "
                f"{r['cupti_stream']:>4} {(r['start_ns'] - t_base) / 1e3:>10.2f} {dur:>10.3f} {r['bytes']:>10} "
                f"{gbs:>7} {r['pinned']:>3} {r['name']}"
            )
    tagged_launch_recs = sum(1 for r in records if r["external_id"] >= 1_000_000)
    print(
        f"\nlaunch-loop records while polling: {tagged_launch_recs} with their external id (of {args.launches}); "
        f"untagged records: {len(untagged)} (expected {args.launches} + 2 gate spins + 2 name probes)"
    )
    missing = sorted(set(expected) - set(by_id))
    print(f"external ids joined: {len(by_id)}/{len(expected)}; missing: {missing}")

    print("\nchecks:")
    for ext_id, req in spin_reqs.items():
        for r in by_id.get(ext_id, []):
            dur = r["end_ns"] - r["start_ns"]
            print(
                f"  spin ext {ext_id}: requested {req / 1e3:.1f} us, measured {dur / 1e3:.3f} us, "
                f"diff {(dur - req) / 1e3:+.3f} us -> within 2 us: {abs(dur - req) <= 2000}"
            )
    if by_id.get(1) and by_id.get(2):
        ov = overlap_us(by_id[1][0], by_id[2][0])
        print(
            f"  spin kernels on s1/s2 overlap by {ov:.2f} us -> overlap: {ov > 0}; streams "
            f"{by_id[1][0]['cupti_stream']} vs {by_id[2][0]['cupti_stream']}"
        )
    if by_id.get(3) and by_id.get(4):
        a, b = by_id[3][0], by_id[4][0]
        ov = overlap_us(a, b)
        print(
            f"  pinned H2D s1/s2: overlap {ov:.2f} us -> do NOT overlap: {ov <= 0}; "
            f"durations {(a['end_ns'] - a['start_ns']) / 1e3:.1f} / {(b['end_ns'] - b['start_ns']) / 1e3:.1f} us"
        )
    pins = {i: [r["pinned"] for r in by_id.get(i, [])] for i in (3, 4, 5, 7, 8, 6)}
    print(
        f"  pinned flags: H2D pinned {pins[3]}/{pins[4]} (expect 1), D2H pinned {pins[5]} (expect 1), "
        f"H2D pageable {pins[7]} (expect 0), D2D {pins[8]} (expect -1), memset {pins[6]} (expect -1)"
    )
    kinds_ok = {i: [r["kind"] for r in by_id.get(i, [])] for i in (3, 5, 6, 7, 8)}
    print(f"  kinds: {kinds_ok}")
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "libcupti" in line})
        print(f"libcupti loaded: {' '.join(libs)}")
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
