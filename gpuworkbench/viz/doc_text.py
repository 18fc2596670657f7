"""A Bokeh document's JSON text written straight from its models, as Bokeh's serializer would write it, each model's
text kept for the next time the same model is shown (the kept layouts of ``reuse.py``).

A layout shown again has new data, ranges and titles, but most of its ~200 models (axes, tools, grids, glyphs) are
as they were: their text, whole subtree included, is reused as it stands, and only models whose properties were
given new values (or that hold a data source) are written again. Ids in kept text are a placeholder (``TOKEN``) and a
number per model; each document replaces the placeholder with a fresh prefix, so that two outputs never share an id.
Data columns go as Bokeh's inline buffers, small ones stored rather than compressed (gzip level 0: cheaper to make
than to send), and repeated strings as codes (``CODED``) that ``notebook_doc.EXPAND_JS`` expands in the browser.
"""

from __future__ import annotations

import base64
import gzip
import os
import sys
import weakref
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

import numpy as np
from bokeh.core.json_encoder import PayloadEncoder
from bokeh.core.property.container import ColumnData
from bokeh.core.property.wrappers import PropertyValueContainer
from bokeh.core.serialization import Serializer
from bokeh.model import Model
from bokeh.settings import settings
from bokeh.util.serialization import array_encoding_disabled, transform_array

#: A column of strings sent as codes: {"type": CODED, "codes": base64 of unsigned ints of ``width`` bytes each
#: (native order), "width": 1|2|4, "strings": [...], "order"}.
CODED = "gpuworkbench_strings"
#: Columns of strings shorter than this are sent as they are.
CODE_MIN = 32
#: Buffers smaller than this (bytes) are stored in their gzip stream, not compressed.
STORE_BELOW = 64 * 1024
#: Stands for a document's id prefix in kept text (hex: nothing in it needs escaping in JSON).
TOKEN = f"gwid{os.urandom(6).hex()}-"
_MARK = f"gwslot{os.urandom(6).hex()}"  # a model's place in the text of a value holding models
_SPLIT = f'"{_MARK}"'
_HOLE = f"gwdata{os.urandom(6).hex()}"  # around the number of a source's data in a document's text (``fill``)
_ORDER = sys.byteorder
#: What ``serialize_json`` writes (compact, no key sorting), without its settings look-ups per call.
JSON = PayloadEncoder(separators=(",", ":"))
_DTYPE_NAMES: dict[np.dtype, str] = {}


@dataclass(eq=False)
class _Tpl:
    """The text of a value holding models: ``pieces`` around the models' places (``slots``, in text order); ``items``
    are the value's own items then, so that a list or dict changed in place is not mistaken for the same value."""

    pieces: list[str]
    slots: list[Model]
    items: tuple[Any, ...]


@dataclass(eq=False)
class Entry:
    """A model as last written: its id (``TOKEN`` and a number), the properties set then (Bokeh's order),
    their values (as the model stores them), each one's text (``"key":value``; a ``_Tpl`` for a value holding models;
    None for a data source's columns, written every time), and the whole subtree's text where it holds no data."""

    id: str
    ref: str
    head: str
    selected: frozenset[str] | None = None
    keys: tuple[str, ...] = ()
    values: list[Any] | None = None
    texts: list[Any] | None = None
    has_data: bool = False
    subtree: str | None = None
    children: list[str] | None = None
    #: Whether the model, or one written inside its text, was given a new value since the text was written (set by
    #: ``_Watched``; a new entry is unwritten); ``parent``: the entry whose text holds this one's whole.
    dirty: bool = True
    parent: Entry | None = None
    #: The models written whole in the subtree's text (itself first), and those it refers to that it does not hold.
    members: list[Model] = field(default_factory=list)
    refs: set[Model] = field(default_factory=set)


