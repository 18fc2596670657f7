"""The notebook publication of a trace's layout: the document Bokeh's own ``notebook_content`` writes, and a kept
layout refilled by a later trace (``viz/reuse.py``) equal to that trace's layout built afresh."""

from __future__ import annotations

import base64
import gzip
import json
import linecache
import re
import shutil
import subprocess

import numpy as np
import pytest

import gpuworkbench as gw

pytest.importorskip("bokeh")

from bokeh.embed.notebook import notebook_content  # noqa: E402

from gpuworkbench.viz import reuse, trace_layout  # noqa: E402
from gpuworkbench.viz.notebook_doc import CODED, EXPAND_JS, document_json, notebook_bundle  # noqa: E402


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


def docs_json(script: str) -> str:
    """The docs_json expression of a notebook script (JSON, or ``EXPAND_JS`` applied to JSON)."""
    found = re.search(r"const docs_json = (.*?);\n\s*const render_items = (.*);\n", script, re.S)
    assert found is not None
    return found.group(1)


def expanded(x):
    """``x`` with every coded column put back as Bokeh writes it (what ``EXPAND_JS`` does in the browser), and every
    inline buffer as the bytes BokehJS reads from it (gunzipped: a buffer may be stored or compressed)."""
    if isinstance(x, dict):
        if x.get("type") == CODED:
            codes = np.frombuffer(base64.b64decode(x["codes"]), dtype=f"u{x['width']}")
            array = [x["strings"][c] for c in codes]
            return {"type": "ndarray", "array": array, "shape": [len(array)], "dtype": "object", "order": x["order"]}
        if x.get("type") == "bytes" and isinstance(x.get("data"), str):
            return {"type": "bytes", "data": gzip.decompress(base64.b64decode(x["data"]))}
        return {k: expanded(v) for k, v in x.items()}
    return [expanded(v) for v in x] if isinstance(x, list) else x


def renamed(doc: dict) -> dict:
    """``doc`` with its model ids renamed in order of appearance (ids are fresh each time)."""
    ids: dict[str, str] = {}

    def walk(x):
        if isinstance(x, dict):
            return {k: (ids.setdefault(v, f"m{len(ids)}") if k == "id" else walk(v)) for k, v in x.items()}
        return [walk(v) for v in x] if isinstance(x, list) else x

    return walk(doc)


def document(script: str) -> dict:
    """The document of a notebook script, coded columns expanded, ids renamed."""
    text = docs_json(script)
    if text.startswith(EXPAND_JS):
        text = text[len(EXPAND_JS) + 1 : -1]
    (doc,) = json.loads(text).values()
    return renamed(expanded(doc))


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


def test_a_layout_refilled_back_and_forth_is_each_trace_built_afresh(monkeypatch):
    published: list[str] = []
    monkeypatch.setattr(reuse, "publish", lambda root, cache: published.append(notebook_bundle(root, cache)[1]))
    monkeypatch.setattr(reuse, "_kept", {})
    small, large = traced("<cell doc 10>", 2, 1 << 10), traced("<cell doc 11>", 9, 1 << 12)
    for trace in (small, large, small, small):  # a value left as it was only where it is the same
        reuse.show_trace_reused(trace, None, None, trace_layout)
    assert len(reuse._kept) == 1
    for trace, script in zip((small, large, small, small), published):
        assert document(script) == document(notebook_content(trace_layout(trace))[0])


def test_a_kept_model_is_given_only_the_values_it_does_not_hold_and_then_written_again():
    from bokeh.models import Range1d

    limits = Range1d(start=0, end=1, bounds=(0, 1))
    cache: dict = {}
    document_json(limits, cache)
    reuse._put(limits, start=0.0, end=1, bounds=(0, 1))  # equal values: nothing to write again
    assert not cache[limits].dirty
    reuse._put(limits, start=0, end=2)
    assert cache[limits].dirty and limits.end == 2 and '"end":2' in document_json(limits, cache)[0]


