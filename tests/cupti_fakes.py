"""A fake cupti-python module and a fake libcupti, for CUPTI's tests without a GPU (``from cupti_fakes import ...``).

``fake_cupti_module()`` has the enums a source makes its record tables from, with CUPTI's own codes, and logs the kinds
turned on and off. ``FakeLib`` plays libcupti's callback subscriber: ``api_call()`` is a CUDA call's entry and exit.
``fake_lifecycle`` backs the ``fake_cupti`` fixture (conftest.py): a fresh ``Lifecycle`` on them, with the fake module
as ``cupti``; the process's own lifecycle is left alone.
"""

from __future__ import annotations

import ctypes
import enum
import sys
import types
from collections.abc import Iterator

import pytest

from gpuworkbench.trace import cupti

ENTER, EXIT = 0, 1
#: The fake driver's one call that enqueues device work (``cuLaunchKernel``'s callback id here).
WORK = 20
#: CUPTI's activity kind codes (cupti.h) for the kinds a source enables.
ACTIVITY_KINDS = {
    "MEMCPY": 1,
    "MEMSET": 2,
    "KERNEL": 3,
    "DRIVER": 4,
    "RUNTIME": 5,
    "CONCURRENT_KERNEL": 10,
    "EXTERNAL_CORRELATION": 39,
}
MEMCPY_KINDS = {"HTOD": 1, "DTOH": 2, "HTOA": 3, "ATOH": 4, "ATOA": 5, "ATOD": 6, "DTOA": 7, "DTOD": 8, "HTOH": 9}


def fake_cupti_module(timestamp: int = 5_000) -> types.SimpleNamespace:
    """cupti-python's ``cupti`` as far as a source uses it; ``enabled`` (kind codes on) and ``log`` record
    ``activity_enable`` / ``activity_disable``. No per-API switches: the API filter cannot be set (as in an older
    CUPTI), and no MEMORY2 or MARKER kind."""
    enabled: set[int] = set()
    log: list[str] = []
    return types.SimpleNamespace(
        ActivityKind=enum.IntEnum("ActivityKind", ACTIVITY_KINDS),
        driver_api_trace_cbid=enum.IntEnum(
            "driver_api_trace_cbid", {"INVALID": 0, "cuCtxGetCurrent": 13, "cuLaunchKernel": WORK}
        ),
        runtime_api_trace_cbid=enum.IntEnum("runtime_api_trace_cbid", {"INVALID": 0, "cudaLaunchKernel_v7000": 211}),
        ExternalCorrelationKind=enum.IntEnum("ExternalCorrelationKind", {"INVALID": 0, "UNKNOWN": 1, "CUSTOM0": 3}),
        ActivityMemcpyKind=enum.IntEnum("ActivityMemcpyKind", MEMCPY_KINDS),
        ActivityMemoryKind=enum.IntEnum("ActivityMemoryKind", {"PAGEABLE": 1, "PINNED": 2, "DEVICE": 3}),
        Result=enum.IntEnum("Result", {"SUCCESS": 0, "ERROR_MAX_LIMIT_REACHED": 12}),
        activity_enable=lambda k: (enabled.add(int(k)), log.append(f"enable {k.name}")),
        activity_disable=lambda k: (enabled.discard(int(k)), log.append(f"disable {k.name}")),
        get_timestamp=lambda: timestamp,
        activity_push_external_correlation_id=lambda kind, i: None,
        activity_pop_external_correlation_id=lambda kind: None,
        enabled=enabled,
        log=log,
    )


class Fn:
    """A fake foreign function: callable, and takes ``argtypes``/``restype`` as ctypes' do."""

    def __init__(self, body) -> None:
        self.body = body

    def __call__(self, *args):
        return self.body(*args)


