"""Tests of the kernel end of the JupyterLab panel (notebook/comm.py) with fake comms: checks, versions, replies,
pushes."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.notebook import comm, history

pytest.importorskip("IPython")  # the notebook side needs it


class FakeComm:
    """A comm as ipykernel hands it over: records what the kernel sends, lets a test play the front end."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = fail
        self._on_msg: Any = None
        self._on_close: Any = None

    def send(self, data: Any) -> None:
        if self.fail:
            raise OSError("the front end went away")
        json.dumps(data, allow_nan=False)  # what goes over the wire must be strict JSON
        self.sent.append(data)

    def on_msg(self, callback: Any) -> None:
        self._on_msg = callback

    def on_close(self, callback: Any) -> None:
        self._on_close = callback

    def receive(self, data: Any) -> None:
        """The front end sends ``data``."""
        self._on_msg({"content": {"comm_id": "c", "data": data}})

    def close_from_front_end(self) -> None:
        self._on_close({"content": {"comm_id": "c", "data": {}}})

    def replies(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == "reply"]


class FakeEvents:
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Any]] = {}

    def register(self, event: str, callback: Any) -> None:
        self.callbacks.setdefault(event, []).append(callback)


def fake_shell(live: Any = None) -> SimpleNamespace:
    """Enough of a kernel's InteractiveShell for the server: a kernel, the magics registry, events."""
    registry = {"GpuMagics": SimpleNamespace(live=live, device=None)}
    return SimpleNamespace(kernel=object(), magics_manager=SimpleNamespace(registry=registry), events=FakeEvents())


def request(request_id: Any = 1, method: str = "state", **params: Any) -> dict[str, Any]:
    return {"v": comm.PROTOCOL_VERSION, "type": "request", "id": request_id, "method": method, "params": params}


@pytest.fixture
def server():
    """A server without its sampling thread: the tests call sample_memory themselves, so counts are exact."""
    srv = comm.PanelServer(fake_shell(), interval_s=None)
    yield srv
    srv.close()
    history.history.clear()


@pytest.fixture
def panel(server: comm.PanelServer) -> FakeComm:
    """A front end that opened its comm with a state request (so it is subscribed)."""
    front = FakeComm()
    server.on_open(front, {"content": {"comm_id": "c", "data": request(0)}})
    return front


def traced_upload(n: int) -> gw.Trace:
    """A finished trace of one upload of ``n`` floats on the CPU backend."""
    dev = gw.Device("cpu")
    with gw.trace() as trace:
        buf = dev.alloc(n)
        buf.copy_from_host(np.ones(n, np.float32))
        buf.free()
    trace.wait_pending()
    return trace


@pytest.fixture
def record() -> history.TraceRecord:
    """A traced upload on the CPU backend, kept in history.history as %%gpu would keep it."""
    trace = traced_upload(1024)
    rec = history.TraceRecord(
        7, time.time(), 0.0125, (trace.started_ns, trace.stopped_ns), 42.0, float("nan"), None, trace, name="upload"
    )
    history.history.append(rec)
    return rec


# ---------------------------------------------------------------------- message checks
def test_parse_message_accepts_a_request() -> None:
    parsed = comm.parse_message(request(3, "timeline", trace=5))
    assert parsed == comm.Request(3, "timeline", {"trace": 5})
    assert comm.parse_message({"v": 1, "type": "request", "id": "a", "method": "state"}).params == {}


