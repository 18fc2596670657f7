"""A trace file read into ``EventGroups`` (``kineto_decode.py``) without holding the whole document: the
``traceEvents`` array is cut at event boundaries (``}, {``) into pieces of about 8 MiB (2 MiB in a mapped file's last
32 MiB: the helper's last pieces, which the load waits for, are short), and each piece is decoded by
msgspec into typed events, gathered into columns and let go. A plain file is mapped copy-on-write and each piece is a
view of the mapping (its "[" and "]" written over the separators around it: no copy of the bytes, no reading thread);
a gzip file (told by its magic bytes) comes in 8 MiB blocks gunzipped on a thread (reading and zlib release the GIL,
so the decompression overlaps the decoding). In a large file, a helper process reads the pieces it is free to take
while this one reads others (``kineto_helper.py``); pieces join in the file's order.

A cut is checked by the decode itself: a piece starts where the last one ended, so a cut inside a string or inside
an event leaves a piece that is no JSON array. Any such piece, a document laid out otherwise (traceEvents not in its
first 64 MiB, objects listed after the events), an event whose types don't fit (``NaN``, a name that is a number, a
float where an int belongs) is read whole by Python's json instead: slower, with the checks and messages of a whole
parse (empty, truncated JSON, not JSON, not gzip, no traceEvents list)."""

from __future__ import annotations

import json
import mmap
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import msgspec

from ..errors import InvalidArgument
from .kineto_decode import Collector, EventGroups, Piece, read_piece
from .kineto_helper import Helper, HelperLost, helper_kind
from .kineto_types import typed_events

