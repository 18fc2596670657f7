"""Persistent kernels: one kernel launched once that loops, taking commands from a ring the host writes directly.

A launch-per-command round trip pays a kernel launch, a synchronization and a copy back for every small step; here a
command costs the host a few stores into page-locked memory that the GPU polls (mapped with ``cudaHostAllocMapped``),
and its answer comes back the same way. That wins for many tiny, dependent steps (latency-bound work); for large or
independent work, ordinary launches are as fast and far simpler.

Layout of the ring (one allocation, little-endian 64-bit words): a 128-byte header (stop flag; then the kernel's
state and the count of commands it has finished, on their own cache line), ``capacity`` command slots and
``capacity`` answer slots of 64 bytes each. Ticket ``t`` (from 1) uses slot ``t % capacity``; its sequence number is
written last, after the fields (x86 stores are seen in order; the kernel reads through ``volatile`` and fences with
``__threadfence_system()`` before it publishes an answer's sequence number).

On the CPU backend the same ring is served by a Python function running on one stream's worker thread, with NumPy:
the same API and the same results, but a thread, not a kernel, and latencies of a thread that yields the GIL.

Hazards while a persistent kernel runs, and what gpuworkbench does about each (anything that waits for the whole
device would wait forever). Measured on an H200 by ``benchmarks/probes/persistent_probe.py``: cudaDeviceSynchronize,
cudaFree, cudaFreeHost, loading a new module and starting a CUPTI trace waited for a looping kernel; cudaMalloc,
cudaMallocAsync/cudaFreeAsync, cudaHostAlloc, copies, other streams' syncs and memGetInfo did not.

- ``Device.synchronize()`` skips the persistent stream; ``Stream.synchronize()`` on it raises instead of hanging.
- ``Buffer.free`` gives the block back to the device's pool (``backends/cuda/pool.py``), with no CUDA call; without
  the pool (``GPUWB_CUDA_POOL=0``, compute-sanitizer) its cudaFree, like the arena's, is deferred until the last
  persistent kernel on the device stops. ``Device.empty_cache()`` gives nothing back meanwhile. Memory allocated
  meanwhile comes from an arena allocated just before the kernel's launch, so that CUDA promises the kernel what it
  reads there (``backends/cuda/arena.py``); once the arena is full, from ``cudaMallocAsync`` on a private stream,
  freed stream-ordered, which a running kernel refuses to read.
- ``Device.compile`` is refused: loading a module may synchronize the context (CUDA's lazy loading). Compile first.
- The ring (mapped host memory) is released with cudaFreeHost only once no persistent kernel runs on the device.
- A trace that first meets the device while one runs takes its spans from CUDA events, not CUPTI (which would wait).
- A buffer named by a pending command stays alive until its answer; freeing it waits for that answer.
- Outside gpuworkbench (``cupy.cuda.Device().synchronize()``, ``torch.cuda.synchronize()``, a first call of a
  library's kernel) the same waits happen and cannot be intercepted: stop the kernel first.
- The kernel is not shown in traces: its span would stay open until stop, and a trace waiting for it would wait.

``stop()`` (also on ``with`` exit, from ``Device.close()`` and at interpreter exit) sets the flag first, then waits:
an error in a command or an interrupt while waiting never leaves the kernel running.
"""

from __future__ import annotations

from .kernel import PersistentKernel
from .ring import Command

__all__ = ["Command", "PersistentKernel"]
