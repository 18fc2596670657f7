"""Counter tracks of a trace (``gw.trace(counters=True)``): the host's CPU and memory, and each device's own counters
where its platform offers some, sampled on a thread of their own (from the harvesters' pool) on the trace's clock.

The sampler starts with the trace and samples the host (``counter_sources.HostSource``) at once and then at its
rate; each device that appears in the trace (at its first op) is asked what it offers (``counter_offer.offer``): a
source of its own is sampled beside the host's, and a device without one says so once in ``trace.stats.warnings``.
CPU shares cover the time since the sample before (the first has none: NaN). A sample's time is
``time.perf_counter_ns()``, the spans' host clock; the last sample, taken as the trace stops, carries the stop time.
A source that raises is dropped with one warning. A trace without counters makes no sampler and no thread.
A finished trace (``gw.load_trace``) holds the samples its file had instead of a sampler (``hold_samples``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from . import counter_sources
from .columns import Columns
from .counter_offer import offer
from .counter_sources import CounterSource
from .harvest_threads import THREADS, Run

#: The sampler's storage: a sample's time, device (``HOST`` for the host) and counter (an index into its list).
STORED: dict[str, Any] = {"time_ns": np.int64, "device": np.int16, "counter": np.int32, "value": np.float64}
#: ``Trace.counters()``'s columns: ``name`` and ``unit`` as Python strings (as ``table()``'s ``name``).
COLUMNS: dict[str, Any] = {"time_ns": np.int64, "device": np.int16, "name": object, "unit": object, "value": np.float64}
#: Samples kept (the newest win): ~7 hours of the host's four counters at 10 Hz.
CAPACITY = 1_000_000
#: How long a reader waits for a stopped sampler's last sample.
JOIN_S = 2.0
#: A sample this soon after the one before (in periods) is not taken again as the trace stops, unless that one was the
#: first (which has no CPU share: a trace shorter than a period has its first and its last sample of each counter;
#: one that stops before the sampler's thread took its first samples has its last ones only).
FRESH = 0.25


def wanted(counters: object) -> bool:
    """``counters`` checked: a bool, else ``InvalidArgument`` naming it."""
    if not isinstance(counters, bool):
        raise InvalidArgument(f"counters must be True or False, not {counters!r}")
    return counters


def empty_counters_table() -> dict[str, np.ndarray]:
    """A counters table without rows."""
    return {column: np.zeros(0, dtype=dtype) for column, dtype in COLUMNS.items()}


class _Due:
    """A source and when it is due next (perf_counter ns)."""

    def __init__(self, source: CounterSource, key: str, codes: list[int], now: int) -> None:
        self.source, self.key, self.codes = source, key, codes
        self.period_ns = max(1, int(1e9 / source.rate_hz))
        self.next_ns = now  # a first sample at once: the lines start with the trace
        self.last_ns = now
        self.samples = 0


class Sampler:
    """One trace's sampler: its thread, its sources and its samples."""

    def __init__(self, name: str, devices: Any, warn: Any) -> None:
        #: ``devices()`` lists the trace's devices as (number, key, name); ``warn(message)`` adds a warning once.
        self._devices, self._warn, self.name = devices, warn, name
        self._rows = Columns(STORED, CAPACITY)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._stop_ns = 0
        self._thread: Run | None = None  # the loop's run on a pooled thread (as the harvester's)
        self._due: list[_Due] = []
        self._seen: set[int] = set()
        self._host = ""  # the host source's description, for the devices that share it
        self.counters: list[tuple[str, str]] = []  # (name, unit) per counter code
        self._codes: dict[tuple[str, str], int] = {}
        #: What each device's counters come from: "host" and each device's key -> what it is, and its rate.
        self.sources: dict[str, str] = {}

    def start(self) -> None:
        """Sample from now on (on a pooled thread, named ``name`` while it samples), unless sampling already."""
        if self.alive:
            return
        self._halt.clear()
        self._thread = THREADS.run(self._loop, self.name)

    def stop(self, at_ns: int) -> None:
        """Take a last sample, stamped ``at_ns`` (the trace's stop), and end the thread; never waits for it."""
        self._stop_ns = at_ns
        self._halt.set()

    def join(self, timeout: float = JOIN_S) -> None:
        """Wait for a stopped sampler's thread to end (its last sample is in then)."""
        thread = self._thread
        if thread is not None and self._halt.is_set():
            thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def table(self, since: int = 0) -> dict[str, np.ndarray]:
        """The samples taken after the first ``since`` ones, as ``COLUMNS``, in the order they were taken."""
        with self._lock:
            rows = self._rows.table(since)
        if not rows["time_ns"].size:
            return empty_counters_table()
        names = np.array([name for name, _ in self.counters] or [""], dtype=object)
        units = np.array([unit for _, unit in self.counters] or [""], dtype=object)
        code = rows["counter"]
        return {
            "time_ns": rows["time_ns"],
            "device": rows["device"],
            "name": names[code],
            "unit": units[code],
            "value": rows["value"],
        }

    # ---------------------------------------------------------------- the thread
    def _loop(self) -> None:
        try:
            self._seen = set()  # a restarted trace asks its devices again (their notes are not repeated)
            self._add(counter_sources.host_source(), "host")
            self._host = self.sources["host"]
            while True:
                self._look_at_devices()
                wait = (min(d.next_ns for d in self._due) - time.perf_counter_ns()) / 1e9 if self._due else 0.05
                stopping = self._halt.wait(max(wait, 0.0))
                now = time.perf_counter_ns()
                if stopping:
                    self._look_at_devices()  # a device whose first op came after the last wake-up still says so
                    last = [d for d in self._due if d.samples <= 1 or now - d.last_ns >= FRESH * d.period_ns]
                    self._sample(last, self._stop_ns)
                    return
                self._sample([d for d in self._due if d.next_ns <= now], now)
        except Exception as exc:  # noqa: BLE001 - counters never break a trace: said once, and sampling ends
            self._warn(f"counters: sampling stopped ({exc!r})")
        finally:
            for due in self._due:
                _close(due.source)
            self._due = []

    def _add(self, source: CounterSource, key: str) -> None:
        codes = []
        for counter in source.counters:
            pair = (counter.name, counter.unit)
            code = self._codes.get(pair)
            if code is None:
                code = self._codes[pair] = len(self.counters)
                self.counters.append(pair)
            codes.append(code)
        self._due.append(_Due(source, key, codes, time.perf_counter_ns()))
        self.sources[key] = source.describe()

    def _look_at_devices(self) -> None:
        """Ask each device new to the trace what it offers."""
        devices = self._devices()
        if len(devices) == len(self._seen):
            return
        for number, key, name in devices:
            if number in self._seen:
                continue
            self._seen.add(number)
            offer_ = offer(number, key, name, self._host or "not sampled")
            self.sources[key] = offer_.says
            if offer_.note:
                self._warn(offer_.note)
            if offer_.source is not None:
                self._add(offer_.source, key)

    def _sample(self, due: list[_Due], at_ns: int) -> None:
        for d in due:
            source, n = d.source, len(d.codes)
            try:
                values = np.asarray(source.sample(), np.float64)
                if values.shape != (n,):
                    raise ValueError(f"{values.size} values for {n} counters")
            except Exception as exc:  # noqa: BLE001 - one warning, and this source is left out from now on
                self._due.remove(d)
                _close(source)
                self._warn(f"counters: {d.key} ({source.describe()}) failed: {exc!r}; its samples end")
                continue
            d.last_ns, d.samples = at_ns, d.samples + 1
            d.next_ns += d.period_ns
            if d.next_ns <= at_ns:  # fell behind (a long GIL hold): the next one period on, no burst to catch up
                d.next_ns = at_ns + d.period_ns
            block = {
                "time_ns": np.full(n, at_ns, np.int64),
                "device": np.full(n, source.device, np.int16),
                "counter": np.asarray(d.codes, np.int32),
                "value": values,
            }
            with self._lock:
                self._rows.extend_columns(block)


