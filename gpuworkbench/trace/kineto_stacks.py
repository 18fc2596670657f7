"""Source lines of a Kineto trace recorded with ``torch.profiler(with_stack=True)``: each CUDA runtime call's Python
stack, read from the trace's ``python_function`` events, and the user frame on it as a ``Location`` (``lines.py``).

The rules, in order:

1. **Stack.** Kineto records each Python call as a ``python_function`` event spanning it on its (pid, tid), so those
   events nest. A runtime call's stack is the chain of events of its own thread that enclose its start; the nesting
   is read from the intervals (each event's parent is the latest earlier one a level less deep), so files without
   ``Python parent id`` read the same. Where that stack has no user frame (PyTorch's autograd engine runs backward's
   launches on a thread without Python), the call takes the stack of another thread of the same process at that
   time, threads with the most frames around runtime calls first: the main thread, blocked in ``backward()``.
2. **User frame.** The location is the innermost user frame of that stack. Library frames: names that are no
   ``file(line): function`` (``<built-in ...>``, ``nn.Module: ...``, ``nn.Optimizer: ...``), ``<frozen ...>`` and
   ``<string>``, absolute paths under :data:`lines.LIBRARIES`, and relative paths (Kineto strips ``sys.path``
   entries) whose first component is gpuworkbench, a module of the standard library, a common library (torch,
   numpy, transformers ...: known by name, installed here or not) or a module that ``importlib`` finds under
   ``LIBRARIES`` (site-packages). Cells (``<ipython-input-...>``) and ipykernel's temporary files are user code.
3. **Line and text.** A frame's name carries the line its function starts on (a module frame shows 0), not the line
   being run. So a location takes file, line and function from the user frame's name, and ``text`` is the call that
   frame made: the next event down the stack ("nn.Module: Sequential_0"; "cross_entropy" from
   "torch/nn/functional.py(3421): cross_entropy"; "randn" from "<built-in method randn of type object at 0x...>").
   ``statistics().lines`` groups by file, line and text, so each call of a cell is a row of its own. The site fields
   are the location's own.
4. **Spans.** Device work gets the location of the runtime call that enqueued it (``kineto.py``, by correlation),
   and so does the call's ``api`` span. A trace without python_function events has no locations (``loc`` -1).

Only the runtime calls are given a stack: the python_function events become NumPy columns (times, an interned name
code, a thread code) and every step after that is vectorised (sorts, ``searchsorted`` and walks up the parents that
touch only the calls still unresolved, one pass per stack level).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from . import lines
from .kineto_events import distinct
from .lines import Location

#: A frame's event name: "file(line): function".
_FRAME = re.compile(r"(.*)\((\d+)\): (.*)", re.S)
_BUILTIN = re.compile(r"<built-in (?:method|function) ([^ >]+)[^>]*>", re.S)
#: File names that are never user code (as in lines.py): frozen modules, ``<string>`` from exec of generated code.
_NEVER = ("<frozen ", "<string>")
#: Top-level names counted as libraries whether or not they are installed where the trace is read.
KNOWN_LIBRARIES = frozenset(
    (
        "gpuworkbench torch torchvision torchaudio torchtext torchao torchrec functorch triton fbgemm_gpu torch_xla "
        "numpy scipy pandas sympy numba cupy jax jaxlib tensorflow keras transformers accelerate datasets tokenizers "
        "safetensors huggingface_hub diffusers peft timm einops xformers flash_attn bitsandbytes deepspeed apex "
        "megatron vllm lightning pytorch_lightning lightning_fabric tqdm IPython ipykernel dask distributed"
    ).split()
)


class Frames(NamedTuple):
    """A trace's python_function events as columns: start and end (ns, as in the file), ``name`` (codes into
    ``names``) and ``thread`` (a code per (pid, tid): ``pid << 32 | tid`` of codes of their values)."""

    start: np.ndarray
    end: np.ndarray
    name: np.ndarray
    names: Sequence[str]
    thread: np.ndarray


def stack_locations(
    python: Frames, rows: np.ndarray, row_threads: Mapping[int, int], starts: np.ndarray
) -> tuple[np.ndarray, list[Location]]:
    """The location code of each runtime call and the locations the codes index (-1 and none where the trace has no
    python_function events). A call is given by its host row (``rows``: any integer; ``row_threads`` holds each row's
    thread, coded as ``python.thread``; its pid is ``thread >> 32``) and its start (``starts``, ns as the file has
    it)."""
    n = len(rows)
    loc = np.full(n, -1, np.int32)
    if not python.start.size or not n:
        return loc, []
    starts = np.asarray(starts, np.int64)
    frames = _Frames(python, np.sort(starts))
    keys = {key: i for i, key in enumerate(frames.thread_keys)}  # threads with python events first, then the rest
    used, inverse = distinct(rows)
    row_code = np.array([keys.setdefault(row_threads[row], len(keys)) for row in used.tolist()], np.int64)
    call_thread = row_code[inverse]
    pid_of = np.array(list(keys), np.int64) >> 32
    frame, child = frames.user_frames(call_thread, starts)
    for other in frames.by_size:  # rule 1: calls with no user frame on their thread, on their process's others
        todo = np.flatnonzero(frame < 0)
        if not todo.size:
            break
        todo = todo[(call_thread[todo] != other) & (pid_of[call_thread[todo]] == pid_of[other])]
        if todo.size:
            frame[todo], child[todo] = frames.user_frames(np.full(todo.size, other), starts[todo])
    return frames.locations(frame, child, loc)


class _Frames:
    """The python_function events that enclose a runtime call (on any thread) as columns, sorted by thread, start and
    longest first, with each one's parent. The others are on no call's stack; an event's ancestors enclose what it
    encloses, so those kept nest as they did."""

    def __init__(self, python: Frames, calls: np.ndarray) -> None:
        start, end = python.start, python.end
        keep = np.searchsorted(calls, end, side="right") > np.searchsorted(calls, start, side="left")
        kept = np.flatnonzero(keep)
        start, end, thread_code = start[kept], end[kept], python.thread[kept]
        used_names, name_code = distinct(python.name[kept])
        seen_threads, first, thread = distinct(thread_code, first=True)
        appearance = np.argsort(first, kind="stable")  # thread codes in order of first appearance
        rank = np.empty(seen_threads.size, np.int64)
        rank[appearance] = np.arange(seen_threads.size)
        thread = rank[thread]
        order = np.lexsort((-end, start, thread))
        self.start, self.end, self.thread = start[order], end[order], thread[order]
        self.name_code = name_code[order]
        self.names = [python.names[c] for c in used_names.tolist()]
        verdicts: dict[str, bool] = {}
        self.user = np.array([is_user_frame(s, verdicts) for s in self.names], bool)[self.name_code]
        self.thread_keys = seen_threads[appearance].tolist()
        bounds = np.searchsorted(self.thread, np.arange(len(self.thread_keys) + 1))
        self.segments = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        parents = [_parents(self.start[a:b], self.end[a:b]) for a, b in self.segments]
        shifted = [np.where(p >= 0, p + a, -1) for p, (a, _) in zip(parents, self.segments)]
        self.parent = np.concatenate(shifted).astype(np.int64) if shifted else np.zeros(0, np.int64)
        self.by_size = np.argsort(-np.diff(bounds), kind="stable").tolist()

    def user_frames(self, thread: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For calls on ``thread`` (codes; those from ``len(segments)`` on have no python events) at times ``t``: the
        innermost enclosing user frame (-1: none) and the frame below it on the stack (the call it made; -1: none)."""
        c = np.full(t.size, -1, np.int64)
        for code in np.flatnonzero(np.bincount(thread[thread < len(self.segments)], minlength=1)).tolist():
            a, b = self.segments[code]
            at = np.flatnonzero(thread == code)
            c[at] = a + np.searchsorted(self.start[a:b], t[at], side="right") - 1
            c[at[c[at] < a]] = -1
        live = np.flatnonzero(c >= 0)  # climb out of the frames that ended before the call
        while live.size:
            out = live[self.end[c[live]] < t[live]]
            c[out] = self.parent[c[out]]
            live = out[c[out] >= 0]
        child = np.full(t.size, -1, np.int64)
        live = np.flatnonzero(c >= 0)  # climb to the innermost user frame
        while live.size:
            library = live[~self.user[c[live]]]
            child[library] = c[library]
            c[library] = self.parent[c[library]]
            live = library[c[library] >= 0]
        return c, np.where(c >= 0, child, -1)

    def locations(self, frame: np.ndarray, child: np.ndarray, loc: np.ndarray) -> tuple[np.ndarray, list[Location]]:
        """Location codes of the calls (``loc``, filled where ``frame`` >= 0) and the locations, one per distinct
        (user frame's name, call text)."""
        found = np.flatnonzero(frame >= 0)
        if not found.size:
            return loc, []
        width = len(self.names) + 1
        pair = self.name_code[frame[found]] * width + np.where(child[found] >= 0, self.name_code[child[found]] + 1, 0)
        pairs, inverse = distinct(pair)
        interned: dict[Location, int] = {}
        codes = np.empty(pairs.size, np.int32)
        for i, p in enumerate(pairs.tolist()):
            name, below = divmod(p, width)
            location = _location(self.names[name], call_text(self.names[below - 1]) if below else "")
            codes[i] = interned.setdefault(location, len(interned))
        loc[found] = codes[inverse]
        return loc, list(interned)


