"""CUDA buffers from the caching pool: a free waits for the buffer's own ops only, never for other streams' work, and
its block is reused; running out of memory is still a named error; without the pool (``GPUWB_CUDA_POOL=0``, or under
compute-sanitizer) each buffer is an allocation of its own. The GPU tests are marked ``gpu``."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support import cuda_devices

import gpuworkbench as gw
from gpuworkbench.backends.cuda.pool import BufferPool, caching_wanted

SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""

POOLED = pytest.mark.skipif(not caching_wanted(), reason="no pooled buffers here (GPUWB_CUDA_POOL, compute-sanitizer)")
SANITIZED = any(name.startswith("NV_SANITIZER_INJECTION") for name in os.environ)


@pytest.fixture(scope="module")
def dev():
    return cuda_devices(1)[0]


@pytest.mark.gpu
@POOLED
def test_a_free_does_not_wait_for_another_streams_kernel(dev):
    spin = dev.compile(SPIN, "spin")
    busy, mine = dev.create_stream("busy"), dev.create_stream("mine")
    data = np.arange(1 << 16, dtype=np.float32)
    try:
        spin(1, 1, (np.uint64(1000),), stream=busy).wait()  # compiled and loaded before the long one
        buf = dev.alloc(data.size)
        buf.copy_from_host_async(data, mine)
        out = np.empty_like(data)
        buf.copy_to_host_async(out, mine)
        long = spin(1, 1, (np.uint64(2_000_000_000),), stream=busy)  # 2 s on the other stream
        buf.free()  # waits for the copies on `mine` alone
        running = not long.done
        assert np.array_equal(out, data)  # the free came after the buffer's own ops
        assert running, "Buffer.free waited for a kernel on another stream"
    finally:
        dev.synchronize()
        busy.close()
        mine.close()


@pytest.mark.gpu
@POOLED
def test_a_freed_block_is_reused_and_counted_free(dev):
    import cupy as cp

    nbytes = 64 << 20
    driver_free = cp.cuda.runtime.memGetInfo
    first = dev.alloc(nbytes, "uint8")
    first.free()
    before, (free_after, _) = driver_free()[0], dev.memory_info()
    again = dev.alloc(nbytes, "uint8")
    try:
        assert driver_free()[0] == before  # the pool's block: the driver gave nothing more
        free_again, _ = dev.memory_info()
        assert free_again == free_after - nbytes  # the pool's unused blocks count as free
    finally:
        again.free()


@pytest.mark.gpu
def test_a_buffer_too_large_even_after_the_pool_lets_go_is_out_of_memory(dev):
    cached = dev.alloc(32 << 20, "uint8")
    cached.free()  # an unused block in the pool
    held = dev.held_bytes
    free, total = dev.memory_info()
    with pytest.raises(gw.OutOfMemory, match="cannot allocate") as info:
        dev.alloc(total + (1 << 30), "uint8")
    assert (info.value.asked, info.value.total) == (total + (1 << 30), total)
    assert dev.held_bytes == held
    with dev.alloc(1000) as b:  # the device still works
        b.copy_from_host(np.ones(1000, np.float32))
        assert b.copy_to_host()[-1] == 1


@pytest.mark.gpu
@POOLED
def test_empty_cache_gives_the_pools_blocks_back_to_the_driver(dev):
    import cupy as cp

    dev.empty_cache()
    big = dev.alloc(256 << 20, "uint8")
    big.free()  # cached by the pool: the driver still counts it used
    before, ours = cp.cuda.runtime.memGetInfo()[0], dev.memory_info()[0]
    assert dev.empty_cache() >= 256 << 20
    assert cp.cuda.runtime.memGetInfo()[0] >= before + (256 << 20)
    assert abs(dev.memory_info()[0] - ours) <= 2 << 20  # free to our allocations before and after


@pytest.mark.gpu
@pytest.mark.skipif(SANITIZED, reason="memcheck holds freed memory back, to catch a use after the free")
def test_without_the_pool_each_buffer_is_its_own_allocation(monkeypatch):
    cp = pytest.importorskip("cupy")
    cuda_devices(1)
    monkeypatch.setenv("GPUWB_CUDA_POOL", "0")
    pool, driver_free = BufferPool(cp), cp.cuda.runtime.memGetInfo
    before = driver_free()[0]
    pointer = pool.alloc(64 << 20)
    assert driver_free()[0] <= before - (64 << 20)
    assert pool.give_back(pointer) and not pool.give_back(pointer)
    assert driver_free()[0] == before and pool.cached_bytes == 0  # cudaFree'd at once


@pytest.mark.parametrize(
    ("told", "sanitizer", "caching"),
    [(None, False, True), (None, True, False), ("0", False, False), ("off", False, False), ("1", True, True)],
)
def test_the_pool_is_left_out_when_asked_and_under_compute_sanitizer(monkeypatch, told, sanitizer, caching):
    for name in [n for n in os.environ if n.startswith("NV_SANITIZER_INJECTION")] + ["GPUWB_CUDA_POOL"]:
        monkeypatch.delenv(name, raising=False)
    if told is not None:
        monkeypatch.setenv("GPUWB_CUDA_POOL", told)
    if sanitizer:  # as compute-sanitizer 2025.3 sets it in the program it runs
        monkeypatch.setenv("NV_SANITIZER_INJECTION_PORT_BASE", "49152")
    assert caching_wanted() is caching


class _FakeMemory:
    """CuPy's ``cuda.memory`` as the pool uses it: blocks with pointers (``Memory``: cudaMalloc, cudaFree when
    dropped), a caching ``MemoryPool`` whose pointers give their block back when dropped, and running out of room."""

    class OutOfMemoryError(MemoryError):
        pass

    def __init__(self, room: int) -> None:
        self.room, self.next, self.pools, self.freed = room, 0x1000, [], []
        fake = self

        class Memory:
            def __init__(self, n: int) -> None:
                self.size = 0  # nothing to free where the allocation fails
                if n > fake.room:
                    raise fake.OutOfMemoryError(n)
                fake.room -= n
                self.ptr, self.size, fake.next = fake.next, n, fake.next + n

            def __del__(self) -> None:
                if self.size:
                    fake.room += self.size
                    fake.freed.append(self.ptr)

        class MemoryPointer:
            def __init__(self, mem: Memory, offset: int, back: list | None = None) -> None:
                self.mem, self.ptr, self._back = mem, mem.ptr + offset, back

            def __del__(self) -> None:
                if self._back is not None:
                    self._back.append(self.mem)

        class MemoryPool:
            def __init__(self) -> None:
                self.cached: list[Memory] = []
                fake.pools.append(self)

            def malloc(self, n: int) -> MemoryPointer:
                mem = next((m for m in self.cached if m.size == n), None)
                if mem is None:
                    mem = Memory(n)
                else:
                    self.cached.remove(mem)
                return MemoryPointer(mem, 0, self.cached)

            def free_bytes(self) -> int:
                return sum(m.size for m in self.cached)

            def free_all_blocks(self) -> None:
                self.cached.clear()

        self.Memory, self.MemoryPointer, self.MemoryPool = Memory, MemoryPointer, MemoryPool


@pytest.fixture
def fake_cupy(monkeypatch):
    import types

    monkeypatch.delenv("GPUWB_CUDA_POOL", raising=False)
    for name in [n for n in os.environ if n.startswith("NV_SANITIZER_INJECTION")]:
        monkeypatch.delenv(name)
    memory = _FakeMemory(room=1 << 20)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory)), memory


def test_the_pool_keeps_freed_blocks_until_released(fake_cupy):
    import threading

    cupy, memory = fake_cupy
    pool = BufferPool(cupy)
    starts = [threading.Thread(target=pool.alloc, args=(256,)) for _ in range(8)]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    assert len(memory.pools) == 1  # first allocations from several threads make one pool
    pointer = pool.alloc(4096)
    assert pool.give_back(pointer) and not pool.give_back(pointer) and not pool.give_back(0xDEAD)
    assert pool.cached_bytes == 4096 and not memory.freed  # kept for the next allocation: no cudaFree
    assert pool.alloc(4096) == pointer  # the same block again
    assert pool.alloc(1 << 21) is None  # no room: the caller raises OutOfMemory
    assert pool.give_back(pointer) and pool.release() == 4096 and pool.cached_bytes == 0
    assert memory.freed == [pointer]  # released: cudaFree'd


def test_without_the_pool_a_free_is_kept_only_while_a_persistent_kernel_runs(fake_cupy, monkeypatch):
    cupy, memory = fake_cupy
    monkeypatch.setenv("GPUWB_CUDA_POOL", "0")
    pool = BufferPool(cupy)
    first = pool.alloc(512)
    assert pool.give_back(first) and memory.freed == [first] and pool.release() == 0  # cudaFree at once
    pool.keep_frees = True  # a persistent kernel runs: a cudaFree could wait for it
    second = pool.alloc(512)
    assert pool.give_back(second) and memory.freed == [first]
    pool.stop_keeping()
    assert memory.freed == [first, second]