class FakeLib:
    """libcupti's subscriber calls; ``api_call()`` plays a CUDA call's entry and exit through the subscribed
    callback."""

    def __init__(self, subscribe_status: int = 0) -> None:
        self.calls: list[str] = []
        self.callback = None
        self.domain_on = False
        self.enabled: set[int] = set()  # callback ids enabled one by one (``cuptiEnableCallback``)
        self.subscribe_status = subscribe_status
        self.cuptiSubscribe = Fn(self._subscribe)
        self.cuptiEnableDomain = Fn(self._enable_domain)
        self.cuptiUnsubscribe = Fn(self._unsubscribe)
        self.cuptiFinalize = Fn(lambda: self.calls.append("finalize") or 0)
        self.cuptiEnableCallback = Fn(self._enable_callback)

    def _enable_callback(self, on, sub, domain, cbid) -> int:
        (self.enabled.add if on else self.enabled.discard)(cbid)
        return 0

    def _subscribe(self, out, fn, userdata) -> int:
        self.calls.append("subscribe")
        if not self.subscribe_status:
            self.callback = fn
        return self.subscribe_status

    def _enable_domain(self, on, sub, domain) -> int:
        self.calls.append(f"domain {domain} {on}")
        self.domain_on = bool(on)
        return 0

    def _unsubscribe(self, sub) -> int:
        self.calls.append("unsubscribe")
        self.callback, self.domain_on = None, False
        self.enabled.clear()
        return 0

    def api_call(self, cbid: int = 13) -> None:
        """A CUDA call: its entry and exit reach the subscriber while its domain is on."""
        for site in (ENTER, EXIT):
            data = ctypes.c_int(site)
            callback = self.callback
            if callback is not None and (self.domain_on or cbid in self.enabled):
                callback(None, 1, cbid, ctypes.addressof(data))


class FakeRaw:
    """``RawCupti`` as the lifecycle uses it: registering, flushes, handing back; ``lib`` is a :class:`FakeLib`."""

    def __init__(self) -> None:
        self.lib = FakeLib()
        self.ours = False
        self.flushes = 0
        self.registered = 0
        self.expected_bytes: dict[int, int] = {}
        self.end_status = -1

    def register(self) -> None:
        self.registered += 1
        self.ours = True

    def flush_all(self, forced: int) -> int:
        self.flushes += 1
        return 0

    def hand_back(self) -> bool:
        self.ours = False
        return False


def let_earlier_traces_finish() -> None:
    """A trace from an earlier test (a real one, on a GPU) may still be harvesting, and the process's lifecycle may
    have a timer due: both end (and a real CUPTI is let go) before a test puts a fake ``cupti`` in ``sys.modules``,
    which such a timer would otherwise import."""
    from gpuworkbench.trace.recorder_cupti import OWNER

    owner = OWNER.trace
    if owner is not None and owner._thread is not None:
        owner._hurry.set()
        owner._thread.join(10.0)
    life = cupti.LIFECYCLE
    life.prime_timer.wait_idle(5.0)
    life.let_go()  # a real CUPTI an earlier test left attached (False where there is none)
    with life.lock:
        life.linger_timer.disarm()
        life.prime_timer.disarm()
        life.cancel_reattach()
    for timer in (life.linger_timer, life.prime_timer, life.reattach_timer):
        timer.wait_idle(5.0)


def end_timers(life: cupti.Lifecycle) -> None:
    """Nothing of ``life``'s left due once a test ends."""
    with life.lock:
        life.linger_timer.disarm()
        life.prime_timer.disarm()
        life.cancel_reattach()


def fake_lifecycle(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """A fresh lifecycle on a fake libcupti, with the fake module as ``cupti``, set as a script's: sources linger
    ``linger_s`` 60 s, nothing is initialized again on a timer or primed at a park (priming has its own tests), and
    a take-over's watch is quieted by the linger thread (these sources run without a trace's harvest thread). Yields
    ``life``, ``module``, ``raw``, ``enabled`` and ``log``."""
    let_earlier_traces_finish()
    module = fake_cupti_module()
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=module))
    raw = FakeRaw()
    life = cupti.Lifecycle(raw=raw)
    life.linger_s, life.reattach_s, life.notebook = 60.0, None, False
    life.prime_at_park, life.quiet_by = False, "linger"
    yield types.SimpleNamespace(life=life, module=module, raw=raw, enabled=module.enabled, log=module.log)
    end_timers(life)
