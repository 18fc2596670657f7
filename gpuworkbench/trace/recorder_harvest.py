"""The part of a Trace that turns finished ops into spans: its harvest loop (on a pooled thread), polling
completions without blocking, flushing and decoding CUPTI's records when someone reads or a backlog is due."""

from __future__ import annotations

import time
import warnings

import numpy as np

from . import cupti as cupti_source
from .cupti.ops import ROW
from .spans import KIND_CODE, launch_row

#: Polling period of a stopped trace's harvester while its last ops finish (and of ``wait_pending``).
DRAIN_S = 0.01
#: How soon ``wait_pending`` first looks again, doubling up to ``WAIT_POLL_MAX_S`` (a waiter hurries the harvester:
#: a 1 000-span cell had waited out 5 ms polls; a long-running op is not polled at 2 kHz).
WAIT_POLL_S, WAIT_POLL_MAX_S = 0.0005, 0.002
#: While a CUPTI trace records and nobody reads it, its harvester leaves CUPTI's records where they are (in CUPTI's
#: buffers, or undecoded in ours) for up to this many ops (~350 bytes each): flushing (which holds CUPTI's locks) and
#: decoding (which holds the GIL) would compete with the very launches being measured. A read, stopping, or this
#: many ops flushes and decodes them; a watched trace (below) is flushed and decoded at every harvest (>= 10 Hz).
DEFER_OPS = 200_000
#: ... and while fewer than this many ops of several records (copies, graph launches) hold their completions.
DEFER_COMPLETIONS = 1024
#: A trace counts as watched (decoded at every harvest, for live views) for this long after ``version`` is read.
WATCH_S = 1.0


