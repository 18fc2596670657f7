"""A trace's source lines survive ``to_chrome_trace`` and ``load_trace``: each span keeps its line, and a loaded
trace shows the line's text without the file it came from."""

from __future__ import annotations

import linecache

import numpy as np

import gpuworkbench as gw

CELL = "<export cell>"
SOURCE = "a = dev.alloc(256, 'float32')\na.copy_from_host(host)\nfor _ in range(2):\n    a.copy_from_host(host)\n"


def test_lines_go_out_with_the_file_and_come_back(tmp_path) -> None:
    linecache.cache[CELL] = (len(SOURCE), None, SOURCE.splitlines(True), CELL)
    env = {"dev": gw.Device("cpu"), "host": np.ones(256, np.float32)}
    with gw.trace(lines=True) as t:
        t.lines.set_focus(CELL)
        exec(compile(SOURCE, CELL, "exec"), env)
    t.wait_pending()
    path = tmp_path / "lined.json.gz"
    doc = t.to_chrome_trace(str(path))
    assert len(doc["gpuworkbench"]["locations"]) == len(t.locations)
    before = t.statistics().lines
    del linecache.cache[CELL]  # elsewhere: the cell's text is not to be had but from the file
    after = gw.load_trace(path).statistics().lines
    rows = lambda s: sorted(zip(s["line"].tolist(), s["source"].tolist(), s["ops"].tolist()))  # noqa: E731
    assert rows(after) == rows(before) == [(2, "a.copy_from_host(host)", 1), (4, "a.copy_from_host(host)", 2)]
    env["a"].free()