class Held:
    """Samples a finished trace holds (read from a file): what ``Counting`` asks of a sampler, with nothing to
    sample: starting and stopping it does nothing."""

    alive = False

    def __init__(self, table: dict[str, np.ndarray], sources: dict[str, str]) -> None:
        self._table, self.sources = table, sources

    def start(self) -> None:
        pass

    def stop(self, at_ns: int) -> None:
        pass

    def join(self, timeout: float = JOIN_S) -> None:
        pass

    def table(self, since: int = 0) -> dict[str, np.ndarray]:
        return {column: values[since:].copy() for column, values in self._table.items()}


def hold_samples(trace: Counting, table: dict[str, np.ndarray], sources: dict[str, str]) -> None:
    """Give a finished trace ``table`` (``COLUMNS``, any order) as its counters and ``sources`` as its
    ``counter_sources``; one with samples is drawn with its counter tracks, as one recorded with ``counters=True``."""
    n = len(table["time_ns"])
    rows = {column: np.asarray(table[column], dtype) for column, dtype in COLUMNS.items()}
    if any(len(values) != n for values in rows.values()):
        raise ValueError("counters: the columns differ in length")
    trace._sampler = Held(rows, dict(sources))
    trace.counting = trace.counting or n > 0


def _close(source: CounterSource) -> None:
    try:
        source.close()
    except Exception:  # noqa: BLE001 - closing a source that failed may fail again; nothing to add
        pass


class Counting:
    """Mixed into ``Trace``: its counters (``counters=True``); a trace without them holds no sampler."""

    counting = False  # set by ``Trace(counters=...)`` / ``new_trace``
    _sampler: Sampler | Held | None = None

    def _start_counters(self) -> None:
        if not self.counting:
            return
        if self._sampler is None:
            self._sampler = Sampler(f"gpuworkbench-counters-{self.id}", self._device_keys, self.warn_once)
        self._sampler.start()

    def _stop_counters(self) -> None:
        if self._sampler is not None:
            self._sampler.stop(self.stopped_ns)

    def _device_keys(self) -> list[tuple[int, str, str]]:
        return [(number, clock.key, clock.name) for number, clock in list(self._devices.items())]

    def counters(self, since: int = 0) -> dict[str, np.ndarray]:
        """The counter samples as columns: ``time_ns`` (the spans' host clock), ``device`` (the trace's device
        number; -1: the host), ``name``, ``unit`` and ``value``; once the trace stopped, its last sample included.
        ``since``: only the samples after the first ``since`` (a live reader's cursor). Empty (the same columns) for
        a trace recorded without ``counters=True``."""
        sampler = self._sampler
        if sampler is None:
            return empty_counters_table()
        sampler.join()
        return sampler.table(since)

    @property
    def counter_sources(self) -> dict[str, str]:
        """Where the counters came from: "host" and each device's key -> the source and its rate ("psutil, 10 Hz"),
        or why the device has none. Empty without ``counters=True``."""
        return dict(self._sampler.sources) if self._sampler is not None else {}