def _parents(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each event's parent (index; -1 for a root) among one thread's events sorted by start, longest first: the
    latest earlier event one level less deep, a level being the count of earlier events still open at its start (one
    that ends as it starts is a sibling, not its parent)."""
    n = start.size
    if not n:
        return np.zeros(0, np.int64)
    position = np.arange(n, dtype=np.int64)
    depth = position - np.searchsorted(np.sort(end), start, side="right")
    ordered = np.sort(depth * n + position)  # by level, then position
    at = np.searchsorted(ordered, ordered - n) - 1  # each one's (depth - 1) * n + position: sorted, a faster search
    found = ordered[np.maximum(at, 0)]
    level = ordered // n
    parent = np.empty(n, np.int64)
    parent[ordered % n] = np.where((level > 0) & (at >= 0) & (found // n == level - 1), found % n, -1)
    return parent


def _location(name: str, text: str) -> Location:
    match = _FRAME.fullmatch(name)
    file, line, function = (match.group(1), int(match.group(2)), match.group(3)) if match else (name, 0, "")
    return Location(file, line, function, file, line, function, text)


def call_text(name: str) -> str:
    """What a frame's event name says was called: the function of "file(line): function", the name of a built-in
    ("<built-in method randn of type object at 0x...>": "randn"), else the name itself ("nn.Module: Sequential_0")."""
    match = _FRAME.fullmatch(name)
    if match:
        return match.group(3)
    match = _BUILTIN.fullmatch(name)
    return match.group(1) if match else name


def is_user_frame(name: str, verdicts: dict[str, bool] | None = None) -> bool:
    """Whether a python_function event (by name) is a frame of user code (rule 2 of the module's docstring);
    ``verdicts`` caches the answer per top-level module name."""
    match = _FRAME.fullmatch(name)
    if match is None:
        return False
    file = match.group(1)
    if file.startswith(_NEVER):
        return False
    if file.startswith("<"):
        return True  # a cell, <stdin>
    if os.path.isabs(file):
        return not file.startswith(tuple(lines.LIBRARIES))
    first = file.replace("\\", "/").split("/", 1)[0]
    module = first[:-3] if first.endswith(".py") else first
    cache = {} if verdicts is None else verdicts
    verdict = cache.get(module)
    if verdict is None:
        verdict = cache[module] = not _is_library_module(module)
    return verdict


def _is_library_module(module: str) -> bool:
    if module in KNOWN_LIBRARIES or module in sys.stdlib_module_names:
        return True
    if not module.isidentifier():
        return False
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.has_location and spec.origin else list(spec.submodule_search_locations or ())
    return any(p.startswith(tuple(lines.LIBRARIES)) for p in places) or spec.origin in ("built-in", "frozen")