class Harvesting:
    """Mixed into ``Trace``: its harvester (its attributes are made in ``Trace.__init__``)."""

    def _harvest_loop(self) -> None:
        stopping = False
        while True:
            if self._cupti is not None:  # a take-over's watch callbacks (QUIET_BY "trace"): off as the loop begins,
                cupti_source.quiet_taken_over()  # or at its next wake where CUPTI started later (a first CUDA op)
            if stopping:  # stopped, ops still running: drain at a gentle pace, never in a busy loop
                self._hurry.wait(min(self.interval_s, DRAIN_S))
                self._hurry.clear()
            else:
                stopping = self._stop.wait(self.interval_s)
            cpu = time.thread_time()
            try:
                if self._cupti is not None and not self._taken and self.recording:
                    other = cupti_source.other_client()
                    if other:
                        self._give_up_cupti(other)
                if self._defers():
                    self._deferred = True
                    self._stats.deferred_harvests += 1
                elif not (stopping and not self._unfinished() and self._finish_harvests()):
                    self.harvest()  # (else the finish's own harvest, after CUPTI's last flush, is the only one)
            except Exception as exc:  # noqa: BLE001 - a harvester crash must be visible, not silent
                self.stats.warnings.append(f"harvester error: {exc!r}")
                warnings.warn(f"gpuworkbench trace harvester error: {exc!r}", RuntimeWarning, stacklevel=1)
            self.stats.harvest_cpu_s += time.thread_time() - cpu
            if stopping and not self._unfinished():
                try:
                    self._finish_cupti()
                except Exception as exc:  # noqa: BLE001 - as above: said, and the thread still ends its trace
                    self.stats.warnings.append(f"harvester error: {exc!r}")
                    warnings.warn(f"gpuworkbench trace harvester error: {exc!r}", RuntimeWarning, stacklevel=1)
                self._finished()  # the next trace's object, off its start
                return

    def _defers(self) -> bool:
        """Whether this wake-up may leave CUPTI's records alone: recording, unwatched, a bounded backlog, and no ops
        timed by events waiting (their pooled events are held until harvested)."""
        return (
            self._cupti is not None
            and not self._taken
            and self.recording
            and time.monotonic() - self._read_at > WATCH_S
            and not self._pending
            and not self._waiting
            and len(self._cupti_ops.completions) < DEFER_COMPLETIONS
            and len(self._cupti_ops.rows) < DEFER_OPS * ROW.size
        )

    def _catch_up(self) -> None:
        """Flush and decode what the harvester deferred, for a reader while the trace records."""
        if self._deferred and self.recording:
            self.harvest(flush=True)

    def _unfinished(self) -> int:
        """Ops recorded whose spans have not been made yet."""
        return len(self._pending) + len(self._waiting) + len(self._cupti_ops)

    def harvest(self, flush: bool = False) -> int:
        """Turn finished ops into spans (non-blocking); returns how many spans were added. ``flush``: have CUPTI hand
        back every record now (else only when a flush is due: see ``trace/cupti/source.py``)."""
        with self._harvest_lock:
            self._deferred = False
            return self._harvest(flush)

    def _harvest(self, flush: bool) -> int:
        self.stats.harvest_cycles += 1
        cycle = self.stats.harvest_cycles
        self._sample_clocks()  # before the offsets are read
        offsets = {n: c.offset_ns for n, c in self._devices.items()}
        cupti_rows = None
        ops = self._cupti_ops
        if self._cupti is not None:
            ops.take_rows(cycle)  # before the flush: the windows of the ops handed over so far place its API calls
            if self._window.drifts:
                self._window.sample(self._cupti)
            eager = flush or not self.recording
            records = self._cupti.flush_columns(eager=eager, full=self.others, resolve=self._resolve)
            ops.add_records(records, cycle)
            self.stats.unplaced_calls = self._cupti.unplaced_calls
            if self._foreign is not None:
                self._add_foreign(records)
            if len(ops):
                lost = ops.lost
                off = np.array([offsets[n] for n in range(len(offsets))], np.int64)
                cupti_rows = ops.harvest(cycle, off, off - self._window.offsets(self._cupti))
                if ops.lost > lost:
                    self.stats.lost += ops.lost - lost
                    self.warn_once(f"no CUPTI record arrived for some ops (first: {ops.first_lost!r}): missing")
        waiting = self._waiting
        while self._pending:
            waiting.append(self._pending.popleft())
        rows: list[tuple] = []
        keep: list[tuple] = []
        blocked: set[tuple[int, int]] = set()  # streams with an unfinished op: later ops there are unfinished too
        for p in waiting:
            op_id, dev, stream, kind, nbytes, name, pinned, enq, completion, loc, launch = p
            key = (dev, stream)
            if key in blocked or not completion.done():
                blocked.add(key)
                keep.append(p)
                continue
            times = completion.times_ns()
            if times is None:
                self.stats.lost += 1
                self.warn_once(f"an op finished without timestamps ({name!r}); it is missing")
                continue
            off = offsets[dev]
            span = (kind, dev, stream, times[0] - off, times[1] - off, enq, nbytes, name, pinned, -1)
            rows.append(span + ((0, 0, loc, -1, -1) if launch is None else launch_row(launch, loc)))  # rows alike
        added = len(rows) + (0 if cupti_rows is None else len(cupti_rows["kind"]))
        if added:
            with self._lock:
                self._spans.extend(rows)
                if cupti_rows is not None:
                    self._spans.extend_columns(cupti_rows)
                self._version += 1
        self._waiting = keep
        self.stats.dropped = self._spans.dropped
        return added

    def _add_foreign(self, records: dict[str, np.ndarray] | None) -> None:
        """Other libraries' work, launches, allocations and NVTX ranges from this flush, as spans."""
        foreign = None
        if records is not None:
            theirs = records["external_id"] <= 0
            if theirs.any():
                foreign = {k: v[theirs] for k, v in records.items()}
        blocks = [
            b
            for b in map(self._in_window, self._foreign.spans(foreign, self._cupti.take_extras(), self._cupti_offset))
            if b["kind"].size
        ]
        if not blocks:
            return
        with self._lock:
            for block in blocks:
                self._spans.extend_columns(block)
                if (block["kind"] == KIND_CODE["alloc"]).any() or (block["kind"] == KIND_CODE["free"]).any():
                    now = int(block["end_ns"].max())
                    for dev, total in self._foreign.other_bytes.items():
                        self._other_bytes[dev] = total
                        row = {"device": dev, "t_ns": now, "held_bytes": self._held.get(dev, 0), "used_bytes": -1}
                        self._memory.append(row | {"other_bytes": total})
            self._version += 1

    def _in_window(self, block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The rows of a block of other libraries' work whose call (or start, where no call is known) came before this
        trace stopped: CUPTI runs on after a stop until the trace's own ops are in, and sees work enqueued then. The
        start needs no bound: CUPTI records nothing before the trace starts it but work already running."""
        if not self.stopped_ns:
            return block
        keep = np.where(block["enqueue_ns"] >= 0, block["enqueue_ns"], block["start_ns"]) <= self.stopped_ns
        return block if keep.all() else {k: v[keep] for k, v in block.items()}

    def wait_pending(self, timeout_s: float = 30.0) -> bool:
        """Block until every recorded op has its span (the ops themselves must finish); False on timeout."""
        deadline = time.monotonic() + timeout_s
        poll = WAIT_POLL_S
        while self._unfinished():
            self._read_at = time.monotonic()  # a recording trace's harvester decodes while someone waits
            if self._thread is None or not self._thread.is_alive():
                self.harvest()
            else:
                self._hurry.set()  # a stopped trace's harvester drains now, not at its gentle pace
            if time.monotonic() > deadline:
                return False
            time.sleep(min(self.interval_s / 2, poll))
            poll = min(2 * poll, WAIT_POLL_MAX_S)  # quick at first (a cell's last spans), then less often
        if not self.recording and self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))  # it releases CUPTI as it ends
        return True
