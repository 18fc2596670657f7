"""The kernel end of JupyterLab's GPU Workbench panel: a Jupyter comm carrying devices, traces and timelines.

``%load_ext gpuworkbench`` calls :func:`register`, which listens on the comm target ``gpuworkbench`` (the panel opens
a comm there when it meets a kernel) and opens one comm itself to announce the extension. Going through a comm makes
the panel work wherever the kernel runs (remote kernels, proxies) with no server routes. Every message is a JSON
object ``{"v": 1, "type": ..., ...}``:

front end → kernel   {"v": 1, "type": "request", "id": ID, "method": M, "params": {...}}   ID: int or str
    M = "state"                                    → the state below; the comm then receives pushes
        "timeline" {"trace": N, "dark": bool}      → {"trace": N, "title": str, "html": page with BokehJS inline}
        "export" {"trace": N | null, "path": str | null}   → {"trace": N, "path": absolute path written}
kernel → front end   {"v": 1, "type": "hello", "version": str}                       the announcing comm's open data
                     {"v": 1, "type": "reply", "id": ID, "ok": true, "result": ...}  or "ok": false, "error": str
                     {"v": 1, "type": "state", "version", "devices": [...], "traces": [...], "live": bool}
                         pushed after a cell that changed the traces, the open devices or the live dashboard
                     {"v": 1, "type": "memory", "devices": [...]}   open devices' memory, ≤ 2 Hz, only on change

A device is ``{"id": "cpu:0", "backend", "index", "name", "is_gpu", "open", "current", "used", "total",
"used_known"}`` (``used`` None for a device not opened in this kernel; ``used_known`` False where the backend cannot
tell free memory and ``used`` is what gpuworkbench holds). A trace is ``{"id", "cell", "name", "started", "wall_s",
"overlap_pct", "efficiency", "idle_pct", "spans", "error", "counters"}``; ``counters`` is its counters' summary per
device (``counter_summary.summarize``), [] for a trace recorded without them (a panel takes a trace without the key as
one without counters). A message that is not valid JSON-shaped, has another
``v`` or an unknown ``type`` is ignored with a logged warning; a request naming an unknown method or bad parameters is
answered ``ok: false`` with a warning. Nothing a front end sends can raise in the kernel.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from ..device import Device, auto_spec, devices
from .counter_summary import summarize_trace
from .history import find, history

PROTOCOL_VERSION = 1
TARGET = "gpuworkbench"
#: Seconds between two memory samples; the panel is promised at most 2 Hz.
MEMORY_INTERVAL_S = 0.5
#: The page behind a timeline in Bokeh's dark_minimal theme (its background colour).
DARK_PAGE = "background: #20262b; color: #e0e0e0;"

log = logging.getLogger(__name__)

_server: PanelServer | None = None
#: A stopped trace's counter summary, with the stop time it was made for: every state push lists every trace.
_counter_summaries: weakref.WeakKeyDictionary[Any, tuple[int, list[dict[str, Any]]]] = weakref.WeakKeyDictionary()


@dataclass
class Request:
    """A front end's request, checked: its id, method and parameters."""

    id: int | str
    method: str
    params: dict[str, Any] = field(default_factory=dict)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_message(data: Any) -> Request | None:
    """The request in ``data`` (a comm message's data), or None after a logged warning when it is not one.

    Checks the envelope only (version, type, id, method, params' type); :func:`check_params` checks the rest.
    """
    if not isinstance(data, Mapping):
        log.warning("gpuworkbench comm: ignoring a message that is not an object: %.200r", data)
        return None
    version = data.get("v")
    if not _is_int(version) or version != PROTOCOL_VERSION:
        log.warning(
            "gpuworkbench comm: ignoring a message of protocol version %r (this kernel speaks %d)",
            version,
            PROTOCOL_VERSION,
        )
        return None
    kind = data.get("type")
    if kind != "request":
        log.warning("gpuworkbench comm: ignoring a message of unknown type %.100r", kind)
        return None
    request_id, method, params = data.get("id"), data.get("method"), data.get("params", {})
    if not (_is_int(request_id) or isinstance(request_id, str)):
        log.warning("gpuworkbench comm: ignoring a request whose id is %.100r (want an int or a string)", request_id)
        return None
    if not isinstance(method, str):
        log.warning("gpuworkbench comm: ignoring request %r: method is %.100r, not a string", request_id, method)
        return None
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        log.warning("gpuworkbench comm: ignoring request %r: params is %.100r, not an object", request_id, params)
        return None
    return Request(request_id, method, dict(params))


