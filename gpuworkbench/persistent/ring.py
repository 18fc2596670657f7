"""The ring a persistent kernel serves, and its two servers: the CUDA kernel's source, and the CPU backend's loop.

One allocation of little-endian 64-bit words: a ``HEADER``-byte header (the stop flag at ``STOP``; the kernel's state
at ``STATE`` and the last ticket it answered at ``PROCESSED``, on their own cache line), then ``capacity`` command
slots and ``capacity`` answer slots of ``SLOT`` bytes each. Ticket ``t`` uses slot ``t % capacity``; its sequence
number is written last, after the fields.
"""

from __future__ import annotations

import struct
import time
from enum import IntEnum
from typing import Any

import numpy as np


class Command(IntEnum):
    """The commands a persistent kernel understands."""

    ECHO = 1  # answer a + b: the smallest round trip
    SCALE = 2  # multiply a buffer's first n elements by a, in place
    SUM = 3  # answer the sum of a buffer's first n elements (one block's reduction)


HEADER = 128
SLOT = 64
STOP = 0  # word the host sets to ask the kernel to exit
STATE = 64  # the kernel's state: 0 launched, 1 looping, 2 exited
PROCESSED = 72  # the last ticket the kernel has answered
I64 = struct.Struct("<q")
BODY = struct.Struct("<qQqddq")  # op, buffer pointer, n, a, b, dtype code (after the sequence number)
ANSWER = struct.Struct("<qqdq")  # sequence number, status, value, integer value
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))
DTYPE_CODES = {dt: i for i, dt in enumerate(DTYPES)}


class Status(IntEnum):
    """An answer's status word."""

    OK = 0
    UNKNOWN = 1  # not a command the kernel knows
    BAD_DTYPE = 2  # an element type the kernel does not handle
    RAISED = 3  # the CPU loop's NumPy raised (its message is kept by the loop)


CUDA_SOURCE = r"""
typedef long long i64;

template <typename T> __device__ __forceinline__ T gw_load(const T* p) {
#if defined(__HIP_PLATFORM_AMD__)
    return *(const volatile T*)p;
#else
    return __ldcg(p);  // through L2 only: L1 may hold what this kernel read before the host copied new data in
#endif
}

template <typename T, typename A> __device__ void gw_scale(T* p, i64 n, A a) {
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) p[i] = (T)(gw_load(p + i) * a);
}

template <typename T, typename S> __device__ S gw_sum(const T* p, i64 n) {
    S s = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) s += gw_load(p + i);
    return s;
}

extern "C" __global__ void gw_persistent(i64* ring, i64 capacity) {
    volatile i64* header = ring;
    volatile i64* commands = ring + 16;
    volatile i64* answers = commands + capacity * 8;
    __shared__ i64 op, n, dtype, go;
    __shared__ unsigned long long ptr;
    __shared__ double a, b;
    __shared__ double partial[1024];
    __shared__ i64 ipartial[1024];
    const int t = threadIdx.x;
    if (t == 0) { header[8] = 1; __threadfence_system(); }
    for (i64 expected = 1;; ++expected) {
        if (t == 0) {
            volatile i64* slot = commands + (expected % capacity) * 8;
            i64 ready = 0;
            for (unsigned polls = 1;; ++polls) {
                if (slot[0] == expected) { ready = 1; break; }
                if ((polls & 63) == 0 && header[0] != 0) {  // stop: but a command written before the flag goes first
                    __threadfence_system();
                    ready = slot[0] == expected;
                    break;
                }
            }
            if (ready) {
                __threadfence_system();  // the fields were written before the sequence number: read them after it
                const i64 f1 = slot[1], f2 = slot[2], f3 = slot[3], f4 = slot[4], f5 = slot[5], f6 = slot[6];
                op = f1;  // all six reads are in flight together; one PCIe round trip, not six
                ptr = (unsigned long long)f2;
                n = f3;
                a = __longlong_as_double(f4);
                b = __longlong_as_double(f5);
                dtype = f6;
            }
            go = ready;
        }
        __syncthreads();
        if (!go) break;
        i64 status = 0;
        double value = 0.0;
        i64 ivalue = 0;
        if (op == 1) {
            value = a + b;
        } else if (op == 2) {
            if (dtype == 0) gw_scale((float*)ptr, n, (float)a);  // float32 * float32: one rounding, as NumPy
            else if (dtype == 1) gw_scale((double*)ptr, n, a);
            else if (dtype == 2) gw_scale((int*)ptr, n, a);  // through double, truncated by the conversion
            else if (dtype == 3) gw_scale((i64*)ptr, n, a);
            else status = 2;
        } else if (op == 3) {
            double dsum = 0.0;
            i64 isum = 0;
            if (dtype == 0) dsum = gw_sum<float, double>((const float*)ptr, n);
            else if (dtype == 1) dsum = gw_sum<double, double>((const double*)ptr, n);
            else if (dtype == 2) isum = gw_sum<int, i64>((const int*)ptr, n);
            else if (dtype == 3) isum = gw_sum<i64, i64>((const i64*)ptr, n);
            else status = 2;
            if (status == 0) {
                partial[t] = dsum;
                ipartial[t] = isum;
                __syncthreads();
                for (int s = blockDim.x / 2; s > 0; s >>= 1) {
                    if (t < s) { partial[t] += partial[t + s]; ipartial[t] += ipartial[t + s]; }
                    __syncthreads();
                }
                value = dtype < 2 ? partial[0] : (double)ipartial[0];
                ivalue = ipartial[0];
            }
        } else {
            status = 1;
        }
        __threadfence();  // this thread's stores (SCALE) reach device memory before the answer is published
        __syncthreads();
        if (t == 0) {
            volatile i64* answer = answers + (expected % capacity) * 8;
            answer[1] = status;
            answer[2] = __double_as_longlong(value);
            answer[3] = ivalue;
            __threadfence_system();  // the fields before the sequence number the host waits for
            answer[0] = expected;
            header[9] = expected;
        }
        __syncthreads();  // the shared command fields are reused by the next iteration
    }
    if (t == 0) { __threadfence_system(); header[8] = 2; __threadfence_system(); }
}
"""