@pytest.mark.parametrize(
    "data",
    [
        None,
        42,
        "state",
        [1, 2],
        {"type": "request", "id": 1, "method": "state"},  # no version
        {"v": 2, "type": "request", "id": 1, "method": "state"},  # a newer protocol
        {"v": "1", "type": "request", "id": 1, "method": "state"},
        {"v": True, "type": "request", "id": 1, "method": "state"},
        {"v": 1, "type": "subscribe", "id": 1},  # unknown type
        {"v": 1, "id": 1, "method": "state"},  # no type
        {"v": 1, "type": "request", "method": "state"},  # no id
        {"v": 1, "type": "request", "id": True, "method": "state"},
        {"v": 1, "type": "request", "id": 1.5, "method": "state"},
        {"v": 1, "type": "request", "id": 1, "method": 7},
        {"v": 1, "type": "request", "id": 1, "method": "state", "params": [1]},
    ],
)
def test_parse_message_ignores_malformed_with_a_warning(data: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuworkbench.notebook.comm"):
        assert comm.parse_message(data) is None
    assert len(caplog.records) == 1 and "ignoring" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    ("req", "problem"),
    [
        (comm.Request(1, "zap"), "unknown method 'zap'"),
        (comm.Request(1, "timeline"), "'trace' is required"),
        (comm.Request(1, "timeline", {"trace": "3"}), "must be an int"),
        (comm.Request(1, "timeline", {"trace": True}), "must be an int"),
        (comm.Request(1, "timeline", {"trace": 3, "dark": "yes"}), "'dark' must be true or false"),
        (comm.Request(1, "timeline", {"trace": 3, "compare": "2"}), "'compare' must be an int"),
        (comm.Request(1, "export", {"path": ""}), "'path' must be a non-empty string"),
        (comm.Request(1, "state", {"verbose": True}), "unknown parameter(s) 'verbose'"),
    ],
)
def test_check_params_says_what_is_wrong(req: comm.Request, problem: str) -> None:
    assert problem in comm.check_params(req)


def test_check_params_accepts_valid_requests() -> None:
    assert comm.check_params(comm.Request(1, "state")) is None
    assert comm.check_params(comm.Request(1, "timeline", {"trace": 2, "dark": True})) is None
    assert comm.check_params(comm.Request(1, "export", {"trace": None, "path": None})) is None


# ---------------------------------------------------------------------- requests and replies
def test_state_request_in_the_open_message_is_answered(panel: FakeComm) -> None:
    (reply,) = panel.sent
    assert reply["v"] == comm.PROTOCOL_VERSION and reply["type"] == "reply" and reply["id"] == 0 and reply["ok"]
    state = reply["result"]
    assert state["type"] == "state" and state["version"] == gw.__version__
    assert state["traces"] == [] and state["live"] is False
    cpu = next(d for d in state["devices"] if d["id"] == "cpu:0")
    assert cpu["backend"] == "cpu" and cpu["is_gpu"] is False and cpu["total"] > 0


def test_malformed_and_unknown_messages_are_ignored_with_a_warning(
    server: comm.PanelServer, caplog: pytest.LogCaptureFixture
) -> None:
    front = FakeComm()
    server.attach(front)
    with caplog.at_level(logging.WARNING, logger="gpuworkbench.notebook.comm"):
        for data in (None, "hi", {"v": 99, "type": "request", "id": 1, "method": "state"}, {"v": 1, "type": "?"}):
            front.receive(data)
    assert front.sent == []  # nothing answered, nothing raised
    assert len(caplog.records) == 4
    assert server.subscribers == []  # only a valid request subscribes a comm


