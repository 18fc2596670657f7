"""The persistent kernels' arena: one device allocation made before a persistent kernel launches, suballocated while
it runs.

CUDA promises a kernel the memory that was allocated before it was launched (or ordered before it on its stream). A
buffer made by cudaMallocAsync while the kernel loops is neither: its reads give the right data on today's drivers,
but compute-sanitizer's memcheck rightly reports them. Buffers made while a persistent kernel runs therefore come from
this arena, first fit, in 256-byte-aligned pieces (cudaMalloc's own alignment), so that the kernel only ever reads
memory that existed when it started.
"""

from __future__ import annotations

import bisect

#: Pieces start at multiples of this (cudaMalloc returns 256-byte-aligned pointers; vector loads rely on it).
ALIGN = 256


class Arena:
    """First-fit suballocation of ``[base, base + size)``: ``alloc`` gives a pointer or None when no hole is large
    enough; ``free`` takes back what ``alloc`` gave. Not thread-safe: the device holds its lock around both."""

    def __init__(self, base: int, size: int) -> None:
        self.base, self.size = base, size
        self._holes: list[tuple[int, int]] = [(base, size)]  # (start, size), sorted by start, never adjacent
        self._pieces: dict[int, int] = {}  # pointer -> size of the pieces handed out

    def alloc(self, nbytes: int) -> int | None:
        """A piece of at least ``nbytes`` (rounded up to ``ALIGN``), or None where no hole holds it."""
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for i, (start, size) in enumerate(self._holes):
            if size >= need:
                if size == need:
                    del self._holes[i]
                else:
                    self._holes[i] = (start + need, size - need)
                self._pieces[start] = need
                return start
        return None

    def owns(self, pointer: int) -> bool:
        """Whether ``pointer`` lies inside the arena (a piece or a view into one)."""
        return self.base <= pointer < self.base + self.size

    def free(self, pointer: int) -> None:
        """Give a piece back, merging it with the holes beside it."""
        size = self._pieces.pop(pointer)
        i = bisect.bisect_left(self._holes, (pointer, 0))
        start, end = pointer, pointer + size
        if i < len(self._holes) and self._holes[i][0] == end:  # the hole after it
            end += self._holes.pop(i)[1]
        if i > 0 and sum(self._holes[i - 1]) == start:  # the hole before it
            start = self._holes.pop(i - 1)[0]
            i -= 1
        self._holes.insert(i, (start, end - start))

    @property
    def used(self) -> int:
        """Bytes handed out and not yet given back."""
        return sum(self._pieces.values())

    @property
    def largest_hole(self) -> int:
        """The largest piece ``alloc`` could give now."""
        return max((size for _, size in self._holes), default=0)

    def __len__(self) -> int:
        return len(self._pieces)
