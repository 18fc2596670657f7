"""Which line did that: every op of a traced cell carries the line that issued it (CPU backend; CUDA on the GPU)."""

from __future__ import annotations

import ctypes
import linecache
import os
import re
import struct
import sys
import threading

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench.trace import lines as lines_mod
from gpuworkbench.trace.call_watch import CallWatch
from gpuworkbench.trace.cupti.sites import KEEP, SLACK_NS, CallSites
from gpuworkbench.trace.lines import Location, SourceLines

CELL = """\
small = dev.alloc(1 << 10, "float32")
big = dev.alloc(1 << 18, "float32")
small.copy_from_host(np.ones(1 << 10, np.float32))
for _ in range(3):
    big.copy_from_host(np.ones(1 << 18, np.float32))
out = big.copy_to_host()
"""


@pytest.fixture
def cell_shell(shell):
    """The IPython shell, with the names these cells make taken out of its namespace afterwards (their buffers
    freed): the shell is one instance for the whole test run."""
    before = set(shell.user_ns)
    yield shell
    for name in set(shell.user_ns) - before:
        shell.user_ns.pop(name, None)


def work_locations(trace) -> list:
    """The locations of the trace's device work (kernels, copies, memsets), in the order the spans arrived: a trace
    may hold more locations than its ops use (a watch of Python's monitoring interns every line it sees)."""
    table = trace.table()
    work = np.isin(table["kind"], [0, 1, 2, 3, 4])
    return [trace.locations[i] for i in table["loc"][work].tolist() if i >= 0]


def _by_line(trace) -> dict[int, tuple[int, int]]:
    """line -> (ops, bytes) of the device work charged to it."""
    table = trace.table()
    out: dict[int, tuple[int, int]] = {}
    work = np.isin(table["kind"], [0, 1, 2, 3, 4])
    for loc, nbytes in zip(table["loc"][work].tolist(), table["bytes"][work].tolist()):
        line = trace.locations[loc].line if loc >= 0 else -1
        ops, total = out.get(line, (0, 0))
        out[line] = (ops + 1, total + nbytes)
    return out


def test_a_cells_ops_are_each_charged_to_their_line(cell_shell) -> None:
    shell = cell_shell
    shell.user_ns.update(dev=gw.Device("cpu"), np=np)
    shell.run_cell(f"%%gpu -o t --no-show\n{CELL}").raise_error()
    t = shell.user_ns["t"]
    assert _by_line(t) == {3: (1, 4 << 10), 5: (3, 3 * (4 << 18)), 6: (1, 4 << 18)}
    cell_file = work_locations(t)[0].file
    assert all(loc.file == cell_file and loc.function == "<module>" for loc in work_locations(t))
    assert re.fullmatch(r"In\[\d+\]", lines_mod.short_file(cell_file))  # as IPython names it in tracebacks
    lines = t.statistics().lines
    rows = {int(n): (int(o), int(c), str(s)) for n, o, c, s in zip(lines["line"], lines["ops"], lines["copies"],
                                                                     lines["source"])}  # fmt: skip
    assert rows[5] == (3, 3, "big.copy_from_host(np.ones(1 << 18, np.float32))")
    assert rows[6] == (1, 1, "out = big.copy_to_host()")
    assert abs(float(np.sum(lines["share_pct"])) - 100.0) < 1e-6
    assert int(np.sum(lines["device_time_ns"])) > 0


def test_a_function_from_an_earlier_cell_is_charged_to_the_calling_line(cell_shell) -> None:
    shell = cell_shell
    shell.user_ns.update(dev=gw.Device("cpu"), np=np)
    shell.run_cell(
        "def fill(buf, n):\n    for _ in range(n):\n        buf.copy_from_host(np.ones(buf.length, np.float32))\n"
    )
    shell.run_cell("b = dev.alloc(256, 'float32')")
    shell.run_cell("%%gpu -o t --no-show\nx = 1\nfill(b, 2)\nfill(b, 1)\n").raise_error()
    t = shell.user_ns["t"]
    assert _by_line(t) == {2: (2, 2048), 3: (1, 1024)}
    site = {(loc.line, loc.site_line, loc.site_function) for loc in work_locations(t)}
    assert site == {(2, 3, "fill"), (3, 3, "fill")}
    assert all(loc.nested and loc.site_file != loc.file for loc in work_locations(t))
    assert "via fill" in str(work_locations(t)[0])