def test_repeated_strings_go_as_codes_and_the_browser_expands_them_to_bokehs_document():
    layout = trace_layout(traced("<cell doc 4>", 150, 1 << 10))
    _, ours, _ = notebook_bundle(layout)
    bokehs, _, _ = notebook_content(layout)
    text = docs_json(ours)
    assert text.startswith(EXPAND_JS) and f'"type":"{CODED}"' in text
    plain, _, _ = document_json(layout, coded=False)
    assert len(text) < 0.75 * len(plain)  # rows, kinds, styles, names, lines: each string sent once
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the browser's expansion")
    script = f"process.stdout.write(JSON.stringify({text}))"  # on stdin: longer than one argument may be
    run = subprocess.run([node], input=script, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (doc,) = json.loads(run.stdout).values()
    assert renamed(expanded(doc)) == document(bokehs)


def test_the_span_tooltip_reads_each_spans_name_row_and_line_from_the_expanded_document():
    trace = traced("<cell doc 5>", 40, 1 << 10)
    _, script, _ = notebook_bundle(trace_layout(trace))
    doc = document(script)
    found = []

    def walk(x):
        if isinstance(x, dict):
            if x.get("name") == "ColumnDataSource" and x.get("attributes", {}).get("name") == "span source":
                found.append(dict(x["attributes"]["data"]["entries"]))
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    (data,) = found
    names, rows, lines = (data[c]["array"] for c in ("name", "row", "line"))
    table = trace.table()
    assert sorted(names) == sorted(str(n) for n in table["name"])
    assert {n for n in names if "copy" in n.lower() or "h2d" in n.lower() or "d2h" in n.lower()}
    assert all(r.startswith("cpu") for r in rows)
    assert {"x.copy_from_host(h)", "x.copy_to_host(h)"} <= {line.split("  ")[1] for line in lines if line}


def test_a_kept_model_changed_in_place_is_encoded_again():
    from bokeh.models import Div

    layout = trace_layout(traced("<cell doc 6>", 3, 1 << 10))
    cache: dict = {}
    notebook_bundle(layout, cache)
    layout.children.append(Div(text="added in place"))  # the same list, one more child
    _, again, _ = notebook_bundle(layout, cache)
    assert "added in place" in again
    assert document(again) == document(notebook_content(layout)[0])


def test_the_warm_up_builds_and_encodes_a_layout_without_showing_it(monkeypatch):
    from gpuworkbench import viz

    shown: list = []
    monkeypatch.setattr("gpuworkbench.viz.notebook_doc.publish", lambda *a, **k: shown.append(a))
    viz.warm_up()
    assert not shown


def test_a_warmed_shape_is_refilled_by_a_cell_on_another_device_as_its_layout_built_afresh(monkeypatch):
    from gpuworkbench import viz

    published: list[str] = []
    monkeypatch.setattr(reuse, "publish", lambda root, cache: published.append(notebook_bundle(root, cache)[1]))
    monkeypatch.setattr(reuse, "_kept", {})
    reuse.warm(viz.warm_up_trace(memory=True), trace_layout)  # "device 0", one memory series
    (kept,) = reuse._kept.values()
    trace = traced("<cell doc 7>", 3, 1 << 10)  # the CPU device, allocating: a memory series of its own name
    reuse.show_trace_reused(trace, None, None, trace_layout)
    assert list(reuse._kept.values()) == [kept]  # refilled, not built
    assert document(published[0]) == document(notebook_content(trace_layout(trace))[0])
    assert "device 0: held by gpuworkbench" not in published[0]


def test_kept_texts_hold_no_data_and_a_changed_property_is_written_again():
    from gpuworkbench.viz.doc_text import TextEncoder

    layout = trace_layout(traced("<cell doc 8>", 3, 1 << 10))
    cache: dict = {}
    notebook_bundle(layout, cache)
    kept = {model: entry.subtree for model, entry in cache.items() if entry.subtree is not None}
    assert kept and all('"type":"bytes"' not in text and CODED not in text for text in kept.values())
    timeline = next(m for m in layout.references() if m.name == "timeline")
    timeline.title.text = "a title set since"
    _, again, _ = notebook_bundle(layout, cache)
    assert "a title set since" in again
    assert document(again) == document(notebook_content(layout)[0])
    unchanged = [m for m, text in kept.items() if cache[m].subtree is text]
    assert len(unchanged) > len(kept) // 2  # most models' text is reused as it was
    assert timeline.title not in unchanged
    encoder = TextEncoder(cache)
    assert encoder.model(timeline.xaxis[0])[0] is kept[timeline.xaxis[0]]


def test_only_models_given_new_values_and_their_holders_are_visited_again_and_moved_models_are_placed_anew():
    from gpuworkbench.viz.doc_text import TextEncoder

    layout = trace_layout(traced("<cell doc 9>", 3, 1 << 10))
    cache: dict = {}
    notebook_bundle(layout, cache)
    timeline = next(m for m in layout.references() if m.name == "timeline")
    visited: list = []
    refresh = TextEncoder._refresh

    def counting(self, model, entry):
        visited.append(model)
        return refresh(self, model, entry)

    TextEncoder._refresh = counting
    try:
        timeline.xaxis[0].formatter.precision = 3  # deep inside a subtree that holds no data
        _, again, _ = notebook_bundle(layout, cache)
        assert document(again) == document(notebook_content(layout)[0])
        assert timeline.xaxis[0].formatter in visited and timeline.xaxis[0] in visited
        assert timeline.yaxis[0] not in visited and len(visited) < len(cache) // 2
        layout.children.reverse()  # in place: every model now first written somewhere else in the text
        _, moved, _ = notebook_bundle(layout, cache)
        assert document(moved) == document(notebook_content(layout)[0])
    finally:
        TextEncoder._refresh = refresh


def test_a_model_shown_by_many_layouts_keeps_none_of_their_caches():
    import gc

    from gpuworkbench.viz.notebook_doc import _config

    layout = trace_layout(traced("<cell doc 10>", 3, 1 << 10))
    notebook_bundle(layout, {})
    gc.collect()
    before = len(_config()._property_values.entries)  # every document's config model, kept layouts' caches elsewhere
    for _ in range(3):
        notebook_bundle(layout, {})  # a cache each time, dropped after
    gc.collect()
    assert len(_config()._property_values.entries) == before  # no entry outlives its cache
    cache: dict = {}
    notebook_bundle(layout, cache)
    assert len(_config()._property_values.entries) == before + 1


def test_a_bokeh_whose_private_store_differs_falls_back_to_bokehs_own_show(monkeypatch):
    """Where our encoder meets a Bokeh it does not know (an attribute gone), the picture is shown by ``bokeh.io.show``,
    and from then on too; nothing is lost."""
    import bokeh.io

    from gpuworkbench import viz
    from gpuworkbench.viz import notebook_doc, reuse

    shown: list = []
    monkeypatch.setattr(viz, "inline_setup", lambda: True)
    monkeypatch.setattr(bokeh.io, "show", shown.append)
    monkeypatch.setattr(notebook_doc, "FAILED", [])

    def broken(*_args, **_kwargs):
        raise AttributeError("'Model' object has no attribute '_property_values'")

    monkeypatch.setattr(reuse, "show_trace_reused", broken)
    trace = viz.warm_up_trace(False)
    assert viz.show_trace(trace) is None
    assert len(shown) == 1 and notebook_doc.FAILED and not notebook_doc.fast_path_applies()
    viz.show_trace(trace)
    assert len(shown) == 2