class TextEncoder:
    """Writes models as JSON text, keeping each model's ``Entry`` in ``cache`` (model -> entry) for the next document
    of the same models; ``coded``: columns of repeated strings as ``CODED`` (``self.coded_columns`` counts them)."""

    def __init__(self, cache: dict[Model, Entry] | None = None, coded: bool = False) -> None:
        self.watch = cache is not None  # a kept cache: its models say when they are given new values
        self.cache = cache if cache is not None else {}
        self.coded = coded
        self.coded_columns = 0
        self.seen: set[Model] = set()
        self.order: list[Model] = []  # models written whole, in document order
        self.refs: list[Model] = []  # models written as references, in document order
        self.parents: list[Entry] = []
        self.holes: list[str] = []  # the sources' data texts, in the document's text as places (``fill``)
        self.level = settings.compression_level()

    def model(self, model: Model) -> tuple[str, bool]:
        """(the model's text here: whole the first time this document meets it, else a reference, its sources' data
        as places that ``fill`` fills; whether that text holds data written this time)."""
        seen = self.seen
        entry = self.cache.get(model)
        if entry is None:
            at = f"{TOKEN}{len(self.cache) + 1}"  # entries are never removed: numbers stay unique within a cache
            head = f'{{"type":"object","name":"{model.__qualified_model__}","id":"{at}"'
            entry = self.cache[model] = Entry(at, f'{{"id":"{at}"}}', head)
            if self.watch:
                _Watched.watch(model, entry)
        elif model in seen:
            self.refs.append(model)
            return entry.ref, False
        elif (
            not entry.dirty
            and entry.subtree is not None
            and seen.isdisjoint(entry.members)
            and seen.issuperset(entry.refs)
        ):  # nothing in it was given a new value, and what it holds and refers to stands as when it was written
            seen.update(entry.members)
            self.order.extend(entry.members)
            self.refs.extend(entry.refs)
            return entry.subtree, False
        seen.add(model)
        first, first_ref = len(self.order), len(self.refs)
        self.order.append(model)
        same = self._refresh(model, entry)
        children: list[str] = []
        volatile = entry.has_data
        self.parents.append(entry)
        for text in entry.texts:
            if type(text) is _Tpl:
                for slot in text.slots:
                    child, changing = self.model(slot)
                    children.append(child)
                    volatile |= changing
        self.parents.pop()
        entry.parent = self.parents[-1] if self.parents else None
        entry.members = self.order[first:]
        entry.refs = set(self.refs[first_ref:]).difference(entry.members)
        entry.dirty = not self.watch
        if same and not volatile and entry.subtree is not None and _same_texts(children, entry.children):
            return entry.subtree, False
        out = self._compose(model, entry, children)
        entry.subtree, entry.children = (None, None) if volatile else (out, children)
        return out, volatile

    def _refresh(self, model: Model, entry: Entry) -> bool:
        """Bring the entry's property texts up to date; True where none changed (and no data source is written)."""
        values = model._property_values  # other library: Bokeh's store of explicitly set properties
        unstable = model._unstable_default_values  # other library: defaults Bokeh materialised (child models)
        if (
            entry.selected is None
            or len(entry.selected) != len(values) + len(unstable)
            or not (entry.selected.issuperset(values) and entry.selected.issuperset(unstable))
        ):
            self._rebuild(model, entry, frozenset(values) | frozenset(unstable))
            return False
        same = not entry.has_data
        lookup = type(model).lookup
        old, texts = entry.values, entry.texts
        for i, key in enumerate(entry.keys):
            text = texts[i]
            if text is None:
                continue
            stored = values[key] if key in values else unstable.get(key)
            if type(text) is _Tpl:
                if stored is not old[i] or not _same_items(text.items, stored):
                    texts[i] = self._template(key, lookup(key).get_value(model), stored)
                    old[i], same = stored, False
            elif stored is not old[i]:
                texts[i] = f'"{key}":{JSON.encode(ValueEncoder(self).encode(lookup(key).get_value(model)))}'
                old[i], same = stored, False
        return same

    def _rebuild(self, model: Model, entry: Entry, selected: frozenset[str]) -> None:
        """The entry written afresh (a model met for the first time, or given other properties)."""
        values = model._property_values  # other library: as in _refresh
        unstable = model._unstable_default_values  # other library: as in _refresh
        lookup = type(model).lookup
        props = set_properties(model, selected)
        entry.selected, entry.keys = selected, tuple(props)
        entry.values, entry.texts, entry.has_data = [], [], False
        entry.subtree = entry.children = None
        for key, value in props.items():
            stored = values[key] if key in values else unstable.get(key)
            prop = lookup(key).property
            if isinstance(prop, ColumnData):  # a source's data: new with every trace, never kept
                entry.values.append(None)
                entry.texts.append(None)
                entry.has_data = True
            elif prop.has_ref:
                entry.values.append(stored)
                entry.texts.append(self._template(key, value, stored))
            else:
                entry.values.append(stored)
                entry.texts.append(f'"{key}":{JSON.encode(ValueEncoder(self).encode(value))}')

    def _template(self, key: str, value: Any, stored: Any) -> _Tpl:
        encoder = ValueEncoder(self)
        text = f'"{key}":{JSON.encode(encoder.encode(value))}'
        pieces = text.split(_SPLIT) if encoder.slots else [text]
        if len(pieces) != len(encoder.slots) + 1:
            raise ValueError(f"the text of {key!r} holds the slot marker {_MARK!r} outside a slot")
        return _Tpl(pieces, encoder.slots, _items(stored))

    def _compose(self, model: Model, entry: Entry, children: list[str]) -> str:
        parts: list[str] = []
        at = 0
        lookup = type(model).lookup
        for key, text in zip(entry.keys, entry.texts):
            if type(text) is str:
                parts.append(text)
            elif text is None:
                self.holes.append(self.data(lookup(key).get_value(model)))
                parts.append(f'"{key}":{_HOLE}{len(self.holes) - 1}{_HOLE}')
            else:
                n = len(text.slots)
                spliced = [text.pieces[0]]
                for child, piece in zip(children[at : at + n], text.pieces[1:]):
                    spliced.append(child)
                    spliced.append(piece)
                at += n
                parts.append("".join(spliced))
        if not parts:
            return entry.head + "}"
        return f'{entry.head},"attributes":{{{",".join(parts)}}}}}'

    def fill(self, text: str) -> str:
        """A document's ``text`` with the sources' data in their places: the data, most of the text, is copied once
        here instead of again into the text of every model that holds it."""
        if not self.holes:
            return text
        pieces = text.split(_HOLE)
        pieces[1::2] = [self.holes[int(i)] for i in pieces[1::2]]
        return "".join(pieces)

    # ------------------------------------------------------------------ data
    def data(self, data: Any) -> str:
        """A source's columns as Bokeh writes them (a map of ndarrays), numeric columns as inline buffers."""
        if not data:
            return '{"type":"map"}'
        entries = ",".join(f"[{JSON.encode(key)},{self.column(column)}]" for key, column in data.items())
        return f'{{"type":"map","entries":[{entries}]}}'

    def column(self, column: Any) -> str:
        if isinstance(column, np.ndarray) and column.shape != ():
            if column.dtype == object and column.ndim == 1:
                return self.strings(column)
            array = transform_array(column)
            if array.dtype.kind != "U" and not array_encoding_disabled(array):
                shape = f"[{array.shape[0]}]" if array.ndim == 1 else JSON.encode(list(array.shape))
                name = _DTYPE_NAMES.get(array.dtype)
                if name is None:
                    name = _DTYPE_NAMES[array.dtype] = array.dtype.name  # computed in Python by NumPy: ~3 µs
                return (
                    f'{{"type":"ndarray","array":{{"type":"bytes","data":"{self.b64(array.tobytes())}"}},'
                    f'"shape":{shape},"dtype":"{name}","order":"{_ORDER}"}}'
                )
        elif type(column) is list and all(map(_plain, column)):
            return JSON.encode(column)  # what Bokeh writes of strings, safe integers and finite floats: themselves
        return JSON.encode(ValueEncoder(self).encode(column))

    def strings(self, column: np.ndarray) -> str:
        """A 1-d object column: as codes into its distinct strings where they repeat enough (those it was made from,
        for a ``Coded`` column), else as Bokeh does."""
        if self.coded and len(column) >= CODE_MIN:
            made = getattr(column, "codes", None)
            if made is not None and len(made) == len(column):
                strings = column.strings
                if len(strings) * 2 <= len(column) and all(type(x) is str for x in strings):
                    return self._coded(made, strings)
        items = column.tolist()  # strings as Bokeh writes them, without an encode call per item
        if self.coded and len(items) >= CODE_MIN:
            coded = self._codes(items)
            if coded is not None:
                return coded
        if all(type(x) is str for x in items):
            return f'{{"type":"ndarray","array":{JSON.encode(items)},"shape":[{len(items)}],"dtype":"object","order":"{_ORDER}"}}'  # noqa: E501
        return JSON.encode(ValueEncoder(self).encode(column))

    def _codes(self, items: list[Any]) -> str | None:
        try:
            distinct = dict.fromkeys(items)
        except TypeError:  # an unhashable item: not a column of strings
            return None
        if len(distinct) * 2 > len(items) or not all(type(x) is str for x in distinct):
            return None
        index = {s: i for i, s in enumerate(distinct)}
        codes = np.fromiter(map(index.__getitem__, items), dtype=np.int64, count=len(items))
        return self._coded(codes, list(distinct))

    def _coded(self, codes: np.ndarray, strings: list[str]) -> str:
        width = 1 if len(strings) <= 0x100 else 2 if len(strings) <= 0x10000 else 4
        self.coded_columns += 1
        data = base64.b64encode(codes.astype(f"u{width}").tobytes()).decode("ascii")
        return (
            f'{{"type":"{CODED}","codes":"{data}","width":{width},"strings":{JSON.encode(strings)},"order":"{_ORDER}"}}'
        )

    def b64(self, raw: bytes) -> str:
        """A buffer as Bokeh sends it inline (gzip, then base64); stored, not compressed, below ``STORE_BELOW``."""
        level = 0 if len(raw) < STORE_BELOW else self.level
        return base64.b64encode(gzip.compress(raw, mtime=1, compresslevel=level)).decode("ascii")