BLOCK = 8 << 20
_HEAD_LIMIT = 64 << 20  # where traceEvents must start for the streaming read
_GZIP_MAGIC = b"\x1f\x8b"
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT = re.compile(rb"\}\s*,\s*\{")
_TEXT = re.compile(rb"\S")
_SPACE = b" \t\r\n"
_PIECE = 50_000  # events typed at a time on the slower path
#: What a file that is not gzip nor JSON is, by its first bytes.
_MAGIC = (
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (b"BZh", "bzip2-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x04\x22\x4d\x18", "LZ4-compressed data"),
    (b"PK\x03\x04", "a zip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
)


def read_events(where: str) -> tuple[dict[str, Any], EventGroups]:
    """The document's top-level keys (traceEvents left out; none for a bare array of events) and its events'
    groups. Raises ``InvalidArgument`` naming the file and what is wrong with it."""
    try:
        try:
            meta, collector = _stream(where, own=None, helped=helper_kind(where))
        except HelperLost as lost:
            if lost.slow:
                raise _Slow from None
            meta, collector = _stream(where, own=None, helped=None)
    except _Slow:
        meta, collector = _whole(where)
    return meta, collector.groups()


class _Slow(Exception):
    """The streaming read cannot read this document: read it whole."""


# ---------------------------------------------------------------------------------------------- the bytes


class _Blocks:
    """The file's bytes in blocks of up to ``BLOCK``, gunzipped where it starts with gzip's magic, read ahead on a
    thread (two blocks at most wait). Errors (no such file, truncated or corrupt gzip) arrive in order."""

    def __init__(self, where: str) -> None:
        self.where = where
        try:
            self._file = open(where, "rb")  # noqa: SIM115 (closed by close(), after the thread)
        except FileNotFoundError:
            raise InvalidArgument(f"cannot load trace {where}: no such file") from None
        except OSError as exc:
            raise InvalidArgument(f"cannot load trace {where}: {exc.strerror or exc}") from None
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuworkbench-load-trace", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self._file.close()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def _run(self) -> None:
        try:
            head = self._file.read(2)
            self._file.seek(0)
            for block in self._gunzip() if head == _GZIP_MAGIC else self._plain():
                if not self._put(block):
                    return
        except InvalidArgument as exc:
            self._put(exc)
        except OSError as exc:
            self._put(InvalidArgument(f"cannot load trace {self.where}: {exc.strerror or exc}"))
        self._put(None)

    def _plain(self) -> Iterator[bytes]:
        while block := self._file.read(BLOCK):
            yield block

    def _gunzip(self) -> Iterator[bytes]:
        """Every gzip member's data in turn (zero padding between or after members is skipped, as gzip does)."""
        unzip, pending = zlib.decompressobj(31), b""
        while data := pending or self._file.read(1 << 20):
            pending = b""
            if unzip.eof:  # between members
                data = data.lstrip(b"\x00")
                if len(data) == 1:
                    data += self._file.read(1)
                if not data:
                    continue
                if data[:2] != _GZIP_MAGIC:
                    raise InvalidArgument(f"cannot load trace {self.where}: corrupt gzip (data after its end)")
                unzip = zlib.decompressobj(31)
            while True:
                try:
                    out = unzip.decompress(data, BLOCK)
                except zlib.error as exc:
                    raise InvalidArgument(f"cannot load trace {self.where}: corrupt gzip ({exc})") from None
                if out:
                    yield out
                if unzip.eof:
                    pending = unzip.unused_data
                    break
                data = unzip.unconsumed_tail
                if not data and len(out) < BLOCK:
                    break
        if not unzip.eof:
            raise InvalidArgument(f"cannot load trace {self.where}: truncated gzip (the file ends mid-stream)")


# ---------------------------------------------------------------------------------------------- streaming


def _stream(where: str, own: bool | None, helped: str | None, flows: bool = False) -> tuple[dict[str, Any], Collector]:
    """Read the file block by block, every other piece by a helper process where ``helped`` says how to start one
    ("fork" or "spawn": ``kineto_helper.helper_kind``). ``own``: keep our exports' args, None: as its head says;
    ``flows``: keep the ``ac2g`` flows. Where the tail says otherwise, or device work or a runtime call lacks its
    correlation (a flow links it then), read it again with what was missing."""
    helper = Helper(helped) if helped else None  # started before the reading thread
    try:
        mapped = _mapped(where)
        if mapped is not None:
            try:
                meta, collector = _parse_mapped(mapped, where, own, flows, helper)
            finally:
                mapped.close()
        else:
            blocks = _Blocks(where)
            try:
                meta, collector = _parse(iter(blocks), where, own, flows, helper)
            finally:
                blocks.close()
    finally:
        if helper is not None:
            helper.close()
    own_export = isinstance(meta.get("gpuworkbench"), dict)
    wants_flows = collector.needs_flows and not collector.flows and not own_export
    if (own is None and collector.own != own_export) or wants_flows:
        return _stream(where, own_export, helped, flows or wants_flows)
    return meta, collector


def _parse(
    blocks: Iterator[bytes], where: str, own: bool | None, flows: bool, helper: Helper | None
) -> tuple[dict[str, Any], Collector]:
    buf, head = bytearray(), None
    for block in blocks:  # up to the "[" that opens the events
        buf += block
        head = _head(buf)
        if head is not None:
            break
        if len(buf) > _HEAD_LIMIT:
            raise _Slow
    if head is None:
        raise _Slow
    meta, start, bare = head
    collector = Collector(where, isinstance(meta.get("gpuworkbench"), dict) if own is None else own, flows)
    pieces = _Pieces(collector, helper)
    work = bytearray(b"[") + buf[start:]  # a JSON array of whole events up to each cut
    del buf
    while True:
        cut = _last_cut(work)
        if cut is not None:
            end, following = cut
            work[end] = ord("]")  # a comma or a space between two events
            with memoryview(work) as view, view[: end + 1] as array:
                pieces.read(array)
            work = bytearray(b"[") + work[following:]
        block = next(blocks, None)
        if block is None:
            break
        work += block
    meta.update(_end(work, 0, bare, pieces))
    return meta, collector


def _mapped(where: str) -> mmap.mmap | None:
    """A plain (not gzip) file mapped copy-on-write, so that pieces are cut out of it in place (no copy of the bytes,
    no reading thread); None where it is gzip, empty or cannot be mapped (``_Blocks`` reads it, and names what is
    wrong)."""
    try:
        with open(where, "rb") as f:
            if f.read(2) == _GZIP_MAGIC:
                return None
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None


def _parse_mapped(
    mm: mmap.mmap, where: str, own: bool | None, flows: bool, helper: Helper | None
) -> tuple[dict[str, Any], Collector]:
    """``_parse`` of a mapped file: each piece is a view of the mapping from the byte before its first event, made
    "[", to the separator after its last, made "]" (where events are separated by a bare comma, that byte is the
    next piece's "[" once this piece is read). Pages read are handed back as it goes, so that the file counts in
    the peak RSS about one piece at a time."""
    with memoryview(mm) as view:
        with view[:_HEAD_LIMIT] as opening:
            head = _head(opening)
        if head is None:
            raise _Slow
        meta, start, bare = head
        collector = Collector(where, isinstance(meta.get("gpuworkbench"), dict) if own is None else own, flows)
        pieces = _Pieces(collector, helper)
        first, released = start - 1, 0  # the array's "[", then each piece's
        while (cut := _next_cut(mm, first)) is not None:
            end = cut.start() + 1
            mm[end] = ord("]")
            with view[first : end + 1] as array:
                pieces.read(array)
            first = cut.end() - 2
            mm[first] = ord("[")
            released = _release(mm, released, first)
    meta.update(_end(mm, first, bare, pieces))
    return meta, collector


def _next_cut(mm: mmap.mmap, first: int) -> re.Match[bytes] | None:
    """The cut that ends the piece from ``first``: the first one ``BLOCK`` on, a quarter of that in the file's last
    ``4 * BLOCK`` bytes, so that the pieces the load waits for at its end (the helper's last) are short; None: the
    rest is the last piece."""
    step = BLOCK if len(mm) - first > 4 * BLOCK else BLOCK // 4
    return _CUT.search(mm, first + step) if first + step < len(mm) else None


def _release(mm: mmap.mmap, released: int, upto: int) -> int:
    """Drop the mapping's pages before ``upto`` (from ``released`` on) from this process's memory."""
    aligned = upto - upto % mmap.PAGESIZE
    if aligned - released < BLOCK or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return released
    mm.madvise(mmap.MADV_DONTNEED, released, aligned - released)
    return aligned


class _Pieces:
    """Reads pieces (JSON arrays of events) into the collector in the file's order: each one itself, or, with a
    helper, those it is free to take there while it reads others here (held until the helper's earlier ones are
    back)."""

    def __init__(self, collector: Collector, helper: Helper | None) -> None:
        self.collector, self.helper = collector, helper
        self._waiting: list[Piece | None] = []  # in file order; None: the helper's next one

    def read(self, array: memoryview) -> None:
        self._take(wait=False)
        own, flows = self.collector.own, self.collector.flows
        if self.helper is not None and self.helper.send(array, own, flows):
            self._waiting.append(None)
            return
        self.add(self.decode(array))

    def decode(self, array: memoryview) -> Piece:
        """The piece's events read into columns; raises ``_Slow`` where it does not decode."""
        try:
            events = self.collector.decoder.decode(array)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise _Slow from None
        return read_piece(events, self.collector.own, self.collector.flows)

    def add(self, piece: Piece) -> None:
        """Add ``piece`` after those before it in the file."""
        self._waiting.append(piece)
        self._take(wait=False)

    def finish(self) -> None:
        """Wait for the helper's pieces and add all."""
        self._take(wait=True)

    def _take(self, wait: bool) -> None:
        while self._waiting:
            if self._waiting[0] is None:
                if not wait and not self.helper.ready():  # type: ignore[union-attr]
                    return
                self._waiting[0] = self.helper.receive()  # type: ignore[union-attr]
            self.collector.add(self._waiting.pop(0))  # type: ignore[arg-type]


def _head(buf: bytearray) -> tuple[dict[str, Any], int, bool] | None:
    """(the keys before traceEvents, where its first event may start, whether the document is a bare array), or
    None when more bytes are needed."""
    text = _TEXT.search(buf)
    if text is None:
        return None
    if buf[text.start()] == ord("["):
        return {}, text.start() + 1, True
    if buf[text.start()] != ord("{"):
        raise _Slow
    found = _KEY.search(buf)
    if found is None:
        return None
    try:
        meta = msgspec.json.decode(bytes(buf[: found.start()]) + b'"traceEvents": []}')
    except msgspec.DecodeError:
        raise _Slow from None
    if not isinstance(meta, dict):
        raise _Slow
    meta.pop("traceEvents", None)
    return meta, found.end(), False


def _last_cut(buf: bytearray) -> tuple[int, int] | None:
    """(just past the last whole event, start of the next) at the last ``}, {`` of ``buf``: searched in its last
    64 KiB first, the whole of it where that has none."""
    for lo in (max(0, len(buf) - (1 << 16)), 0):
        last = None
        for last in _CUT.finditer(buf, lo):  # noqa: B007 (the last match is wanted)
            pass
        if last is not None:
            return last.start() + 1, last.end() - 1
        if lo == 0:
            break
    return None


def _end(work: bytearray | mmap.mmap, first: int, bare: bool, pieces: _Pieces) -> dict[str, Any]:
    """The last event (``work`` from ``first`` is "[" and it, or "[" and the "]" of an empty array, then the rest of
    the file) and the keys after the array: the "]" that closes it is the last one after which both read."""
    at = len(work)
    while (at := work.rfind(b"]", first + 1, at)) >= first + 1:
        rest = _after(bytes(work[at + 1 :]).strip(_SPACE), bare)
        if rest is None:
            continue
        try:
            with memoryview(work) as view, view[first : at + 1] as array:
                events = pieces.collector.decoder.decode(array)
        except msgspec.ValidationError:
            raise _Slow from None
        except msgspec.DecodeError:
            continue
        pieces.add(read_piece(events, pieces.collector.own, pieces.collector.flows))
        pieces.finish()
        return rest
    raise _Slow


def _after(tail: bytes, bare: bool) -> dict[str, Any] | None:
    """The keys after the events array (``tail``: what follows its ``]``), or None where they don't read."""
    if bare:
        return {} if not tail else None
    if tail == b"}":
        return {}
    if tail[:1] != b",":
        return None
    try:
        rest = msgspec.json.decode(b"{" + tail[1:])
    except msgspec.DecodeError:
        return None
    return rest if isinstance(rest, dict) else None


# ---------------------------------------------------------------------------------------------- whole


def _whole(where: str) -> tuple[dict[str, Any], Collector]:
    """The document parsed whole by Python's json, its events typed ``_PIECE`` at a time."""
    blocks = _Blocks(where)
    try:
        raw = b"".join(blocks)
    finally:
        blocks.close()
    doc = _parse_json(raw, where)
    del raw
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InvalidArgument(f"cannot load trace {where}: it has no traceEvents list (not a Chrome / Kineto trace)")
    meta = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    collector = Collector(where, isinstance(meta.get("gpuworkbench"), dict))
    for first in range(0, len(events), _PIECE):
        collector.read(typed_events(events[first : first + _PIECE], first, where))
    return meta, collector


def _parse_json(raw: bytes, where: str) -> Any:
    if not raw or raw.isspace():  # no stripped copy of a large file on the way to the parse
        raise InvalidArgument(f"cannot load trace {where}: the file is empty")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        if isinstance(exc, json.JSONDecodeError) and _cut_short(raw.strip(), exc):
            what = f"truncated JSON (it ends at byte {len(raw)} inside a value)"
        else:
            what = f"not JSON ({exc})"
        raise InvalidArgument(f"cannot load trace {where}: {_not_gzip(raw, where, what)}") from None


def _not_gzip(raw: bytes, where: str, what: str) -> str:
    """What a file that does not parse is: named by its magic bytes where they are known; one named ``.gz`` is said
    to be no gzip (its first bytes are not gzip's), not a truncated one."""
    if raw[:2] == _GZIP_MAGIC:
        return f"gzip-compressed {what}"
    for magic, kind in _MAGIC:
        if raw.startswith(magic):
            return f"{kind}, not gzip nor JSON (decompress it, or compress it with gzip)"
    if where.endswith(".gz"):
        return f"not gzip (its first bytes, {raw[:4].hex(' ')}, are not gzip's magic 1f 8b) and {what}"
    return what


def _cut_short(text: bytes, exc: json.JSONDecodeError) -> bool:
    """Whether a document that failed to parse is a prefix of one: it ends inside a string, fails at its last bytes,
    or opens an object or array that it never closes (a whole trace ends with ``}`` or ``]``)."""
    if exc.msg.startswith("Unterminated string") or exc.pos >= len(text):
        return True
    return text[:1] in (b"{", b"[") and text[-1:] not in (b"}", b"]")