def test_no_lines_leaves_spans_without_a_location(cell_shell) -> None:
    shell = cell_shell
    shell.user_ns.update(dev=gw.Device("cpu"), np=np)
    shell.run_cell(f"%%gpu -o t --no-show --no-lines\n{CELL}").raise_error()
    t = shell.user_ns["t"]
    assert t.lines is None and t.locations == []
    assert (t.table()["loc"] == -1).all()
    assert len(t.statistics().lines["line"]) == 0


def _cell(name: str, source: str):
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    return compile(source, name, "exec")


def test_ops_from_two_threads_get_their_own_threads_lines() -> None:
    dev = gw.Device("cpu")
    a, b = dev.alloc(64, "float32"), dev.alloc(64, "float32")
    host = np.ones(64, np.float32)
    go = threading.Barrier(2)
    work = _cell("<threads>", "def left():\n    go.wait()\n    a.copy_from_host(host)\n    a.copy_from_host(host)\n"
                              "def right():\n    go.wait()\n    b.copy_from_host(host)\n")  # fmt: skip
    env = {"a": a, "b": b, "host": host, "go": go}
    exec(work, env)
    with gw.trace(lines=True) as t:
        threads = [threading.Thread(target=env[f]) for f in ("left", "right")]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    t.wait_pending()
    table = t.table()
    by_function = {(loc.function, loc.line) for loc in (t.locations[i] for i in table["loc"] if i >= 0)}
    assert by_function == {("left", 3), ("left", 4), ("right", 7)}


