"""The words of cooperative kernels: ``gw.shared``, ``gw.barrier`` and a thread's place in its block.

They mean something only inside a ``@gw.kernel`` body, where the translator recognises them by identity; called as
plain Python they refuse.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..errors import InvalidArgument


def _kernel_only(what: str) -> NoReturn:
    raise InvalidArgument(f"gw.{what}() is kernel language: it works inside a @gw.kernel body, not in plain Python")


def shared(shape: int | tuple[int, ...], dtype: Any = "float32") -> Any:
    """``tile = gw.shared((16, 16), gw.f32)`` in a kernel body: an array every thread of a block shares.

    The shape is 1 or 2 constant ints, fixed when the kernel is decorated; ``dtype`` a kernel type (``gw.f32``) or its
    NumPy name. Declared at the top level of the body; its contents start undefined (write before reading)."""
    _kernel_only("shared")


def barrier() -> None:
    """``gw.barrier()`` in a kernel body: every thread of the block waits here; what the block wrote before it
    (shared and global arrays) is what its threads read after it. Every thread must reach the same barriers."""
    _kernel_only("barrier")


def local_id(axis: int = 0) -> int:
    """The thread's index within its block along ``axis`` (0: x, along a row; 1: y), from 0 to group_size - 1."""
    _kernel_only("local_id")


def group_id(axis: int = 0) -> int:
    """The block's index along ``axis``: the thread's index is group_id(a) * group_size(a) + local_id(a)."""
    _kernel_only("group_id")


def group_size(axis: int = 0) -> int:
    """Threads per block along ``axis``: the launch's block."""
    _kernel_only("group_size")


def num_groups(axis: int = 0) -> int:
    """Blocks in the launch along ``axis``."""
    _kernel_only("num_groups")


BLOCK_PLACES = {id(f): f.__name__ for f in (local_id, group_id, group_size, num_groups)}  # id → the word's name
