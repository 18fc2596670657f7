"""CUPTI's lifetime across traces: a stopped source parks with its kinds on, the next takes it over without enabling
anything, and after ``linger_s`` CUPTI is let go (``cuptiFinalize`` at a CUDA call's exit). A fake cupti module and a
fake libcupti stand in for the real ones (the ``fake_cupti`` fixture, tests/cupti_fakes.py), on a lifecycle of
their own: runs without a GPU. On a GPU, tests/trace/test_cuda_any_code.py checks that the next trace still sees every
kernel, and benchmarks/probes/cupti_idle.py what an idle process pays."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import types

from cupti_fakes import ENTER, WORK, FakeLib

from gpuworkbench.trace.cupti.detach import Deadline, ExitDetach
from gpuworkbench.trace.cupti.prime import PRIMER, Primer


def linger_out(fake_cupti) -> FakeLib:
    """Start and stop a source, then wait for the linger to run out (the detach armed); the fake libcupti."""
    life = fake_cupti.life
    s = life.new_source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    deadline = time.monotonic() + 5
    while not (life.detach is not None and life.detach.armed) and time.monotonic() < deadline:
        time.sleep(0.01)
    return lib


def test_a_stopped_source_parks_and_the_next_takes_its_kinds_over_without_enabling(fake_cupti):
    life = fake_cupti.life
    first = life.new_source()
    assert life.detached()
    assert life.state().startswith("not attached")
    first.start()
    assert fake_cupti.raw.registered == 1 and len(fake_cupti.enabled) == 6 and not life.detached()
    assert fake_cupti.raw.lib.calls == ["subscribe"]  # on the starting thread, no callback on yet
    assert life.state().startswith("recording")
    first.stop()
    assert not first.running and life.parked is first and life.active is None
    assert life.state().startswith("lingering") and "at the first untraced launch, copy or memset, or in " in (
        life.state()
    )
    assert life.lingering()
    assert len(fake_cupti.enabled) == 6 and not any(e.startswith("disable") for e in fake_cupti.log)
    fake_cupti.log.clear()
    second = life.new_source()
    second.start()
    assert fake_cupti.log == [] and fake_cupti.raw.registered == 1  # nothing enabled or registered again
    assert life.active is second and life.parked is None and second.decoder.cutoff == 5_000
    assert wait_for(lambda: not life.linger_timer.armed)  # only the watch's callbacks to turn off, then nothing due
    second.stop()
    assert life.parked is second and life.linger_timer.armed


def test_after_the_linger_kinds_go_off_and_cupti_is_finalized_at_the_next_cuda_call(fake_cupti):
    life = fake_cupti.life
    life.linger_s = 0.05
    life.api_filter.on = True
    lib = linger_out(fake_cupti)
    assert fake_cupti.enabled == set() and life.parked is None
    # watching for untraced work while parked, not any more once unparked, then armed: waits for a CUDA call
    assert lib.calls == ["subscribe", "domain 1 1", "domain 1 0", "domain 1 1"] and not life.detached()
    assert "next CUDA call" in life.state()
    lib.api_call()
    assert lib.calls[4:] == ["unsubscribe", "finalize"] and life.detached()
    assert not fake_cupti.raw.ours and not life.api_filter.on  # CUPTI forgot both: set again on the next start
    again = life.new_source()
    again.start()
    assert fake_cupti.raw.registered == 2 and len(fake_cupti.enabled) == 6 and again.decoder.cutoff == 0
    assert lib.calls[6:] == ["subscribe"]  # a new subscriber for the next detach


def test_a_start_calls_off_a_detach_that_has_not_happened(fake_cupti):
    life = fake_cupti.life
    life.linger_s = 0.0
    lib = linger_out(fake_cupti)
    again = life.new_source()
    again.start()
    assert lib.calls[-2:] == ["domain 1 1", "domain 1 0"]  # armed, then called off: never finalized, still subscribed
    assert fake_cupti.raw.registered == 1 and len(fake_cupti.enabled) == 6  # still attached: kinds on again
    lib.api_call()
    assert "finalize" not in lib.calls and not life.detached()
    again.stop()


def test_another_tool_taking_cupti_turns_parked_kinds_off_and_calls_off_the_detach(fake_cupti):
    life = fake_cupti.life
    s = life.new_source()
    s.start()
    s.stop()
    life.hand_over()
    assert fake_cupti.enabled == set() and life.parked is None and not life.linger_timer.armed
    assert fake_cupti.raw.lib.calls[-1] == "unsubscribe" and life.detach is None  # Kineto subscribes next


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


def test_untraced_work_ends_the_linger_and_cupti_is_initialized_again_with_no_kind_on(fake_cupti):
    """A lingering source is let go at the first untraced call that enqueues work, not after ``linger_s``; CUPTI is
    then initialized again off that thread (``reattach_s``), and the next trace only enables its kinds."""
    life = fake_cupti.life
    life.reattach_s = 0.02
    s = life.new_source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    assert life.lingering() and lib.domain_on  # watching
    lib.api_call()  # a call that enqueues nothing (a query, a get): the source lingers on
    assert life.lingering() and "finalize" not in lib.calls
    lib.api_call(WORK)  # an untraced launch
    assert wait_for(lambda: life.parked is None and fake_cupti.enabled == set())
    assert wait_for(lambda: life.detach is not None and life.detach.armed)
    lib.api_call()  # the next call's exit lets CUPTI go
    assert "finalize" in lib.calls and fake_cupti.raw.registered == 1
    assert life.settle(5) and fake_cupti.raw.registered == 2  # initialized again, on the re-attach thread
    assert life.state().startswith("ready") and not life.detached() and fake_cupti.enabled == set()
    fake_cupti.log.clear()
    again = life.new_source()
    again.start()
    assert fake_cupti.raw.registered == 2 and len(fake_cupti.enabled) == 6  # enabled, not registered again
    assert life.state().startswith("recording")
    again.stop()


def test_a_trace_taking_a_lingering_source_over_stops_the_watch(fake_cupti, monkeypatch):
    life = fake_cupti.life
    s = life.new_source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    assert lib.domain_on
    gate = threading.Event()
    linger_over = life.linger_timer._fn
    monkeypatch.setattr(life.linger_timer, "_fn", lambda token: (gate.wait(5), linger_over(token)))
    again = life.new_source()
    again.start()
    # its own launches are traced: nothing to watch; the callbacks go off on the linger thread, not in the start
    assert not life.detach.watching and life.active is again and lib.domain_on
    lib.api_call(WORK)  # before they are off: the callback returns at once, no let-go
    assert lib.calls[-1] == "domain 1 1" and life.active is again
    gate.set()
    assert wait_for(lambda: not lib.domain_on) and lib.calls[-1] == "domain 1 0"
    lib.api_call(WORK)
    time.sleep(0.05)
    assert life.active is again and len(fake_cupti.enabled) == 6 and "finalize" not in lib.calls
    again.stop()


def test_let_go_calls_off_a_due_reattach(fake_cupti):
    """``let_go`` (a benchmark's baseline, ``%gpu cupti release``) leaves CUPTI let go: a re-initialization that was
    due does not happen."""
    life = fake_cupti.life
    life.reattach_s = 0.05
    s = life.new_source()
    s.start()
    s.stop()
    life.reattach_soon(0.05)
    assert life.let_go() and life.detached()
    assert life.settle(1)
    time.sleep(0.1)
    assert life.detached() and fake_cupti.raw.registered == 1


def test_a_blocker_keeps_cupti_as_it_is_until_it_goes(fake_cupti):
    """While a persistent kernel runs (attaching or letting CUPTI go waited for it to end, on an H200), the linger
    does not end and ``let_go`` refuses; once it goes, the linger runs its course."""
    life = fake_cupti.life
    life.linger_s = 0.02
    owner = object()
    life.block(owner, "a persistent kernel runs")
    s = life.new_source()
    s.start()
    s.stop()
    time.sleep(0.1)
    assert life.lingering() and life.blocked() == "a persistent kernel runs"
    assert not life.let_go() and life.lingering()
    lib = fake_cupti.raw.lib
    assert not lib.domain_on  # the linger ran out while blocked: not watching (every call would pay the callback)
    assert life.state().startswith("blocked: a persistent kernel runs")
    life.unblock(owner)
    assert not life.blocked()
    assert wait_for(lambda: not life.lingering(), 3.0)  # the linger, re-armed for 1 s, ends


def test_a_block_calls_off_an_armed_detach_and_its_end_arms_it_again(fake_cupti):
    life = fake_cupti.life
    life.linger_s = 0.0
    lib = linger_out(fake_cupti)
    owner = object()
    life.block(owner, "a persistent kernel runs")  # its launch must not host a finalize
    assert not life.detach.armed and not lib.domain_on
    lib.api_call(WORK)
    assert "finalize" not in lib.calls and not life.detached()
    life.unblock(owner)
    assert life.detach.armed  # host_exit needs libcuda (absent here): the next call of any thread hosts it
    lib.api_call()
    assert lib.calls[-2:] == ["unsubscribe", "finalize"] and life.detached()


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


def test_in_a_notebook_a_let_go_is_not_followed_by_a_reattach_and_a_traced_cell_attaches(fake_cupti):
    """In a notebook (``notebook``) a let-go is not followed by a re-initialization on a timer (it could stall a
    running cell's launches, and untraced cells would pay *ready*'s cost): the next cell that traces attaches CUPTI
    in its pre-run hook (``warm_for_cell``) and parks a source for its trace."""
    life = fake_cupti.life
    life.reattach_s = 0.01
    life.notebook = True
    life.linger_s = 0.0
    lib = linger_out(fake_cupti)
    lib.api_call()
    assert life.detached() and not life.reattach_timer.armed
    time.sleep(0.05)
    assert fake_cupti.raw.registered == 1 and life.detached()
    assert life.state().endswith("the next cell that traces attaches it before it runs")
    life.linger_s = 60.0
    assert life.warm_for_cell()
    assert fake_cupti.raw.registered == 2 and life.lingering() and len(fake_cupti.enabled) == 6


def test_a_park_primes_on_its_own_thread_then_watches_unless_taken_over_first(fake_cupti, monkeypatch):
    """With ``prime_at_park`` the park hands priming to the prime thread (the parking thread, which the next trace
    waits for, does not prime), which watches once it has primed; a source taken over before then is neither primed
    nor watched."""
    life = fake_cupti.life
    life.prime_at_park = True
    primed = []
    monkeypatch.setattr(PRIMER, "prime", lambda lib: primed.append((threading.current_thread().name, lib)))
    s = life.new_source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    assert wait_for(lambda: life.detach.watching) and lib.domain_on
    assert primed == [("gpuworkbench-cupti-prime", lib)]
    arm = life.prime_timer.arm
    monkeypatch.setattr(life.prime_timer, "arm", lambda delay, token: arm(0.2, token))  # the prime thread runs late
    again = life.new_source()
    again.start()
    again.stop()  # parks again; a trace takes it over before the prime thread runs
    third = life.new_source()
    third.start()
    assert life.active is third
    time.sleep(0.3)
    assert len(primed) == 1 and not life.detach.watching  # nothing primed or watched for a source in use
    third.stop()


def test_a_watch_firing_as_a_trace_takes_over_leaves_no_callback_on(fake_cupti, monkeypatch):
    """The watch's report (a deadline for its park token) can replace the take-over's ``QUIET``: the stale call then
    turns the callbacks off itself, or every CUDA call of the trace would pay for them."""
    life = fake_cupti.life
    gate = threading.Event()
    linger_over = life.linger_timer._fn
    monkeypatch.setattr(life.linger_timer, "_fn", lambda token: (gate.wait(5), linger_over(token)))
    s = life.new_source()
    s.start()
    s.stop()
    lib = fake_cupti.raw.lib
    parked = life.park_token
    again = life.new_source()
    again.start()
    life.linger_timer.arm(0.0, parked)  # the watch's report, after the take-over armed QUIET
    gate.set()
    assert wait_for(lambda: not lib.domain_on) and life.active is again
    again.stop()


def test_a_source_started_again_is_reset_first(fake_cupti):
    """A new source starts as it is; one started before is reset when it starts again, so that nothing of its last
    run is carried into this one."""
    life = fake_cupti.life
    s = life.new_source()
    s.start()
    s.stop()
    s.decoder._extras["api"].append("left from its last run")
    joiner = s._joiner
    s.start()
    assert s.decoder.take_extras()["api"] is None and s._joiner is not joiner and life.active is s
    s.stop()


def test_a_take_over_leaves_the_callbacks_to_the_trace_harvest_thread_when_quiet_by_trace(fake_cupti):
    """``quiet_by == "trace"``: a take-over wakes no linger thread; the taking trace's harvest thread turns the watch's
    callbacks off as it begins (``quiet_taken_over``), unless a watch needs them again by then."""
    life = fake_cupti.life
    life.quiet_by = "trace"
    lib = fake_cupti.raw.lib
    s = life.new_source()
    s.start()
    s.stop()
    assert lib.domain_on and life.linger_timer.armed
    again = life.new_source()
    again.start()
    assert not life.linger_timer.armed and lib.domain_on and life.quiet_due  # nothing woken, nothing due
    lib.api_call(WORK)  # the callback returns at once: its work is traced
    assert life.active is again and "finalize" not in lib.calls
    life.quiet_taken_over()
    assert not lib.domain_on and lib.calls[-1] == "domain 1 0" and not life.quiet_due
    life.quiet_taken_over()  # once
    assert lib.calls[-1] == "domain 1 0" and lib.calls.count("domain 1 0") == 1
    again.stop()  # parks: watching again
    third = life.new_source()
    third.start()
    third.stop()  # parked again before its harvest thread began: the watch needs the callbacks
    assert life.quiet_due and life.detach.watching
    life.quiet_taken_over()
    assert lib.domain_on and life.detach.watching


def ready(fake_cupti) -> None:
    """CUPTI initialized again with no kind on, as ``reattach_soon`` leaves it."""
    life = fake_cupti.life
    fake_cupti.raw.register()
    life.attached = life.fresh = True
    assert life.state().startswith("ready")


def test_a_traced_cell_finds_a_source_parked_and_primed_on_its_own_thread(fake_cupti, monkeypatch):
    """``warm_for_cell`` (a tracing cell's pre-run hook) parks a source where CUPTI was only ready and primes it on
    the calling thread, keeping that thread's calls (the prime thread primes too, its calls dropped, and the hook
    waits for it); nothing watches the source, and the cell's trace takes it over without enabling anything."""
    life = fake_cupti.life
    life.prime_at_park = True
    primed = []
    here = threading.get_ident()
    monkeypatch.setattr(
        PRIMER, "prime", lambda lib, drop_calls=True: primed.append((threading.get_ident() == here, drop_calls))
    )
    ready(fake_cupti)
    assert life.warm_for_cell()
    assert life.lingering() and len(fake_cupti.enabled) == 6
    # this thread's calls stay in traces (they end before the take-over's cutoff); the prime thread's are done
    assert sorted(primed) == [(False, True), (True, False)]
    time.sleep(0.05)
    assert not life.detach.watching and not fake_cupti.raw.lib.domain_on
    fake_cupti.log.clear()
    trace_source = life.new_source()
    trace_source.start()
    assert fake_cupti.log == [] and life.active is trace_source
    assert not life.warm_for_cell()  # a source records: nothing parked, nothing primed
    trace_source.stop()
    assert wait_for(lambda: life.detach.watching)  # parked after a trace: primed, then watched
    assert life.warm_for_cell()  # lingering after a trace: primed here again, and the watch called off
    assert sorted(primed[2:]) == [(False, True), (True, False)]
    assert not life.detach.watching and not fake_cupti.raw.lib.domain_on
    assert life.lingering() and life.linger_timer.left_s() > life.linger_s - 1


def test_untraced_work_in_a_traced_cell_before_its_trace_keeps_the_source_parked(fake_cupti, monkeypatch):
    """The source the pre-run hook parks for a traced cell is not watched: the cell's own CUDA calls before its
    trace starts (``a = cp.ones(3)`` above ``with gw.trace():``) do not let it go, and the trace takes it over."""
    life = fake_cupti.life
    life.prime_at_park = True
    monkeypatch.setattr(PRIMER, "prime", lambda lib, drop_calls=True: 1)
    lib = fake_cupti.raw.lib
    ready(fake_cupti)
    assert life.warm_for_cell()
    assert life.prime_timer.wait_idle(1.0)  # the prime thread is done: a watch would be on by now
    worker = threading.Thread(target=lib.api_call, args=(WORK,))
    worker.start()
    worker.join()
    lib.api_call(WORK)
    time.sleep(0.05)
    assert life.lingering() and len(fake_cupti.enabled) == 6 and "finalize" not in lib.calls
    fake_cupti.log.clear()
    trace_source = life.new_source()
    trace_source.start()
    assert fake_cupti.log == [] and life.active is trace_source
    trace_source.stop()


def test_the_watch_ignores_the_callers_own_prime_but_not_other_work(fake_cupti, monkeypatch):
    life = fake_cupti.life
    life.prime_at_park = True
    lib = fake_cupti.raw.lib
    monkeypatch.setattr(PRIMER, "prime", lambda cupti_lib, drop_calls=True: lib.api_call(WORK) or 1)
    ready(fake_cupti)
    parked = life.new_source()
    parked.start()
    parked.stop()
    assert wait_for(lambda: life.detach.watching)  # once the prime thread has primed
    assert life.prime_here() == 1  # this thread's prime, while watched: not untraced work
    assert life.lingering() and life.detach.watching and life.detach.ignored_thread == 0
    worker = threading.Thread(target=lib.api_call, args=(WORK,))
    worker.start()
    worker.join()
    assert wait_for(lambda: life.parked is None and fake_cupti.enabled == set())  # untraced work: let go


def test_warm_for_cell_leaves_cupti_alone_where_it_is_not_ready(fake_cupti, monkeypatch):
    life = fake_cupti.life
    raw, life.raw = life.raw, None
    assert not life.warm_for_cell() and fake_cupti.enabled == set()  # never set up (``prepare``): the trace attaches
    life.raw = raw
    ready(fake_cupti)
    profiling = [True]  # torch.profiler records: it holds CUPTI
    autograd = types.SimpleNamespace(_profiler_enabled=lambda: profiling[0])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=types.SimpleNamespace(_autograd=autograd)))
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    assert not life.warm_for_cell() and fake_cupti.enabled == set()
    profiling[0] = False
    life.block(fake_cupti, "a persistent kernel runs")
    assert not life.warm_for_cell() and fake_cupti.enabled == set()
    life.unblock(fake_cupti)
    life.prime_at_park = False
    assert life.warm_for_cell() and len(fake_cupti.enabled) == 6  # parked, not primed
    assert life.prime_here() == 0


