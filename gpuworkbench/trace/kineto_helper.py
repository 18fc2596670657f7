"""A helper process that reads every other piece of a large trace file for ``kineto_read.py``: msgspec's decode and
the gathering into columns hold the GIL, so where two cores are free a child process decodes one piece while the
loading process decodes the next, and the load takes a little over half the time.

The child gets each piece through shared memory and sends back its ``Piece`` (pickled columns); it touches nothing
else of the parent's (no CUDA, no files, no output). Where the loading process runs no other thread and has no CUDA
library loaded (a script), the child is forked before the reading thread starts, and leaves with ``os._exit``.
Elsewhere (a notebook kernel runs threads; CUDA does not follow a fork) it is a fresh interpreter (``spawn``) that
imports only the decoder's modules (``_BOOT``: not the package, whose import takes longer than a piece's decode),
while the loading process reads the first pieces alone. Used on Linux only, with two usable cores or more, and for
files of ``MIN_BYTES`` of JSON or more.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings

import msgspec

from .kineto_decode import Piece, read_piece
from .kineto_types import decoder

#: The largest piece a helper reads (larger ones, a single huge event, are read by the loading process); it holds
#: ``SLOTS`` pieces at a time, so that it has the next one to read as it sends one back.
SLOT = 32 << 20
SLOTS = 2
#: Files smaller than this (in JSON; a gzip file counts as ``_GZIP_RATIO`` times its size) are read without help;
#: a spawned helper, which starts a Python and imports the decoder first (0.2 s), only from ``SPAWN_MIN_BYTES`` (on
#: the 2-core dev box it lost 3 % on a 39 MB file and gained 1.3 x on 80 MB: ``benchmarks/probes/load_modes.py``).
MIN_BYTES = 32 << 20
SPAWN_MIN_BYTES = 64 << 20
_GZIP_RATIO = 8
_HEADER = struct.Struct("<qqB")  # a piece's slot, its length (-1: stop) and flags (own, flows)
_LENGTH = struct.Struct("<q")


class HelperLost(Exception):
    """The helper failed or went away (the load is done again without it), or found a piece that does not decode
    (``slow``: the slower path reads the file)."""

    def __init__(self, why: str, slow: bool = False) -> None:
        super().__init__(why)
        self.slow = slow


#: Modules whose presence means the process may hold a CUDA context, which a forked child must not inherit.
CUDA_MODULES = ("cupy", "torch", "numba.cuda", "cuda.core", "cuda.bindings", "pycuda", "jax", "cupti")


def helper_kind(where: str) -> str | None:
    """How a helper process would start to shorten the load of ``where``: "fork" where no other Python thread runs
    (a thread holding a lock at the fork would leave it held in the child: a notebook kernel runs several, and a
    trace's harvester one) and no CUDA library is loaded (CUDA does not follow a fork), else "spawn"; None where
    none would help (not Linux, one usable core, a small file; for a spawned one, a file under ``SPAWN_MIN_BYTES``)."""
    if sys.platform != "linux" or not hasattr(os, "memfd_create"):
        return None
    try:
        cores = len(os.sched_getaffinity(0))
        size = os.path.getsize(where)
        with open(where, "rb") as f:
            gzip = f.read(2) == b"\x1f\x8b"
    except OSError:
        return None
    json_bytes = size * (_GZIP_RATIO if gzip else 1)
    if cores < 2 or json_bytes < MIN_BYTES:
        return None
    if threading.active_count() > 1 or any(name in sys.modules for name in CUDA_MODULES):
        return "spawn" if json_bytes >= SPAWN_MIN_BYTES else None
    return "fork"


#: The spawned child's program: the package and its ``trace`` folder as bare packages (their ``__init__`` not run),
#: then the loop. argv: the socket's and the shared memory's descriptors, the package's folder.
_BOOT = """
import signal, socket, sys, types, mmap
signal.signal(signal.SIGINT, signal.SIG_IGN)
conn_fd, shared_fd, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for name, path in (("gpuworkbench", root), ("gpuworkbench.trace", root + "/trace")):
    package = types.ModuleType(name)
    package.__path__ = [path]
    sys.modules[name] = package
from gpuworkbench.trace.kineto_helper import SLOT, SLOTS, serve
serve(socket.socket(fileno=conn_fd), mmap.mmap(shared_fd, SLOT * SLOTS))
"""


class Helper:
    """The child (``kind``: "fork" or "spawn", as ``helper_kind`` says) and the loading process's end of it: ``send``
    a piece (False where it is too large or ``SLOTS`` are out), ``receive`` the ``Piece`` of the oldest one out
    (``out``: how many), ``ready``: whether it has arrived, ``close``."""

    def __init__(self, kind: str = "fork") -> None:
        ours, theirs = socket.socketpair()
        self._process: subprocess.Popen | None = None
        if kind == "spawn":
            try:
                shared_fd = os.memfd_create("gpuworkbench-trace-pieces")
                try:
                    os.ftruncate(shared_fd, SLOT * SLOTS)
                    self._shared = mmap.mmap(shared_fd, SLOT * SLOTS)
                    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                    self._process = subprocess.Popen(
                        [sys.executable, "-c", _BOOT, str(theirs.fileno()), str(shared_fd), root],
                        pass_fds=(theirs.fileno(), shared_fd),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,  # a child that fails is lost (HelperLost): the load goes on alone
                    )
                finally:
                    os.close(shared_fd)
                    theirs.close()
            except OSError as exc:  # no interpreter to start (an embedded Python), no memory: the load goes on alone
                ours.close()
                raise HelperLost(f"cannot start a helper process: {exc}") from None
            self.pid, self._conn = self._process.pid, ours
            self._slots: list[int] = []  # the slots of the pieces out, oldest first
            return
        self._shared = mmap.mmap(-1, SLOT * SLOTS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+ warns of fork with threads running
            pid = os.fork()
        if pid == 0:  # the child
            ours.close()
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
                serve(theirs, self._shared)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self._conn = pid, ours
        self._slots = []

    @property
    def out(self) -> int:
        return len(self._slots)

    def send(self, piece: memoryview, own: bool, flows: bool) -> bool:
        n = len(piece)
        if n > SLOT or self.out >= SLOTS:
            return False
        slot = next(s for s in range(SLOTS) if s not in self._slots)
        self._shared[slot * SLOT : slot * SLOT + n] = piece
        try:
            self._conn.sendall(_HEADER.pack(slot, n, own | flows << 1))
        except OSError as exc:
            raise HelperLost(str(exc)) from None
        self._slots.append(slot)
        return True

    def ready(self) -> bool:
        """Whether the oldest piece out has come back (without waiting)."""
        return bool(self._slots) and bool(select.select([self._conn], [], [], 0)[0])

    def receive(self) -> Piece:
        try:
            (n,) = _LENGTH.unpack(_receive(self._conn, _LENGTH.size))
            kind, value = pickle.loads(_receive(self._conn, n))
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise HelperLost(str(exc) or type(exc).__name__) from None
        self._slots.pop(0)
        if kind != "piece":
            raise HelperLost(kind if value is None else f"{kind}: {value}", slow=kind == "slow")
        return value

    def close(self) -> None:
        """Stop the child (a piece it still reads is dropped: its end of the socket fails) and reap it."""
        try:
            self._conn.sendall(_HEADER.pack(0, -1, 0))
            self._conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()
        if self._process is not None:
            try:
                self._process.wait(2.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._shared.close()
            return
        deadline = time.monotonic() + 2.0
        try:
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.001)
        except ChildProcessError:  # reaped already (SIGCHLD ignored)
            pass
        self._shared.close()


def _receive(conn: socket.socket, n: int) -> bytes:
    data = bytearray(n)
    with memoryview(data) as view:
        got = 0
        while got < n:
            k = conn.recv_into(view[got:])
            if not k:
                raise EOFError("the helper process closed its end")
            got += k
    return bytes(data) if n < 4096 else data  # type: ignore[return-value]


def serve(conn: socket.socket, shared: mmap.mmap) -> None:
    """The child's loop: read the piece in ``shared`` that each header names, send back its ``Piece``."""
    while True:
        try:
            slot, n, flags = _HEADER.unpack(_receive(conn, _HEADER.size))
        except EOFError:
            return
        if n < 0:
            return
        own, flows = bool(flags & 1), bool(flags & 2)
        try:
            with memoryview(shared) as view, view[slot * SLOT : slot * SLOT + n] as piece:
                events = decoder(flows, own).decode(piece)
            result: tuple = ("piece", read_piece(events, own, flows))
            del events
        except (msgspec.DecodeError, msgspec.ValidationError):
            result = ("slow", None)
        except Exception as exc:  # sent back: the parent reads the file again without the helper
            result = ("error", repr(exc))
        data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        conn.sendall(_LENGTH.pack(len(data)))
        conn.sendall(data)
