"""CUPTI's lifetime across traces: a stopped source parks with its kinds on, the next takes it over without enabling
anything, and after ``LINGER_S`` CUPTI is let go (``cuptiFinalize`` at a CUDA call's exit). A fake cupti module and a
fake libcupti stand in for the real ones: runs without a GPU. On a GPU, tests/test_cuda_any_code.py checks that the
next trace still sees every kernel, and benchmarks/probes/cupti_idle.py what an idle process pays."""

from __future__ import annotations

import ctypes
import enum
import sys
import threading
import time
import types

import pytest

from gpuworkbench.trace import cupti as cupti_mod
from gpuworkbench.trace.cupti_detach import Deadline, ExitDetach

ENTER, EXIT = 0, 1
WORK = 20  # the callback id the fake marks as a launch


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
        self.subscribe_status = subscribe_status
        self.cuptiSubscribe = Fn(self._subscribe)
        self.cuptiEnableDomain = Fn(self._enable_domain)
        self.cuptiUnsubscribe = Fn(self._unsubscribe)
        self.cuptiFinalize = Fn(lambda: self.calls.append("finalize") or 0)

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
        return 0

    def api_call(self, cbid: int = 13) -> None:
        """A CUDA call: its entry and exit reach the subscriber while its domain is on."""
        for site in (ENTER, EXIT):
            data = ctypes.c_int(site)
            callback = self.callback
            if callback is not None and self.domain_on:
                callback(None, 1, cbid, ctypes.addressof(data))


class FakeRaw:
    def __init__(self) -> None:
        self.lib = FakeLib()
        self.ours = False
        self.flushes = 0
        self.registered = 0

    def register(self) -> None:
        self.registered += 1
        self.ours = True

    def flush_all(self, forced: int) -> int:
        self.flushes += 1
        return 0

    def hand_back(self) -> bool:
        self.ours = False
        return False


def _let_earlier_traces_finish() -> None:
    """A trace from an earlier test (a real one, on a GPU) may still be harvesting: its harvester parks its source
    when it ends, which must not land in the module state this fixture sets up."""
    from gpuworkbench.trace import recorder

    owner = recorder._CUPTI_OWNER
    if owner is not None and owner._thread is not None:
        owner._hurry.set()
        owner._thread.join(10.0)
    cupti_mod._PRIME.wait_idle(5.0)
    cupti_mod.let_go()  # a real CUPTI an earlier test left attached (False where there is none)
    with cupti_mod._STATE_LOCK:
        cupti_mod._LINGER.disarm()
        cupti_mod._PRIME.disarm()
        cupti_mod._cancel_reattach()
    for deadline in (cupti_mod._LINGER, cupti_mod._PRIME, cupti_mod._REATTACH):
        deadline.wait_idle(5.0)  # a call of an earlier test's state under way ends before this test's state is set


@pytest.fixture
def fake_cupti(monkeypatch):
    _let_earlier_traces_finish()
    kinds = enum.IntEnum(
        "ActivityKind",
        {
            "CONCURRENT_KERNEL": 10,
            "KERNEL": 3,
            "MEMCPY": 1,
            "MEMSET": 2,
            "EXTERNAL_CORRELATION": 36,
            "DRIVER": 6,
            "RUNTIME": 7,
        },
    )
    enabled: set[int] = set()
    log: list[str] = []
    module = types.SimpleNamespace(
        ActivityKind=kinds,
        activity_enable=lambda k: (enabled.add(int(k)), log.append(f"enable {k.name}")),
        activity_disable=lambda k: (enabled.discard(int(k)), log.append(f"disable {k.name}")),
        get_timestamp=lambda: 5_000,
        activity_push_external_correlation_id=lambda kind, i: None,
        activity_pop_external_correlation_id=lambda kind: None,
    )
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=module))
    raw = FakeRaw()
    monkeypatch.setattr(cupti_mod, "_raw_cupti", lambda c: raw)
    monkeypatch.setattr(cupti_mod, "_RAW", raw)
    monkeypatch.setattr(cupti_mod, "API_FILTER", False)
    monkeypatch.setattr(cupti_mod, "OPTIONAL_KINDS", ())
    for name in ("_ACTIVE", "_PARKED", "_DETACH"):
        monkeypatch.setattr(cupti_mod, name, None)
    monkeypatch.setattr(cupti_mod, "_TICKS", False)
    monkeypatch.setattr(cupti_mod, "_ATTACHED", False)
    monkeypatch.setattr(cupti_mod, "_FRESH", False)
    monkeypatch.setattr(cupti_mod, "LINGER_S", 60.0)
    monkeypatch.setattr(cupti_mod, "REATTACH_S", None)
    monkeypatch.setattr(cupti_mod, "NOTEBOOK", False)  # as in a script
    monkeypatch.setattr(cupti_mod, "_BLOCKERS", {})
    monkeypatch.setattr(cupti_mod, "PRIME_AT_PARK", False)  # a park watches at once (priming: its own tests)
    monkeypatch.setattr(cupti_mod, "QUIET_BY", "linger")  # these sources run without a trace's harvest thread
    monkeypatch.setattr(cupti_mod, "_QUIET_DUE", False)
    work = bytearray(WORK + 1)
    work[WORK] = 1  # the fake's one call that enqueues device work
    monkeypatch.setattr(cupti_mod, "_WORK_CBIDS", bytes(work))
    yield types.SimpleNamespace(enabled=enabled, log=log, raw=raw)
    with cupti_mod._STATE_LOCK:
        cupti_mod._LINGER.disarm()
        cupti_mod._PRIME.disarm()
        cupti_mod._cancel_reattach()


