"""Columns of strings made from codes (``viz/coded.py``): the encoder sends the codes they were made from, and an
array derived from one is a plain array that the encoder codes afresh."""

from __future__ import annotations

import base64

import numpy as np
import pytest

pytest.importorskip("bokeh")

from gpuworkbench.viz.coded import coded, lookup  # noqa: E402
from gpuworkbench.viz.doc_text import TextEncoder  # noqa: E402


def sent(text: str) -> list[str]:
    """The column a coded text stands for."""
    import json

    rep = json.loads(text)
    codes = np.frombuffer(base64.b64decode(rep["codes"]), dtype=f"u{rep['width']}")
    return [rep["strings"][c] for c in codes]


def test_a_coded_column_is_sent_as_the_codes_it_was_made_from(monkeypatch):
    column = coded(["a", "b", "unused"], np.arange(64) % 2)
    assert column.tolist() == ["a", "b"] * 32
    encoder = TextEncoder(coded=True)
    monkeypatch.setattr(encoder, "_codes", lambda items: pytest.fail("coded again item by item"))
    text = encoder.strings(column)
    assert sent(text) == column.tolist() and '"unused"' in text


def test_an_array_derived_from_a_coded_column_is_coded_afresh():
    column = coded(["x", "y"], np.arange(100) % 2)
    for derived in (column[::-1], column.copy(), column[column == "x"], np.concatenate([column, column])):
        assert getattr(derived, "codes", None) is None
        assert sent(TextEncoder(coded=True).strings(derived)) == derived.tolist()


def test_a_lookup_is_made_once_per_distinct_string_of_a_coded_column_and_per_item_of_any_other():
    column = coded(["idle", "K", "H"], np.arange(30) % 3)
    seen: list[str] = []

    def length(s: str) -> int:
        seen.append(s)
        return len(s)

    expected = [len(s) for s in column.tolist()]
    assert lookup(column, length, np.int64).tolist() == expected and len(seen) == 3
    for plain in (column[::-1], column.tolist(), np.asarray(column.tolist(), dtype=object)):
        assert lookup(plain, len, np.int64).tolist() == [len(s) for s in np.asarray(plain).tolist()]
    assert lookup([], len, bool).shape == (0,)
