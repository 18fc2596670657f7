"""Which line of the user's code issued an op: the nearest frame outside libraries, found by walking the stack.

A trace that attributes (``gw.trace(lines=True)``, on in ``%%gpu``) asks ``SourceLines.here()`` as each op is
enqueued, and CUPTI's callbacks ask the same for every other library's launches and copies (``cupti/sites.py``).
A location is two frames: the *site*, the innermost frame in user code, and the *line*, the frame in the traced cell
(``focus``) when the stack passes through it, else the site. So a function defined in an earlier cell and called from
this one is charged to the calling line, with its own line kept as the site. Locations are interned: a span carries
a small integer (the ``loc`` column), an index into the trace's ``locations``.

Which frames count as library code is settable: :data:`LIBRARIES` holds path prefixes (site-packages, the standard
library, gpuworkbench itself) and ``treat_as_library`` adds modules or folders.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Any

from ..errors import InvalidArgument

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the gpuworkbench package


def _default_libraries() -> list[str]:
    """gpuworkbench, the standard library and every site-packages folder, as path prefixes."""
    paths = {_HERE + os.sep}
    found = sysconfig.get_paths()  # worked out on each call: once, at import
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if found.get(key):
            paths.add(os.path.join(found[key], ""))
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            paths.add(os.path.join(entry, ""))
    return sorted(paths)


#: Path prefixes whose frames are library code: never a location. ``treat_as_library`` adds to it.
LIBRARIES: list[str] = _default_libraries()
#: File names (not paths) that are never user code: frozen modules, ``<string>`` from exec of generated code.
_NEVER = ("<frozen ", "<string>")
_VERSION = [0]  # bumped by ``treat_as_library``: cached verdicts are dropped


def treat_as_library(*names: str) -> list[str]:
    """Count frames in these modules (imported names, e.g. ``"mymodels"``) or folders as library code, so that work
    they issue is charged to the user's line that called them; returns the prefixes now in :data:`LIBRARIES`."""
    for name in names:
        path = name
        if os.path.sep not in name and not os.path.exists(name):
            module = sys.modules.get(name)
            file = getattr(module, "__file__", None)
            if file is None:
                raise InvalidArgument(f"treat_as_library: {name!r} is neither a folder nor an imported module")
            path = os.path.dirname(file) if os.path.basename(file) == "__init__.py" else file
        path = os.path.abspath(path)
        LIBRARIES.append(path + os.sep if os.path.isdir(path) else path)
    _VERSION[0] += 1
    return list(LIBRARIES)


@dataclass(frozen=True)
class Location:
    """Where an op came from: ``file:line`` in ``function`` (the traced cell's line where the stack passed through
    it), and the innermost user frame (``site_*``; the same where the op was issued on that line itself)."""

    file: str
    line: int
    function: str
    site_file: str = ""
    site_line: int = 0
    site_function: str = ""
    #: What to show for the line where its text cannot be read (a trace loaded from a file: the call it made).
    text: str = ""

    @property
    def source(self) -> str:
        """``text`` where it is set (a loaded trace), else the line's text as ``linecache`` has it ("" when gone)."""
        return self.text or linecache.getline(self.file, self.line).strip()

    @property
    def nested(self) -> bool:
        """Whether the op was issued inside a function the line called (the site is another line)."""
        return bool(self.site_file) and (self.site_file, self.site_line) != (self.file, self.line)

    def __str__(self) -> str:
        text = f"{short_file(self.file)}:{self.line}"
        if self.nested:
            text += f" (via {self.site_function} at {short_file(self.site_file)}:{self.site_line})"
        return text


