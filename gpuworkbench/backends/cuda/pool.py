"""A CUDA device's buffers from CuPy's caching memory pool. A freed buffer's block goes back to the pool, with no
CUDA call, for the next allocation to reuse; ``cudaFree`` waits for every stream's work on the device, so a free in a
pipeline used to stall the host until the other streams' kernels ended (2.0 ms behind another stream's 2 ms kernel
on an H200, against 0.04 ms from the pool: ``benchmarks/probes/buffer_free.py`` and the figures in
``docs/benchmarks.md``). The caller has waited for every op that used a buffer before it frees it, so a reused block is
idle whichever stream the next user runs on."""

from __future__ import annotations

from typing import Any


class BufferPool:
    """Device pointers handed out from one CuPy ``MemoryPool``, each kept alive by its ``MemoryPointer`` until freed."""

    def __init__(self, cupy: Any) -> None:
        self._pool = cupy.cuda.MemoryPool()
        self._out_of_memory = cupy.cuda.memory.OutOfMemoryError
        self._held: dict[int, Any] = {}  # pointer -> its MemoryPointer (dropping it gives the block back)

    def alloc(self, nbytes: int) -> int | None:
        """A pointer to at least ``nbytes`` (256-byte aligned, as cudaMalloc's), or None where the device has no room
        even after the pool gave its unused blocks back to the driver (CuPy's pool does that before it fails)."""
        try:
            memory = self._pool.malloc(nbytes)
        except self._out_of_memory:
            return None
        pointer = int(memory.ptr)
        self._held[pointer] = memory
        return pointer

    def give_back(self, pointer: int) -> bool:
        """Return the block of ``pointer`` to the pool; False where the pool did not hand it out."""
        return self._held.pop(pointer, None) is not None

    @property
    def cached_bytes(self) -> int:
        """Bytes the pool holds unused: free for this device's next allocations, not for other libraries."""
        return int(self._pool.free_bytes())

    def release(self) -> None:
        """Give the pool's unused blocks back to the driver (cudaFree)."""
        self._pool.free_all_blocks()
