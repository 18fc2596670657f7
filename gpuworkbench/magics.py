"""The ``%gpu`` line magic and ``%%gpu`` cell magic: devices, memory, live view, export, quick benchmarks, traced cells.

``%load_ext gpuworkbench`` registers them. Every traced cell, and every trace ``%gpu load`` read, is kept in
:data:`history` (newest last) so that a front end can list the kernel's traces. Bokeh and ipywidgets are imported
only when a picture or a progress bar is drawn.
"""

from __future__ import annotations

import ast
import html
import inspect
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ._progress import Progress as _Progress
from .errors import GpuError, _fmt_bytes
from .trace import cupti
from .trace.spans import KIND_CODE

if TYPE_CHECKING:
    from .device import Device
    from .trace.recorder import Trace

LINE_USAGE = """\
%gpu                              list backends and devices (the current one marked)
%gpu use BACKEND[:N]              select the current device (also what gw.Device() returns from now on)
%gpu mem                          memory of the current device and what gpuworkbench holds there
%gpu live [stop]                  a dashboard that keeps updating while later cells run; stop it
%gpu export PATH [--live]         write the last %%gpu trace (or the live one) as Chrome-trace JSON
%gpu load PATH [-o NAME]          read a Chrome / Kineto trace (PyTorch profiler, an export) and show it like %%gpu
%gpu cupti [release]              where CUPTI stands (attached, lingering after a trace, let go); let it go now
%gpu bench copy|launch|pipeline   quick benchmarks on the current device
%gpu bench crossover [OP ...] [--sizes N,N,...] [--repeats R] [--budget S] [--refresh]
                                  from which size each library op (all: no OP) beats NumPy, with and without
                                  copies: a table and a log-log plot (cached per device; --refresh measures again)"""
CELL_USAGE = "%%gpu [-o NAME] [--no-show] [--device BACKEND[:N]]   trace the cell; show timeline, memory and summary"

#: How many traced cells :data:`history` keeps (the oldest go first).
HISTORY_LIMIT = 100


@dataclass
class TraceRecord:
    """One ``%%gpu`` cell: when it ran, how long, its headline figures and the Trace itself.

    Figures are None when the cell raised, traced no device work, or the figure does not apply (no copies).
    """

    execution_count: int | None
    started: float  # Unix time (s) when the cell started
    wall_s: float
    window_ns: tuple[int, int]  # the summary's window W on the trace clock: the cell's wall time (see GpuMagics)
    overlap_pct: float | None
    efficiency: float | None
    idle_pct: float | None
    trace: Trace
    name: str | None = None  # the ``-o`` name, if any
    error: str | None = None  # repr of the exception the cell raised, if any
    source: str | None = None  # the file ``%gpu load`` read the trace from (its window is then the trace's own)


#: Every trace captured by ``%%gpu`` (or read by ``%gpu load``) in this kernel, oldest first (at most HISTORY_LIMIT).
history: list[TraceRecord] = []


def register(ipython: Any) -> None:
    """Register ``%gpu`` and ``%%gpu`` on ``ipython`` (called by ``%load_ext gpuworkbench``)."""
    ipython.register_magics(GpuMagics)
    if _number_cells not in ipython.events.callbacks["post_run_cell"]:
        # before the comm's own post_run_cell hook (registered after this), so the panel sees the right number
        ipython.events.register("post_run_cell", _number_cells)
    if _ready_cupti_for_cell not in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.register("pre_run_cell", _ready_cupti_for_cell)
    cupti.NOTEBOOK = True  # CUPTI is attached for the cells that trace, before they run, not on a timer


#: Words in a cell's source that say it traces (or asks about CUPTI): CUPTI lingering after a trace is kept for it.
_TRACING_WORDS = ("%%gpu", "%gpu live", "%gpu cupti", "trace(", "gw.dask", ".live(")
#: A cell that traces on this process's GPUs (``gw.trace(``, not ``gw.load_trace(`` or ``gw.dask.trace(``): CUPTI is
#: made ready for its trace before it runs.
_TRACES_HERE = re.compile(r"%%gpu|%gpu live|\.live\(|(?<!\w)(?<!dask\.)trace\(")


