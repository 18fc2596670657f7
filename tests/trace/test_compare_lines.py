"""Tests of trace/compare_lines.py: ``gw.compare(a, b).lines``, device time per source line matched across two runs."""

from __future__ import annotations

import linecache

import numpy as np
import pytest
from support import rows

import gpuworkbench as gw
from gpuworkbench.trace.compare_lines import LINE_CHANGE_COLUMNS
from gpuworkbench.trace.lines import Location
from gpuworkbench.trace.recorder import Trace

# Two runs of a cell: b copies 6 times where a copied twice (same loop line, n changed) and adds a copy above it,
# which moves the loop and the copy back down by one line.
BEFORE = """n = 2
a = dev.alloc(1 << 12, 'float32')
h = np.ones(1 << 12, np.float32)
for _ in range(n): a.copy_from_host(h)
b = a.copy_to_host()
"""
AFTER = """n = 6
a = dev.alloc(1 << 12, 'float32')
h = np.ones(1 << 12, np.float32)
a.copy_from_host(h)
for _ in range(n): a.copy_from_host(h)
b = a.copy_to_host()
"""
LOOP = "for _ in range(n): a.copy_from_host(h)"


def run_cell(device, name: str, source: str, lines: bool = True) -> Trace:
    """``source`` run as a cell named ``name`` under a CPU trace that records its lines."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    with gw.trace(lines=lines) as trace:
        if lines:
            trace.lines.set_focus(name)
        exec(compile(source, name, "exec"), {"dev": device, "np": np})
    trace.wait_pending()
    return trace


@pytest.fixture(scope="module")
def cpu():
    return gw.Device("cpu")


@pytest.fixture(scope="module")
def cells(cpu):
    return run_cell(cpu, "<cell 31>", BEFORE), run_cell(cpu, "<cell 32>", AFTER)


def by_source(table) -> dict[str, dict]:
    return {r["source"]: r for r in rows(table)}


def test_lines_of_two_runs_match_by_text_across_cells_and_moved_lines(cells):
    diff = gw.compare(*cells, labels=("before", "after"))
    assert list(diff.lines.columns) == list(LINE_CHANGE_COLUMNS)
    got = by_source(diff.lines)
    assert set(got) == {LOOP, "b = a.copy_to_host()", "a.copy_from_host(h)"}
    loop, back, added = got[LOOP], got["b = a.copy_to_host()"], got["a.copy_from_host(h)"]
    assert (loop["line_a"], loop["line_b"], loop["ops_a"], loop["ops_b"]) == (4, 5, 2, 6)
    assert (back["line_a"], back["line_b"], back["ops_a"], back["ops_b"]) == (5, 6, 1, 1)
    assert (added["line_a"], added["line_b"], added["ops_a"], added["ops_b"]) == (-1, 4, 0, 1)
    assert added["time_a_ns"] == 0 and added["time_b_ns"] > 0 and added["delta_ns"] == added["time_b_ns"]
    assert np.isnan(added["ratio"])
    for r in got.values():
        assert r["delta_ns"] == r["time_b_ns"] - r["time_a_ns"]
    assert loop["ratio"] == pytest.approx(loop["time_b_ns"] / loop["time_a_ns"])
    # each side's times are that trace's own statistics().lines
    for side, trace in zip("ab", cells):
        stats = {(r["line"], r["device_time_ns"]) for r in rows(trace.statistics().lines)}
        assert stats == {(r[f"line_{side}"], r[f"time_{side}_ns"]) for r in got.values() if r[f"line_{side}"] >= 0}
    deltas = np.abs(np.asarray(diff.lines["delta_ns"]))
    assert (np.diff(deltas) <= 0).all()


def test_text_and_html_show_the_lines_that_changed(cells):
    diff = gw.compare(*cells, labels=("before", "after <fix>"))
    text = str(diff)
    section = text[text.index("lines that changed") :]
    assert section.startswith("lines that changed (3 of 3; 0 the same)")
    assert "line before" in section and "ops after <fix>" in section and LOOP in section
    page = diff._repr_html_()
    assert "lines that changed" in page and "a.copy_to_host()" in page and "line after &lt;fix&gt;" in page


def test_traces_without_lines_give_an_empty_table_and_no_section(cpu, cells):
    plain = run_cell(cpu, "<cell 33>", BEFORE, lines=False), run_cell(cpu, "<cell 34>", AFTER, lines=False)
    for pair in (plain, (cells[0], plain[1]), (plain[0], cells[1])):
        diff = gw.compare(*pair)
        assert len(diff.lines) == 0 and list(diff.lines.columns) == list(LINE_CHANGE_COLUMNS)
        assert "lines that changed" not in str(diff) and "lines that changed" not in diff._repr_html_()
    without, with_lines = str(gw.compare(*plain)).split("\n\n"), str(gw.compare(*cells)).split("\n\n")
    assert len(with_lines) == len(without) + 1 and with_lines[-1].startswith("lines that changed")
    assert [s.split("\n")[0] for s in with_lines[:-1]] == [s.split("\n")[0] for s in without]


# --- hand-built traces: exact times -----------------------------------------------------------------------------------


def located(spans: list[tuple[int, int]], locations: list[Location]) -> Trace:
    """A stopped trace of kernels ``(duration_ns, loc)`` one after another, whose ``loc`` points into ``locations``."""
    records, t = [], 0
    for duration, loc in spans:
        records.append({"kind": "kernel", "stream": 0, "start_ns": t, "end_ns": t + duration, "name": "k", "loc": loc})
        t += duration
    built = Trace.from_records(records)
    return Trace.finished(built.table(), built.devices, built.stream_labels, locations=locations)


def test_equal_lines_match_by_their_place_among_equal_lines():
    a_src = "step()\nx = 1\nstep()\n"
    b_src = "step()\nprep()\nx = 1\nstep()\n"
    for name, src in (("<cell 41>", a_src), ("<cell 42>", b_src)):
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    # a's first step() issued no work: still the first of the two, so a's line 3 is b's line 4
    a = located([(300, 0)], [Location("<cell 41>", 3, "<module>")])
    b_locs = [Location("<cell 42>", n, "<module>") for n in (1, 2, 4)]
    b = located([(150, 0), (40, 1), (200, 2)], b_locs)
    got = [
        (r["source"], r["line_a"], r["line_b"], r["time_a_ns"], r["time_b_ns"], r["delta_ns"])
        for r in rows(gw.compare(a, b).lines)
    ]
    assert got == [
        ("step()", -1, 1, 0, 150, 150),
        ("step()", 3, 4, 300, 200, -100),
        ("prep()", -1, 2, 0, 40, 40),
    ]


def test_loaded_lines_without_file_text_match_by_recorded_text_and_unknown_by_place():
    # files linecache cannot read: the Location's text stands for the line; no text at all: (file, line)
    a = located(
        [(10, 0), (20, 1), (5, -1), (7, 2)],
        [
            Location("/gone/a.py", 7, "f", text="k()"),
            Location("/gone/a.py", 9, "f", text="k()"),
            Location("/x.py", 3, "g"),
        ],
    )
    b = located(
        [(12, 0), (25, 1), (6, -1), (9, 2)],
        [
            Location("/gone/b.py", 8, "f", text="k()"),
            Location("/gone/b.py", 11, "f", text="k()"),
            Location("/x.py", 3, "g"),
        ],
    )
    got = {
        (r["source"], r["line_a"], r["line_b"]): (r["time_a_ns"], r["time_b_ns"]) for r in rows(gw.compare(a, b).lines)
    }
    assert got == {("k()", 7, 8): (10, 12), ("k()", 9, 11): (20, 25), ("(unknown)", 0, 0): (5, 6), ("", 3, 3): (7, 9)}
    assert "(line 3: text unknown)" in str(gw.compare(a, b))


def test_without_pandas_lines_is_a_dict_of_numpy_columns(monkeypatch: pytest.MonkeyPatch):
    import sys

    a = located([(10, 0)], [Location("/gone/a.py", 1, "f", text="k()")])
    monkeypatch.setitem(sys.modules, "pandas", None)
    lines = gw.compare(a, a).lines
    assert isinstance(lines, dict) and tuple(lines) == LINE_CHANGE_COLUMNS
    assert lines["delta_ns"].tolist() == [0] and lines["ratio"].tolist() == [1.0]
    assert "lines that changed (0 of 1; 1 the same)" in str(gw.compare(a, a))
