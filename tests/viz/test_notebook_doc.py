"""The notebook publication of a trace's layout: the document Bokeh's own ``notebook_content`` writes, and a kept
layout refilled by a later trace (``viz/reuse.py``) equal to that trace's layout built afresh."""

from __future__ import annotations

import json
import linecache
import re

import numpy as np
import pytest

import gpuworkbench as gw

pytest.importorskip("bokeh")

from bokeh.embed.notebook import notebook_content  # noqa: E402

from gpuworkbench.viz import reuse, trace_layout  # noqa: E402
from gpuworkbench.viz.notebook_doc import notebook_bundle  # noqa: E402


def traced(cell: str, steps: int, size: int) -> gw.Trace:
    """A CPU trace with lines of ``steps`` rounds of upload, kernel, download from the cell ``cell``."""
    dev = gw.Device("cpu")
    src = (
        f"x = dev.alloc({size}, 'float32')\nh = np.ones({size}, np.float32)\n"
        f"for _ in range({steps}):\n    x.copy_from_host(h)\n    x.copy_to_host(h)\n"
    )
    linecache.cache[cell] = (len(src), None, src.splitlines(True), cell)
    with gw.trace(lines=True) as t:
        t.lines.set_focus(cell)
        exec(compile(src, cell, "exec"), {"dev": dev, "np": np})
    t.wait_pending()
    return t


def document(script: str) -> dict:
    """The document of a notebook script, its model ids renamed in order of appearance (ids are fresh each time)."""
    found = re.search(r"const docs_json = (.*);\n\s*const render_items = (.*);\n", script)
    assert found is not None
    (doc,) = json.loads(found.group(1)).values()
    ids: dict[str, str] = {}

    def walk(x):
        if isinstance(x, dict):
            return {k: (ids.setdefault(v, f"m{len(ids)}") if k == "id" else walk(v)) for k, v in x.items()}
        return [walk(v) for v in x] if isinstance(x, list) else x

    return walk(doc)


def model_ids(script: str) -> set[str]:
    return set(re.findall(r'"id":"([^"]+)"', script))


def test_our_document_is_bokehs():
    layout = trace_layout(traced("<cell doc 1>", 3, 1 << 10))
    _, ours, _ = notebook_bundle(layout)
    bokehs, _, _ = notebook_content(layout)
    assert document(ours) == document(bokehs)


def test_a_kept_layout_refilled_is_the_new_trace_built_afresh(monkeypatch):
    published: list[str] = []

    def capture(root, cache):
        published.append(notebook_bundle(root, cache)[1])

    monkeypatch.setattr(reuse, "publish", capture)
    monkeypatch.setattr(reuse, "_kept", {})
    first, second = traced("<cell doc 2>", 3, 1 << 10), traced("<cell doc 3>", 7, 1 << 12)
    reuse.show_trace_reused(first, None, None, trace_layout)
    reuse.show_trace_reused(second, None, None, trace_layout)
    assert len(reuse._kept) == 1  # the second cell refilled the first one's layout
    assert ("Plot", "source view") in next(iter(reuse._kept.values())).models
    assert document(published[1]) == document(notebook_content(trace_layout(second))[0])
    assert document(published[0]) != document(published[1])  # nothing of the first trace is left in the second
    assert not model_ids(published[0]) & model_ids(published[1])  # two outputs never share a model id
    kept = next(iter(reuse._kept.values()))
    assert not kept.models[("ColumnDataSource", "span source")].data  # the kept layout holds no trace between cells