def _optional(kind: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
    return lambda value: None if value is None or kind(value) else what


METHOD_PARAMS: dict[str, dict[str, tuple[bool, Callable[[Any], str | None]]]] = {
    # method → parameter → (required, check returning what is wrong or None)
    "state": {},
    "timeline": {
        "trace": (True, lambda v: None if _is_int(v) else "an int (a trace id)"),
        "dark": (False, _optional(lambda v: isinstance(v, bool), "true or false")),
        "compare": (False, _optional(_is_int, "an int (the id of the trace to compare with) or null")),
    },
    "export": {
        "trace": (False, _optional(_is_int, "an int (a trace id) or null")),
        "path": (False, _optional(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string or null")),
    },
}


def check_params(request: Request) -> str | None:
    """What is wrong with the request's method or parameters, in one line; None when it can be answered."""
    spec = METHOD_PARAMS.get(request.method)
    if spec is None:
        return f"unknown method {request.method!r} (known: {', '.join(sorted(METHOD_PARAMS))})"
    unknown = sorted(set(request.params) - set(spec))
    if unknown:
        return f"{request.method}: unknown parameter(s) {', '.join(map(repr, unknown))}"
    for name, (required, check) in spec.items():
        if name not in request.params:
            if required:
                return f"{request.method}: parameter {name!r} is required"
            continue
        wrong = check(request.params[name])
        if wrong is not None:
            return f"{request.method}: parameter {name!r} must be {wrong}, not {request.params[name]!r:.100}"
    return None


def _number(value: Any) -> float | None:
    """A finite float, or None: NaN and infinities are not JSON and would break the front end's parser."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def trace_entry(record: Any) -> dict[str, Any]:
    """One ``history.TraceRecord`` as the panel lists it (plain JSON types)."""
    return {
        "id": int(record.trace.id),
        "cell": None if record.execution_count is None else int(record.execution_count),
        "name": record.name or _source_name(record),
        "started": _number(record.started),
        "wall_s": _number(record.wall_s),
        "overlap_pct": _number(record.overlap_pct),
        "efficiency": _number(record.efficiency),
        "idle_pct": _number(record.idle_pct),
        "spans": len(record.trace),
        "error": record.error,
        "counters": counter_summary(record.trace),
    }


def counter_summary(trace: Any) -> list[dict[str, Any]]:
    """The trace's counters per device as the panel shows them (``counter_summary.summarize``), made once per stop
    of the trace; [] without counters, or after a logged warning where they cannot be summarized."""
    if not getattr(trace, "counting", False):
        return []
    kept = _counter_summaries.get(trace)
    if kept is not None and not trace.recording and kept[0] == trace.stopped_ns:
        return kept[1]
    try:
        rows = summarize_trace(trace)
    except Exception as exc:  # noqa: BLE001 - the trace's other figures still reach the panel
        log.warning("gpuworkbench comm: counters of trace %s: %s", getattr(trace, "id", "?"), exc)
        return []
    if not trace.recording:
        _counter_summaries[trace] = (trace.stopped_ns, rows)
    return rows


def device_entry(info: Any, device: Any = None, current: str = "") -> dict[str, Any]:
    """A device as the panel shows it: ``info`` (a DeviceInfo) and, when opened in this kernel, its live memory."""
    spec = f"{info.backend}:{info.index}"
    entry = {
        "id": spec,
        "backend": info.backend,
        "index": int(info.index),
        "name": info.name,
        "is_gpu": bool(info.is_gpu),
        "open": device is not None,
        "current": spec == current,
        "used": None,
        "total": int(info.total_memory) if info.total_memory else None,
        "used_known": False,
    }
    if device is not None:
        try:
            free, total = device.memory_info()
        except Exception as exc:  # a device lost mid-session must not stop the panel's updates
            log.warning("gpuworkbench comm: memory of %s: %s", spec, exc)
        else:
            entry["total"], entry["used"] = int(total), int(total - free)
            entry["used_known"] = bool(device.caps.memory_free_known)
    return entry


class PanelServer:
    """The comms of every panel watching this kernel: answers their requests and pushes state and memory to them.

    One per kernel (see :func:`register`); a comm receives pushes once it has sent a valid request, so a front end
    without the panel never gets a stream of memory samples.
    """

    def __init__(
        self,
        shell: Any,
        open_comm: Callable[..., Any] | None = None,
        interval_s: float | None = MEMORY_INTERVAL_S,
    ) -> None:
        self.shell = shell
        # None: no sampling thread (whoever made the server calls sample_memory); never faster than 2 Hz
        self.interval_s = None if interval_s is None else max(float(interval_s), MEMORY_INTERVAL_S)
        self._open_comm = open_comm
        self._lock = threading.Lock()
        self._comms: dict[int, Any] = {}  # id(comm) → comm: every comm attached and not closed
        self._subscribed: set[int] = set()
        self._catalog: list[Any] | None = None  # devices() found once: probing every backend is not free
        self._current = ""  # the current device's spec, as last probed
        self._last_state: Any = None
        self._last_memory: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ comms
    def announce(self) -> Any:
        """Open a comm to the front end saying the extension is loaded, and push to it from now on.

        A panel's requests wait until the running cells end (they travel on the shell channel), so this comm gets
        pushes without asking: state after each cell, memory while cells run. A front end without the panel closes it.
        """
        if self._open_comm is None:
            return None
        comm = self._open_comm(target_name=TARGET, data={"v": PROTOCOL_VERSION, "type": "hello", "version": _version()})
        self.attach(comm)
        with self._lock:
            self._subscribed.add(id(comm))
        self._ensure_thread()
        return comm

    def on_open(self, comm: Any, message: Mapping[str, Any]) -> None:
        """The comm target's callback: a panel opened ``comm``; its open data may carry a first request."""
        self.attach(comm)
        data = _content_data(message)
        if data:  # an empty open is allowed: the panel may ask later
            self.handle(comm, data)

    def attach(self, comm: Any) -> None:
        """Listen to ``comm``'s messages and forget it when it closes."""
        with self._lock:
            self._comms[id(comm)] = comm
        comm.on_msg(lambda message: self.handle(comm, _content_data(message)))
        comm.on_close(lambda message: self.detach(comm))

    def detach(self, comm: Any) -> None:
        """Stop sending to ``comm`` (it closed); the memory thread ends with the last subscriber."""
        with self._lock:
            self._comms.pop(id(comm), None)
            self._subscribed.discard(id(comm))

    @property
    def subscribers(self) -> list[Any]:
        with self._lock:
            return [self._comms[i] for i in self._subscribed if i in self._comms]

    def handle(self, comm: Any, data: Any) -> None:
        """Answer one message from ``comm``; anything malformed is ignored with a warning, and nothing raises."""
        try:
            request = parse_message(data)
            if request is None:
                return
            problem = check_params(request)
            if problem is not None:
                log.warning("gpuworkbench comm: request %r refused: %s", request.id, problem)
                self._send(comm, {"type": "reply", "id": request.id, "ok": False, "error": problem})
                return
            with self._lock:
                newly = id(comm) in self._comms and id(comm) not in self._subscribed
                if newly:
                    self._subscribed.add(id(comm))
            if newly:
                self._ensure_thread()
            try:
                result = getattr(self, f"_request_{request.method}")(**request.params)
            except Exception as exc:  # the reply says what went wrong instead of a traceback in the kernel
                log.warning("gpuworkbench comm: %s failed: %s", request.method, exc)
                self._send(comm, {"type": "reply", "id": request.id, "ok": False, "error": _describe(exc)})
                return
            self._send(comm, {"type": "reply", "id": request.id, "ok": True, "result": result})
        except Exception:  # a bug here must not take the kernel's comm handling down with it
            log.warning("gpuworkbench comm: could not answer %.200r", data, exc_info=True)

    def _send(self, comm: Any, message: dict[str, Any]) -> None:
        try:
            comm.send({"v": PROTOCOL_VERSION, **message})
        except Exception as exc:  # a comm whose front end went away: forget it
            log.warning("gpuworkbench comm: sending %s failed (%s); dropping the comm", message.get("type"), exc)
            self.detach(comm)

    def _broadcast(self, message: dict[str, Any]) -> None:
        for comm in self.subscribers:
            self._send(comm, message)

    # ------------------------------------------------------------------ requests
    def _request_state(self) -> dict[str, Any]:
        state = self.state()
        self._last_state = _state_key(state)
        return state

    def _request_timeline(self, trace: int, dark: bool | None = None, compare: int | None = None) -> dict[str, Any]:
        record = find(trace)
        title = _trace_title(record)
        if compare is not None:  # "compare with…": the other trace first, then this one, and what changed
            before = find(compare)
            title = f"{_trace_title(before)} → {title}"
            return {"trace": trace, "title": title, "html": compare_html(before, record, title, dark=bool(dark))}
        return {"trace": trace, "title": title, "html": timeline_html(record, title, dark=bool(dark))}

    def _request_export(self, trace: int | None = None, path: str | None = None) -> dict[str, Any]:
        record = find(trace)
        if path is None:
            label = record.name or (f"cell{record.execution_count}" if record.execution_count else "")
            path = f"gpuworkbench-{label or 'trace'}-{record.trace.id}.json"
        target = os.path.abspath(os.path.expanduser(path))
        record.trace.to_chrome_trace(target)
        return {"trace": int(record.trace.id), "path": target}

    # ------------------------------------------------------------------ what the panel shows
    def state(self, probe: bool = True) -> dict[str, Any]:
        """Devices, traces and whether the live dashboard runs: everything the panel shows (``probe``: see devices)."""
        return {
            "type": "state",
            "version": _version(),
            "devices": self.devices(probe),
            "traces": [trace_entry(r) for r in list(history)],
            "live": self._live_running(),
        }

    def devices(self, probe: bool = True) -> list[dict[str, Any]]:
        """Every device found (probed once per kernel), with live memory for those opened in this kernel.

        Without ``probe``, and before a request probed, only the open devices: probing every backend inside a user's
        cell would slow it and could print there.
        """
        if self._catalog is None and not probe:
            current = self._current_spec(probe=False) or self._current
            return [device_entry(dev.info, dev, current) for dev in _open_devices().values()]
        if self._catalog is None:
            try:
                self._catalog = devices()
            except Exception as exc:  # a broken backend must not hide the ones that work
                log.warning("gpuworkbench comm: listing devices failed: %s", exc)
                self._catalog = []
        current = self._current = self._current_spec(probe) or self._current
        opened = _open_devices()
        entries = [
            device_entry(info, opened.pop(f"{info.backend}:{info.index}", None), current) for info in self._catalog
        ]
        entries += [device_entry(dev.info, dev, current) for dev in opened.values()]
        return entries

    def memory(self) -> list[dict[str, Any]]:
        """The open devices' entries (live memory); cheap enough for the sampling thread."""
        current = self._current_spec(probe=False) or self._current
        return [device_entry(dev.info, dev, current) for dev in _open_devices().values()]

    def _magics(self) -> Any:
        manager = getattr(self.shell, "magics_manager", None)
        return getattr(manager, "registry", {}).get("GpuMagics") if manager is not None else None

    def _live_running(self) -> bool:
        live = getattr(self._magics(), "live", None)
        return live is not None and bool(getattr(live, "running", True))

    def _current_spec(self, probe: bool = True) -> str:
        """The device ``%gpu use`` chose, else the one ``gw.Device()`` picks (probing only when ``probe``)."""
        chosen = getattr(self._magics(), "device", None)
        if chosen is not None and not chosen.closed:
            return chosen.spec
        env = os.environ.get("GPUWB_DEVICE", "")
        if env or not probe:
            return env
        try:
            return "{}:{}".format(*auto_spec())
        except Exception:
            return ""

    # ------------------------------------------------------------------ pushes
    def after_cell(self, result: Any = None) -> None:
        """IPython's post_run_cell hook: push the state when the cell captured a trace or changed devices or live."""
        try:
            if not self.subscribers:
                return
            state = self.state(probe=False)
            key = _state_key(state)
            if key != self._last_state:
                self._last_state = key
                self._broadcast(state)
        except Exception:
            log.warning("gpuworkbench comm: pushing the state failed", exc_info=True)

    def sample_memory(self) -> bool:
        """Push the open devices' memory if it changed since the last push; True when it pushed."""
        entries = self.memory()
        key = [(e["id"], e["used"], e["total"]) for e in entries]
        if key == self._last_memory:
            return False
        self._last_memory = key
        self._broadcast({"type": "memory", "devices": entries})
        return True

    def _ensure_thread(self) -> None:
        if self.interval_s is None:
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._last_memory = None
            self._thread = threading.Thread(target=self._sample_loop, name="gpuworkbench-panel", daemon=True)
            self._thread.start()

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s or MEMORY_INTERVAL_S):
            if not self.subscribers:
                return  # the next subscriber starts a new thread
            try:
                self.sample_memory()
            except Exception:
                log.warning("gpuworkbench comm: sampling memory failed", exc_info=True)

    def close(self) -> None:
        """Stop the sampling thread and forget every comm (the comms themselves are left to the kernel)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * (self.interval_s or MEMORY_INTERVAL_S))
        with self._lock:
            self._comms.clear()
            self._subscribed.clear()


def _content_data(message: Any) -> Any:
    """The ``data`` of a comm message (or of a comm_open), None when the message has none."""
    if isinstance(message, Mapping):
        content = message.get("content")
        if isinstance(content, Mapping):
            return content.get("data")
    return None


def _open_devices() -> dict[str, Any]:
    return {dev.spec: dev for dev in Device.open_devices()}


def _state_key(state: Mapping[str, Any]) -> Any:
    """What decides whether a state is news: traces, the set of devices and which are open, live (not memory)."""
    devices = [(d["id"], d["open"], d["current"]) for d in state["devices"]]
    return state["traces"], devices, state["live"]


def _source_name(record: Any) -> str | None:
    """The file name of a trace ``%gpu load`` read (None for a ``%%gpu`` cell's)."""
    source = getattr(record, "source", None)
    return os.path.basename(source) if source else None


def _trace_title(record: Any) -> str:
    where = f"cell [{record.execution_count}]" if record.execution_count is not None else f"trace {record.trace.id}"
    label = record.name or _source_name(record)
    return f"{where} {label}" if label else where


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, (LookupError, ImportError)) else f"{type(exc).__name__}: {text}"


@functools.cache
def _version() -> str:
    """The package's version, as the panel shows it."""
    return __version__


def timeline_html(record: Any, title: str, dark: bool = False) -> str:
    """A standalone page (BokehJS inline, so it works offline) with the trace's source lines (where it recorded them),
    timeline, summary and statistics."""
    from bokeh.models import Div

    figure = record.trace.timeline(title=f"{title}: timeline")
    figure.sizing_mode = "stretch_width"
    parts: list[Any] = [figure]
    if record.trace.locations:  # the cell's lines with their device time, above the timeline (tap one: its spans)
        from ..viz import source_figure

        parts.insert(0, source_figure(record.trace, figure, dark=dark))
    try:
        # a loaded trace is measured over its own work, a cell's over the cell's wall time
        summary = record.trace.summary(window=None if getattr(record, "source", None) else record.window_ns)
        parts.append(Div(text=summary._repr_html_(), sizing_mode="stretch_width"))
    except Exception as exc:  # the timeline alone is still worth showing
        log.warning("gpuworkbench comm: summary of %s: %s", title, exc)
    try:  # kernels by time, copies by direction and host memory, API calls, launch latency
        parts.append(Div(text=record.trace.statistics()._repr_html_(), sizing_mode="stretch_width"))
    except Exception as exc:  # noqa: BLE001 - the timeline and summary are still worth showing
        log.warning("gpuworkbench comm: statistics of %s: %s", title, exc)
    return _page(parts, title, dark)


def compare_html(before: Any, after: Any, title: str, dark: bool = False) -> str:
    """A standalone page with two traces' timelines on one time axis and the table of what changed between them."""
    from bokeh.models import Div

    from ..trace.compare import compare

    labels = (_trace_title(before), _trace_title(after))
    comparison = compare(before.trace, after.trace, labels=labels)
    figure = comparison.figure()
    figure.sizing_mode = "stretch_width"
    return _page([figure, Div(text=comparison._repr_html_(), sizing_mode="stretch_width")], title, dark)


def _page(parts: list[Any], title: str, dark: bool) -> str:
    """``parts`` in one column as a standalone page (BokehJS inline), in Bokeh's dark theme where ``dark``."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.resources import INLINE
    from bokeh.themes import built_in_themes

    layout = column(*parts, sizing_mode="stretch_width")
    if not dark:
        return file_html(layout, INLINE, title=f"gpuworkbench {title}")
    page = file_html(layout, INLINE, title=f"gpuworkbench {title}", theme=built_in_themes["dark_minimal"])
    # The theme colours the plots only; the page and the summary's text follow it here.
    return page.replace("<head>", f"<head><style>html, body {{{DARK_PAGE}}}</style>", 1)  # the first is the page's


def register(ipython: Any) -> PanelServer | None:
    """Serve the panel from this kernel (``%load_ext gpuworkbench``); None outside a Jupyter kernel."""
    global _server
    if getattr(ipython, "kernel", None) is None:
        return None  # terminal IPython or a test shell: no front end to talk to
    from comm import create_comm, get_comm_manager

    if _server is None or _server.shell is not ipython:
        if _server is not None:
            _server.close()
        _server = PanelServer(ipython, open_comm=create_comm)
        get_comm_manager().register_target(TARGET, _server.on_open)
        ipython.events.register("post_run_cell", _server.after_cell)
    _server.announce()
    return _server
