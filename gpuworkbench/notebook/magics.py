"""The ``%gpu`` line magic and ``%%gpu`` cell magic: devices, memory, live view, export, quick benchmarks, traced cells.

``%load_ext gpuworkbench`` registers them. Every traced cell, and every trace ``%gpu load`` read, is kept in
``history.history`` (newest last) so that a front end can list the kernel's traces. Bokeh and ipywidgets are imported
only when a picture or a progress bar is drawn.
"""

from __future__ import annotations

import ast
import os
import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from .._format import in_notebook
from ..device import Device
from ..errors import GpuError
from ..trace import cupti
from ..trace.recorder import Trace, new_trace
from . import benches, cell_hooks
from .devices import device_table, memory_lines
from .history import RUNNING_CELL, TraceRecord, device_work, history, keep
from .output import error, present

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
                                  copies: a table and a log-log plot (cached per device; --refresh measures again)
%gpu timeit [--warmup N] [--budget S] [--flush-l2] [--graph] [-o NAME] STATEMENT
                                  device time per call (from the trace's spans) and host time per call, with their
                                  spread; %%gpu timeit [options] times the cell"""
CELL_USAGE = (
    "%%gpu [-o NAME] [--no-show] [--no-lines] [--counters] [--device BACKEND[:N]]   trace the cell; show its lines' "
    "device time, timeline, memory and summary; --counters: sample the host's CPU and memory (and devices' counters "
    "where offered) too"
)


def register(ipython: Any) -> None:
    """Register ``%gpu`` and ``%%gpu`` on ``ipython``, and the hooks run around each cell (``%load_ext``); in a Jupyter
    kernel, the pictures' one-off costs are paid on its event loop once ``%load_ext``'s cell is done (``warm_up``)."""
    ipython.register_magics(GpuMagics)
    cell_hooks.register(ipython)
    loop = getattr(getattr(ipython, "kernel", None), "io_loop", None)  # a Jupyter kernel's; a terminal has none
    if hasattr(loop, "add_callback") and not _warming:
        _warming.append(True)
        loop.add_callback(warm_up)  # runs once the loop is free: after %load_ext's cell has replied


_warming: list[bool] = []  # the warm-up is scheduled once per process


def warm_up() -> None:
    """``viz.warm_up`` (Bokeh's imports and first layout), between cells; never raises (without Bokeh, nothing)."""
    try:
        from ..viz import warm_up as warm_pictures

        warm_pictures()
    except Exception:  # noqa: BLE001  nothing between cells may break the kernel; the first %%gpu cell pays instead
        pass


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
        head = line.split(None, 1)
        if head and head[0] == "timeit":  # %gpu timeit STATEMENT / %%gpu timeit: the statement stays raw text
            from . import timeit_magic

            return timeit_magic.run(self, head[1] if len(head) > 1 else "", cell)
        if cell is not None:
            return self._traced_cell(line, cell)
        try:
            words = shlex.split(line)
        except ValueError as exc:
            error("%gpu", f"{exc}\n{LINE_USAGE}")
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
            error("%gpu", f"unknown command {command!r}\n{LINE_USAGE}")
        else:
            handlers[command](args)
        return None

    def current_device(self) -> Device:
        """The device chosen with ``%gpu use``, else the one ``gw.Device()`` picks."""
        if self.device is not None and not self.device.closed:
            return self.device
        return Device()

    # ------------------------------------------------------------------ %gpu
    def _devices(self, args: list[str]) -> None:
        """A table of every backend and device, with memory; the current device marked."""
        if args:
            error("%gpu", f"unexpected {' '.join(args)!r}\n{LINE_USAGE}")
            return
        present(device_table(self.device))

    def _open(self, spec: str) -> Device | None:
        """The device named by ``spec``, or None after printing one line saying why it cannot be used."""
        try:
            return Device(spec)
        except (GpuError, ValueError) as exc:
            error("%gpu use", exc)
            return None

    def _use(self, args: list[str]) -> None:
        """Make ``BACKEND[:N]`` the current device, for the magics and for ``gw.Device()`` (via GPUWB_DEVICE)."""
        if len(args) != 1:
            error("%gpu use", "give one device, e.g. %gpu use opencl:0 (see %gpu for the list)")
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
            error("%gpu mem", f"takes no arguments, got {' '.join(args)!r}")
            return
        try:
            lines = memory_lines(self.current_device())
        except GpuError as exc:
            error("%gpu mem", exc)
            return
        print("\n".join(lines))

    def _live(self, args: list[str]) -> None:
        """Show a live dashboard (``gw.live()``), or stop the running one with ``%gpu live stop``."""
        if args == ["stop"]:
            if self.live is None:
                error("%gpu live stop", "no live dashboard is running")
                return
            self._stop_live()
            print("live dashboard stopped")
            return
        if args:
            error("%gpu live", f"unexpected {' '.join(args)!r}; use %gpu live or %gpu live stop")
            return
        if self.live is not None:
            self._stop_live()
        try:
            from ..viz.dashboard import live

            self.live = live(device=self.device)
        except ImportError as exc:
            error("%gpu live", f"the dashboard needs ipywidgets, bokeh and jupyter_bokeh ({exc})")
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
            error("%gpu export", "give one path, e.g. %gpu export run.json (add --live for the live trace)")
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
            error("%gpu export", "nothing to export yet: run a %%gpu cell (or start %gpu live) first")
            return
        path = os.path.abspath(os.path.expanduser(paths[0]))
        try:
            doc = trace.to_chrome_trace(path)
        except OSError as exc:
            error("%gpu export", f"cannot write {path}: {exc.strerror or exc}")
            return
        events = len(doc["traceEvents"])
        print(f"wrote {what} ({len(trace)} spans, {events} events) to {path}; open it in https://ui.perfetto.dev")

    def _load(self, args: list[str]) -> None:
        """Read a trace file (``gw.load_trace``), keep it in the history (the panel lists it, as it lists ``%%gpu``
        cells) and show it as a ``%%gpu`` cell's trace is shown; ``-o NAME`` stores the Trace."""
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
            error("%gpu load", f"give one trace file, e.g. %gpu load trace.json.gz\n{usage}")
            return
        if name is not None and not name.isidentifier():
            error("%gpu load", f"-o takes a Python name, not {name!r}\n{usage}")
            return
        path = os.path.abspath(os.path.expanduser(paths[0]))
        try:
            from ..trace.kineto import load_trace  # the reader and its decoder on first use (~30 ms)

            trace = load_trace(path)
        except GpuError as exc:
            error("%gpu load", exc)
            return
        table = trace.table()
        work = device_work(table)
        window = (int(table["start_ns"][work].min()), int(table["end_ns"][work].max())) if work.any() else (0, 0)
        summary = trace.summary() if work.any() else None
        wall_s = (window[1] - window[0]) / 1e9
        record = TraceRecord(RUNNING_CELL, time.time(), wall_s, window, None, None, None, trace, name, source=path)
        if summary is not None:
            record.take_figures(summary)
        keep(record)
        if name is not None:
            self.shell.user_ns[name] = trace
        devices = ", ".join(f"{c.key} {c.name}" for c in trace.devices.values()) or "no device"
        print(f"loaded {path}: {len(trace)} spans on {devices}")
        if summary is None:
            print("%gpu load: the trace holds no device work (copies, kernels), so there is nothing to show")
            return
        self._show(trace, summary, None)

    def _cupti(self, args: list[str]) -> None:
        """Where CUPTI stands, and what the hook before the last cell did to it; ``release`` lets it go first."""
        if args == ["release"]:
            released = cupti.let_go()
            why = "CUPTI is not attached, a trace records, or another tool holds it"
            print("CUPTI let go" if released else f"not let go: {why}")
        elif args:
            error("%gpu cupti", f"unknown argument {' '.join(args)!r}: %gpu cupti [release]")
            return
        print(f"CUPTI: {cupti.state()}")
        if cell_hooks.last_done is not None:
            done, ms = cell_hooks.last_done
            print(f"last done before a cell: {done}, in {ms:.1f} ms, outside the cell's own time")
        if cell_hooks.last_between is not None:
            done, ms = cell_hooks.last_between
            print(f"last done between cells, while the kernel was idle: {done}, in {ms:.1f} ms")

    # ------------------------------------------------------------------ %gpu bench
    def _bench(self, args: list[str]) -> None:
        """Run one benchmark on the current device: ``copy``, ``launch``, ``pipeline`` or ``crossover [OP ...]``."""
        if args and args[0] == "crossover":
            try:
                self.last_bench = self._bench_crossover(args[1:])
            except GpuError as exc:
                error("%gpu bench crossover", exc)
            return
        if len(args) != 1 or args[0] not in benches.BENCHES:
            error("%gpu bench", "choose one of: copy, launch, pipeline, crossover [OP ...]")
            return
        try:
            self.last_bench = benches.BENCHES[args[0]](self.current_device())
        except GpuError as exc:
            error(f"%gpu bench {args[0]}", exc)

    def _bench_crossover(self, args: Sequence[str]) -> dict[str, Any] | None:
        """``%gpu bench crossover [OP ...] [options]``: the options checked, then ``gw.crossover`` on the current
        device; None after a line saying what is wrong with the options."""
        ops: list[str] = []
        options: dict[str, Any] = {}
        words = iter(args)
        for word in words:
            name, _, value = word.partition("=")
            if name in ("--sizes", "--repeats", "--budget"):
                value = value or next(words, "")
                try:
                    if name == "--sizes":
                        options["sizes"] = [int(v) for v in value.split(",") if v]
                    elif name == "--repeats":
                        options["repeats"] = int(value)
                    else:
                        options["budget_s"] = float(value)
                except ValueError:
                    wrong = f"{name} takes a number (--sizes: numbers separated by commas), not {value!r}"
                    error("%gpu bench crossover", wrong)
                    return None
            elif name == "--refresh":
                options["refresh"] = True
            elif word.startswith("-"):
                error("%gpu bench crossover", f"unknown option {word}\n{LINE_USAGE}")
                return None
            else:
                ops.append(word)
        return benches.bench_crossover(ops, self.current_device(), options)

    # ------------------------------------------------------------------ %%gpu
    def _traced_cell(self, line: str, cell: str) -> Any:
        """Run ``cell`` inside a trace, record it in the history, show it, and return its last value."""
        __tracebackhide__ = True
        try:
            opts, rest = self.parse_options(line, "o:", "no-show", "no-lines", "counters", "device=")
        except UsageError as exc:
            error("%%gpu", f"{exc}\nusage: {CELL_USAGE}")
            return None
        name = opts.get("o")
        if rest.strip():
            error("%%gpu", f"unexpected {rest.strip()!r}\nusage: {CELL_USAGE}")
            return None
        if name is not None and not name.isidentifier():
            error("%%gpu", f"-o takes a Python name, not {name!r}\nusage: {CELL_USAGE}")
            return None
        saved_env = os.environ.get("GPUWB_DEVICE")
        if "device" in opts:
            dev = self._open(opts["device"])
            if dev is None:
                return None
            os.environ["GPUWB_DEVICE"] = dev.spec  # gw.Device() inside the cell gets it

        body, last = self._compile(cell)
        trace = new_trace(lines="no-lines" not in opts, counters="counters" in opts)
        if trace.lines is not None:  # each op is charged to the line of this cell that issued it
            trace.lines.set_focus(body.co_filename)
        namespace = self.shell.user_ns
        record = TraceRecord(RUNNING_CELL, time.time(), 0.0, (0, 0), None, None, None, trace, name)
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
            keep(record)
            if name is not None:
                namespace[name] = trace
        summary = self._summarise(record)
        if "no-show" not in opts:
            self._show(trace, summary, record.window_ns)
        if trace.counting:
            trace.counters()  # waits for the sampler's last sample, and the notes it adds
        for note in trace.stats.warnings:  # what the trace could not record, or where it took what it shows
            print(f"%%gpu note: {note}")
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
            error("%%gpu", "some ops the cell enqueued have not finished after 60 s; the trace misses them")
        table = trace.table(wait=False)
        work = device_work(table)
        if not work.any():
            return None
        start_ns, end_ns = record.window_ns
        record.window_ns = (start_ns, max(end_ns, int(table["end_ns"][work].max())))
        summary = trace.summary(window=record.window_ns)
        record.take_figures(summary)
        return summary

    def _show(self, trace: Trace, summary: Any, window: tuple[int, int] | None) -> None:
        """Timeline, memory and summary (``trace.show()``, over ``window``: None for the trace's own) in a notebook;
        the summary as text elsewhere."""
        if summary is None:
            print("%%gpu: the cell ran no device work (copies, kernels), so there is nothing to show")
            return
        if not in_notebook():
            print(summary)
            return
        try:
            from ..viz import show_trace  # Bokeh on first use

            shown = show_trace(trace, window, summary)  # the summary computed once, for the record and the picture
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