def test_library_code_is_skipped_and_treat_as_library_moves_the_charge_up(tmp_path, monkeypatch) -> None:
    helper = tmp_path / "helpers_for_lines.py"
    helper.write_text("def upload(buf, host):\n    buf.copy_from_host(host)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import helpers_for_lines

    monkeypatch.setattr(lines_mod, "LIBRARIES", list(lines_mod.LIBRARIES))
    dev = gw.Device("cpu")
    buf, host = dev.alloc(16, "float32"), np.ones(16, np.float32)
    code = _cell("<caller>", "x = 0\nupload(buf, host)\n")
    env = {"upload": helpers_for_lines.upload, "buf": buf, "host": host}
    with gw.trace(lines=True) as t:
        t.lines.set_focus("<other cell>")  # not on the stack: the innermost user frame is the line
        exec(code, env)
    assert [(loc.file, loc.line) for loc in work_locations(t)] == [(str(helper), 2)]
    lines_mod.treat_as_library("helpers_for_lines")
    with gw.trace(lines=True) as t2:
        t2.lines.set_focus("<other cell>")
        exec(code, env)
    assert [(loc.file, loc.line) for loc in work_locations(t2)] == [("<caller>", 2)]
    with pytest.raises(ValueError, match="neither a folder nor an imported module"):
        lines_mod.treat_as_library("no_such_module_here")


def test_work_on_a_thread_without_user_frames_is_charged_to_the_home_threads_line() -> None:
    lines = SourceLines()
    ready, done = threading.Event(), threading.Event()
    seen = []

    def worker() -> None:  # a thread of a library (PyTorch's autograd engine): only library frames
        ready.wait()
        seen.append(lines.here(1))
        done.set()

    lines_mod.LIBRARIES.append(__file__)
    try:
        th = threading.Thread(target=worker)
        th.start()
        code = _cell("<home>", "ready.set()\ndone.wait()\n")
        exec(code, {"ready": ready, "done": done})
        th.join()
    finally:
        lines_mod.LIBRARIES.remove(__file__)
        lines_mod._VERSION[0] += 1
    assert [lines.locations[i] for i in seen] == [Location("<home>", 2, "<module>", "<home>", 2, "<module>")]


def _cbdata(site: int, corr: int):
    """CUpti_CallbackData as CUPTI hands it over: the site (0 entry, 1 exit) first, the correlation id at byte 64."""
    data = ctypes.create_string_buffer(72)
    struct.pack_into("<i", data, 0, site)
    struct.pack_into("<I", data, 64, corr)
    return data


def test_call_sites_log_what_cuptis_callback_reports_and_join_each_call_to_its_threads_last_entry() -> None:
    lines = SourceLines()
    sites = CallSites(lines, bytes([0, 1, 0]))
    data = [_cbdata(0, 41), _cbdata(1, 41), _cbdata(0, 42), _cbdata(0, 43)]
    code = _cell("<sites>", "hook(1, d[0])\nhook(1, d[1])\nhook(2, d[2])\nhook(1, d[3])\n")
    exec(code, {"hook": lambda cbid, data: sites(cbid, data), "d": [ctypes.addressof(x) for x in data]})
    # frame 2 above the hook (the lambda stands for detach._on_api) is the cell: its lines are the sites; the exit
    # (site 1) and the call whose id the work table does not mark (cbid 2) log nothing
    assert sites.calls == 2 and [loc for _, _, loc in sites.log] == [0, 1]
    thread = sites.log[0][0]
    (t0, l0), (t1, l1) = [(t, loc) for _, t, loc in sites.log]
    got = sites.locate(
        np.array([thread, thread, thread, thread + 1]),
        np.array([t0 - 5, t1 - 5, t0 - 20, 0]),
        np.array([t0 + 5, t1 + 5, t0 - 2 * SLACK_NS, t1 + 5]),  # the third ended well before any entry
    )
    home = lines.home & 0xFFFFFFFF
    assert got.tolist()[:3] == [l0, l1, -1]
    assert got[3] == (l1 if home == thread else -1)  # a thread without entries takes the home thread's
    assert [lines.locations[l0].line, lines.locations[l1].line] == [1, 4]


def test_call_sites_skip_calls_made_by_our_own_code() -> None:
    sites = CallSites(SourceLines(), bytes([0, 1]))
    enter = _cbdata(0, 5)
    package = os.path.dirname(gw.__file__)
    ours = compile("hook(1, e)\n", os.path.join(package, "fake_module_for_test.py"), "exec")
    exec(ours, {"hook": lambda cbid, data: sites(cbid, data), "e": ctypes.addressof(enter)})
    assert sites.log == [] and sites.calls == 0


def test_call_sites_join_calls_of_several_threads_and_keep_each_threads_last_entry() -> None:
    lines = SourceLines()
    lines.home = 6
    sites = CallSites(lines)
    ms = 1_000_000
    sites.log += [(5, 10 * ms, 0), (5, 20 * ms, 1), (6, 30 * ms, 2)]  # (thread, time, location)
    early = 2 * SLACK_NS  # thread 6's second and thread 5's last end this long before any entry of their thread
    ends = np.array([11 * ms, 25 * ms, 31 * ms, 30 * ms - early, 32 * ms, 10 * ms - early])
    got = sites.locate(np.array([5, 5, 6, 6, 7, 5]), np.zeros(6, np.int64), ends)
    assert got.tolist() == [0, 1, 2, -1, 2, -1]  # thread 7 has no entry: the home thread's (6) at its time
    for _ in range(KEEP + 1):  # old entries go, each thread's last stays: that is where the thread still is
        sites.locate(np.array([5]), np.zeros(1, np.int64), np.array([50 * ms]))
    assert sites.locate(np.array([5, 6]), np.zeros(2, np.int64), np.array([50, 50]) * ms).tolist() == [1, 2]
    assert sites._time.tolist() == [20 * ms, 30 * ms]
    late = sites.locate(np.array([5, 5]), np.zeros(2, np.int64), np.array([20 * ms - SLACK_NS, 20 * ms - early]))
    assert late.tolist() == [1, -1]  # none before: the first entry within the slack after the call's end, not later


def test_a_trace_started_in_a_cell_charges_the_work_its_lines_call_to_them() -> None:
    dev = gw.Device("cpu")
    env = {"dev": dev, "np": np, "gw": gw}
    exec(_cell("<earlier>", "def upload(buf):\n    buf.copy_from_host(np.ones(buf.length, np.float32))\n"), env)
    cell = "buf = dev.alloc(64, 'float32')\nwith gw.trace(lines=True) as t:\n    upload(buf)\n    upload(buf)\n"
    exec(_cell("<started here>", cell), env)
    t = env["t"]
    t.wait_pending()
    assert t.lines.focus == {"<started here>"}
    assert [(loc.file, loc.line, loc.site_file, loc.site_line) for loc in work_locations(t)] == [
        ("<started here>", 3, "<earlier>", 2),
        ("<started here>", 4, "<earlier>", 2),
    ]


@pytest.mark.skipif(not CallWatch.available(), reason="Python's monitoring (sys.monitoring) needs Python 3.12+")
def test_the_call_watch_logs_each_line_of_user_code_and_each_return_into_it_and_no_library_code() -> None:
    import json

    lines = SourceLines(("<watched>",))
    sites = CallSites(lines)
    watch = CallWatch(lines, sites)
    env = {"json": json}
    exec(_cell("<helper cell>", "def helper(x):\n    return json.dumps(x)\n"), env)
    code = _cell("<watched>", "a = json.dumps([1])\nb = helper({'k': 2}) * 2\nc = len(a) + 1\n")
    assert watch.start(sys._getframe(0))
    tool = watch.tool
    try:
        exec(code, env)
        mine = lines.current.get(threading.get_ident())
    finally:
        watch.stop()
    where = [lines.locations[loc] for _, _, loc in sites.log]
    cell = [(w.line, w.site_file, w.site_line) for w in where if w.file == "<watched>"]
    # line 1; line 2, helper's line (its own line kept as the site), back on line 2 when helper returns (where
    # "* 2" runs); line 3. json's own Python code runs unwatched.
    assert cell == [
        (1, "<watched>", 1), (2, "<watched>", 2), (2, "<helper cell>", 2), (2, "<watched>", 2), (3, "<watched>", 3)
    ]  # fmt: skip
    assert all(w.file in ("<watched>", __file__) for w in where)
    assert lines.locations[mine].file == __file__  # after the cell returned: this test's line that ran it
    assert sys.monitoring.get_tool(tool) is None and not lines.watched  # the tool id is given back
    n = len(sites.log)
    exec(code, env)
    assert len(sites.log) == n  # stopped: nothing more is logged


def test_an_op_reads_the_threads_place_where_a_watch_keeps_it() -> None:
    lines = SourceLines()
    spot = lines.add(Location("<cell>", 7, "<module>", "<cell>", 7, "<module>"))
    lines.current[threading.get_ident()] = spot
    lines.watched = True
    assert lines.here(1) == spot
    lines.watched = False
    assert lines.locations[lines.here(1)].file == __file__  # no watch: the walk finds this test's frame


@pytest.mark.skipif(not CallWatch.available(), reason="Python's monitoring (sys.monitoring) needs Python 3.12+")
def test_the_call_watch_follows_a_focus_set_after_it_started() -> None:
    lines = SourceLines(("<first focus>",))
    sites = CallSites(lines)
    watch = CallWatch(lines, sites)
    code = _cell("<second focus>", "a = 1\nb = a + 1\n")
    assert watch.start(sys._getframe(0))
    try:
        lines.set_focus("<second focus>")
        exec(code, {})
    finally:
        watch.stop()
    where = [lines.locations[loc] for _, _, loc in sites.log]
    cell = [(w.line, w.site_line) for w in where if w.file == "<second focus>"]
    assert cell == [(1, 1), (2, 2)]


def test_a_way_to_find_call_sites_that_is_not_one_is_said(monkeypatch) -> None:
    from gpuworkbench.trace import recorder_cupti

    t = gw.Trace(lines=True)
    t._foreign, t._cupti = object(), object()  # as where CUPTI records other libraries' work
    monkeypatch.setattr(recorder_cupti.CALL_SITES, "by", "monitor")
    t._report_sites()
    assert t._sites is None
    assert t.stats.warnings == [
        "other libraries' work carries no source line: CALL_SITES.by is 'monitor', not 'auto', 'monitoring', "
        "'cupti' or 'off'"
    ]
    monkeypatch.setattr(recorder_cupti.CALL_SITES, "by", "off")
    quiet = gw.Trace(lines=True)
    quiet._foreign, quiet._cupti = object(), object()
    quiet._report_sites()
    assert quiet._sites is None and quiet.stats.warnings == []
