"""The CUPTI record walk (trace/cupti/walk.py) on hand-made activity buffers: the walk that skips runs and the one by
pointer doubling must each visit exactly the records a one-by-one walk by the same record sizes visits, and leave to
CUPTI's walk a buffer whose chain of sizes leads nowhere. Runs without a GPU (no libcupti is loaded)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuworkbench.trace.cupti import walk
from gpuworkbench.trace.cupti.walk import ALONE, UNVERIFIED, RecordWalker

SIZES = {5: 40, 39: 24, 10: 200, 1: 88, 2: 64}  # kind -> record bytes (API, external id, kernel, memcpy, memset)


def raw_walker() -> RecordWalker:
    raw = RecordWalker()  # no libcupti: only the size table the walk reads
    for kind, size in SIZES.items():
        raw.size_words[kind] = size // 4
    return raw


def buffer(kinds: list[int]) -> tuple[bytes, list[int]]:
    """Records of the given kinds (kind word first, a recognisable filler after), and their word offsets."""
    out, offsets = bytearray(), []
    for n, kind in enumerate(kinds):
        offsets.append(len(out) // 4)
        record = bytearray(struct.pack("<I", kind)) + bytes(SIZES[kind] - 4)
        record[8:12] = struct.pack("<I", 10 + n % 7)  # inside a record: a word that is also a kind code
        out += record
    return bytes(out), offsets


def one_by_one(raw: RecordWalker, data: bytes) -> list[int]:
    words, i, offsets = memoryview(data).cast("I"), 0, []
    while i < len(words):
        offsets.append(i)
        i += raw.size_words[words[i]]
    return offsets


def test_a_launch_loop_buffer_is_walked_to_the_same_offsets():
    raw = raw_walker()
    kinds = [5, 39, 10] * 500 + [1] + [5, 39, 10] * 300 + [2, 2] + [10] * 40 + [5, 39]
    data, offsets = buffer(kinds)
    assert raw.walk(data).tolist() == offsets == one_by_one(raw, data)


pattern = st.lists(st.sampled_from(sorted(SIZES)), min_size=1, max_size=4)
segment = st.tuples(pattern, st.integers(0, 60))  # a pattern repeated 0..60 times
noise = st.lists(st.sampled_from(sorted(SIZES)), max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(segment, noise), min_size=1, max_size=8))
def test_any_mix_of_runs_and_odd_records_walks_like_one_by_one(parts):
    kinds: list[int] = []
    for (repeated, times), odd in parts:
        kinds += repeated * times + odd
    if not kinds:
        kinds = [10]
    data, offsets = buffer(kinds)
    try:
        for alone in (16, 1 << 30):  # pointer doubling after the first vain look for a run, and never
            walk.ALONE = alone
            assert raw_walker().walk(data).tolist() == offsets
    finally:
        walk.ALONE = ALONE


def test_records_that_do_not_repeat_are_walked_by_pointer_doubling(monkeypatch):
    raw = raw_walker()
    kinds = [5, 39, 10, 1, 2, 5, 10, 10, 2, 1, 39, 5, 1] * 20  # no run of 1 to 4 records repeats twice in a row
    data, offsets = buffer(kinds)
    doubled: list[int] = []
    original = raw._doubled
    monkeypatch.setattr(raw, "_doubled", lambda array, i: doubled.append(i) or original(array, i))
    assert raw.walk(data).tolist() == offsets
    assert doubled and doubled[0] == offsets[walk.ALONE]  # the rest after ALONE records one by one


def test_a_kind_of_unknown_size_falls_back_to_cuptis_walk(monkeypatch):
    raw = raw_walker()
    data, _ = buffer([5, 39, 10] * 40)
    raw.size_words[39] = UNVERIFIED
    monkeypatch.setattr(raw, "walk_cupti", lambda d: [0, 99])
    assert raw.walk(data).tolist() == [0, 99]


def test_an_empty_buffer_has_no_records():
    assert raw_walker().walk(b"").tolist() == []


@pytest.mark.parametrize(
    "spoil",
    [
        lambda data: data[:-8],  # the last record cut short: its size leads past the end
        lambda data: data + bytes(8),  # a slot after the last record whose kind (0) has no size
        lambda data: struct.pack("<I", 77) + data[4:],  # a first word that is no kind of known size
    ],
    ids=["past the end", "trailing slot", "unknown first kind"],
)
def test_a_chain_that_leads_nowhere_is_left_to_cuptis_walk(monkeypatch, spoil):
    raw = raw_walker()
    data, _ = buffer([5, 39, 10, 1, 2] * 30)
    monkeypatch.setattr(raw, "walk_cupti", lambda d: [0, 4])
    assert raw.walk(data).tolist() != [0, 4]  # the unspoilt buffer is walked by sizes
    assert raw.walk(spoil(data)).tolist() == [0, 4]


def test_a_kind_whose_learned_size_is_not_a_multiple_of_8_bytes_is_no_size(monkeypatch):
    raw = raw_walker()
    data, _ = buffer([5, 39, 10] * 10)
    raw.size_words[39] = 5  # 20 bytes: records start 8-byte aligned, so no record is this long
    monkeypatch.setattr(raw, "walk_cupti", lambda d: [0, 6])
    assert raw.walk(data).tolist() == [0, 6]