def short_file(file: str) -> str:
    """A file's name as a reader wants it: a cell's as IPython names it in tracebacks ("In[7]"), or the path's last
    two parts."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None:
        try:
            named = shell.compile.format_code_name(file)
        except AttributeError:  # an IPython without it (before 8): the file's own name
            named = None
        if named:
            return named[1]
    if file.startswith("<"):
        return file
    parts = file.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


class SourceLines:
    """One trace's locations (interned) and the cache of which code objects are library code."""

    def __init__(self, focus: tuple[str, ...] = ()) -> None:
        self.focus = frozenset(focus)  # file names of the traced cell(s)
        self.locations: list[Location] = []
        self._index: dict[tuple, int] = {}  # a location's fields -> its code
        self._at: dict[tuple[int, int, int, int], int] = {}  # (id(code), offset) of the line and site -> code
        self._codes: list[Any] = []
        #: id(code object) -> (library code?, the code object, held so that its id is not reused). By id: hashing a
        #: code object hashes its bytecode and constants (µs for a large function), on the path of every op.
        self._library: dict[int, tuple[bool, Any]] = {}
        self._version = _VERSION[0]
        self._lock = threading.RLock()  # re-entered where a finalizer runs user code inside it (a watch then logs)
        #: The thread that started the trace: work on a thread without user frames (PyTorch's autograd engine) is
        #: charged to the line this thread is on.
        self.home = threading.get_ident()
        #: Where each thread's user code is now (thread id -> location code), kept by a ``call_watch.CallWatch``
        #: while ``watched``: an op then reads it instead of walking the stack.
        self.current: dict[int, int] = {}
        self.watched = False
        self.by_line: dict[tuple[int, int], int] = {}  # (id(code), line) of a frame in focus -> location code

    @classmethod
    def holding(cls, locations: list[Location]) -> SourceLines:
        """A table of these locations, in order (a trace read from a file)."""
        lines = cls()
        for location in locations:
            lines.add(location)
        return lines

    def set_focus(self, *files: str) -> None:
        """Charge work to the lines of these files (a cell's compiled name) where the stack passes through them."""
        self.focus = frozenset(files)
        self.by_line.clear()  # lines of the focus before: no longer their own place

    def focus_on_caller(self) -> None:
        """Focus on the file of the nearest user frame of the caller's stack (the cell that starts a trace)."""
        frame = sys._getframe(1)  # noqa: SLF001
        while frame is not None and self._is_library(frame.f_code):
            frame = frame.f_back
        if frame is not None:
            self.focus = frozenset({frame.f_code.co_filename})

    def is_library(self, code: Any) -> bool:
        """Whether frames of ``code`` are library code (under :data:`LIBRARIES`, frozen or generated)."""
        known = self._library.get(id(code))
        return self._is_library(code) if known is None else known[0]

    def _is_library(self, code: Any) -> bool:
        if self._version != _VERSION[0]:
            self._library.clear()
            self._version = _VERSION[0]
        file = code.co_filename
        verdict = file.startswith(_NEVER) or file.startswith(tuple(LIBRARIES))
        self._library[id(code)] = (verdict, code)
        return verdict

    def at(self, frame: FrameType | None) -> int:
        """The location code of the stack from ``frame`` outwards (-1: no user frame in it)."""
        library = self._library
        site = None
        while frame is not None:
            code = frame.f_code
            known = library.get(id(code))
            if not (self._is_library(code) if known is None else known[0]):
                site = frame
                break
            frame = frame.f_back
        if site is None:
            return -1
        line = site
        focus = self.focus
        if focus and site.f_code.co_filename not in focus:
            outer = site.f_back
            while outer is not None:
                if outer.f_code.co_filename in focus:
                    line = outer
                    break
                outer = outer.f_back
        # By instruction offset first: a frame's line number is worked out from its code's line table on each read.
        fast = (id(line.f_code), line.f_lasti, id(site.f_code), site.f_lasti)
        loc = self._at.get(fast)
        if loc is None:
            loc = self._at[fast] = self._intern(line, site)
        return loc

    def _intern(self, line: FrameType, site: FrameType) -> int:
        key = (line.f_code.co_filename, line.f_lineno, line.f_code.co_name, site.f_code.co_filename, site.f_lineno,
               site.f_code.co_name)  # fmt: skip
        with self._lock:
            loc = self._index.get(key)
            if loc is None:
                self._codes += (line.f_code, site.f_code)  # their ids key ``_at``: held, so that none is reused
                self.locations.append(Location(*key))
                loc = self._index[key] = len(self.locations) - 1
        return loc

    def in_focus(self, code: Any, line: int) -> int:
        """The location code of line ``line`` of ``code``, a frame of the focus (its own site): no walk."""
        loc = self.by_line.get((id(code), line))
        if loc is None:
            key = (code.co_filename, line, code.co_name, code.co_filename, line, code.co_name)
            with self._lock:
                loc = self._index.get(key)
                if loc is None:
                    self._codes.append(code)  # its id keys ``by_line``: held, so that it is not reused
                    self.locations.append(Location(*key))
                    loc = self._index[key] = len(self.locations) - 1
            self.by_line[(id(code), line)] = loc
        return loc

    def here(self, skip: int = 1) -> int:
        """The location code of the caller's stack (``skip`` frames above this one), or of the home thread's where
        this thread has no user frame; where a watch keeps each thread's place, that place."""
        if self.watched:
            loc = self.current.get(threading.get_ident(), -1)
            if loc >= 0:
                return loc
        loc = self.at(sys._getframe(skip))  # noqa: SLF001 - the one cheap way to the caller's frame
        if loc < 0 and threading.get_ident() != self.home:
            loc = self.at(sys._current_frames().get(self.home))  # noqa: SLF001
        return loc

    def add(self, location: Location) -> int:
        """Intern a location read from elsewhere (a Kineto file, another trace); its code."""
        key = (location,)
        with self._lock:
            loc = self._index.get(key)
            if loc is None:
                self.locations.append(location)
                loc = self._index[key] = len(self.locations) - 1
        return loc


def remap(codes: Any, locations: list[Location], into: SourceLines) -> Any:
    """``codes`` (a loc column of a trace whose table is ``locations``) as codes of ``into`` (merging traces)."""
    import numpy as np

    codes = np.asarray(codes)
    if not locations:
        return np.full(codes.shape, -1, np.int32)
    lookup = np.array([into.add(loc) for loc in locations], np.int32)
    return np.where(codes >= 0, lookup[np.clip(codes, 0, None)], -1).astype(np.int32)
