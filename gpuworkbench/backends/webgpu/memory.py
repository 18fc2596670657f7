"""WebGPU buffers in whole 4-byte words: the allocation handle and the rounding and checks a copy needs, because
WebGPU copies move words only."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidArgument


def words(nbytes: int) -> int:
    """``nbytes`` rounded up to whole 4-byte words."""
    return (nbytes + 3) & ~3


class Alloc:
    """A device allocation: the GPUBuffer (whole words) and the bytes the caller asked for."""

    __slots__ = ("buffer", "nbytes")

    def __init__(self, buffer: Any, nbytes: int) -> None:
        self.buffer, self.nbytes = buffer, nbytes


def padded(alloc: Alloc, offset: int, nbytes: int, what: str) -> int:
    """The word-rounded size of a write of ``nbytes`` at ``offset``; InvalidArgument where it would spill."""
    if offset % 4 or (nbytes % 4 and offset + nbytes != alloc.nbytes):
        raise InvalidArgument(
            f"webgpu {what}: WebGPU moves whole 4-byte words; {nbytes} B at offset {offset} into a "
            f"{alloc.nbytes} B buffer must start on a word and end on one or at the buffer's end"
        )
    return words(nbytes)