def test_a_prime_on_the_users_thread_keeps_the_primer_thread_named():
    primer = Primer()
    primer.prime(None)
    named = primer.threads
    assert named == frozenset({threading.get_ident() & 0xFFFFFFFF})
    done = []
    other = threading.Thread(target=lambda: done.append(primer.prime(None, drop_calls=False)))
    other.start()
    other.join()
    assert done == [0] and primer.threads == named and primer.rounds == 2


def test_the_phase_follows_each_transition(fake_cupti):
    """``phase`` names where CUPTI stands after each transition; ``state()`` says it in words, starting with it."""
    from gpuworkbench.trace.cupti import Phase

    life = fake_cupti.life
    life.linger_s, life.reattach_s = 0.0, 60.0
    assert life.phase is Phase.NOT_ATTACHED
    s = life.new_source()
    s.start()
    assert life.phase is Phase.RECORDING
    life.linger_s = 60.0
    s.stop()
    assert life.phase is Phase.LINGERING and life.state().startswith("lingering")
    owner = object()
    life.block(owner, "a persistent kernel runs")
    assert life.phase is Phase.BLOCKED and life.state().startswith("blocked: a persistent kernel runs")
    life.unblock(owner)
    life.linger_timer.arm(0.0, life.park_token)  # the linger runs out
    assert wait_for(lambda: life.phase is Phase.LETTING_GO) and "next CUDA call" in life.state()
    fake_cupti.raw.lib.api_call()  # finalized in this call's exit; initialized again reattach_s later
    assert life.phase is Phase.REATTACHING and life.state().endswith("initialized again (no kind on) shortly")
    life.reattach_timer.arm(0.0, life.reattach_token)
    assert life.settle(5) and life.phase is Phase.READY and life.state().startswith("ready")
    life.fresh = False  # as after torch.profiler took CUPTI over
    assert life.phase is Phase.ATTACHED and life.state() == "attached with its kinds off"


