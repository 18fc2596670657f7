"""The pinned staging of pageable copies (``backends/cuda/staging.py``), with host memory standing in for the device:
every byte arrives, in place, whatever the number of chunks, and a slot is reused only after its DMA has ended."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from gpuworkbench.backends.cuda import staging


class FakeEvent:
    """Records which slot DMAs an event covered; ``synchronize`` is where the stager waits for them."""

    def __init__(self, log: list) -> None:
        self.log = log

    def record(self, stream: object) -> None:
        self.log.append(("record", id(self)))

    def synchronize(self) -> None:
        self.log.append(("wait", id(self)))


def host_copy(dst: int, src: int, nbytes: int, stream: object) -> None:
    ctypes.memmove(dst, src, nbytes)


@pytest.fixture
def stager(monkeypatch):
    monkeypatch.setattr(staging, "CHUNK", 1 << 12)  # many chunks from a small array
    log: list = []
    made = staging.Stager(lambda n: bytearray(n), lambda: FakeEvent(log))
    yield made, log
    made.close()


@pytest.mark.parametrize("nbytes", [1, (1 << 12) - 1, 1 << 12, 5 * (1 << 12) + 3, 37 * (1 << 12) + 1001])
def test_every_byte_arrives_in_place_both_ways(stager, nbytes) -> None:
    s, _ = stager
    src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    device = np.zeros(nbytes, np.uint8)
    s.h2d(host_copy, device.ctypes.data, src, stream=None)
    assert np.array_equal(device, src)
    back = np.zeros(nbytes, np.uint8)
    s.d2h(host_copy, back, device.ctypes.data, stream=None)
    assert np.array_equal(back, src)


def test_a_slot_is_reused_only_after_waiting_for_its_last_dma(stager) -> None:
    s, log = stager
    chunks = 3 * staging.SLOTS
    src = np.arange(chunks * (1 << 12) // 4, dtype=np.float32)
    device = np.zeros_like(src)
    s.h2d(host_copy, device.ctypes.data, src, stream=None)
    assert np.array_equal(device, src)
    events = {e for kind, e in log if kind == "record"}
    assert len(events) == staging.SLOTS  # one event per slot, recorded again at each DMA
    waits = [e for kind, e in log if kind == "wait"]
    assert len(waits) == chunks - staging.SLOTS  # every reuse of a slot waited for that slot's previous DMA
    for k, (kind, e) in enumerate(log):
        if kind == "wait":
            assert ("record", e) in log[:k]