class _Watched(dict):
    """A model's store of set properties (Bokeh's ``_property_values``, ``_unstable_default_values``) that marks the
    model's entries, and the entries whose text holds theirs, dirty when a property is given a value: every set, and
    every change of a container in place, ends in a store here (Bokeh's ``PropertyDescriptor._set_value``). The
    entries are held weakly: a model shown by many layouts (the documents' config) keeps none of their caches."""

    __slots__ = ("entries",)

    entries: weakref.WeakSet[Entry]

    @classmethod
    def watch(cls, model: Model, entry: Entry) -> None:
        for name in ("_property_values", "_unstable_default_values"):  # other library: Bokeh's stores
            store = getattr(model, name)
            if type(store) is not cls:
                store = cls(store)
                store.entries = weakref.WeakSet()
                setattr(model, name, store)
            store.entries.add(entry)

    def _changed(self) -> None:
        for entry in self.entries:
            while entry is not None and not entry.dirty:
                entry.dirty = True
                entry = entry.parent

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, *args: Any) -> Any:
        self._changed()
        return super().pop(*args)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._changed()
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def clear(self) -> None:
        super().clear()
        self._changed()

    def popitem(self) -> tuple[str, Any]:
        self._changed()
        return super().popitem()


class ValueEncoder(Serializer):
    """Bokeh's serializer for one property value: models in it become marked places (``slots``), written in their
    own right by ``TextEncoder``; buffers and string columns as ``TextEncoder`` writes them."""

    def __init__(self, owner: TextEncoder) -> None:
        super().__init__(deferred=False)
        self.owner = owner
        self.slots: list[Model] = []

    def encode(self, obj: Any) -> Any:
        if isinstance(obj, Model):
            self.slots.append(obj)
            return _MARK
        return super().encode(obj)

    def _encode_bytes(self, obj: bytes | memoryview) -> dict[str, Any]:
        return {"type": "bytes", "data": self.owner.b64(obj if isinstance(obj, bytes) else obj.tobytes())}


