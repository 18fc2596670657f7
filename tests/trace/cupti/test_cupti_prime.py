"""The primer (``trace/cupti/prime.py``) against a fake libcuda and libcupti: which devices it primes, what it makes
once, and that a failure leaves nothing behind. On a GPU, tests/trace/test_cuda_any_code.py checks that its work never
reaches a trace."""

from __future__ import annotations

import threading

from gpuworkbench.trace.cupti.prime import Primer


class FakeCuda:
    """Two devices, the first with an active primary context; ``fail`` names a call that returns an error."""

    def __init__(self, active=(True, False), fail: str = "") -> None:
        self.active, self.fail = active, fail
        self.calls: list[str] = []
        self.depth = 0  # contexts pushed and not popped

    def _status(self, name: str) -> int:
        self.calls.append(name)
        return 1 if name == self.fail else 0

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.active)
        return self._status("cuDeviceGetCount")

    def cuDeviceGet(self, device, ordinal):
        device._obj.value = ordinal
        return self._status("cuDeviceGet")

    def cuDevicePrimaryCtxGetState(self, device, flags, on):
        on._obj.value = int(self.active[device.value])
        return self._status("cuDevicePrimaryCtxGetState")

    context_id = 1  # the primary context's unique id (a reset makes a new one)

    def cuDevicePrimaryCtxRetain(self, context, device):
        context._obj.value = 0x1000 + device.value
        return self._status("cuDevicePrimaryCtxRetain")

    def cuCtxGetId(self, context, ident):
        ident._obj.value = self.context_id
        return self._status("cuCtxGetId")

    def cuDevicePrimaryCtxRelease_v2(self, device):
        return self._status("cuDevicePrimaryCtxRelease")

    def cuCtxPushCurrent_v2(self, context):
        self.depth += 1
        return self._status("push")

    def cuCtxPopCurrent_v2(self, context):
        self.depth -= 1
        return self._status("pop")

    def cuStreamCreate(self, stream, flags):
        stream._obj.value = 0x2000
        return self._status("cuStreamCreate")

    def cuStreamDestroy_v2(self, stream):
        return self._status("cuStreamDestroy")

    def cuMemAlloc_v2(self, pointer, size):
        pointer._obj.value = 0x3000 + 0x100 * (self.context_id - 1)  # a new context: another address
        return self._status("cuMemAlloc")

    def cuMemcpyHtoDAsync_v2(self, dst, src, size, stream):
        return self._status("copy")

    def cuMemsetD32Async(self, dst, value, count, stream):
        return self._status("memset")


class FakeCupti:
    """libcupti's ``cuptiGetStreamIdEx``, as a function ctypes-style (argument types can be set on it); ``status``
    non-zero: CUPTI cannot name the stream."""

    def __init__(self, status: int = 0) -> None:
        def get_stream_id(context, stream, per_thread, sid):
            sid._obj.value = 17
            return status

        self.cuptiGetStreamIdEx = get_stream_id


def primer(cuda: FakeCuda) -> Primer:
    p = Primer()
    p._lib = cuda
    return p


def test_only_devices_with_an_active_context_are_primed_their_stream_made_once_and_no_context_kept():
    cuda = FakeCuda()
    p = primer(cuda)
    with p.lock:
        assert p.prime(FakeCupti()) == 1
        assert p.prime(FakeCupti()) == 1
    assert cuda.calls.count("cuStreamCreate") == 1 and cuda.calls.count("cuMemAlloc") == 1
    assert cuda.calls.count("copy") == 2 and cuda.calls.count("memset") == 2 and cuda.depth == 0
    assert cuda.calls.count("cuDevicePrimaryCtxRetain") == cuda.calls.count("cuDevicePrimaryCtxRelease") == 2
    assert p.streams == frozenset({(0, 17)}) and p.addresses == frozenset({(0, 0x3000)}) and p.error == ""
    assert p.threads == frozenset({threading.get_ident() & 0xFFFFFFFF}) and p.rounds == 2


def test_a_new_primary_context_gets_a_new_stream_and_allocation():
    cuda = FakeCuda()
    p = primer(cuda)
    with p.lock:
        p.prime(FakeCupti())
        cuda.context_id = 2  # the device was reset: the old stream and bytes went with the old context
        assert p.prime(FakeCupti()) == 1
    assert cuda.calls.count("cuStreamCreate") == 2 and cuda.calls.count("cuMemAlloc") == 2
    # the old address went with its context: another library's allocation there is not taken for the primer's
    assert p.addresses == frozenset({(0, 0x3100)})


def test_a_device_whose_stream_cupti_cannot_name_is_not_primed():
    """Its records could not be told from the user's: nothing is enqueued."""
    cuda = FakeCuda()
    p = primer(cuda)
    with p.lock:
        assert p.prime(FakeCupti(status=1)) == 0
        assert p.prime(None) == 0
    assert "copy" not in cuda.calls and p.streams == frozenset() and cuda.depth == 0


def test_a_device_whose_set_up_fails_gives_back_what_was_made_and_is_never_tried_again():
    cuda = FakeCuda(fail="cuMemAlloc")
    p = primer(cuda)
    with p.lock:
        assert p.prime(FakeCupti()) == 0
        assert p.prime(FakeCupti()) == 0
    assert cuda.calls.count("cuMemAlloc") == 1 and cuda.calls.count("cuStreamDestroy") == 1
    assert cuda.calls.count("cuDevicePrimaryCtxRetain") == cuda.calls.count("cuDevicePrimaryCtxRelease") == 1
    assert cuda.depth == 0 and "device 0" in p.error and "cuMemAlloc" in p.error and p.streams == frozenset()


def test_a_failed_copy_is_reported_the_context_popped_and_released_and_tried_again_next_time():
    cuda = FakeCuda(fail="copy")
    p = primer(cuda)
    with p.lock:
        assert p.prime(FakeCupti()) == 0
        assert p.prime(FakeCupti()) == 0
    assert "cuMemcpyHtoDAsync" in p.error and cuda.depth == 0 and "memset" not in cuda.calls
    assert cuda.calls.count("copy") == 2 and cuda.calls.count("cuStreamCreate") == 1
    assert cuda.calls.count("cuDevicePrimaryCtxRetain") == cuda.calls.count("cuDevicePrimaryCtxRelease") == 2


def test_no_driver_no_priming():
    cuda = FakeCuda(fail="cuDeviceGetCount")  # the driver never initialized: no CUDA work in this process
    p = primer(cuda)
    with p.lock:
        assert p.prime(FakeCupti()) == 0
    assert cuda.calls == ["cuDeviceGetCount"]


def test_no_libcuda_says_so_and_never_raises(monkeypatch):
    import ctypes

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    p = Primer()
    with p.lock:
        assert p.prime(FakeCupti()) == 0
        assert p.prime(FakeCupti()) == 0
    assert "OSError" in p.error
