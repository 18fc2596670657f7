"""The part of a Trace that takes CUPTI as its span source on CUDA: starting it, handing it over, its clock, and the
devices and host threads that only CUPTI's records name (other libraries' work)."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import cupti as cupti_source
from .call_watch import CallWatch
from .columns import DeviceClock
from .cupti import detach as detach_hook
from .cupti.clock import WindowClock
from .cupti.foreign import ForeignRecords
from .cupti.ops import CuptiOps
from .cupti.sites import CallSites
from .device_limits import DeviceLimits, cuda_limits
from .spans import parse_peer_copy, thread_stream

#: How long a new trace waits for a stopped one to hand CUPTI over (its harvester releases CUPTI once its last ops
#: have their spans).
CUPTI_HANDOFF_S = 2.0
#: Modules whose presence means CUDA may be used by other code in this process: a trace then starts CUPTI when it
#: starts, not when the workbench's own first op meets a CUDA device, so that every library's work is in it.
CUDA_MODULES = ("cupy", "torch", "numba.cuda", "cuda.core", "cuda.bindings", "pycuda", "jax")


class _CallSites:
    """How a trace with lines finds the source line of other libraries' CUDA calls: "auto" (Python's monitoring on
    3.12+, else CUPTI's callbacks), "monitoring", "cupti" (CUPTI's callbacks: ~2.5 µs and more per CUDA call, every
    library's and ours, H200) or "off"."""

    by = "auto"


CALL_SITES = _CallSites()


class _Owner:
    """The trace whose CUPTI source is started: CUPTI serves one per process."""

    trace: Any = None


OWNER = _Owner()


def hook_torch_profiler() -> None:
    """Have torch.profiler take CUPTI cleanly from a recording trace: wraps ``torch.autograd.profiler.
    _prepare_profiler`` (once) so that the trace holding CUPTI flushes and stops it before Kineto takes the callbacks.
    Without it, records in a buffer of ours would go to Kineto, which drops buffers it did not hand out: lost to both.
    A seam with PyTorch (docs/architecture.md); a torch without that function keeps the harvester's detection."""
    module = sys.modules.get("torch.autograd.profiler")
    original = getattr(module, "_prepare_profiler", None)
    if original is None or getattr(original, "gpuworkbench_hook", False):
        return

    def prepare(*args: Any, **kwargs: Any) -> Any:
        owner = OWNER.trace
        if owner is not None:
            owner._yield_cupti("torch.profiler started and took CUPTI")
        cupti_source.hand_over()
        cupti_source.timestamps_may_change()
        return original(*args, **kwargs)

    prepare.gpuworkbench_hook = True  # type: ignore[attr-defined]
    module._prepare_profiler = prepare
    cupti_source.callbacks_unknown()  # a profiler session before the hook may have taken the callbacks


