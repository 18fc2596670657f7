"""Tests of the column steps a loaded trace is built with (trace/kineto_events.py, columns.py): codes of distinct
values counted without a sort, rows linked by key, span blocks joined in start order, and the joined table handed
to the trace's storage without a copy. Each agrees with the plain NumPy it stands in for."""

from __future__ import annotations

import numpy as np
import pytest

from gpuworkbench.trace.columns import Columns, Handover
from gpuworkbench.trace.kineto_events import (
    NameCodes,
    concat_blocks,
    distinct,
    distinct_values,
    first_rows,
    link_column,
    ns_column,
    span_block,
)
from gpuworkbench.trace.spans import COLUMNS, DEFAULTS

RNG = np.random.default_rng(7)

#: Integer columns as a load meets them: few values in a small range (streams, name codes), int64 keys of two codes
#: (``pid << 32 | tid``), negative values, and ranges too wide for a table (np.unique's sort then).
SAMPLES = {
    "streams": RNG.integers(-9, 3, 5000).astype(np.int32),
    "devices": RNG.integers(0, 4, 3000).astype(np.int16),
    "thread keys": (RNG.integers(0, 3, 4000) << 32) | RNG.integers(0, 5, 4000),
    "negative keys": (RNG.integers(-2, 1, 4000) << 32) | RNG.integers(0, 1 << 32, 4000) % 7,
    "device rows": (RNG.integers(0, 2, 4000) << 32) ^ (RNG.choice([7, 13, -5], 4000) & 0xFFFFFFFF),
    "wide": RNG.integers(-(1 << 62), 1 << 62, 3000),
    "wide pairs": (RNG.integers(0, 1 << 30, 3000) << 32) | RNG.integers(0, 1 << 31, 3000),
    "one": np.array([5], np.int64),
    "empty": np.zeros(0, np.int64),
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_distinct_is_np_unique(name: str) -> None:
    values = SAMPLES[name]
    found, index, inverse = np.unique(values, return_index=True, return_inverse=True)
    got_found, got_index, got_inverse = distinct(values, first=True)
    assert got_found.dtype == values.dtype
    np.testing.assert_array_equal(got_found, found)
    np.testing.assert_array_equal(got_index, index)
    np.testing.assert_array_equal(got_inverse, inverse.reshape(-1))
    np.testing.assert_array_equal(distinct(values)[1], inverse.reshape(-1))
    np.testing.assert_array_equal(distinct_values(values), found)


def naive_first_rows(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    first: dict[int, int] = {}
    for row, key in enumerate(keys.tolist()):
        if key >= 0:
            first.setdefault(key, row)
    return np.array([first.get(w, -1) if w >= 0 else -1 for w in wanted.tolist()], np.int64)


@pytest.mark.parametrize("spread", [10, 1 << 40])  # a table over the keys' range; a sort where it is too wide
def test_first_rows_finds_the_first_row_of_each_key(spread: int) -> None:
    keys = RNG.integers(-3, 400, 2000) * (spread // 10) + (RNG.integers(-3, 400, 2000) >= 0)
    keys[::7] = -1  # no key
    wanted = np.concatenate([keys[RNG.permutation(keys.size)], [-1, -5, keys.max() + 1, 10**15]])
    np.testing.assert_array_equal(first_rows(keys, wanted), naive_first_rows(keys, wanted))
    values = RNG.integers(0, 100, keys.size).astype(np.int16)
    expected = np.where(naive_first_rows(keys, wanted) >= 0, values[naive_first_rows(keys, wanted)], -9)
    linked = link_column(keys, values, wanted, -9)
    assert linked.dtype == np.int16
    np.testing.assert_array_equal(linked, expected)
    assert (first_rows(np.full(3, -1), wanted) == -1).all() and first_rows(keys, wanted[:0]).size == 0


def test_ns_column_reads_microseconds_exactly_and_refuses_what_is_no_finite_time() -> None:
    us = np.array([0.0, 1.0005, -2.25, 1.5e9 + 0.001, 9.0e15, 1234.5678])
    whole = np.floor(us)
    expected = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
    np.testing.assert_array_equal(ns_column(us, "f.json", "ts"), expected)
    assert ns_column(np.zeros(0), "f.json", "ts").size == 0
    for bad, what in (([1.0, np.nan], "not a finite number"), ([np.inf], "not a finite number"),
                      ([1.0, -1e16], "out of range")):  # fmt: skip
        with pytest.raises(Exception, match=what):
            ns_column(np.array(bad), "f.json", "ts")


def plain_concat(blocks: list[dict]) -> dict[str, np.ndarray]:
    """The join as it was written first: every column of every block made whole, joined, put in start order."""
    full = []
    for block in blocks:
        n = block.n
        columns = {}
        for column, dtype in COLUMNS.items():
            value = block.get(column, DEFAULTS.get(column, 0))
            if isinstance(value, NameCodes):
                value = value.table[value.codes]
            columns[column] = (
                np.asarray(value, object) if dtype is object else np.broadcast_to(np.asarray(value), (n,)).astype(dtype)
            )
        full.append(columns)
    table = {c: np.concatenate([b[c] for b in full]) for c in COLUMNS}
    order = np.argsort(table["start_ns"], kind="stable")
    return {c: v[order] for c, v in table.items()}


@pytest.mark.parametrize("rows", [(3, 0, 5), (700, 900, 400)])
def test_concat_blocks_puts_each_row_in_start_order(rows: tuple[int, int, int]) -> None:
    names = np.array(["kernel", "cudaLaunchKernel", "aten::mm"], object)
    a, b, c = rows
    blocks = [
        span_block(a, kind=4, device=RNG.integers(0, 2, a), stream=7, start_ns=RNG.integers(0, 50, a) * 10,
                   end_ns=RNG.integers(500, 600, a), name=NameCodes(RNG.integers(0, 3, a), names),
                   grid=RNG.integers(1, 9, a)),
        span_block(b, kind=8, device=0, stream=-2, start_ns=RNG.integers(0, 50, b) * 10, end_ns=600,
                   name=NameCodes(RNG.integers(0, 3, b), names), corr=RNG.integers(0, 99, b)),
        span_block(c, kind=9, device=1, stream=-3, start_ns=RNG.integers(0, 50, c) * 10, end_ns=600,
                   name=[f"range {i % 4}" for i in range(c)]),
    ]  # fmt: skip
    table = concat_blocks(blocks)
    assert isinstance(table, Handover)
    expected = plain_concat(blocks)
    for column, dtype in COLUMNS.items():
        assert table[column].dtype == np.dtype(dtype), column
        np.testing.assert_array_equal(table[column], expected[column], err_msg=column)
    empty = concat_blocks([span_block(0, kind=0, start_ns=np.zeros(0, np.int64), name=[])])
    assert all(empty[c].size == 0 and empty[c].dtype == np.dtype(d) for c, d in COLUMNS.items())


def test_a_handed_over_table_is_kept_without_a_copy() -> None:
    n = 2000
    table = Handover({c: np.zeros(n, dtype) for c, dtype in COLUMNS.items()})
    store = Columns(COLUMNS, max(n, 1_000_000), DEFAULTS)
    store.extend_columns(table)
    assert all(store.cols[c] is table[c] for c in COLUMNS)
    assert (store.size, store.count, store.dropped) == (n, n, 0)
    np.testing.assert_array_equal(store.table()["start_ns"], table["start_ns"])
    store.append({"kind": 4, "start_ns": 5})  # it grows as it would have
    assert store.count == n + 1 and store.table()["start_ns"][-1] == 5
    # a plain dict, a small table, or one that is a view: copied as before
    for given, rows in ((dict(table), n), (Handover({c: v[:10] for c, v in table.items()}), 10)):
        copy = Columns(COLUMNS, 1_000_000, DEFAULTS)
        copy.extend_columns(given)
        assert copy.count == rows and not any(copy.cols[c] is given[c] for c in COLUMNS)
