"""A CUDA device's buffers from CuPy's caching memory pool. A freed buffer's block goes back to the pool, with no
CUDA call, for the next allocation to reuse; ``cudaFree`` waits for every stream's work on the device, so a free
beside another stream's 2 ms kernel took 2.0 ms, and 0.05 ms from the pool (an H200, ``benchmarks/probes/
buffer_free.py``). The caller has waited for every op that used a buffer before it frees it, so a reused block is
idle whichever stream the next user runs on.

``GPUWB_CUDA_POOL=0`` gives every buffer its own cudaMalloc and cudaFree instead, as PyTorch's
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` does, so that compute-sanitizer sees each buffer as an allocation of its own: its
memcheck finds an access past a buffer's end only then, and its racecheck (2025.3, on an H200) reported a
shared-memory race in a kernel only with the buffers so allocated. Under compute-sanitizer (which sets
``NV_SANITIZER_INJECTION_*`` in its target's environment) that is the default."""

from __future__ import annotations

import os
import threading
from typing import Any

_OFF = ("0", "false", "no", "off")


def caching_wanted() -> bool:
    """Whether buffers come from the caching pool: ``GPUWB_CUDA_POOL``, else yes unless compute-sanitizer runs."""
    told = os.environ.get("GPUWB_CUDA_POOL")
    if told is not None:
        return told.strip().lower() not in _OFF
    return not any(name.startswith("NV_SANITIZER_INJECTION") for name in os.environ)


class BufferPool:
    """Device pointers handed out from one CuPy ``MemoryPool`` (or, not caching, one cudaMalloc each), each kept alive
    by its ``MemoryPointer`` until freed. Whether it caches is read once, as the device opens."""

    def __init__(self, cupy: Any) -> None:
        self.caching = caching_wanted()
        self._cupy = cupy
        self._pool: Any = None  # made at the first allocation
        self._malloc: Any = None
        self._start = threading.Lock()  # two threads' first allocations make one pool
        self._held: dict[int, Any] = {}  # pointer -> its MemoryPointer (dropping it gives the block back)
        self._kept: list[Any] = []  # not caching, a persistent kernel running: frees whose cudaFree could wait for it
        self.keep_frees = False

    def alloc(self, nbytes: int) -> int | None:
        """A pointer to at least ``nbytes`` (256-byte aligned, as cudaMalloc's), or None where the device has no room
        even after the pool gave its unused blocks back to the driver (CuPy's pool does that before it fails)."""
        memory = self._cupy.cuda.memory
        if self._malloc is None:
            with self._start:
                if self._malloc is None:
                    if self.caching:
                        self._pool = memory.MemoryPool()
                        self._malloc = self._pool.malloc
                    else:
                        self._malloc = lambda n: memory.MemoryPointer(memory.Memory(n), 0)
        try:
            block = self._malloc(nbytes)
        except memory.OutOfMemoryError:
            return None
        pointer = int(block.ptr)
        self._held[pointer] = block
        return pointer

    def give_back(self, pointer: int) -> bool:
        """Return the block of ``pointer`` to the pool; False where the pool did not hand it out."""
        memory = self._held.pop(pointer, None)
        if memory is None:
            return False
        if self.keep_frees and self._pool is None:
            self._kept.append(memory)
        return True

    def stop_keeping(self) -> None:
        """No persistent kernel runs any longer: the frees kept meanwhile happen now."""
        self.keep_frees = False
        self._kept.clear()

    @property
    def cached_bytes(self) -> int:
        """Bytes the pool holds unused: free for this device's next allocations, not for other libraries."""
        return int(self._pool.free_bytes()) if self._pool is not None else 0

    def release(self) -> int:
        """Give the pool's unused blocks back to the driver (cudaFree); the bytes given back. A block split between a
        buffer still held and free space stays until the buffer is freed (CuPy's rule)."""
        if self._pool is None:
            return 0
        before = self.cached_bytes
        self._pool.free_all_blocks()
        return before - self.cached_bytes
