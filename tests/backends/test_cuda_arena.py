"""The persistent kernels' arena (``backends/cuda/arena.py``): first-fit pieces, aligned, merged back when freed.
Pure bookkeeping over addresses, so it runs without a GPU; its use on CUDA: tests/flows/test_persistent.py."""

import random

import pytest

from gpuworkbench.backends.cuda.arena import ALIGN, Arena

BASE = 1 << 40


def test_pieces_are_aligned_first_fit_and_refused_when_no_hole_holds_them():
    arena = Arena(BASE, 4096)
    a, b, c = arena.alloc(1), arena.alloc(300), arena.alloc(256)
    assert (a, b, c) == (BASE, BASE + 256, BASE + 256 + 512)
    assert arena.used == 1024 and len(arena) == 3
    assert arena.alloc(4096) is None  # 3072 bytes are left
    arena.free(b)
    assert arena.alloc(512) == b  # the first hole that holds it
    assert arena.owns(BASE + 4095) and not arena.owns(BASE + 4096) and not arena.owns(BASE - 1)


def test_freed_pieces_merge_with_both_neighbours():
    arena = Arena(BASE, 8 * ALIGN)
    pieces = [arena.alloc(ALIGN) for _ in range(8)]
    assert arena.largest_hole == 0 and arena.alloc(1) is None
    for i in (1, 3, 2):  # 1 and 3 first, then 2 between them: one hole of three pieces
        arena.free(pieces[i])
    assert arena.largest_hole == 3 * ALIGN
    assert arena.alloc(3 * ALIGN) == pieces[1]


def test_a_random_workload_never_overlaps_and_ends_with_one_hole():
    rng = random.Random(7)
    arena = Arena(BASE, 1 << 20)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.45:
            ptr = rng.choice(list(live))
            arena.free(ptr)
            del live[ptr]
            continue
        size = rng.randint(1, 40_000)
        ptr = arena.alloc(size)
        if ptr is None:
            assert arena.largest_hole < size
            continue
        assert ptr % ALIGN == 0 and BASE <= ptr and ptr + size <= BASE + (1 << 20)
        assert all(ptr + size <= p or p + n <= ptr for p, n in live.items())
        live[ptr] = size
    for ptr in list(live):
        arena.free(ptr)
    assert arena.used == 0 and arena.largest_hole == 1 << 20 and not arena


def test_freeing_what_it_did_not_give_is_an_error():
    arena = Arena(BASE, 4096)
    with pytest.raises(KeyError):
        arena.free(BASE + 256)