def _ready_cupti_for_cell(info: Any) -> None:
    """Before each cell, on the kernel's thread, outside the cell's own time: for a cell that traces, attach CUPTI if
    it was let go, park a source for the cell's trace to take over and prime it on this thread
    (``cupti.warm_for_cell``); for a cell that does not, let go an attached CUPTI (a source lingering after a trace
    or parked by ``%load_ext``, CUPTI ready, or left attached by torch.profiler), which would slow every CUDA call of
    the cell (an empty launch 1.5 × while a source lingers, 1.7 × after torch.profiler on an H100, a few % when ready),
    so that it runs as in a process that never traced. Cells that ask about CUPTI (``%gpu cupti``) or trace on Dask
    workers leave it as it is; so does a trace or a torch.profiler that still records (a live view, a schedule)."""
    global _last_hook
    t0 = time.perf_counter_ns()
    cupti.settle(1.0)  # a re-initialization under way (one armed before %load_ext)
    source = getattr(info, "raw_cell", "") or ""
    done = ""
    if _TRACES_HERE.search(source):
        attached = not cupti.detached()
        if cupti.warm_for_cell():
            done = "made CUPTI ready for the cell's trace" if attached else "attached CUPTI for the cell's trace"
    elif not any(word in source for word in _TRACING_WORDS) and not cupti.detached():
        if cupti.let_go():  # refused while a trace, a block or another tool (torch.profiler recording) holds CUPTI
            done = "let CUPTI go for the untraced cell"
    if done:
        _last_hook = (done, (time.perf_counter_ns() - t0) / 1e6)


#: What the pre-run hook last did to CUPTI, and how long it took (ms); ``%gpu cupti`` reports it.
_last_hook: tuple[str, float] | None = None


def _number_cells(result: Any) -> None:
    """Give records made during the cell just run that cell's number: inside a running cell IPython 9's
    ``execution_count`` already names the next cell."""
    for record in reversed(history):
        if record.execution_count != -1:  # -1 marks a record of the running cell
            break
        record.execution_count = result.execution_count


def _error(what: str, message: object) -> None:
    print(f"{what}: {message}", file=sys.stderr)


class _Table:
    """A small table shown as HTML in a notebook and as aligned text elsewhere (IPython's display picks)."""

    def __init__(self, headers: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> None:
        self.headers, self.rows, self.notes = list(headers), [list(r) for r in rows], list(notes)

    def __repr__(self) -> str:
        cells = [self.headers, *self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.headers))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        return "\n".join(lines + self.notes)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        notes = "".join(f"<div>{html.escape(n)}</div>" for n in self.notes)
        return f"<table class='gpuworkbench-devices'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"


def _link_notes(found: Sequence[Any]) -> list[str]:
    """One line per pair of CUDA GPUs: the link the driver reports (``backends.cuda.peer_links``: NVLink, PCIe, peer
    access with its rank, or none); nothing with fewer than two GPUs or when the driver cannot say."""
    count = sum(1 for info in found if info.backend == "cuda")
    if count < 2:
        return []
    try:
        from .backends.cuda import peer_links

        links = peer_links(count)
    except Exception:  # noqa: BLE001 - a listing never fails on the links
        return []
    notes = []
    for a in range(count):
        for b in range(a + 1, count):
            ab, ba = links.get((a, b), "unknown"), links.get((b, a), "unknown")
            link = ab if ab == ba else f"{ab} (cuda:{a} → cuda:{b}), {ba} (cuda:{b} → cuda:{a})"
            if link == "none":
                link = "no peer access: copies between them go through the host"
            notes.append(f"link cuda:{a} ↔ cuda:{b}: {link}")
    return notes