def source() -> cupti_mod.CuptiSource:
    s = cupti_mod.CuptiSource()
    s._tables_ready = True  # the fake module has no enums or dtypes to make tables from
    return s


def linger_out(fake_cupti) -> FakeLib:
    """Start and stop a source, then wait for the linger to run out (the detach armed); the fake libcupti."""
    s = source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    deadline = time.monotonic() + 5
    while not (cupti_mod._DETACH is not None and cupti_mod._DETACH.armed) and time.monotonic() < deadline:
        time.sleep(0.01)
    return lib


def test_a_stopped_source_parks_and_the_next_takes_its_kinds_over_without_enabling(fake_cupti):
    first = source()
    assert cupti_mod.detached()
    assert cupti_mod.state().startswith("not attached")
    first.start()
    assert fake_cupti.raw.registered == 1 and len(fake_cupti.enabled) == 6 and not cupti_mod.detached()
    assert fake_cupti.raw.lib.calls == ["subscribe"]  # on the starting thread, no callback on yet
    assert cupti_mod.state().startswith("recording")
    first.stop()
    assert not first.running and cupti_mod._PARKED is first and cupti_mod._ACTIVE is None
    assert cupti_mod.state().startswith("lingering") and "at the first untraced launch, copy or memset, or in " in (
        cupti_mod.state()
    )
    assert cupti_mod.lingering()
    assert len(fake_cupti.enabled) == 6 and not any(e.startswith("disable") for e in fake_cupti.log)
    fake_cupti.log.clear()
    second = source()
    second.start()
    assert fake_cupti.log == [] and fake_cupti.raw.registered == 1  # nothing enabled or registered again
    assert cupti_mod._ACTIVE is second and cupti_mod._PARKED is None and second._cutoff == 5_000
    assert wait_for(lambda: not cupti_mod._LINGER.armed)  # only the watch's callbacks to turn off, then nothing due
    second.stop()
    assert cupti_mod._PARKED is second and cupti_mod._LINGER.armed


def test_after_the_linger_kinds_go_off_and_cupti_is_finalized_at_the_next_cuda_call(fake_cupti, monkeypatch):
    monkeypatch.setattr(cupti_mod, "LINGER_S", 0.05)
    monkeypatch.setattr(cupti_mod, "_API_FILTER_SET", True)
    lib = linger_out(fake_cupti)
    assert fake_cupti.enabled == set() and cupti_mod._PARKED is None
    # watching for untraced work while parked, not any more once unparked, then armed: waits for a CUDA call
    assert lib.calls == ["subscribe", "domain 1 1", "domain 1 0", "domain 1 1"] and not cupti_mod.detached()
    assert "next CUDA call" in cupti_mod.state()
    lib.api_call()
    assert lib.calls[4:] == ["unsubscribe", "finalize"] and cupti_mod.detached()
    assert not fake_cupti.raw.ours and not cupti_mod._API_FILTER_SET  # CUPTI forgot both: set again on the next start
    again = source()
    again.start()
    assert fake_cupti.raw.registered == 2 and len(fake_cupti.enabled) == 6 and again._cutoff == 0
    assert lib.calls[6:] == ["subscribe"]  # a new subscriber for the next detach