def cpu_execute(op: int, data: np.ndarray | None, n: int, a: float, b: float, dtype: int) -> tuple[int, float, int]:
    """One command with NumPy, rounding as the CUDA kernel does: (status, value, integer value)."""
    if op == Command.ECHO:
        return Status.OK, a + b, 0
    if op not in (Command.SCALE, Command.SUM):
        return Status.UNKNOWN, 0.0, 0
    if not 0 <= dtype < len(DTYPES) or data is None:
        return Status.BAD_DTYPE, 0.0, 0
    dt = DTYPES[dtype]
    view = data[: n * dt.itemsize].view(dt)
    if op == Command.SCALE:
        if dt.kind == "f":
            view *= dt.type(a)  # float32 · float32(a): one rounding, as on the device
        else:
            view[:] = (view.astype(np.float64) * a).astype(dt)  # C's conversion truncates toward zero
        return Status.OK, 0.0, 0
    if dt.kind == "f":
        return Status.OK, float(view.sum(dtype=np.float64)), 0
    total = int(view.sum(dtype=np.int64))
    return Status.OK, float(total), total


class CpuLoop:
    """The CPU backend's persistent 'kernel': a function that one stream's worker thread runs until the stop flag."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}  # ticket -> the buffer's memory (no pointers on the CPU)
        self.errors: dict[int, str] = {}  # ticket -> what a command raised

    def __call__(self, ring: np.ndarray, capacity: Any) -> None:
        mv, cap = memoryview(ring), int(capacity)
        answers = HEADER + cap * SLOT
        I64.pack_into(mv, STATE, 1)
        expected, idle_since = 1, None
        while True:
            slot = HEADER + (expected % cap) * SLOT
            if I64.unpack_from(mv, slot)[0] != expected:
                if I64.unpack_from(mv, STOP)[0] and I64.unpack_from(mv, slot)[0] != expected:
                    break
                now = time.perf_counter()
                idle_since = idle_since or now
                time.sleep(0 if now - idle_since < 2e-3 else 5e-5)  # poll, yielding the GIL to the host
                continue
            idle_since = None
            op, _, n, a, b, dtype = BODY.unpack_from(mv, slot + 8)
            try:
                status, value, ivalue = cpu_execute(op, self.buffers.pop(expected, None), n, a, b, dtype)
            except Exception as exc:  # noqa: BLE001 - a failing command is answered, the loop goes on
                self.errors[expected] = f"{type(exc).__name__}: {exc}"
                status, value, ivalue = Status.RAISED, 0.0, 0
            answer = answers + (expected % cap) * SLOT
            ANSWER.pack_into(mv, answer, 0, status, value, ivalue)
            I64.pack_into(mv, answer, expected)  # last, as the device does
            I64.pack_into(mv, PROCESSED, expected)
            expected += 1
        I64.pack_into(mv, STATE, 2)