def set_properties(model: Model, selected: frozenset[str]) -> dict[str, Any]:
    """``model.properties_with_values(include_defaults=False)``, without computing the default of every property the
    model was never given (Bokeh asks each for its value before it drops those not set: most of a layout's first
    encoding)."""
    themed = model.themed_values() or {}
    wanted = selected | frozenset(themed)
    unstable = model._unstable_default_values  # other library: as in properties_with_values
    out: dict[str, Any] = {}
    for key in type(model).properties(_with_props=True):
        if key not in wanted:
            continue
        descriptor = type(model).lookup(key)
        if not descriptor.serialized:
            continue
        value = descriptor.get_value(model)
        if key not in themed and key in unstable and isinstance(value, PropertyValueContainer):
            continue  # an unmodified default container, as Bokeh leaves it out
        out[key] = value
    return out


def _plain(x: Any) -> bool:
    """Whether Bokeh encodes ``x`` as itself."""
    kind = type(x)
    return kind is str or (kind is float and isfinite(x)) or (kind is int and -_MAX_SAFE_INT < x <= _MAX_SAFE_INT)


_MAX_SAFE_INT = 2**53 - 1


def _items(value: Any) -> tuple[Any, ...]:
    """A list's or dict's items (the objects themselves, kept alive), to notice a change made in place."""
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return ()


def _same_items(items: tuple[Any, ...], value: Any) -> bool:
    now = _items(value)
    return len(now) == len(items) and all(a is b for a, b in zip(now, items))


def _same_texts(now: list[str], then: list[str] | None) -> bool:
    return then is not None and len(now) == len(then) and all(a is b for a, b in zip(now, then))