def test_unknown_method_is_refused_in_the_reply(panel: FakeComm, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuworkbench.notebook.comm"):
        panel.receive(request(5, "reboot"))
        panel.receive(request(6, "timeline", trace="latest"))
    refused = panel.replies()[-2:]
    assert [r["id"] for r in refused] == [5, 6] and not any(r["ok"] for r in refused)
    assert "unknown method 'reboot'" in refused[0]["error"] and "'trace' must be an int" in refused[1]["error"]
    assert len(caplog.records) == 2


def test_requests_about_traces_before_any_trace_say_so(panel: FakeComm) -> None:
    panel.receive(request(2, "timeline", trace=1))
    panel.receive(request(3, "export"))
    for reply in panel.replies()[-2:]:
        assert not reply["ok"] and "no trace yet" in reply["error"]


def test_trace_entry_is_plain_json_without_nan(record: history.TraceRecord) -> None:
    entry = comm.trace_entry(record)
    assert entry["id"] == record.trace.id and entry["cell"] == 7 and entry["name"] == "upload"
    assert entry["overlap_pct"] == 42.0 and entry["efficiency"] is None and entry["idle_pct"] is None
    assert entry["wall_s"] == pytest.approx(0.0125) and entry["spans"] >= 1 and entry["error"] is None
    assert entry["counters"] == []  # recorded without counters
    json.dumps(entry, allow_nan=False)


def test_export_writes_the_chrome_trace_and_replies_with_its_path(panel: FakeComm, record, tmp_path) -> None:
    target = tmp_path / "out" / "run.json"
    target.parent.mkdir()
    panel.receive(request(4, "export", trace=record.trace.id, path=str(target)))
    reply = panel.replies()[-1]
    assert reply["ok"], reply
    assert reply["result"] == {"trace": record.trace.id, "path": str(target)}
    assert json.loads(target.read_text())["traceEvents"]


def test_export_without_trace_takes_the_last_one_into_the_working_directory(panel, record, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    panel.receive(request(4, "export"))
    result = panel.replies()[-1]["result"]
    assert result["path"] == str(tmp_path / f"gpuworkbench-upload-{record.trace.id}.json")
    assert (tmp_path / f"gpuworkbench-upload-{record.trace.id}.json").exists()


def test_unknown_trace_id_is_refused(panel: FakeComm, record) -> None:
    panel.receive(request(8, "timeline", trace=record.trace.id + 1000))
    reply = panel.replies()[-1]
    assert not reply["ok"] and "no longer in this kernel's history" in reply["error"]


def test_timeline_reply_is_a_standalone_page(panel: FakeComm, record) -> None:
    pytest.importorskip("bokeh")
    panel.receive(request(9, "timeline", trace=record.trace.id))
    reply = panel.replies()[-1]
    assert reply["ok"], reply
    result = reply["result"]
    assert result["trace"] == record.trace.id and result["title"] == "cell [7] upload"
    page = result["html"]
    assert page.lstrip().startswith("<!DOCTYPE html>") and "cdn.bokeh.org" not in page  # BokehJS inline: offline
    assert "BEGIN bokeh.min.js" in page
    panel.receive(request(10, "timeline", trace=record.trace.id, dark=True))
    dark = panel.replies()[-1]["result"]["html"]
    assert comm.DARK_PAGE in dark[: dark.index("<script")]  # in the page's own head


def test_timeline_page_holds_the_statistics_and_compare_gives_both_traces(panel: FakeComm, record) -> None:
    pytest.importorskip("bokeh")
    panel.receive(request(12, "timeline", trace=record.trace.id))
    page = panel.replies()[-1]["result"]["html"]
    assert "gpuworkbench-statistics" in page and "copies and memsets" in page
    later = traced_upload(2048)
    after = history.TraceRecord(8, time.time(), 0.02, (later.started_ns, later.stopped_ns), 40.0, 1.0, None, later)
    history.history.append(after)
    panel.receive(request(13, "timeline", trace=later.id, compare=record.trace.id))
    reply = panel.replies()[-1]
    assert reply["ok"], reply
    assert reply["result"]["title"] == "cell [7] upload → cell [8]"
    page = reply["result"]["html"]
    assert "gpuworkbench-comparison" in page and "wall time" in page and "BEGIN bokeh.min.js" in page
    panel.receive(request(14, "timeline", trace=later.id, compare=later.id + 1000))
    assert "no longer in this kernel's history" in panel.replies()[-1]["error"]


def test_a_failing_request_becomes_an_error_reply(panel: FakeComm, record, monkeypatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(record.trace), "to_chrome_trace", broken)
    panel.receive(request(11, "export"))
    reply = panel.replies()[-1]
    assert not reply["ok"] and reply["error"] == "RuntimeError: disk full"


# ---------------------------------------------------------------------- pushes
def test_state_is_pushed_after_a_cell_that_captured_a_trace(server: comm.PanelServer, panel: FakeComm) -> None:
    server.after_cell()
    assert len(panel.sent) == 1  # nothing changed since the state request: nothing pushed
    dev = gw.Device("cpu")
    with gw.trace() as trace:
        dev.alloc(16).free()
    history.history.append(history.TraceRecord(3, time.time(), 0.001, (0, 1), None, None, None, trace))
    server.after_cell()
    pushed = panel.sent[-1]
    assert pushed["type"] == "state" and [t["id"] for t in pushed["traces"]] == [trace.id]
    server.after_cell()
    assert panel.sent[-1] is pushed  # the same state is not pushed twice


def test_a_counters_cell_pushes_its_counter_summary(server: comm.PanelServer, panel: FakeComm, shell) -> None:
    """A ``%%gpu --counters`` cell on the CPU backend: the state pushed after it carries, per device, each counter's
    mean and peak and what sampled it; the summary is made once per trace, not at every push."""
    cell = "b = gw.Device('cpu').alloc(1 << 16)\nb.copy_from_host(np.ones(1 << 16, np.float32))\ntime.sleep(0.3)\n"
    shell.run_cell("import time\nimport numpy as np\nimport gpuworkbench as gw")
    shell.run_cell_magic("gpu", "--no-show --counters -o counted", cell)
    server.after_cell()
    (entry,) = panel.sent[-1]["traces"]
    trace = shell.user_ns["counted"]
    assert panel.sent[-1]["type"] == "state" and entry["id"] == trace.id
    host, cpu = entry["counters"]
    assert host["device"] == "host" and host["sampler"] == "psutil, 10 Hz"
    names = [c["name"] for c in host["counters"]]
    assert names == ["host CPU", "process CPU", "host memory used", "process RSS"]
    cpu_share = host["counters"][0]
    assert cpu_share["unit"] == "% of all cores" and 0 <= cpu_share["mean"] <= cpu_share["peak"] <= 100
    assert cpu_share["text"].startswith("host CPU ") and "% of all cores (peak " in cpu_share["text"]
    assert host["counters"][3]["unit"] in ("MiB", "GiB") and host["counters"][3]["samples"] >= 2
    assert cpu["device"] == "cpu:0" and cpu["counters"] == []  # the CPU backend's counters are the host's
    assert cpu["source"] == trace.counter_sources["cpu:0"] and cpu["sampler"] == "the host's counters"
    assert comm.trace_entry(history.history[-1])["counters"] is entry["counters"]  # kept, not made again
    shell.run_cell("b.free()")


def test_live_dashboard_state_is_pushed() -> None:
    shell = fake_shell(live=SimpleNamespace(running=True))
    srv = comm.PanelServer(shell, interval_s=None)
    front = FakeComm()
    srv.on_open(front, {"content": {"data": request(1)}})
    assert front.sent[0]["result"]["live"] is True
    shell.magics_manager.registry["GpuMagics"].live = None
    srv.after_cell()
    assert front.sent[-1]["type"] == "state" and front.sent[-1]["live"] is False
    srv.close()


def test_memory_is_pushed_only_when_it_changes(server: comm.PanelServer, panel: FakeComm) -> None:
    dev = gw.Device("cpu")
    server.sample_memory()  # the first sample always goes out
    first = panel.sent[-1]
    assert first["type"] == "memory" and any(d["id"] == "cpu:0" and d["open"] for d in first["devices"])
    assert server.sample_memory() is False
    buf = dev.alloc(1 << 20)
    try:
        assert server.sample_memory() is True
        cpu = next(d for d in panel.sent[-1]["devices"] if d["id"] == "cpu:0")
        assert cpu["used"] >= 1 << 20 and cpu["used_known"] is True
    finally:
        buf.free()


def test_memory_thread_samples_at_most_twice_a_second_and_stops_without_subscribers() -> None:
    srv = comm.PanelServer(fake_shell(), interval_s=0.01)
    assert srv.interval_s == comm.MEMORY_INTERVAL_S == 0.5
    gw.Device("cpu")
    front = FakeComm()
    srv.on_open(front, {"content": {"data": request(1)}})
    deadline = time.monotonic() + 3
    while not any(m["type"] == "memory" for m in front.sent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(m["type"] == "memory" for m in front.sent)
    front.close_from_front_end()
    srv._thread.join(timeout=2)
    assert not srv._thread.is_alive()
    srv.close()


def test_a_closed_comm_gets_nothing_more(server: comm.PanelServer, panel: FakeComm, record) -> None:
    panel.close_from_front_end()
    count = len(panel.sent)
    server.after_cell()
    server.sample_memory()
    assert len(panel.sent) == count and server.subscribers == []


def test_a_comm_that_fails_to_send_is_dropped(server: comm.PanelServer, caplog) -> None:
    front = FakeComm()
    server.on_open(front, {"content": {"data": request(1)}})
    front.fail = True
    with caplog.at_level(logging.WARNING, logger="gpuworkbench.notebook.comm"):
        server.sample_memory()
    assert server.subscribers == [] and "dropping the comm" in caplog.text


def test_the_announcing_comm_gets_pushes_without_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A panel's first request waits for running cells; the comm %load_ext opened is pushed to meanwhile."""
    opened: list[FakeComm] = []
    srv = comm.PanelServer(
        fake_shell(), open_comm=lambda **kw: opened.append(FakeComm()) or opened[-1], interval_s=None
    )
    probed: list[bool] = []
    real_devices = comm.devices
    monkeypatch.setattr(comm, "devices", lambda: probed.append(True) or real_devices())
    front = srv.announce()
    assert srv.subscribers == [front]
    gw.Device("cpu")
    srv.after_cell()  # what the %load_ext cell's post_run_cell does
    state = front.sent[-1]
    assert state["type"] == "state" and "cpu:0" in [d["id"] for d in state["devices"]]
    assert all(d["open"] for d in state["devices"])  # the open devices only
    assert probed == []  # no backend probed inside a user's cell
    front.receive(request(1))  # the panel's request, answered once the cells ended: the whole list
    assert probed == [True] and len(front.replies()[-1]["result"]["devices"]) >= 1
    srv.close()


# ---------------------------------------------------------------------- registration
def test_register_is_a_no_op_outside_a_kernel() -> None:
    assert comm.register(SimpleNamespace(kernel=None)) is None


def test_register_serves_the_target_hooks_cells_and_announces(monkeypatch: pytest.MonkeyPatch) -> None:
    import comm as comm_package

    targets: dict[str, Any] = {}
    opened: list[FakeComm] = []

    def create_comm(target_name: str, data: Any) -> FakeComm:
        front = FakeComm()
        front.opened = (target_name, data)
        opened.append(front)
        return front

    monkeypatch.setattr(comm_package, "create_comm", create_comm)
    monkeypatch.setattr(comm_package, "get_comm_manager", lambda: SimpleNamespace(register_target=targets.__setitem__))
    monkeypatch.setattr(comm, "_server", None)
    shell = fake_shell()
    srv = comm.register(shell)
    try:
        assert targets == {comm.TARGET: srv.on_open}
        assert shell.events.callbacks["post_run_cell"] == [srv.after_cell]
        assert opened[0].opened == (comm.TARGET, {"v": 1, "type": "hello", "version": gw.__version__})
        assert comm.register(shell) is srv and len(opened) == 2  # %reload_ext: announced again, hooked once
        assert len(shell.events.callbacks["post_run_cell"]) == 1
    finally:
        srv.close()


def test_timeline_page_of_a_trace_with_lines_shows_the_source_view(panel: FakeComm) -> None:
    pytest.importorskip("bokeh")
    import linecache

    source = "buf = dev.alloc(256)\nbuf.copy_from_host(np.ones(256, np.float32))\n"
    linecache.cache["<panel cell>"] = (len(source), None, source.splitlines(True), "<panel cell>")
    env = {"dev": gw.Device("cpu"), "np": np}
    with gw.trace(lines=True) as trace:
        trace.lines.set_focus("<panel cell>")
        exec(compile(source, "<panel cell>", "exec"), env)
    trace.wait_pending()
    rec = history.TraceRecord(9, time.time(), 0.01, (trace.started_ns, trace.stopped_ns), 1.0, 1.0, None, trace)
    history.history.append(rec)
    panel.receive(request(15, "timeline", trace=trace.id))
    page = panel.replies()[-1]["result"]["html"]
    assert "source view" in page and "device time by source line" in page
    assert "buf.copy_from_host(np.ones(256, np.float32))" in page
    env["buf"].free()
