"""The live dashboard: a notebook widget whose timeline, summary numbers and memory gauge follow a recording trace.

A background thread polls the trace (``version``, then ``table(since=cursor, wait=False)``) at most ``rate_hz`` times a
second and pushes only the new spans, with ``ColumnDataSource.stream`` (bounded by ``rollover``), through
``jupyter_bokeh.BokehModel``. Pushes leave the kernel on IOPub, which any thread may use, so the view keeps moving while
a long cell runs; the front end never polls (its messages would wait until the cell ends). Never ``push_notebook``.
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets
import numpy as np
from jupyter_bokeh import BokehModel

from gpuworkbench.trace.analysis import summarize
from gpuworkbench.trace.device_limits import limits_of
from gpuworkbench.trace.spans import COLUMNS, empty_table

from .._format import counter_value, decimal_bytes, percent
from ..errors import InvalidArgument
from .inline import inline_setup
from .timeline import build_timeline, device_names
from .timeline_data import RowLayout, span_columns

#: Most pushes a second a dashboard may make; DESIGN §5 asks for 10–30.
MAX_RATE_HZ = 30.0

# Dashboards whose thread runs; ``live()`` stops those that own their trace before starting another.
_RUNNING: weakref.WeakSet[Live] = weakref.WeakSet()


class _BokehModel(BokehModel):
    """``jupyter_bokeh.BokehModel`` that applies front-end changes under the dashboard's lock, and may close twice.

    Front-end events (a pan changing a range) arrive on the main thread while the dashboard's thread streams: one lock
    keeps them apart. jupyter_bokeh 4.1 raises KeyError when closed again, as ipywidgets does from ``__del__``.
    """

    def __init__(self, model: Any, lock: threading.RLock) -> None:
        self._document_lock = lock
        super().__init__(model)

    def _sync_model(self, *args: Any) -> None:
        with self._document_lock:
            super()._sync_model(*args)

    def close(self) -> None:
        try:
            super().close()
        except KeyError:
            pass


class Live(widgets.VBox):
    """A dashboard widget that follows ``trace`` while later cells run: timeline, summary numbers, memory gauge.

    Its thread starts at once and pushes at most ``rate_hz`` (≤ 30) times a second, only when the trace changed; the
    timeline keeps the newest ``rollover`` spans; the numbers (``summary_hz`` times a second) describe the newest
    ``summary_spans``. ``device`` (a gpuworkbench Device, optional) gives the gauge its total; without it the gauge
    shows held bytes beside the used total traced. ``stop()`` ends the thread (and the trace, if the dashboard
    started it).
    """

    def __init__(
        self,
        trace: Any,
        device: Any = None,
        *,
        rate_hz: float = 10.0,
        summary_hz: float = 2.0,
        rollover: int = 20_000,
        summary_spans: int = 5_000,
        owns_trace: bool = False,
        display_grace_s: float = 1.0,
        width: int = 1000,
    ) -> None:
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"rate_hz must be in (0, {MAX_RATE_HZ:g}], not {rate_hz!r}")
        if rollover < 1 or summary_spans < 1:
            raise ValueError(f"rollover and summary_spans must be at least 1 span, not {rollover!r}, {summary_spans!r}")
        inline_setup()
        self.trace, self.device, self.owns_trace = trace, device, owns_trace
        self.rate_hz, self.summary_hz, self.rollover = float(rate_hz), float(summary_hz), int(rollover)
        self.summary_spans = int(summary_spans)
        self.display_grace_s = display_grace_s
        self.pushes = 0  # ticks that sent anything to the front end
        self.spans_streamed = 0
        self.errors: list[str] = []
        self._push_times: deque[float] = deque(maxlen=4096)
        self._cursor = 0  # spans of the trace read so far (``table(since=...)``)
        self._version = -1
        self._t0_ns = int(trace.started_ns) or None
        self.cpu_s = 0.0  # CPU time the dashboard's thread spent in ticks: what it can take from the traced work
        self._retained = empty_table()  # the newest ``summary_spans`` spans, for the numbers
        self._summary_at = 0.0
        self._rate_since = time.monotonic()  # when the spans/s count began
        self._summary_cursor = 0
        self._counter_cursor = 0  # counter samples read so far, and the newest value of each (device -> name -> text)
        self._newest_counters: dict[int, dict[str, str]] = {}
        self._peak_held = 0
        self._hold_until = 0.0
        self._last_push = -1e9
        self._min_gap = 1.0 / self.rate_hz + 1e-6  # a hair over the period, so that float rounding cannot add a push
        self._doc_lock = threading.RLock()
        self._stop = threading.Event()

        self._rows = RowLayout(device_names(trace), trace.stream_labels, states=False)
        self._figure, self.source, _, _ = build_timeline(
            empty_table(), self._rows, self._t0_ns or 0, title="live timeline", width=width, webgl=True
        )
        self._bokeh = _BokehModel(self._figure, self._doc_lock)
        self._numbers = widgets.HTML(value="<i>waiting for spans…</i>")
        self._gauge = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, description="memory", bar_style="info")
        self._gauge_text = widgets.HTML(value="")
        super().__init__(children=[self._numbers, widgets.HBox([self._gauge, self._gauge_text]), self._bokeh])

        self._thread = threading.Thread(target=self._run, name=f"gpuworkbench-live-{trace.id}", daemon=True)
        _RUNNING.add(self)
        self._thread.start()

    # ------------------------------------------------------------------ public
    @property
    def running(self) -> bool:
        """True while the polling thread runs."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (blocks until it ends, at most ``timeout_s``), then stop the trace if this dashboard owns it.

        A last refresh shows whatever arrived since the final push.
        """
        first = not self._stop.is_set()
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        _RUNNING.discard(self)
        if first:
            if self.owns_trace:
                self.trace.stop()
            self._tick(final=True)

    def close(self) -> None:
        """Stop the dashboard and close its widgets."""
        if hasattr(self, "_thread"):  # not when __init__ refused its arguments (ipywidgets closes from __del__)
            self.stop()
            self._bokeh.close()
        super().close()

    def max_pushes_per_second(self) -> int:
        """The most pushes made within any one second so far (of the last 4096 pushes)."""
        times = np.array(self._push_times)
        if times.size == 0:
            return 0
        return int((np.searchsorted(times, times + 1.0, side="left") - np.arange(times.size)).max())

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        # Pushes sent before a view exists are lost to it: give the new view the current state, and hold pushes
        # briefly while the front end builds it.
        with self._doc_lock:
            self._bokeh.update_from_model(self._figure)
            self._hold_until = time.monotonic() + self.display_grace_s
        return super()._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<gpuworkbench Live dashboard of trace {self.trace.id}: {self.spans_streamed} spans streamed, {state}>"

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        next_poll = time.monotonic()
        while True:
            # Polls start at least a period apart, and never sooner than a push may follow the last one.
            delay = max(next_poll, self._last_push + self._min_gap) - time.monotonic()
            if self._stop.wait(max(delay, 0.0)):
                return
            now = time.monotonic()
            next_poll = now + period
            if now < self._hold_until:
                continue
            try:
                cpu = time.thread_time()
                self._tick()
                self.cpu_s += time.thread_time() - cpu
            except Exception as exc:  # noqa: BLE001 - a broken tick must show in the widget, not kill the thread
                message = f"{type(exc).__name__}: {exc}"
                if len(self.errors) < 20:
                    self.errors.append(message)
                self._numbers.value = f"<b>live dashboard error</b>: {html.escape(message)}"

    def _tick(self, final: bool = False) -> None:
        """Stream the spans that arrived since the last tick and, when due, refresh the numbers and the gauge."""
        if final:  # keep the rate limit for the last push too
            time.sleep(max(self._last_push + self._min_gap - time.monotonic(), 0.0))
        now = time.monotonic()
        if now - self._last_push < self._min_gap:
            return
        summary_due = final or now - self._summary_at >= 1.0 / self.summary_hz
        version = self.trace.version
        if version == self._version and not summary_due:
            return
        sent = False
        with self._doc_lock:
            if version != self._version:
                self._version = version
                sent = self._stream_new_spans()
            if summary_due:
                self._summary_at = now
                sent = self._refresh_numbers(now) or sent
        if sent:
            self.pushes += 1
            self._last_push = now
            self._push_times.append(now)

    def _stream_new_spans(self) -> bool:
        new, self._cursor = self.trace.delta(self._cursor)
        n = len(new["kind"])
        if n == 0:
            return False
        if self._t0_ns is None:
            self._t0_ns = int(self.trace.started_ns) or int(new["start_ns"].min())
        self._rows.device_names = device_names(self.trace)
        self._rows.stream_labels = self.trace.stream_labels
        self._rows.limits = limits_of(self.trace.devices)
        if self._rows.add_table(new):
            self._figure.y_range.factors = self._rows.factors
            self._figure.height = self._rows.height(26)
        self.source.stream(span_columns(new, self._rows, self._t0_ns), rollover=self.rollover)
        self.spans_streamed += n
        keep = self.summary_spans
        self._retained = {col: np.concatenate([self._retained[col], new[col]])[-keep:] for col in COLUMNS}
        return True

    def _refresh_numbers(self, now: float) -> bool:
        elapsed = now - self._rate_since
        rate = (self._cursor - self._summary_cursor) / elapsed if elapsed > 0 else 0.0
        self._rate_since = now
        self._summary_cursor = self._cursor
        text = self._numbers_html(rate)
        changed = text != self._numbers.value
        if changed:
            self._numbers.value = text
        return self._refresh_gauge() or changed

    def _numbers_html(self, rate: float) -> str:
        shown = len(self._retained["kind"])
        head = (
            f"<b>{self.spans_streamed:,}</b> spans · <b>{rate:,.0f}</b> spans/s · numbers over the "
            f"{'newest ' if self.spans_streamed > shown else ''}{shown:,} spans"
        )
        if self.trace.stats.dropped:
            head += f" · {self.trace.stats.dropped:,} dropped by the trace's ring"
        if shown == 0:
            return f"<div class='gpuworkbench-live'>{head}{self._counters_html()}</div>"
        summary = summarize(self._retained)
        names = device_names(self.trace)
        rows = []
        for device, ds in sorted(summary.devices.items()):
            efficiency = "n/a" if ds.pipeline_efficiency is None else f"{ds.pipeline_efficiency:.2f}"
            states = ", ".join(
                f"{state} {100 * ns / ds.window_ns:.0f} %" for state, ns in ds.states.items() if ns and ds.window_ns
            )
            rows.append(
                f"<tr><th style='text-align:left'>{html.escape(names.get(device, f'device {device}'))}</th>"
                f"<td>overlap {percent(ds.overlap_pct)}</td><td>idle {percent(ds.idle_pct)}</td>"
                f"<td>pipeline efficiency {efficiency}</td><td>{html.escape(states)}</td></tr>"
            )
        return f"<div class='gpuworkbench-live'>{head}<table>{''.join(rows)}</table>{self._counters_html()}</div>"

    def _counters_html(self) -> str:
        """The newest sample of each counter, per device ("" for a trace without counters)."""
        if not getattr(self.trace, "counting", False):
            return ""
        table = self.trace.counters(since=self._counter_cursor)  # only what came since the last refresh
        self._counter_cursor += len(table["time_ns"])
        newest = self._newest_counters
        for device, name, unit, value in zip(*(table[c].tolist() for c in ("device", "name", "unit", "value"))):
            newest.setdefault(device, {})[name] = counter_value(value, unit)  # rows are in time order: the last wins
        if not newest:
            return "<div><i>counters: no sample yet</i></div>"
        names = device_names(self.trace)
        rows = [
            f"<tr><th style='text-align:left'>{html.escape('host' if device < 0 else names.get(device, str(device)))}"
            f"</th><td>{html.escape(' · '.join(f'{n} {v}' for n, v in values.items()))}</td></tr>"
            for device, values in sorted(newest.items())
        ]
        return f"<table class='gpuworkbench-live-counters'>{''.join(rows)}</table>"

    def _refresh_gauge(self) -> bool:
        held, total, used = self._memory()
        self._peak_held = max(self._peak_held, held)
        scale = total if total > 0 else max(self._peak_held, used, 1)
        value = min(held / scale, 1.0)
        text = f"held {decimal_bytes(held)}"
        if total > 0:
            text += f" of {decimal_bytes(total)}"
        if used >= 0:
            text += f" · device used {decimal_bytes(used)}"
        changed = text != self._gauge_text.value
        if changed:
            self._gauge.value = value
            self._gauge_text.value = text
        return changed

    def _memory(self) -> tuple[int, int, int]:
        """(held, total, used) bytes: total is 0 and used -1 where unknown."""
        if self.device is not None:
            free, total = self.device.memory_info()
            return int(self.device.held_bytes), int(total), int(total - free)
        memory: Mapping[str, np.ndarray] = self.trace.memory_table()
        if len(memory["device"]) == 0:
            return 0, 0, -1
        held = used = 0
        for device in np.unique(memory["device"]):
            last = np.flatnonzero(memory["device"] == device)[-1]  # samples are in time order
            held += int(memory["held_bytes"][last])
            device_used = int(memory["used_bytes"][last])
            used = -1 if used < 0 or device_used < 0 else used + device_used
        return held, 0, used


def live(trace: Any = None, device: Any = None, counters: bool = False, **options: Any) -> Live:
    """A live dashboard of ``trace``, or of a new trace it starts (and stops on ``stop()``) when none is given;
    ``counters``: that trace samples counters, whose newest values the dashboard shows (as it does for a given trace
    recorded with ``counters=True``).

    Starting a dashboard with its own trace stops earlier such dashboards, so re-running a cell leaves one recording.
    """
    owns = trace is None
    if not isinstance(counters, bool):
        raise InvalidArgument(f"counters is True or False, not {counters!r}")
    if counters and not owns and not getattr(trace, "counting", False):
        raise InvalidArgument(
            "counters=True starts a trace that samples counters; the trace given was recorded "
            "without them: pass gw.trace(counters=True) instead"
        )
    if owns:
        from gpuworkbench.trace.recorder import Trace

        for old in list(_RUNNING):
            if old.owns_trace:
                old.stop()
        trace = Trace(capacity=options.pop("capacity", 250_000), counters=counters).start()
    return Live(trace, device, owns_trace=owns, **options)