def test_the_packages_tunables_are_the_process_lifecycles(monkeypatch):
    """``gw.cupti.LINGER_S`` and the other upper-case names read and set the attributes of ``cupti.LIFECYCLE``, which
    listens for blocks."""
    from gpuworkbench import listeners
    from gpuworkbench.trace import cupti

    monkeypatch.setattr(cupti.LIFECYCLE, "linger_s", cupti.LIFECYCLE.linger_s)  # restored after the test
    cupti.LINGER_S = 7.5
    assert cupti.LIFECYCLE.linger_s == 7.5 and cupti.LINGER_S == 7.5
    assert cupti.NOTEBOOK is cupti.LIFECYCLE.notebook and cupti.detach_refused == cupti.LIFECYCLE.detach_refused
    assert cupti.LIFECYCLE in listeners.BLOCKERS


def test_between_cells_a_lingering_source_is_let_go_and_cupti_made_ready_for_the_next_cell(fake_cupti):
    """A notebook kernel idle after a traced cell (``between_cells``): the lingering source is let go and CUPTI
    initialized again with no kind on, so that no pre-run hook attaches; from *let go* it is only initialized again;
    from *ready*, or while a trace records, nothing is done."""
    life = fake_cupti.life
    life.notebook = True
    life.prepared = True
    s = life.new_source()
    s.start()
    assert life.between_cells() == ""  # a trace records
    s.stop()
    assert life.lingering()
    assert life.between_cells() == "let go, ready"
    assert life.state().startswith("ready") and not life.lingering() and fake_cupti.raw.registered == 2
    assert life.between_cells() == ""  # ready already
    assert life.let_go() and life.detached()
    assert life.between_cells() == "ready" and fake_cupti.raw.registered == 3
    assert life.warm_for_cell() and life.lingering()  # the next traced cell's hook parks a source: nothing attached
    assert fake_cupti.raw.registered == 3