def _best_s(fn: Callable[[], Any], repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls (each call waits for its own work)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


@magics_class
class GpuMagics(Magics):
    """``%gpu`` (devices, memory, live view, export, benchmarks) and ``%%gpu`` (trace one cell).

    ``%%gpu`` measures W as the cell's wall time, extended to the end of any op the cell enqueued and left running.
    """

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self.device: Device | None = None  # chosen with %gpu use; None = gw.Device()'s choice
        self.live: Any = None  # the dashboard started by %gpu live
        self.last_bench: dict[str, Any] | None = None

    # ------------------------------------------------------------------ entry point
    @line_cell_magic
    def gpu(self, line: str, cell: str | None = None) -> Any:
        """%gpu [use|mem|live|export|bench ...] and %%gpu [-o NAME] [--no-show] [--device SPEC]."""
        __tracebackhide__ = True  # a cell's own error shows the cell's frames, not the magic's
        if cell is not None:
            return self._traced_cell(line, cell)
        try:
            words = shlex.split(line)
        except ValueError as exc:
            _error("%gpu", f"{exc}\n{LINE_USAGE}")
            return None
        command, args = (words[0], words[1:]) if words else ("", [])
        handlers: dict[str, Callable[[list[str]], None]] = {
            "": self._devices,
            "use": self._use,
            "mem": self._mem,
            "live": self._live,
            "export": self._export,
            "load": self._load,
            "bench": self._bench,
            "cupti": self._cupti,
        }
        if command in ("help", "-h", "--help"):
            print(f"{LINE_USAGE}\n{CELL_USAGE}")
        elif command not in handlers:
            _error("%gpu", f"unknown command {command!r}\n{LINE_USAGE}")
        else:
            handlers[command](args)
        return None

    @property
    def _notebook(self) -> bool:
        """True under a Jupyter kernel (widgets and HTML render there), False in a terminal or a test shell."""
        return getattr(self.shell, "kernel", None) is not None

    def _present(self, obj: Any) -> None:
        """Show ``obj`` as rich output in a notebook and as its text (``str``) elsewhere."""
        if self._notebook:
            display(obj)
        else:
            print(obj)

    def current_device(self) -> Device:
        """The device chosen with ``%gpu use``, else the one ``gw.Device()`` picks."""
        from .device import Device

        if self.device is not None and not self.device.closed:
            return self.device
        return Device()

    # ------------------------------------------------------------------ %gpu
    def _devices(self, args: list[str]) -> None:
        """A table of every backend and device, with memory; the current device marked."""
        from .device import Device, _auto_spec, backend_status, devices

        if args:
            _error("%gpu", f"unexpected {' '.join(args)!r}\n{LINE_USAGE}")
            return
        current = self.device.spec if self.device is not None and not self.device.closed else None
        if current is None:
            try:
                current = "{}:{}".format(*_auto_spec())
            except GpuError:
                current = ""
        rows = []
        found = devices()
        for info in found:
            spec = f"{info.backend}:{info.index}"
            try:
                free, total = Device(info.index, backend=info.backend).memory_info()
                memory = f"{_fmt_bytes(free)} free of {_fmt_bytes(total)}"
            except GpuError as exc:
                memory = f"cannot open: {exc}"
            mark = "→" if spec == current else ""
            rows.append([mark, spec, "GPU" if info.is_gpu else "CPU", info.name, memory])
        notes = _link_notes(found) + [f"{name}: {why}" for name, why in backend_status().items() if why]
        if self.device is None:
            notes.append("current device: chosen automatically (%gpu use BACKEND[:N] to choose)")
        self._present(_Table(["", "device", "type", "name", "memory"], rows, notes))

    def _open(self, spec: str) -> Device | None:
        """The device named by ``spec``, or None after printing one line saying why it cannot be used."""
        from .device import Device

        try:
            return Device(spec)
        except (GpuError, ValueError) as exc:
            _error("%gpu use", exc)
            return None

    def _use(self, args: list[str]) -> None:
        """Make ``BACKEND[:N]`` the current device, for the magics and for ``gw.Device()`` (via GPUWB_DEVICE)."""
        if len(args) != 1:
            _error("%gpu use", "give one device, e.g. %gpu use opencl:0 (see %gpu for the list)")
            return
        dev = self._open(args[0])
        if dev is None:
            return
        self.device = dev
        os.environ["GPUWB_DEVICE"] = dev.spec
        print(f"current device: {dev.spec} {dev.name}")

    def _mem(self, args: list[str]) -> None:
        """Free and total memory of the current device, and what gpuworkbench holds there."""
        if args:
            _error("%gpu mem", f"takes no arguments, got {' '.join(args)!r}")
            return
        try:
            dev = self.current_device()
            free, total = dev.memory_info()
        except GpuError as exc:
            _error("%gpu mem", exc)
            return
        buffers = dev.live_buffers
        estimated = "" if dev.caps.memory_free_known else " (estimated: the backend cannot tell free memory)"
        print(f"{dev.spec} {dev.name}")
        print(f"  device memory  {_fmt_bytes(free)} free of {_fmt_bytes(total)}{estimated}")
        print(f"  gpuworkbench   holds {_fmt_bytes(dev.held_bytes)} in {len(buffers)} live buffer(s)")

    def _live(self, args: list[str]) -> None:
        """Show a live dashboard (``gw.live()``), or stop the running one with ``%gpu live stop``."""
        if args == ["stop"]:
            if self.live is None:
                _error("%gpu live stop", "no live dashboard is running")
                return
            self._stop_live()
            print("live dashboard stopped")
            return
        if args:
            _error("%gpu live", f"unexpected {' '.join(args)!r}; use %gpu live or %gpu live stop")
            return
        import gpuworkbench

        start = getattr(gpuworkbench, "live", None)
        if start is None:
            _error("%gpu live", "this version of gpuworkbench has no live dashboard (gw.live)")
            return
        if self.live is not None:
            self._stop_live()
        try:
            self.live = start(device=self.device) if self.device is not None else start()
        except ImportError as exc:
            _error("%gpu live", f"the dashboard needs ipywidgets, bokeh and jupyter_bokeh ({exc})")
            return
        display(self.live)

    def _stop_live(self) -> None:
        stop = getattr(self.live, "stop", None)
        if stop is not None:
            stop()

    def _export(self, args: list[str]) -> None:
        """Write the last ``%%gpu`` trace (or, with --live or when there is none, the live one) as a Chrome trace."""
        live = "--live" in args
        paths = [a for a in args if a != "--live"]
        if len(paths) != 1:
            _error("%gpu export", "give one path, e.g. %gpu export run.json (add --live for the live trace)")
            return
        live_trace = getattr(self.live, "trace", None)
        if live or not history:
            trace, what = live_trace, "the live dashboard's trace"
        else:
            record = history[-1]
            trace, what = record.trace, f"the %%gpu cell [{record.execution_count}]"
            if record.source:
                what = f"the trace loaded from {record.source}"
        if trace is None:
            _error("%gpu export", "nothing to export yet: run a %%gpu cell (or start %gpu live) first")
            return
        path = os.path.abspath(os.path.expanduser(paths[0]))
        try:
            doc = trace.to_chrome_trace(path)
        except OSError as exc:
            _error("%gpu export", f"cannot write {path}: {exc.strerror or exc}")
            return
        events = len(doc["traceEvents"])
        print(f"wrote {what} ({len(trace)} spans, {events} events) to {path}; open it in https://ui.perfetto.dev")

    def _load(self, args: list[str]) -> None:
        """Read a trace file (``gw.load_trace``), keep it in :data:`history` (the panel lists it, as it lists
        ``%%gpu`` cells) and show it as a ``%%gpu`` cell's trace is shown; ``-o NAME`` stores the Trace."""
        usage = "usage: %gpu load PATH [-o NAME]"
        name, paths, words = None, [], iter(args)
        for word in words:
            if word == "-o":
                name = next(words, "")
            elif word.startswith("-o"):
                name = word[2:]
            else:
                paths.append(word)
        if len(paths) != 1:
            _error("%gpu load", f"give one trace file, e.g. %gpu load trace.json.gz\n{usage}")
            return
        if name is not None and not name.isidentifier():
            _error("%gpu load", f"-o takes a Python name, not {name!r}\n{usage}")
            return
        from .trace.kineto import load_trace

        path = os.path.abspath(os.path.expanduser(paths[0]))
        try:
            trace = load_trace(path)
        except GpuError as exc:
            _error("%gpu load", exc)
            return
        table = trace.table()
        work = np.isin(table["kind"], [KIND_CODE[k] for k in ("h2d", "d2h", "d2d", "memset", "kernel")])
        window = (int(table["start_ns"][work].min()), int(table["end_ns"][work].max())) if work.any() else (0, 0)
        summary = trace.summary() if work.any() else None
        record = TraceRecord(-1, time.time(), (window[1] - window[0]) / 1e9, window, None, None, None, trace, name)
        record.source = path
        if summary is not None:
            record.overlap_pct, record.efficiency = summary.overlap_pct, summary.pipeline_efficiency
            record.idle_pct = summary.idle_pct
        history.append(record)
        del history[:-HISTORY_LIMIT]
        if name is not None:
            self.shell.user_ns[name] = trace
        devices = ", ".join(f"{c.key} {c.name}" for c in trace.devices.values()) or "no device"
        print(f"loaded {path}: {len(trace)} spans on {devices}")
        if summary is None:
            print("%gpu load: the trace holds no device work (copies, kernels), so there is nothing to show")
            return
        self._show(trace, summary, None)

    # ------------------------------------------------------------------ %gpu bench
    def _cupti(self, args: list[str]) -> None:
        if args == ["release"]:
            released = cupti.let_go()
            why = "CUPTI is not attached, a trace records, or another tool holds it"
            print("CUPTI let go" if released else f"not let go: {why}")
        elif args:
            _error("%gpu cupti", f"unknown argument {' '.join(args)!r}: %gpu cupti [release]")
            return
        print(f"CUPTI: {cupti.state()}")
        if _last_hook is not None:
            done, ms = _last_hook
            print(f"last done before a cell: {done}, in {ms:.1f} ms, outside the cell's own time")

    def _bench(self, args: list[str]) -> None:
        """Run one benchmark on the current device: ``copy``, ``launch``, ``pipeline`` or ``crossover [OP ...]``."""
        benches = {"copy": self._bench_copy, "launch": self._bench_launch, "pipeline": self._bench_pipeline}
        if args and args[0] == "crossover":
            try:
                self.last_bench = self._bench_crossover(args[1:])
            except GpuError as exc:
                _error("%gpu bench crossover", exc)
            return
        if len(args) != 1 or args[0] not in benches:
            _error("%gpu bench", "choose one of: copy, launch, pipeline, crossover [OP ...]")
            return
        try:
            dev = self.current_device()
            self.last_bench = benches[args[0]](dev)
        except GpuError as exc:
            _error(f"%gpu bench {args[0]}", exc)

    def _bench_crossover(self, args: list[str]) -> dict[str, Any] | None:
        """``gw.crossover`` on the current device: the table, then the log-log plot (in a notebook)."""
        from .crossovers import crossover

        ops: list[str] = []
        options: dict[str, Any] = {}
        words = iter(args)
        for word in words:
            name, _, value = word.partition("=")
            if name in ("--sizes", "--repeats", "--budget") and not value:
                value = next(words, "")
            try:
                if name == "--sizes":
                    options["sizes"] = [int(v) for v in value.split(",") if v]
                elif name == "--repeats":
                    options["repeats"] = int(value)
                elif name == "--budget":
                    options["budget_s"] = float(value)
                elif name == "--refresh":
                    options["refresh"] = True
                elif word.startswith("-"):
                    _error("%gpu bench crossover", f"unknown option {word}\n{LINE_USAGE}")
                    return None
                else:
                    ops.append(word)
            except ValueError:
                _error("%gpu bench crossover", f"{name} takes a number (--sizes: numbers separated by commas), not "
                                               f"{value!r}")  # fmt: skip
                return None
        result = crossover(ops or None, self.current_device(), progress=True, **options)
        self._present(result)
        if self._notebook:
            from bokeh.io import show

            from .viz import inline_setup

            inline_setup()  # BokehJS from the package (no CDN), once
            show(result.figure())
        return {"device": result.device, "result": result, "crossover": result.crossover}

    def _bench_copy(self, dev: Device) -> dict[str, Any]:
        """Host↔device copy bandwidth from page-locked ("pinned") and ordinary ("pageable") host memory."""
        gpu = dev.info.is_gpu
        nbytes, repeat = (64 << 20, 5) if gpu else (8 << 20, 3)
        n = nbytes // 4
        buf = dev.alloc(n, "float32")
        stream = dev.create_stream("bench-copy")
        pinned = dev.empty_pinned(n, "float32")
        pinned[:] = 1.0
        pageable = np.ones(n, np.float32)
        cases = [
            ("pinned H2D", lambda: buf.copy_from_host_async(pinned, stream).wait()),
            ("pinned D2H", lambda: buf.copy_to_host_async(pinned, stream).wait()),
            ("pageable H2D", lambda: buf.copy_from_host_async(pageable, stream).wait()),
            ("pageable D2H", lambda: buf.copy_to_host_async(pageable, stream).wait()),
        ]
        results: dict[str, Any] = {"device": dev.spec, "bytes": nbytes}
        progress = _Progress("copy", len(cases), self._notebook)
        try:
            for label, fn in cases:
                fn()  # warm-up: first touch of the pages, staging buffers
                gbps = nbytes / _best_s(fn, repeat) / 1e9
                results[label] = gbps
                progress.step(f"{label} {gbps:.2f} GB/s")
        finally:
            progress.close()
            buf.free()
            stream.close()
        rows = [[label, f"{results[label]:.2f} GB/s"] for label, _ in cases]
        notes = [f"{dev.spec} {dev.name}, {_fmt_bytes(nbytes)} per copy, best of {repeat}"]
        if not dev.caps.pinned_memory:
            notes.append("this backend has no page-locked memory: 'pinned' arrays are ordinary memory here")
        self._present(_Table(["copy", "bandwidth"], rows, notes))
        return results

    def _bench_launch(self, dev: Device) -> dict[str, Any]:
        """Kernel launch cost: host time to enqueue one, time per kernel back to back, and launch-and-wait latency."""
        from .kernels import elementwise

        count, round_trips = (5000, 200) if dev.info.is_gpu else (500, 50)
        kernel = elementwise("float32 x, float32 y", "y = x + 1", name="bench_launch")
        x, y = dev.alloc(1, "float32"), dev.alloc(1, "float32")
        stream = dev.create_stream("bench-launch")
        progress = _Progress("launch", 3, self._notebook)
        try:
            x.fill_bytes(0, stream)
            kernel(x, y, stream=stream).wait()  # compiles, and warms the stream
            progress.step("compiled")
            t0 = time.perf_counter()
            for _ in range(count):
                kernel(x, y, stream=stream)
            enqueued = time.perf_counter() - t0
            stream.synchronize()
            finished = time.perf_counter() - t0
            progress.step(f"{count} launches back to back")
            latencies = []
            for _ in range(round_trips):
                t1 = time.perf_counter()
                kernel(x, y, stream=stream).wait()
                latencies.append(time.perf_counter() - t1)
            progress.step(f"{round_trips} launch-and-wait")
        finally:
            progress.close()
            x.free()
            y.free()
            stream.close()
        results = {
            "device": dev.spec,
            "enqueue_s": enqueued / count,
            "per_kernel_s": finished / count,
            "round_trip_s": float(np.median(latencies)),
        }
        rows = [
            ["enqueue (host time per launch)", _us(results["enqueue_s"])],
            ["back to back (time per kernel)", _us(results["per_kernel_s"])],
            ["launch and wait (median)", _us(results["round_trip_s"])],
        ]
        notes = [f"{dev.spec} {dev.name}, a one-element kernel y = x + 1"]
        if dev.caps.kernel_language == "python":
            notes.append("the CPU backend's worker threads share Python's GIL with the host: launches wait for it")
        self._present(_Table(["launch", "time"], rows, notes))
        return results

    def _bench_pipeline(self, dev: Device) -> dict[str, Any]:
        """A double-buffered ``gw.Pipeline`` (H2D → y = 2*x + 1 → D2H), timed, then traced and summarised."""
        from .kernels import elementwise
        from .pipeline import Pipeline
        from .trace.recorder import Trace

        gpu = dev.info.is_gpu
        batches, batch_bytes, repeat = (16, 16 << 20, 3) if gpu else (8, 2 << 20, 2)
        n = batch_bytes // 4
        inputs = [dev.empty_pinned(n, "float32") for _ in range(batches)]
        outputs = [dev.empty_pinned(n, "float32") for _ in range(batches)]
        for i, a in enumerate(inputs):
            a[:] = i
        kernel = elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
        progress = _Progress("pipeline", repeat + 2, self._notebook)
        try:
            with Pipeline(dev, lambda a, b, s: kernel(a, b, stream=s), depth=2) as pipe:
                pipe.run(inputs[:2], outputs[:2])
                progress.step("warm-up")
                best = float("inf")
                for r in range(repeat):
                    best = min(best, pipe.run(inputs, outputs).wall_s)
                    progress.step(f"run {r + 1}: {best * 1e3:.2f} ms")
                with Trace() as trace:
                    traced = pipe.run(inputs, outputs)
                progress.step(f"traced run: {traced.wall_s * 1e3:.2f} ms")
        finally:
            progress.close()
        correct = all(float(o[0]) == 2 * i + 1 and float(o[-1]) == 2 * i + 1 for i, o in enumerate(outputs))
        summary = trace.summary()
        moved = traced.bytes_in + traced.bytes_out
        print(
            f"{dev.spec} {dev.name}: {batches} batches × {_fmt_bytes(batch_bytes)}, double-buffered; "
            f"best {best * 1e3:.2f} ms ({moved / best / 1e9:.2f} GB/s moved), results "
            f"{'correct' if correct else 'WRONG'}"
        )
        self._present(summary)
        return {"device": dev.spec, "best_s": best, "traced": traced, "trace": trace, "correct": correct}

    # ------------------------------------------------------------------ %%gpu
    def _traced_cell(self, line: str, cell: str) -> Any:
        """Run ``cell`` inside a trace, record it in :data:`history`, show it, and return its last value."""
        __tracebackhide__ = True
        try:
            opts, rest = self.parse_options(line, "o:", "no-show", "device=")
        except UsageError as exc:
            _error("%%gpu", f"{exc}\nusage: {CELL_USAGE}")
            return None
        name = opts.get("o")
        if rest.strip():
            _error("%%gpu", f"unexpected {rest.strip()!r}\nusage: {CELL_USAGE}")
            return None
        if name is not None and not name.isidentifier():
            _error("%%gpu", f"-o takes a Python name, not {name!r}\nusage: {CELL_USAGE}")
            return None
        saved_env = os.environ.get("GPUWB_DEVICE")
        if "device" in opts:
            dev = self._open(opts["device"])
            if dev is None:
                return None
            os.environ["GPUWB_DEVICE"] = dev.spec  # gw.Device() inside the cell gets it

        body, last = self._compile(cell)
        from .trace.recorder import new_trace

        trace = new_trace()
        namespace = self.shell.user_ns
        record = TraceRecord(-1, time.time(), 0.0, (0, 0), None, None, None, trace, name)
        trace.start()
        start_ns = time.perf_counter_ns()
        try:
            exec(body, namespace)
            value = eval(last, namespace) if last is not None else None
        except BaseException as exc:
            record.error = repr(exc)
            raise
        finally:
            end_ns = time.perf_counter_ns()
            trace.stop()
            if "device" in opts:
                if saved_env is None:
                    os.environ.pop("GPUWB_DEVICE", None)
                else:
                    os.environ["GPUWB_DEVICE"] = saved_env
            record.wall_s = (end_ns - start_ns) / 1e9
            record.window_ns = (start_ns, end_ns)
            history.append(record)
            del history[:-HISTORY_LIMIT]
            if name is not None:
                namespace[name] = trace
        summary = self._summarise(record)
        if "no-show" not in opts:
            self._show(trace, summary, record.window_ns)
        return value

    def _compile(self, cell: str) -> tuple[Any, Any]:
        """The cell as IPython would run it (magics, !commands, AST transformers), split off its last expression."""
        source = self.shell.transform_cell(cell)
        tree = self.shell.transform_ast(self.shell.compile.ast_parse(source))
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        filename = self.shell.compile.cache(source, self.shell.execution_count)
        flags = self.shell.compile.flags
        body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
        return body, (compile(last, filename, "eval", flags=flags, dont_inherit=True) if last is not None else None)

    def _summarise(self, record: TraceRecord) -> Any:
        """Wait for the cell's spans, fix W, fill the record's figures; the Summary, or None without device work."""
        trace = record.trace
        if not trace.wait_pending(timeout_s=60.0):
            _error("%%gpu", "some ops the cell enqueued have not finished after 60 s; the trace misses them")
        table = trace.table(wait=False)
        work = np.isin(table["kind"], [KIND_CODE[k] for k in ("h2d", "d2h", "d2d", "memset", "kernel")])
        if not work.any():
            return None
        start_ns, end_ns = record.window_ns
        record.window_ns = (start_ns, max(end_ns, int(table["end_ns"][work].max())))
        summary = trace.summary(window=record.window_ns)
        record.overlap_pct = summary.overlap_pct
        record.efficiency = summary.pipeline_efficiency
        record.idle_pct = summary.idle_pct
        return summary

    def _show(self, trace: Trace, summary: Any, window: tuple[int, int] | None) -> None:
        """Timeline, memory and summary (``trace.show()``, over ``window``: None for the trace's own) in a notebook;
        the summary as text elsewhere."""
        if summary is None:
            print("%%gpu: the cell ran no device work (copies, kernels), so there is nothing to show")
            return
        if not self._notebook:
            print(summary)
            return
        try:
            accepts_window = "window" in inspect.signature(trace.show).parameters
            shown = trace.show(window=window) if accepts_window else trace.show()
        except ImportError as exc:
            print(f"(no pictures: {exc})")
            display(summary)
            return
        if shown is not None:
            display(shown)


GpuMagics.gpu.__doc__ = f"""The %gpu line magic and %%gpu cell magic.

{LINE_USAGE}
{CELL_USAGE}
"""
