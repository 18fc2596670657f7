"""CUPTI's lifetime in this process, as one object: who records, who lingers parked for the next trace, when CUPTI is
let go and initialized again, what blocks it and who else takes it. docs/cupti.md draws the phases and what each costs.

Why: once any activity kind has been on, CUPTI instruments every CUDA call of the process until it is finalized, kinds
on or off, and attaching it again costs ~12–16 ms (see ``detach.py`` and docs/cupti.md). So a stopped trace's source
*parks* with its kinds on, for the next trace to take over, and is *let go* (``cuptiFinalize`` at a CUDA call's exit)
once untraced work or ``linger_s`` ends the linger; where ``reattach_s`` is set, CUPTI is then initialized again
with no kind on (*ready*) that much later, on a thread of ours; in a notebook the kernel does so between cells
(``between_cells``). ``LIFECYCLE`` serves the process; the tunables are its attributes, read from
the environment when it is made (``cupti.LINGER_S`` and the others read and set them).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import threading
from typing import Any

import numpy as np

from . import detach as detach_hook
from . import kinds
from .binding import RawCupti, available, import_cupti, open_raw, other_client
from .clock import TickClock
from .detach import Deadline, ExitDetach
from .phase import Phase, render
from .prime import PRIMER
from .source import CuptiSource
from .tunables import Tunables

#: The linger timer's token for turning a taken-over watch's callbacks off (park tokens are >= 1).
QUIET = -1


class Lifecycle(Tunables):
    """CUPTI's phase in this process and the transitions between phases (``phase``; ``state()`` in words). Every
    transition holds ``lock``; ``raw``: libcupti through ctypes (None: opened on first use, ``raw_for``)."""

    def __init__(self, raw: Any = None) -> None:
        super().__init__()
        self.lock = threading.Lock()
        #: CUPTI's timestamps (ticks after another tool) and its API filter: forgotten when CUPTI is finalized.
        self.clock = TickClock()
        self.api_filter = kinds.ApiFilter()
        self.raw = raw
        #: The source that records now, the one parked (lingering) and the number of its parking.
        self.active: CuptiSource | None = None
        self.parked: CuptiSource | None = None
        self.park_token = 0
        #: The park token of a source parked for a notebook cell that traces: no watch for untraced work on it.
        self.unwatched_token = -1
        #: CUPTI's callback subscriber while we have it: armed once the linger is over, it finalizes CUPTI at the next
        #: CUDA call's exit; it also watches for untraced work while a source lingers.
        self.detach: ExitDetach | None = None
        #: Whether CUPTI is attached by us (callbacks registered or kinds enabled since the last ``cuptiFinalize``).
        self.attached = False
        #: Whether CUPTI is attached with no kind enabled since it was initialized (``reattach_soon``): an empty
        #: launch then pays 1.03–1.04 × (H200, one process), where one whose kinds were on pays 1.2 × until finalized.
        self.fresh = False
        #: Callback ids of the driver calls that enqueue device work, as a lookup table (``ExitDetach.watch``).
        self.work_cbids = b""
        #: The CUPTI result that refused the last detach's subscriber or arming (0: not refused); CUPTI then stays
        #: attached.
        self.detach_refused = 0
        #: A take-over stopped the watch and left its callbacks on for ``quiet_taken_over`` to turn off.
        self.quiet_due = False
        #: Who blocks CUPTI now (id(owner) -> reason): a persistent kernel runs.
        self.blockers: dict[int, str] = {}
        self.prepared = False
        self.reattach_token = 0
        #: Set while no re-initialization is due or under way (``settle`` waits for it).
        self.reattached = threading.Event()
        self.reattached.set()
        self.linger_timer = Deadline(self._linger_over, "gpuworkbench-cupti-linger")
        self.prime_timer = Deadline(self._prime_parked, "gpuworkbench-cupti-prime", idle_s=None)  # PRIMER.threads
        self.reattach_timer = Deadline(self._reattach, "gpuworkbench-cupti-reattach")

    # -- where CUPTI stands --------------------------------------------------------------------------------------

    def _phase(self, why_blocked: str) -> Phase:
        if self.active is not None:
            return Phase.RECORDING
        if why_blocked:
            return Phase.BLOCKED
        if self.parked is not None:
            return Phase.LINGERING
        detach = self.detach
        if detach is not None and detach.armed:
            return Phase.LETTING_GO
        if self.reattach_timer.armed:
            return Phase.REATTACHING
        if self.attached:
            return Phase.READY if self.fresh else Phase.ATTACHED
        return Phase.NOT_ATTACHED

    @property
    def phase(self) -> Phase:
        """The phase that holds now, derived from the facts the transitions set (never stored apart from them: a
        let-go happens inside another thread's CUDA call, where no lock is taken)."""
        return self._phase(self.blocked())

    def state(self) -> str:
        """Where CUPTI stands in this process, in words (``%gpu cupti``): what a launch pays for it now, until when."""
        why = self.blocked()
        return render(self, self._phase(why), why)

    def detached(self) -> bool:
        """Whether CUPTI is let go (or was never attached by us): no source records or lingers, and CUPTI is not
        initialized."""
        return not self.attached

    def lingering(self) -> bool:
        """Whether a source lingers (attached, kinds on) for the next trace to take over."""
        return self.parked is not None

    def blocked(self) -> str:
        """Why CUPTI must not be attached or let go now ('' if nothing blocks it)."""
        reasons = tuple(self.blockers.values())
        return reasons[0] if reasons else ""

    def timestamps_are_ticks(self) -> bool:
        """Whether CUPTI's timestamps may be another tool's ticks (``timestamps_may_change`` was called)."""
        return self.clock.ticks

    def set_notebook(self, on: bool) -> None:
        """In a notebook (``%load_ext``) CUPTI is attached for the cells that trace, before they run, not on a timer."""
        self.notebook = on

    # -- sources: recording, taking over, parking ----------------------------------------------------------------

    def raw_for(self, cupti: Any) -> RawCupti:
        """The process's :class:`RawCupti`, opened on first use; its buffers go to the source that records."""
        if self.raw is None:
            self.raw = open_raw(cupti, lambda: self.active)
        return self.raw

    def new_source(self) -> CuptiSource:
        """A source on this lifecycle (one per trace: it takes over a parked one's kinds)."""
        return CuptiSource(self)

    def start_recording(self, source: CuptiSource) -> None:
        """``source`` records from now on (under ``lock``): CUPTI's buffers go to it."""
        self.active = source

    def stop_recording(self, source: CuptiSource) -> None:
        """``source`` records no more (under ``lock``); CUPTI has no "unregister": our callbacks drop what comes."""
        if self.active is source:
            self.active = None

    def take_over(self, source: CuptiSource, cupti: Any) -> bool:
        """Let ``source`` take over the kinds a stopped source left on (under ``lock``): nothing to enable; records of
        work that ended before now are dropped by its cutoff. False where no source is parked."""
        parked = self._claim_parked(taking_over=True)
        if parked is None:
            return False
        source.adopt(parked, cupti)
        self.active = source
        return True

    def mark_attached(self, cupti: Any) -> None:
        """A source turns its kinds on (under ``lock``): CUPTI is attached, no longer fresh, and the detach's
        subscriber is taken here, on the thread starting the trace, not from a thread beside CUDA calls."""
        self.attached, self.fresh = True, False
        self._subscribe_detach(cupti)

    def park(self, source: CuptiSource) -> None:
        """Leave ``source``'s kinds on for ``linger_s`` (under ``lock``); then ``_linger_over`` lets CUPTI go. With
        ``watch_untraced``, sooner: at the first untraced call that enqueues device work. With ``prime_at_park`` the
        prime thread primes CUPTI first (``_prime_parked``), then watches."""
        self.parked, self.park_token = source, self.park_token + 1
        token = self.park_token
        self.linger_timer.arm(self.linger_s, token)
        if self.prime_at_park and self.raw is not None:
            self.prime_timer.arm(0.0, token)  # primes on its own thread, then watches: the next trace does not wait
        else:
            self._watch(token)

    def _watch(self, token: int) -> None:
        """Watch for untraced work while the source parked as ``token`` lingers (under ``lock``); not for a source
        parked for a notebook cell that traces (``unwatch_parked``)."""
        detach = self.detach
        if token != self.unwatched_token and self.watch_untraced and detach is not None and self.work_cbids:
            detach.watch(lambda: self.park_token == token and self.linger_timer.arm(0.0, token), self.work_cbids)

    def _prime_parked(self, token: int) -> None:
        """Prime CUPTI for the source parked as ``token`` (``prime.py``), then watch; nothing if a trace took it over
        or it was let go first. The primer's lock is taken before the state lock goes, so that letting the source go
        (``unpark``: then a finalize, or another tool's subscriber) waits for a prime under way; a take-over does
        not."""
        with self.lock:
            if token != self.park_token or self.parked is None or self.raw is None:
                return
            if self.blockers:  # a persistent kernel holds the device: no work of ours queued behind it
                self._watch(token)
                return
            lib = self.raw.lib
            PRIMER.lock.acquire()
        try:
            PRIMER.prime(lib)
        finally:
            PRIMER.lock.release()
            with self.lock:
                if token == self.park_token and self.parked is not None:
                    self._watch(token)

    def prime_here(self) -> int:
        """Prime the parked source on the calling thread (``prime.py``): the first op CUPTI records on a thread after
        a park costs that thread ~300 µs more, part of it per thread, which the prime thread cannot pay for the
        user's. For a thread that waits for no trace (``%load_ext``, a notebook cell's pre-run hook). Its records end
        before a take-over's cutoff (its streams' are dropped anyway); the watch does not count its work. The number
        of devices primed (0: none parked, a block holds, or ``prime_at_park`` is off)."""
        with self.lock:
            if not self.prime_at_park or self.parked is None or self.raw is None or self.blockers:
                return 0
            lib, detach = self.raw.lib, self.detach
            PRIMER.lock.acquire()
        try:
            if detach is not None:
                detach.ignored_thread = threading.get_ident()
            return PRIMER.prime(lib, drop_calls=False)
        finally:
            if detach is not None:
                detach.ignored_thread = 0
            PRIMER.lock.release()

    def warm_for_cell(self) -> bool:
        """Before a notebook cell that traces (its pre-run hook, on the kernel's thread): where no source lingers,
        attach CUPTI if it was let go (~12–16 ms) and start a source and park it, so that the cell's trace takes it
        over instead of doing that in the cell (enabling the kinds alone took ~0.45 ms on an H100); call off its watch
        (``unwatch_parked``), prime it on this thread (``prime_here``) and wait for the prime thread, so that nothing
        of ours runs beside the cell's start. True if a source is parked for the cell. Nothing where a trace records,
        a block holds, another tool holds CUPTI, CUPTI was never set up (``prepare``) or is attached with its kinds
        off after another tool."""
        if self.active is not None or self.raw is None or self.blocked() or other_client():
            return False
        if not self.attached:
            self._reattach(self.reattach_token)  # here, on the user's thread, between cells
        if self.parked is None and self.fresh:
            self.park_new_source()
        if self.parked is None:
            return False
        self.unwatch_parked()
        self.prime_here()
        self.prime_timer.wait_idle(self.prime_wait_s)  # the cell's trace then starts with no prime or watch under way
        return self.parked is not None

    def between_cells(self) -> str:
        """A notebook kernel idle after a cell (its event loop, not inside a cell): a lingering source let go and
        CUPTI initialized again with no kind on (ready), so that no pre-run hook attaches (~12 ms) or finalizes a
        source with kinds on. What it did ('' nothing: a trace records, a block holds, another tool holds CUPTI)."""
        if not self.prepared or self.active is not None or self.raw is None or self.blocked() or other_client():
            return ""
        done = "let go, " if self.attached and not self.fresh and self.let_go() else ""
        if not self.attached:
            self._reattach(self.reattach_token)
            done += "ready" if self.attached else ""
        return done

    def park_new_source(self) -> None:
        """Start a source and stop it, so that its kinds stay on, parked for the next trace to take over (CUPTI's first
        enabling of each kind paid here); nothing where it cannot start: a trace that cannot start CUPTI says why."""
        with contextlib.suppress(Exception):
            source = self.new_source()
            source.start()
            source.stop()

    def unwatch_parked(self) -> None:
        """Call off the watch on the parked source, for a cell whose trace takes it over: a watch would let it go at
        the cell's first untraced CUDA call before the trace starts (``a = cp.ones(3)`` above ``with gw.trace():``),
        and its callbacks would cost every call until the take-over's quiet. The linger deadline is set again (a watch
        that fired had brought it forward)."""
        with self.lock:
            if self.parked is None:
                return
            self.unwatched_token = self.park_token
            self.linger_timer.arm(self.linger_s, self.park_token)
            if self.detach is not None and not self.detach.armed:
                self.detach.disarm()

    def _claim_parked(self, taking_over: bool = False) -> CuptiSource | None:
        """Take the parked source off the shelf (under ``lock``): its linger deadline and its watch called off (a
        trace taking it over traces its own calls; once unparked, every call would go on paying for the callback).
        ``taking_over`` (a trace's start): the watch's callbacks are turned off just after, by the trace's harvest
        thread (``quiet_taken_over``) or the linger thread (``QUIET``) as ``quiet_by`` says, not on the starting
        thread; until then each returns at once."""
        source = self.parked
        if source is None:
            return None
        self.parked, self.park_token = None, self.park_token + 1
        if self.detach is not None and taking_over:
            self.detach.disarm(keep_domain=True)
            if self.quiet_by == "trace":
                self.quiet_due = True
                self.linger_timer.disarm()
            else:
                self.linger_timer.arm(0.0, QUIET)
        else:
            self.linger_timer.disarm()
            if self.detach is not None:
                self.detach.disarm()
        return source

    def quiet_taken_over(self) -> None:
        """Turn the callbacks of a watch that a trace's take-over stopped off (``quiet_by == "trace"``: the trace's
        harvest thread calls this at each wake), unless a watch or a finalize needs them again by then."""
        if not self.quiet_due:
            return
        with self.lock:
            self.quiet_due = False
            if self.detach is not None:
                self.detach.quiet()

    def unpark(self) -> bool:
        """Turn the parked source's kinds off and drop what CUPTI still holds (under ``lock``); False if none. A
        prime under way is waited for (``PRIMER.lock``): none starts after (its token is stale), so whatever follows
        (a finalize, another tool's subscriber) never meets a CUDA call of the primer's."""
        with PRIMER.lock:
            source = self._claim_parked()
        if source is None:
            return False
        source.disable_all()
        if self.raw is not None:
            self.raw.flush_all(1)  # no source is active: the callbacks drop these records
        return True

    # -- letting go, and initializing again ----------------------------------------------------------------------

    def _linger_over(self, token: int) -> None:
        """No trace took the parked source over in time: kinds off, then CUPTI finalized at the next CUDA call's exit.
        ``QUIET``: a trace took it over; turn the watch's callbacks off (unless a watch or a finalize needs them)."""
        if token == QUIET:
            with self.lock:
                if self.detach is not None:
                    self.detach.quiet()
            return
        with self.lock:
            if token != self.park_token:  # a stale call (a watch that fired as a trace took over): keep the live one
                if self.parked is not None and not self.linger_timer.armed:
                    self.linger_timer.arm(self.linger_s, self.park_token)
                elif self.parked is None and self.detach is not None:
                    self.detach.quiet()  # it may have replaced a take-over's QUIET: the callbacks must not stay on
                return
            if self.blockers:  # letting go could wait for the blocker (a persistent kernel): linger on, unwatched
                if self.detach is not None:
                    self.detach.disarm()
                self.linger_timer.arm(max(self.linger_s, 1.0), token)
                return
            if not self.unpark() or self.detach is None:
                return
            detach = self.detach
            status = detach.arm()
            if status:
                if status > 0:
                    self.detach_refused = status  # CUPTI stays attached (kinds off): the next trace enables them again
                return
        detach.host_exit()  # a CUDA call of this thread's own: its exit lets CUPTI go here, not in the user's next call

    def _subscribe_detach(self, cupti: Any) -> None:
        """Hold CUPTI's callback subscriber for the detach (under ``lock``), unless held already."""
        if self.raw is None or (self.detach is not None and self.detach.subscribed):
            return
        if not self.work_cbids:
            with contextlib.suppress(Exception):  # a cupti without the enum: no watch, the linger runs its course
                self.work_cbids = kinds.work_table(cupti)
        detach = ExitDetach(self.raw.lib, self._detached_at_exit)
        self.detach_refused = detach.subscribe()  # non-zero: another subscriber (Kineto's): CUPTI stays attached
        if not self.detach_refused:
            self.detach = detach

    def _finalized(self) -> None:
        """Right after ``cuptiFinalize`` (inside a CUDA call, on its thread): what CUPTI forgot must be set again."""
        self.attached = self.fresh = False
        if self.raw is not None:
            self.raw.ours = False
        self.api_filter.on = False
        self.clock.forget()  # another tool's timestamp callback may be gone with it: learn the rate again
        PRIMER.streams = frozenset()  # CUPTI's stream ids may differ once it is initialized again: asked at each prime

    def _detached_at_exit(self) -> None:
        """``cuptiFinalize`` ran at a CUDA call's exit: CUPTI is initialized again ``reattach_s`` later, off that
        thread (not in a notebook: the next cell that traces attaches it before it runs)."""
        timed = self.reattach_s is not None and not self.notebook
        if timed:
            self.reattached.clear()  # before ``detached()`` turns true: a ``settle`` then waits for the re-init
        self._finalized()
        if timed:
            self.reattach_soon(self.reattach_s)

    def reattach_soon(self, delay_s: float = 0.0) -> None:
        """Initialize CUPTI again ``delay_s`` from now on a thread of ours, with no kind on (buffer callbacks and the
        API filter set: ~10–13 ms on an H200), so that the next trace only enables its kinds. Nothing happens if
        CUPTI is attached by then, a source records, or another tool holds CUPTI; a block puts it off (tried again
        every second). ``settle`` waits for it."""
        self.reattached.clear()
        self.reattach_timer.arm(delay_s, self.reattach_token)

    def settle(self, timeout_s: float = 1.0) -> bool:
        """Wait up to ``timeout_s`` for a re-initialization that is due or under way (one put off by a block does not
        count); True once none is."""
        return self.reattached.wait(timeout_s)

    def _reattach(self, token: int) -> None:
        """The re-initialization ``reattach_soon`` arms, on the re-attach thread (``token``: called off if changed)."""
        try:
            with self.lock:
                raw = self.raw
                if token != self.reattach_token or self.attached or self.active is not None or raw is None:
                    return
                if other_client():
                    return
                if self.blocked():
                    self.reattach_timer.arm(max(self.reattach_s or 0.0, 1.0), token)  # again once nothing blocks it
                    self.reattached.set()
                    return
                cupti = import_cupti()
                raw.register()
                self.attached = self.fresh = True
                if kinds.API_FILTER and kinds.API_CARRIER_KINDS:  # read now: benchmarks change them
                    self.api_filter.apply(cupti, True)
        except Exception:  # noqa: BLE001  the next trace attaches, and says why if it cannot
            pass
        finally:
            self.reattached.set()

    def cancel_reattach(self) -> None:
        """Call off a re-initialization that is due or waits for ``lock`` (held by the caller)."""
        self.reattach_token += 1
        self.reattach_timer.disarm()
        self.reattached.set()

    def report_sites(self, hook: Any) -> int:
        """Have CUPTI's callback hand each driver call that enqueues work to ``hook(cbid, cbdata)``, on the calling
        thread (``sites.CallSites``); None stops it. 0, or why not: -1 where no subscriber of ours is held (another
        tool's is), else CUPTI's refusal."""
        with self.lock:
            detach = self.detach
            if hook is None:
                detach_hook.HOOK = None
                return 0 if detach is None else max(detach.report_sites(b""), 0)
            if detach is None or not detach.subscribed or not self.work_cbids:
                return -1
            status = detach.report_sites(self.work_cbids)
            if not status:
                detach_hook.HOOK = hook
            return status

    def cancel_detach(self, unsubscribe: bool = False) -> None:
        """A source starts (under ``lock``): an armed detach is called off, one under way waited for; ``unsubscribe``:
        the subscriber is given up too (another tool subscribes next, or the process ends)."""
        detach = self.detach
        if detach is None:
            return
        if unsubscribe:
            detach.unsubscribe()
        elif detach.disarm():
            return
        self.detach = None

    def let_go(self) -> bool:
        """Let CUPTI go now: a parked source's kinds off, then ``cuptiFinalize`` on this thread; nothing initializes
        it again until a trace does. Call it only where no other thread makes CUDA calls (CUPTI asks for a call's exit
        otherwise); for benchmarks that need a process as if it never traced. False if a source records, CUPTI is not
        attached, a block holds (a persistent kernel runs), another tool holds CUPTI, or ``cuptiFinalize`` failed."""
        if self.active is not None or self.raw is None or not self.attached or other_client():
            return False
        with self.lock:
            if self.blockers:
                return False
            self.unpark()
            self.cancel_detach(unsubscribe=True)
            self.cancel_reattach()
            if self.active is not None:
                return False
            lib = self.raw.lib
            lib.cuptiFinalize.restype = ctypes.c_int
            with PRIMER.lock:  # no CUDA call of the primer's in flight
                if lib.cuptiFinalize():
                    return False
            self._finalized()
        return True

    # -- blocks, other tools, the process's start and end --------------------------------------------------------

    def block(self, owner: object, reason: str) -> None:
        """While ``owner`` holds a block (a persistent kernel loops: attaching CUPTI waited for it to end, measured on
        an H200), CUPTI is not attached, initialized again, enabled or let go: a trace takes over a lingering source,
        or else times the workbench's own ops by events, saying ``reason``. Waits out a re-initialization or let-go
        under way, and calls off an armed detach (it would finalize in the blocker's own launch)."""
        with self.lock:
            self.blockers[id(owner)] = reason
            if self.detach is not None and self.detach.armed:
                self.detach.disarm()

    def unblock(self, owner: object) -> None:
        """``owner``'s block ends; CUPTI attached with its kinds off (a detach the block called off) is let go."""
        with self.lock, PRIMER.lock:  # no prime under way when the detach is armed
            self.blockers.pop(id(owner), None)
            detach = self.detach
            go = (
                not self.blockers
                and self.attached
                and not self.fresh
                and self.parked is None
                and self.active is None
                and detach is not None
                and detach.subscribed
                and not detach.armed
                and detach.arm() == 0
            )
        if go:
            detach.host_exit()

    def hand_over(self) -> None:
        """Before another tool (torch.profiler) takes CUPTI: a parked source's kinds turned off and a pending detach
        called off (one subscriber per process: Kineto subscribes too); CUPTI's buffer callbacks given back to Kineto
        where it is loaded (it may register them only once per process: after a trace of ours its next session would
        otherwise send its records to us; measured: torch.profiler then saw 0 kernels)."""
        with self.lock:
            self.unpark()
            self.cancel_detach(unsubscribe=True)
            self.cancel_reattach()
            self.fresh = False  # the other tool's kinds go on
        raw = self.raw
        if raw is not None and self.active is None:
            raw.hand_back()
            if self.api_filter.on:
                with contextlib.suppress(Exception):
                    self.api_filter.apply(import_cupti(), False)  # the other tool records every API call again

    def timestamps_may_change(self) -> None:
        """Called before another tool (torch.profiler) takes CUPTI: its timestamp callback may outlive its session."""
        with self.lock:
            self.clock.may_change()

    def callbacks_unknown(self) -> None:
        """Another client may have registered CUPTI's buffer callbacks (torch was loaded before we watched its
        profiler): the next start registers ours again."""
        if self.raw is not None:
            self.raw.ours = False

    def prepare(self) -> None:
        """Do once what makes the first CUPTI trace slow: import cupti-python (~60 ms on the H100 machine) and what the
        harvest imports (numpy.ma), open libcupti and, with ``attach_early``, attach CUPTI (~20 ms; nothing is
        recorded until a trace starts) and start a source and park it (``stop``): the first trace takes it over
        without attaching, unless untraced work or ``linger_s`` let it go first. On the calling thread: the process's
        first CUPTI set-up from a thread beside the user's CUDA calls made later CUDA calls fail ('context is
        destroyed', seen on the H100 machine); initializing it again after a let-go (``reattach_soon``, from a thread
        of ours) did not, in 15 of 15 processes on an H200. ``%load_ext gpuworkbench`` calls it; so does the first
        trace that meets CUDA. Never raises."""
        if self.prepared:  # every trace's start asks: not behind the state lock, which a prime or a watch may hold
            return
        attached = False
        with self.lock:
            if self.prepared:
                return
            self.prepared = True
            try:
                ok, _ = available()
                if not ok:
                    return
                cupti = import_cupti()
                # numpy imports numpy.ma on the first np.unique: in the first trace's harvest, 77 ms holding the GIL on
                # the H100 host (61 ms of it compiling, where numpy's .pyc files were missing)
                np.unique(np.zeros(2, np.int64))
                raw = self.raw_for(cupti)
                if self.attach_early and self.active is None and not other_client():
                    raw.register()  # attaches CUPTI; our callbacks drop what comes while no source is active
                    self.attached = True
                    attached = True
            except Exception:  # noqa: BLE001  a trace reports why CUPTI cannot start when it tries
                pass
        if attached:  # outside the lock, which start and stop take: CUPTI's first enabling of each kind, paid here;
            # the source stays parked for a first trace to take over
            self.park_new_source()  # primed on the prime thread, which then watches
            self.prime_here()  # and on the user's thread: part of what the first recorded op pays after a park

    def stop_at_exit(self) -> None:
        """Stop the active or parked source and call off a detach before the interpreter goes: CUPTI must not call
        into a finalizing Python. Nothing is primed (no new thread, no CUDA work, as the interpreter ends)."""
        self.prime_at_park = False
        source = self.active
        if source is not None:
            with contextlib.suppress(Exception):
                source.stop()  # parks it: turned off just below
        with contextlib.suppress(Exception), self.lock:
            self.prime_timer.disarm()
            self.cancel_reattach()
            self.unpark()
            self.cancel_detach(unsubscribe=True)


#: The process's lifecycle: every source the workbench starts is on it.
LIFECYCLE = Lifecycle()
atexit.register(LIFECYCLE.stop_at_exit)