def _weak(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (bound to a trace) called through a weak reference to its trace."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        if bound is None:
            raise ReferenceError("the trace is gone")
        return bound(*args)

    return call


def cuda_in_process() -> bool:
    """Whether a CUDA library is loaded in this process (``CUDA_MODULES``)."""
    modules = sys.modules
    return any(name in modules for name in CUDA_MODULES)


def _cuda_name(ordinal: int) -> str:
    """A CUDA device's name, asked of whichever library is loaded (no new CUDA context is made for it), once."""
    name = _CUDA_NAMES.get(ordinal)
    if name is None:
        name = _ask_cuda_name(ordinal)
        if not name.startswith("CUDA device "):
            _CUDA_NAMES[ordinal] = name
    return name


_CUDA_NAMES: dict[int, str] = {}


def _ask_cuda_name(ordinal: int) -> str:
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return cupy.cuda.runtime.getDeviceProperties(ordinal)["name"].decode()
        except Exception:  # noqa: BLE001
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return str(torch.cuda.get_device_name(ordinal))
        except Exception:  # noqa: BLE001
            pass
    return f"CUDA device {ordinal}"


class CuptiTracing:
    """Mixed into ``Trace``: the CUPTI side of a trace (its attributes are made in ``Trace.__init__``)."""

    def _start_cupti(self) -> str:
        if self._cupti_tried:
            return self._cupti_reason
        self._cupti_tried = True
        ok, why = cupti_source.CuptiSource.available()
        if not ok:
            self._cupti_reason = why
            return why
        why = cupti_source.blocked()
        if why and not cupti_source.lingering():  # attaching or enabling could wait for the blocker; taking over not
            self._cupti_reason = why
            self.warn_once(f"CUPTI not used: {why}; this trace times its own ops by events and sees no other work")
            return why
        other = cupti_source.other_client()
        if other:
            self._cupti_reason = other
            self.warn_once(f"CUPTI not used: {other}; this trace times its own ops by events and sees no other work")
            return other
        owner = OWNER.trace
        if owner is not None and owner is not self and not owner.recording:
            owner._await_release()
        cupti_source.prepare()  # once per process: done at %load_ext, else here
        source = cupti_source.new_source()  # one per trace (it takes over a parked one's kinds: cupti.LINGER_S)
        hook_torch_profiler()
        try:
            source.start()
        except cupti_source.CuptiUnavailable as exc:
            self._cupti_reason = str(exc)
            return self._cupti_reason
        OWNER.trace = self
        window = WindowClock()  # set before the source, which a harvester may meet at once
        if cupti_source.timestamps_are_ticks():  # calls before the first harvest are placed between two samples
            window.sample(source)
        self._window = window
        self._clocks_sampled = False  # on first need (``_sample_clocks``), not on the path before the first op
        self._cupti = source
        self._cupti_session = source.session
        if self.others:
            # Weak callbacks: a trace in a reference cycle is freed by the cyclic collector, late and on any thread.
            self._foreign = ForeignRecords(
                _weak(self._foreign_devices),
                _weak(self._thread_row),
                _weak(self.label_stream),
                source.api_name,
                source.names_of,
            )
            mismatch = cupti_source.nvtx_mismatch()
            if mismatch:
                self.warn_once(mismatch)
        return ""

    def _align(self, device: Any) -> DeviceClock:
        caps = device.caps
        limits = DeviceLimits.from_properties(device.backend_device.occupancy_properties())
        clock = DeviceClock(key=device.spec, name=device.name, source=caps.timestamps, limits=limits)
        if caps.timestamps == "events" and self.source in ("auto", "cupti") and device.backend_kind.value == "cuda":
            # Measured on an H200: with a persistent kernel looping (persistent/), a CUPTI trace waited for it to end.
            blocked = device.runs_persistent()
            reason = (
                "a persistent kernel runs on this device, and CUPTI would wait for it to end"
                if blocked
                else self._start_cupti()
            )
            if not blocked and self._cupti is not None and not self._taken:
                clock.source = "cupti"  # its offset: ``_sample_clocks`` (taken already, or fills it in then)
                clock.offset_ns, clock.error_ns = self._cupti_offset, self._cupti_error
                return clock
            reason = reason or self._taken
            clock.note = (
                f"CUPTI not used ({reason}); spans come from CUDA events, which mark when the stream reached each op, "
                "not when the copy engine or SMs ran it: kernels can look several µs longer and a copy queued behind "
                "another stream's copy can look hundreds of µs longer (and falsely overlapping)."
            )
            if self.source == "cupti":
                raise RuntimeError(f"trace source 'cupti' asked for but unavailable: {reason}")
        sample = device.backend_device.clock_sample()
        clock.offset_ns, clock.error_ns = sample.device_ns - sample.host_ns, sample.error_ns
        return clock

    def uses_cupti(self, device_number: int, kind: str = "kernel", nbytes: int = 1, name: str = "") -> bool:
        """Whether this op's span comes from CUPTI: not for zero-byte copies and memsets (they do nothing CUPTI could
        see), nor for peer copies between devices (CUPTI reports them as MEMCPY2 records, a kind not enabled here:
        measured on two H200s, a peer copy's op then got no span)."""
        return (
            self._cupti_flags[device_number]
            and (nbytes > 0 or kind == "kernel")
            and not (kind == "d2d" and parse_peer_copy(name) is not None)
        )

    def _report_sites(self) -> None:
        """Log where user code is as other libraries' launches and copies are made (a trace with ``lines`` that
        records their work), so that their spans carry their source line too: by Python's monitoring where it has it
        (``call_watch.py``), else by CUPTI's callbacks (``cupti/sites.py``); ``CALL_SITES`` chooses."""
        if self.lines is None or self._foreign is None or self._cupti is None or self._sites is not None:
            return
        sites = CallSites(self.lines, cupti_source.LIFECYCLE.work_cbids)
        if CALL_SITES.by in ("auto", "monitoring") and CallWatch.available():
            watch = CallWatch(self.lines, sites)
            if watch.start(sys._getframe(1)):  # noqa: SLF001 - the code that starts the trace is watched too
                sites.watch = watch
            else:
                self.warn_once("other libraries' work carries no source line: Python's monitoring tools are taken")
                return
        elif CALL_SITES.by in ("auto", "cupti"):
            status = cupti_source.LIFECYCLE.report_sites(sites)
            if status:
                why = (
                    "another tool holds CUPTI's callbacks" if status < 0 else f"CUPTI refused its callbacks ({status})"
                )
                self.warn_once(f"other libraries' work carries no source line: {why}")
                return
        else:
            if CALL_SITES.by != "off":  # "monitoring" before Python 3.12, or a name that is none of them
                why = (
                    "Python's monitoring needs Python 3.12+"
                    if CALL_SITES.by == "monitoring"
                    else f"CALL_SITES.by is {CALL_SITES.by!r}, not 'auto', 'monitoring', 'cupti' or 'off'"
                )
                self.warn_once(f"other libraries' work carries no source line: {why}")
            return
        self._sites = sites
        self._foreign.locate = _weak(self._locate_calls)

    def _stop_sites(self) -> None:
        """Stop logging call sites (the log stays, for the harvests still to come)."""
        sites = self._sites
        if sites is None:
            return
        if sites.watch is not None:
            sites.watch.stop()
        elif detach_hook.HOOK is sites:
            cupti_source.LIFECYCLE.report_sites(None)

    def _locate_calls(self, thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The source location of each of other libraries' API calls (thread, start and end on CUPTI's clock)."""
        try:
            off = self._window.offsets(self._cupti, start) if self._cupti is not None else 0
            return self._sites.locate(thread, start - off, end - off)
        except Exception as exc:  # noqa: BLE001 - a location is never worth a span
            self.warn_once(f"other libraries' work has no source line: placing their calls failed ({exc!r})")
            return np.full(thread.size, -1, np.int64)

    def _await_release(self) -> None:
        """Wait (at most ``CUPTI_HANDOFF_S``) for this stopped trace's harvester to release CUPTI; its next pass
        runs now: a forced flush brings the records of ops already done, and it releases CUPTI as its last ops
        are in."""
        if self._thread is not None:
            self._hurry.set()
            self._thread.join(CUPTI_HANDOFF_S)

    def _foreign_devices(self, ordinals: np.ndarray) -> np.ndarray:
        """Trace device numbers of CUDA ordinals seen in CUPTI records (new ones are added, on CUPTI's clock)."""
        numbers = self._cuda_numbers
        unique = np.unique(ordinals)
        if any(int(o) not in numbers for o in unique.tolist()):
            with self._lock:
                for ordinal in unique.tolist():
                    if ordinal not in numbers:
                        number = len(self._devices)
                        self._devices[number] = DeviceClock(
                            key=f"cuda:{ordinal}",
                            name=_cuda_name(ordinal),
                            source="cupti",
                            offset_ns=self._cupti_offset,
                            error_ns=self._cupti_error,
                            limits=cuda_limits(ordinal),
                        )
                        self._cupti_flags.append(True)
                        numbers[ordinal] = number
        lookup = np.array([numbers[int(o)] for o in unique.tolist()], np.int64)
        return lookup[np.searchsorted(unique, ordinals)] if unique.size else np.zeros(0, np.int64)

    def _thread_row(self, device: int, thread: int) -> int:
        """The host row (a negative stream) of a thread CUPTI names by the low 32 bits of its ``pthread_self``."""
        index = self._threads.get(thread)
        if index is None:
            index = self._threads[thread] = len(self._threads)
        stream = thread_stream(index)
        if (device, stream) not in self._stream_labels:
            name = next((t.name for t in threading.enumerate() if (t.ident or 0) & 0xFFFFFFFF == thread), "")
            self._stream_labels[(device, stream)] = f"host {name}" if name else f"host thread {thread:#x}"
        return stream

    def _yield_cupti(self, reason: str) -> None:
        """Hand CUPTI to another client that is about to take it (torch.profiler, through ``hook_torch_profiler``):
        flush and stop it first, so that no buffer of ours is left for the other tool to receive, decode what came
        back, and time later ops by events. Ops whose records had not come (still running) are counted lost."""
        with self._harvest_lock:
            source = self._cupti
            if source is None or self._taken or source.session != self._cupti_session:
                return
            source.stop()
            self._give_up_cupti(reason)
            self._harvest(flush=False)
            left = len(self._cupti_ops)
            if left:
                self.stats.lost += left
                self.warn_once(f"{left} ops still running when CUPTI was handed over have no span")
            self._cupti_ops = CuptiOps()
            self._cupti, self._foreign = None, None
            if OWNER.trace is self:
                OWNER.trace = None

    def _give_up_cupti(self, reason: str) -> None:
        """Another client took CUPTI while this trace recorded: its later ops are timed by events."""
        self._taken = reason
        self._cupti.freeze()
        self._cupti_flags = [False] * len(self._cupti_flags)
        self._streams.clear()
        self.warn_once(
            f"CUPTI taken over mid-trace: {reason}. From then on this trace times its own ops by CUDA events and "
            "sees no other library's work; its ops enqueued just before may be missing."
        )

    def _sample_clocks(self) -> None:
        """CUPTI's clock against the host's and the window clock, once per CUPTI source, when first needed: at the
        first harvest or a read of ``devices`` (a CUDA device's clock made before then gets the offset here). On the
        trace's start, on a CPU that idled between notebook cells, they took ~12 µs before the first op (H200 host)."""
        source = self._cupti
        if self._clocks_sampled or source is None:
            return
        cupti_ns, host_ns, err = source.clock_sample()
        with self._lock:  # against ``_align``: every CUPTI clock made before gets the offset, every one after too
            if self._clocks_sampled:
                return
            self._window.sample(source)
            self._cupti_offset, self._cupti_error = cupti_ns - host_ns, err
            for clock in self._devices.values():
                if clock.source == "cupti":
                    clock.offset_ns, clock.error_ns = self._cupti_offset, self._cupti_error
            self._clocks_sampled = True

    def _resolve(self, thread: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Place CUPTI API calls (thread id, start on CUPTI's clock) in the enqueue windows of the waiting ops."""
        return self._cupti_ops.resolve(thread, start - self._window.offsets(self._cupti, start))

    def _finish_harvests(self) -> bool:
        """Whether ``_finish_cupti`` ends with a harvest of its own (this trace's CUPTI source is still its own)."""
        return self._cupti is not None and self._cupti.session == self._cupti_session

    def _finish_cupti(self) -> None:
        if self._finish_harvests():
            if self._taken:
                self._cupti.abandon()  # the other client holds CUPTI now: leave its kinds and callbacks alone
            else:
                self._cupti.stop()
            self.harvest()  # what the stop's forced flush handed back, and records held for ids: all released now
            self.stats.unplaced_calls = self._cupti.unplaced_calls
            if OWNER.trace is self:
                OWNER.trace = None