def test_a_start_calls_off_a_detach_that_has_not_happened(fake_cupti, monkeypatch):
    monkeypatch.setattr(cupti_mod, "LINGER_S", 0.0)
    lib = linger_out(fake_cupti)
    again = source()
    again.start()
    assert lib.calls[-2:] == ["domain 1 1", "domain 1 0"]  # armed, then called off: never finalized, still subscribed
    assert fake_cupti.raw.registered == 1 and len(fake_cupti.enabled) == 6  # still attached: kinds on again
    lib.api_call()
    assert "finalize" not in lib.calls and not cupti_mod.detached()
    again.stop()


def test_another_tool_taking_cupti_turns_parked_kinds_off_and_calls_off_the_detach(fake_cupti):
    s = source()
    s.start()
    s.stop()
    cupti_mod.hand_over()
    assert fake_cupti.enabled == set() and cupti_mod._PARKED is None and not cupti_mod._LINGER.armed
    assert fake_cupti.raw.lib.calls[-1] == "unsubscribe" and cupti_mod._DETACH is None  # Kineto subscribes next


def test_exit_detach_finalizes_once_on_the_first_exit_of_any_thread():
    lib = FakeLib()
    detached = []
    d = ExitDetach(lib, lambda: detached.append(threading.current_thread().name))
    assert d.subscribe() == 0
    lib.domain_on = True  # as if CUPTI called every subscriber: an unarmed detach ignores the calls
    lib.api_call()
    assert lib.calls == ["subscribe"] and not d.done.is_set()
    assert d.arm() == 0
    data = ctypes.c_int(ENTER)
    lib.callback(None, 1, 13, ctypes.addressof(data))  # an entry: nothing yet
    assert lib.calls == ["subscribe", "domain 1 1"] and not d.done.is_set()
    threads = [threading.Thread(target=lib.api_call, name=f"t{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lib.calls.count("finalize") == 1 and d.finalized and len(detached) == 1
    assert d.disarm() is False  # too late: CUPTI is gone


def test_a_disarmed_detach_stays_subscribed_and_can_be_armed_again():
    lib = FakeLib()
    d = ExitDetach(lib, lambda: None)
    d.subscribe()
    d.arm()
    assert d.disarm() is True and not lib.domain_on
    lib.api_call()
    assert "finalize" not in lib.calls
    d.arm()
    lib.api_call()
    assert lib.calls[-2:] == ["unsubscribe", "finalize"] and d.finalized


def test_exit_detach_refused_leaves_nothing_subscribed():
    lib = FakeLib(subscribe_status=39)  # e.g. CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
    d = ExitDetach(lib, lambda: None)
    assert d.subscribe() == 39 and not d.subscribed and lib.callback is None
    assert d.arm() == -1 and not lib.domain_on


def test_deadline_calls_with_the_last_armed_token_and_disarm_cancels():
    got: list[int] = []
    clock = Deadline(got.append, "test-deadline", idle_s=0.5)
    clock.arm(10.0, 1)
    clock.arm(0.02, 2)  # replaces the first
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert got == [2] and not clock.armed
    clock.arm(0.05, 3)
    clock.disarm()
    time.sleep(0.15)
    assert got == [2]


def test_deadline_wait_idle_waits_for_a_call_due_now_and_one_running_but_not_a_later_one():
    gate = threading.Event()
    done: list[int] = []
    clock = Deadline(lambda token: gate.wait(5.0) and done.append(token), "test-deadline-idle", idle_s=0.5)
    assert clock.wait_idle(0.01)  # nothing armed
    clock.arm(30.0, 1)
    assert clock.wait_idle(0.01)  # due long after the wait
    clock.arm(0.0, 2)  # due now: the call blocks on the gate
    assert not clock.wait_idle(0.1) and done == []
    gate.set()
    assert clock.wait_idle(2.0) and done == [2]


def wait_for(what, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what() and time.monotonic() < deadline:
        time.sleep(0.005)
    return what()


def test_untraced_work_ends_the_linger_and_cupti_is_initialized_again_with_no_kind_on(fake_cupti, monkeypatch):
    """A lingering source is let go at the first untraced call that enqueues work, not after ``LINGER_S``; CUPTI is
    then initialized again off that thread (``REATTACH_S``), and the next trace only enables its kinds."""
    monkeypatch.setattr(cupti_mod, "REATTACH_S", 0.02)
    s = source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    assert cupti_mod.lingering() and lib.domain_on  # watching
    lib.api_call()  # a call that enqueues nothing (a query, a get): the source lingers on
    assert cupti_mod.lingering() and "finalize" not in lib.calls
    lib.api_call(WORK)  # an untraced launch
    assert wait_for(lambda: cupti_mod._PARKED is None and fake_cupti.enabled == set())
    assert wait_for(lambda: cupti_mod._DETACH is not None and cupti_mod._DETACH.armed)
    lib.api_call()  # the next call's exit lets CUPTI go
    assert "finalize" in lib.calls and fake_cupti.raw.registered == 1
    assert cupti_mod.settle(5) and fake_cupti.raw.registered == 2  # initialized again, on the re-attach thread
    assert cupti_mod.state().startswith("ready") and not cupti_mod.detached() and fake_cupti.enabled == set()
    fake_cupti.log.clear()
    again = source()
    again.start()
    assert fake_cupti.raw.registered == 2 and len(fake_cupti.enabled) == 6  # enabled, not registered again
    assert cupti_mod.state().startswith("recording")
    again.stop()


def test_a_trace_taking_a_lingering_source_over_stops_the_watch(fake_cupti, monkeypatch):
    s = source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    assert lib.domain_on
    gate = threading.Event()
    linger_over = cupti_mod._LINGER._fn
    monkeypatch.setattr(cupti_mod._LINGER, "_fn", lambda token: (gate.wait(5), linger_over(token)))
    again = source()
    again.start()
    # its own launches are traced: nothing to watch; the callbacks go off on the linger thread, not in the start
    assert not cupti_mod._DETACH.watching and cupti_mod._ACTIVE is again and lib.domain_on
    lib.api_call(WORK)  # before they are off: the callback returns at once, no let-go
    assert lib.calls[-1] == "domain 1 1" and cupti_mod._ACTIVE is again
    gate.set()
    assert wait_for(lambda: not lib.domain_on) and lib.calls[-1] == "domain 1 0"
    lib.api_call(WORK)
    time.sleep(0.05)
    assert cupti_mod._ACTIVE is again and len(fake_cupti.enabled) == 6 and "finalize" not in lib.calls
    again.stop()


def test_let_go_calls_off_a_due_reattach(fake_cupti, monkeypatch):
    """``let_go`` (a benchmark's baseline, ``%gpu cupti release``) leaves CUPTI let go: a re-initialization that was
    due does not happen."""
    monkeypatch.setattr(cupti_mod, "REATTACH_S", 0.05)
    s = source()
    s.start()
    s.stop()
    cupti_mod.reattach_soon(0.05)
    assert cupti_mod.let_go() and cupti_mod.detached()
    assert cupti_mod.settle(1)
    time.sleep(0.1)
    assert cupti_mod.detached() and fake_cupti.raw.registered == 1


def test_a_blocker_keeps_cupti_as_it_is_until_it_goes(fake_cupti, monkeypatch):
    """While a persistent kernel runs (attaching or letting CUPTI go waited for it to end, on an H200), the linger
    does not end and ``let_go`` refuses; once it goes, the linger runs its course."""
    monkeypatch.setattr(cupti_mod, "LINGER_S", 0.02)
    owner = object()
    cupti_mod.block(owner, "a persistent kernel runs")
    s = source()
    s.start()
    s.stop()
    time.sleep(0.1)
    assert cupti_mod.lingering() and cupti_mod.blocked() == "a persistent kernel runs"
    assert not cupti_mod.let_go() and cupti_mod.lingering()
    lib = fake_cupti.raw.lib
    assert not lib.domain_on  # the linger ran out while blocked: not watching (every call would pay the callback)
    assert cupti_mod.state().startswith("blocked: a persistent kernel runs")
    cupti_mod.unblock(owner)
    assert not cupti_mod.blocked()
    assert wait_for(lambda: not cupti_mod.lingering(), 3.0)  # the linger, re-armed for 1 s, ends


def test_a_block_calls_off_an_armed_detach_and_its_end_arms_it_again(fake_cupti, monkeypatch):
    monkeypatch.setattr(cupti_mod, "LINGER_S", 0.0)
    lib = linger_out(fake_cupti)
    owner = object()
    cupti_mod.block(owner, "a persistent kernel runs")  # its launch must not host a finalize
    assert not cupti_mod._DETACH.armed and not lib.domain_on
    lib.api_call(WORK)
    assert "finalize" not in lib.calls and not cupti_mod.detached()
    cupti_mod.unblock(owner)
    assert cupti_mod._DETACH.armed  # host_exit needs libcuda (absent here): the next call of any thread hosts it
    lib.api_call()
    assert lib.calls[-2:] == ["unsubscribe", "finalize"] and cupti_mod.detached()


def test_a_fired_watch_leaves_no_callback_on_once_disarmed():
    """The watch's first work call leaves the callbacks on (the let-go arms them next); a take-over or a block then
    turns them off, or every CUDA call would go on paying for the callback."""
    lib = FakeLib()
    seen = []
    d = ExitDetach(lib, lambda: None)
    d.subscribe()
    work = bytearray(WORK + 1)
    work[WORK] = 1
    d.watch(lambda: seen.append(1), bytes(work))
    lib.api_call()
    assert seen == [] and lib.domain_on
    lib.api_call(WORK)
    lib.api_call(WORK)
    assert seen == [1] and not d.watching and lib.domain_on
    assert d.disarm() and not lib.domain_on and lib.calls[-1] == "domain 1 0"


def test_in_a_notebook_a_let_go_is_not_followed_by_a_reattach_and_a_traced_cell_attaches(fake_cupti, monkeypatch):
    """In a notebook (``NOTEBOOK``) a let-go is not followed by a re-initialization on a timer (it could stall a
    running cell's launches, and untraced cells would pay *ready*'s cost): the next cell that traces attaches CUPTI
    in its pre-run hook (``warm_for_cell``) and parks a source for its trace."""
    monkeypatch.setattr(cupti_mod, "REATTACH_S", 0.01)
    monkeypatch.setattr(cupti_mod, "NOTEBOOK", True)
    monkeypatch.setattr(cupti_mod, "LINGER_S", 0.0)
    monkeypatch.setattr(cupti_mod.CuptiSource, "_setup_tables", lambda self, cupti: None)
    lib = linger_out(fake_cupti)
    lib.api_call()
    assert cupti_mod.detached() and not cupti_mod._REATTACH.armed
    time.sleep(0.05)
    assert fake_cupti.raw.registered == 1 and cupti_mod.detached()
    assert cupti_mod.state().endswith("the next cell that traces attaches it before it runs")
    monkeypatch.setattr(cupti_mod, "LINGER_S", 60.0)
    assert cupti_mod.warm_for_cell()
    assert fake_cupti.raw.registered == 2 and cupti_mod.lingering() and len(fake_cupti.enabled) == 6


def test_a_park_primes_on_its_own_thread_then_watches_unless_taken_over_first(fake_cupti, monkeypatch):
    """With ``PRIME_AT_PARK`` the park hands priming to the prime thread (the parking thread, which the next trace
    waits for, does not prime), which watches once it has primed; a source taken over before then is neither primed
    nor watched."""
    from gpuworkbench.trace.cupti_prime import PRIMER

    monkeypatch.setattr(cupti_mod, "PRIME_AT_PARK", True)
    primed = []
    monkeypatch.setattr(PRIMER, "prime", lambda lib: primed.append((threading.current_thread().name, lib)))
    s = source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    assert wait_for(lambda: cupti_mod._DETACH.watching) and lib.domain_on
    assert primed == [("gpuworkbench-cupti-prime", lib)]
    arm = cupti_mod._PRIME.arm
    monkeypatch.setattr(cupti_mod._PRIME, "arm", lambda delay, token: arm(0.2, token))  # the prime thread runs late
    again = source()
    again.start()
    again.stop()  # parks again; a trace takes it over before the prime thread runs
    third = source()
    third.start()
    assert cupti_mod._ACTIVE is third
    time.sleep(0.3)
    assert len(primed) == 1 and not cupti_mod._DETACH.watching  # nothing primed or watched for a source in use
    third.stop()


def test_a_watch_firing_as_a_trace_takes_over_leaves_no_callback_on(fake_cupti, monkeypatch):
    """The watch's report (a deadline for its park token) can replace the take-over's ``_QUIET``: the stale call then
    turns the callbacks off itself, or every CUDA call of the trace would pay for them."""
    gate = threading.Event()
    linger_over = cupti_mod._LINGER._fn
    monkeypatch.setattr(cupti_mod._LINGER, "_fn", lambda token: (gate.wait(5), linger_over(token)))
    s = source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    parked = cupti_mod._PARK_TOKEN
    again = source()
    again.start()
    cupti_mod._LINGER.arm(0.0, parked)  # the watch's report, after the take-over armed _QUIET
    gate.set()
    assert wait_for(lambda: not lib.domain_on) and cupti_mod._ACTIVE is again
    again.stop()


def test_a_source_started_again_is_reset_first(fake_cupti):
    """A new source starts as it is; one started before is reset when it starts again, so that nothing of its last
    run is carried into this one."""
    s = source()
    s.start()
    s.stop()
    s._extras["api"].append("left from its last run")
    joiner = s._joiner
    s.start()
    assert s._extras["api"] == [] and s._joiner is not joiner and cupti_mod._ACTIVE is s
    s.stop()


def test_a_take_over_leaves_the_callbacks_to_the_trace_harvest_thread_when_quiet_by_trace(fake_cupti, monkeypatch):
    """``QUIET_BY == "trace"``: a take-over wakes no linger thread; the taking trace's harvest thread turns the watch's
    callbacks off as it begins (``quiet_taken_over``), unless a watch needs them again by then."""
    monkeypatch.setattr(cupti_mod, "QUIET_BY", "trace")
    lib = fake_cupti.raw.lib
    s = source()
    s.start()
    s.stop()
    assert lib.domain_on and cupti_mod._LINGER.armed
    again = source()
    again.start()
    assert not cupti_mod._LINGER.armed and lib.domain_on and cupti_mod._QUIET_DUE  # nothing woken, nothing due
    lib.api_call(WORK)  # the callback returns at once: its work is traced
    assert cupti_mod._ACTIVE is again and "finalize" not in lib.calls
    cupti_mod.quiet_taken_over()
    assert not lib.domain_on and lib.calls[-1] == "domain 1 0" and not cupti_mod._QUIET_DUE
    cupti_mod.quiet_taken_over()  # once
    assert lib.calls[-1] == "domain 1 0" and lib.calls.count("domain 1 0") == 1
    again.stop()  # parks: watching again
    third = source()
    third.start()
    third.stop()  # parked again before its harvest thread began: the watch needs the callbacks
    assert cupti_mod._QUIET_DUE and cupti_mod._DETACH.watching
    cupti_mod.quiet_taken_over()
    assert lib.domain_on and cupti_mod._DETACH.watching


def ready(fake_cupti, monkeypatch) -> None:
    """CUPTI initialized again with no kind on, as ``reattach_soon`` leaves it; sources made by the module itself
    need no tables (the fake module has no enums or dtypes to make them from)."""
    monkeypatch.setattr(cupti_mod.CuptiSource, "_setup_tables", lambda self, cupti: None)
    fake_cupti.raw.register()
    cupti_mod._ATTACHED = cupti_mod._FRESH = True
    assert cupti_mod.state().startswith("ready")


def test_a_traced_cell_finds_a_source_parked_and_primed_on_its_own_thread(fake_cupti, monkeypatch):
    """``warm_for_cell`` (a tracing cell's pre-run hook) parks a source where CUPTI was only ready and primes it on
    the calling thread, keeping that thread's calls (the prime thread primes too, its calls dropped, and the hook
    waits for it); nothing watches the source, and the cell's trace takes it over without enabling anything."""
    from gpuworkbench.trace.cupti_prime import PRIMER

    monkeypatch.setattr(cupti_mod, "PRIME_AT_PARK", True)
    primed = []
    here = threading.get_ident()
    monkeypatch.setattr(
        PRIMER, "prime", lambda lib, drop_calls=True: primed.append((threading.get_ident() == here, drop_calls))
    )
    ready(fake_cupti, monkeypatch)
    assert cupti_mod.warm_for_cell()
    assert cupti_mod.lingering() and len(fake_cupti.enabled) == 6
    # this thread's calls stay in traces (they end before the take-over's cutoff); the prime thread's are done
    assert sorted(primed) == [(False, True), (True, False)]
    time.sleep(0.05)
    assert not cupti_mod._DETACH.watching and not fake_cupti.raw.lib.domain_on
    fake_cupti.log.clear()
    trace_source = source()
    trace_source.start()
    assert fake_cupti.log == [] and cupti_mod._ACTIVE is trace_source
    assert not cupti_mod.warm_for_cell()  # a source records: nothing parked, nothing primed
    trace_source.stop()
    assert wait_for(lambda: cupti_mod._DETACH.watching)  # parked after a trace: primed, then watched
    assert cupti_mod.warm_for_cell()  # lingering after a trace: primed here again, and the watch called off
    assert sorted(primed[2:]) == [(False, True), (True, False)]
    assert not cupti_mod._DETACH.watching and not fake_cupti.raw.lib.domain_on
    assert cupti_mod.lingering() and cupti_mod._LINGER.left_s() > cupti_mod.LINGER_S - 1


def test_untraced_work_in_a_traced_cell_before_its_trace_keeps_the_source_parked(fake_cupti, monkeypatch):
    """The source the pre-run hook parks for a traced cell is not watched: the cell's own CUDA calls before its
    trace starts (``a = cp.ones(3)`` above ``with gw.trace():``) do not let it go, and the trace takes it over."""
    from gpuworkbench.trace.cupti_prime import PRIMER

    monkeypatch.setattr(cupti_mod, "PRIME_AT_PARK", True)
    monkeypatch.setattr(PRIMER, "prime", lambda lib, drop_calls=True: 1)
    lib = fake_cupti.raw.lib
    ready(fake_cupti, monkeypatch)
    assert cupti_mod.warm_for_cell()
    assert cupti_mod._PRIME.wait_idle(1.0)  # the prime thread is done: a watch would be on by now
    worker = threading.Thread(target=lib.api_call, args=(WORK,))
    worker.start()
    worker.join()
    lib.api_call(WORK)
    time.sleep(0.05)
    assert cupti_mod.lingering() and len(fake_cupti.enabled) == 6 and "finalize" not in lib.calls
    fake_cupti.log.clear()
    trace_source = source()
    trace_source.start()
    assert fake_cupti.log == [] and cupti_mod._ACTIVE is trace_source
    trace_source.stop()


def test_the_watch_ignores_the_callers_own_prime_but_not_other_work(fake_cupti, monkeypatch):
    from gpuworkbench.trace.cupti_prime import PRIMER

    monkeypatch.setattr(cupti_mod, "PRIME_AT_PARK", True)
    lib = fake_cupti.raw.lib
    monkeypatch.setattr(PRIMER, "prime", lambda cupti_lib, drop_calls=True: lib.api_call(WORK) or 1)
    ready(fake_cupti, monkeypatch)
    parked = source()
    parked.start()
    parked.stop()
    assert wait_for(lambda: cupti_mod._DETACH.watching)  # once the prime thread has primed
    assert cupti_mod.prime_here() == 1  # this thread's prime, while watched: not untraced work
    assert cupti_mod.lingering() and cupti_mod._DETACH.watching and cupti_mod._DETACH.ignored_thread == 0
    worker = threading.Thread(target=lib.api_call, args=(WORK,))
    worker.start()
    worker.join()
    assert wait_for(lambda: cupti_mod._PARKED is None and fake_cupti.enabled == set())  # untraced work: let go


def test_warm_for_cell_leaves_cupti_alone_where_it_is_not_ready(fake_cupti, monkeypatch):
    assert not cupti_mod.warm_for_cell() and fake_cupti.enabled == set()  # not attached: the trace attaches
    ready(fake_cupti, monkeypatch)
    monkeypatch.setattr(cupti_mod, "other_client", lambda: "torch.profiler is recording (it holds CUPTI)")
    assert not cupti_mod.warm_for_cell() and fake_cupti.enabled == set()
    monkeypatch.setattr(cupti_mod, "other_client", lambda: "")
    cupti_mod.block(fake_cupti, "a persistent kernel runs")
    assert not cupti_mod.warm_for_cell() and fake_cupti.enabled == set()
    cupti_mod.unblock(fake_cupti)
    monkeypatch.setattr(cupti_mod, "PRIME_AT_PARK", False)
    assert cupti_mod.warm_for_cell() and len(fake_cupti.enabled) == 6  # parked, not primed
    assert cupti_mod.prime_here() == 0


def test_a_prime_on_the_users_thread_keeps_the_primer_thread_named():
    from gpuworkbench.trace.cupti_prime import Primer

    primer = Primer()
    primer.prime(None)
    named = primer.threads
    assert named == frozenset({threading.get_ident() & 0xFFFFFFFF})
    done = []
    other = threading.Thread(target=lambda: done.append(primer.prime(None, drop_calls=False)))
    other.start()
    other.join()
    assert done == [0] and primer.threads == named and primer.rounds == 2
