"""A Bokeh layout published to the notebook as ``bokeh.io.show`` publishes it (the same div and script), faster.

``bokeh.io.show`` adds every layout it shows to the notebook's ``curdoc()`` (which keeps each cell's figures alive and
walks all of them again on every show), copies the layout into a new Document and serializes each model by asking
every one of its properties whether it still holds its default: on a 1 000-span trace that is most of a traced cell's
time after its code returns. Here the layout is serialized straight into the same document JSON, with fresh model ids
each time (two outputs never share an id, so clearing one never disposes of another), and a model shown again (the
cached layouts of ``reuse.py``) re-encodes only the properties that were given new values since: the others keep the
encoding they had. Only for the default theme and settings; otherwise ``bokeh.io.show`` does it.
"""

from __future__ import annotations

import base64
import gzip
import itertools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bokeh import __version__ as bokeh_version
from bokeh.core.has_props import is_DataModel
from bokeh.core.json_encoder import PayloadEncoder
from bokeh.core.property.container import ColumnData
from bokeh.core.property.wrappers import PropertyValueContainer
from bokeh.core.serialization import Serializer
from bokeh.model import Model
from bokeh.settings import settings
from bokeh.util.serialization import make_globally_unique_css_safe_id, make_globally_unique_id


@dataclass
class _Encoded:
    """A model's properties as last serialized: names in Bokeh's order, the values then (as the model stores them),
    their encodings, and for a value that holds models its template (``_Template``) instead of an encoding."""

    selected: frozenset[str]
    keys: list[str]
    values: list[Any] = field(default_factory=list)
    reps: list[Any] = field(default_factory=list)


@dataclass
class _Template:
    """The encoding of a value that holds models, the models left as ``_Slot``s (each is encoded where it stands:
    whole the first time the document meets it, else as a reference under its id in this document); ``items`` are
    the value's own items then, so that a list or dict changed in place is not mistaken for the same value."""

    rep: Any
    items: tuple[Any, ...]
    slots: bool


@dataclass(frozen=True)
class _Slot:
    model: Model


class DocEncoder(Serializer):
    """Bokeh's serializer (inline base64 buffers) with fresh ids and each model's encoded properties kept in
    ``cache`` (model -> ``_Encoded``) for the next time the same model is shown.

    ``coded``: a column of repeated strings is sent as small integer codes and its distinct strings (``CODED``), which
    the published script expands before BokehJS reads the document (``EXPAND_JS``); ``self.coded_columns`` counts
    them."""

    def __init__(self, cache: dict[Model, _Encoded] | None = None, coded: bool = False) -> None:
        super().__init__(deferred=False)
        self.cache = cache if cache is not None else {}
        self.ids: dict[Model, str] = {}
        self.coded = coded
        self.coded_columns = 0
        self._level = settings.compression_level()

    def _encode(self, obj: Any) -> Any:
        if isinstance(obj, Model):
            return self._model(obj)
        if isinstance(obj, np.ndarray) and obj.dtype == object and obj.ndim == 1:
            items = obj.tolist()  # strings as Bokeh writes them, without an encode call per item
            coded = self._strings(items) if self.coded and len(items) >= CODE_MIN else None
            if coded is not None:
                return coded
            if all(type(x) is str for x in items):
                return {"type": "ndarray", "array": items, "shape": [len(items)], "dtype": "object",
                        "order": _BYTE_ORDER}  # fmt: skip
        return super()._encode(obj)

    def _strings(self, items: list[Any]) -> dict[str, Any] | None:
        """``items`` as codes into its distinct strings, where they repeat enough to be worth it; else None."""
        try:
            distinct = dict.fromkeys(items)
        except TypeError:  # an unhashable item: not a column of strings
            return None
        if len(distinct) * 2 > len(items) or not all(type(x) is str for x in distinct):
            return None
        index = {s: i for i, s in enumerate(distinct)}
        codes = list(map(index.__getitem__, items))
        self.coded_columns += 1
        return {"type": CODED, "codes": codes, "strings": list(distinct), "order": _BYTE_ORDER}

    def _encode_bytes(self, obj: bytes | memoryview) -> dict[str, Any]:
        """As Bokeh encodes a buffer inline (gzip at Bokeh's level, then base64), without making it an id."""
        data = gzip.compress(obj if isinstance(obj, bytes) else obj.tobytes(), mtime=1, compresslevel=self._level)
        return {"type": "bytes", "data": base64.b64encode(data).decode("ascii")}

    def _model(self, model: Model) -> dict[str, Any]:
        new_id = _new_id()
        self.ids[model] = new_id
        self.add_ref(model, {"id": new_id})
        values = model._property_values  # other library: Bokeh's store of explicitly set properties
        unstable = model._unstable_default_values  # other library: defaults Bokeh materialised (child models)
        selected = frozenset(values) | frozenset(unstable)
        entry = self.cache.get(model)
        lookup = type(model).lookup
        attributes: dict[str, Any] = {}
        if entry is None or entry.selected != selected:  # first time, or other properties set: as Bokeh does it
            props = _set_properties(model, selected)
            entry = _Encoded(selected, list(props))
            for key, value in props.items():
                stored = values[key] if key in values else unstable[key]
                prop = lookup(key).property
                if isinstance(prop, ColumnData):  # a source's data: new with every trace, never kept
                    attributes[key] = self.encode(value)
                    entry.values.append(_AGAIN)
                    entry.reps.append(None)
                elif prop.has_ref:  # a value holding models: the models encoded where they stand every time
                    template = _template(value, stored, self._level)
                    attributes[key] = self._fill(template.rep) if template.slots else template.rep
                    entry.values.append(stored)
                    entry.reps.append(template)
                else:
                    attributes[key] = rep = self.encode(value)
                    entry.values.append(stored)
                    entry.reps.append(rep)
            self.cache[model] = entry
        else:
            for i, key in enumerate(entry.keys):
                value = values[key] if key in values else unstable[key]
                rep = entry.reps[i]
                if rep is None:
                    rep = self.encode(lookup(key).get_value(model))
                elif isinstance(rep, _Template):
                    if value is not entry.values[i] or not _same_items(rep.items, value):
                        rep = entry.reps[i] = _template(lookup(key).get_value(model), value, self._level)
                        entry.values[i] = value
                    rep = self._fill(rep.rep) if rep.slots else rep.rep
                elif value is not entry.values[i]:
                    rep = self.encode(lookup(key).get_value(model))  # as Bokeh serializes it
                    entry.values[i], entry.reps[i] = value, rep
                attributes[key] = rep
        out: dict[str, Any] = {"type": "object", "name": model.__qualified_model__, "id": new_id}
        if attributes:
            out["attributes"] = attributes
        return out

    def _fill(self, rep: Any) -> Any:
        """A template's encoding with its models encoded in this document."""
        if type(rep) is _Slot:
            return self.encode(rep.model)
        if type(rep) is dict:
            return {k: self._fill(v) for k, v in rep.items()}
        if type(rep) in (list, tuple):
            return [self._fill(v) for v in rep]
        return rep


def _set_properties(model: Model, selected: frozenset[str]) -> dict[str, Any]:
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


class _Templater(DocEncoder):
    """Encodes a value as Bokeh would, leaving every model in it a ``_Slot``."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self._level = level
        self.slots = False

    def encode(self, obj: Any) -> Any:
        if isinstance(obj, Model):
            self.slots = True
            return _Slot(obj)
        return super().encode(obj)


def _template(value: Any, stored: Any, level: int) -> _Template:
    """The template of ``value`` (serializable) as the model stores it (``stored``)."""
    templater = _Templater(level)
    rep = templater.encode(value)
    return _Template(rep, _items(stored), templater.slots)


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


#: A column of strings sent as codes (``DocEncoder``): {"type": CODED, "codes": [...], "strings": [...], "order"}.
CODED = "gpuworkbench_strings"
#: Columns shorter than this are sent as they are.
CODE_MIN = 32
#: The browser's side of ``CODED``: a function of the docs_json that puts each coded column back as the ndarray of
#: strings Bokeh would have written, before BokehJS reads the document.
EXPAND_JS = """(function expand(x) {
  if (Array.isArray(x)) {
    for (let i = 0; i < x.length; i++) { const v = x[i]; if (v !== null && typeof v === "object") x[i] = expand(v) }
    return x
  }
  if (x.type === "CODED") {
    const s = x.strings, c = x.codes, a = new Array(c.length)
    for (let i = 0; i < c.length; i++) a[i] = s[c[i]]
    return {type: "ndarray", array: a, shape: [c.length], dtype: "object", order: x.order}
  }
  for (const k in x) { const v = x[k]; if (v !== null && typeof v === "object") x[k] = expand(v) }
  return x
})""".replace("CODED", CODED)


def _new_id() -> str:
    """A model id no other output of this process has (nor, with the process's random prefix, of another kernel)."""
    return f"{_ID_PREFIX}{next(_ID_COUNT)}"


_ID_PREFIX = f"g{os.urandom(4).hex()}-"
_ID_COUNT = itertools.count(1)
_AGAIN = object()  # the value of a property encoded every time
_BYTE_ORDER = sys.byteorder
#: What ``serialize_json`` writes (compact, no key sorting), without its settings look-ups per call.
_JSON = PayloadEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class _Root:
    """What Bokeh's render item reads of a root model, under the id it has in this document."""

    id: str
    name: str
    tags: tuple[Any, ...]


_CONFIG: list[Model] = []


def _config() -> Model:
    """A document's configuration model, as a new Document has it (made once)."""
    if not _CONFIG:
        from bokeh.document import Document

        _CONFIG.append(Document()._config)  # other library: Document.to_json serializes its private config model
    return _CONFIG[0]


def fast_path_applies() -> bool:
    """Whether ``publish`` writes what ``bokeh.io.show`` would: the notebook's document has Bokeh's default theme and
    Bokeh serializes no defaults (``BOKEH_SERIALIZE_INCLUDE_DEFAULTS``)."""
    from bokeh.io import curdoc
    from bokeh.settings import settings
    from bokeh.themes import default as default_theme

    return curdoc().theme is default_theme and not settings.serialize_include_defaults()


def document_json(
    root: Model, cache: dict[Model, _Encoded] | None = None, coded: bool = False
) -> tuple[dict[str, Any], str, int]:
    """The docs_json of a document holding only ``root`` (as ``standalone_docs_json_and_render_items`` writes it), the
    root's id in it and how many of its columns are coded (``coded``: see ``DocEncoder``; the JSON then needs
    ``EXPAND_JS`` before BokehJS reads it)."""
    encoder = DocEncoder(cache, coded)
    data_models = _data_models()
    defs = encoder.encode(data_models)
    config = encoder.encode(_config())
    roots = encoder.encode([root])
    doc: dict[str, Any] = {"version": bokeh_version, "title": "Bokeh Application", "config": config, "roots": roots}
    if data_models:
        doc["defs"] = defs
    return doc, encoder.ids[root], encoder.coded_columns


_DATA_MODELS: dict[int, list[type[Model]]] = {}


def _data_models() -> list[type[Model]]:
    """Bokeh's DataModel classes (a document's ``defs``), looked up again only when a model class was defined since."""
    classes = Model.model_class_reverse_map
    found = _DATA_MODELS.get(len(classes))
    if found is None:
        _DATA_MODELS.clear()
        found = _DATA_MODELS[len(classes)] = [m for m in classes.values() if is_DataModel(m)]
    return found


def notebook_bundle(root: Model, cache: dict[Model, _Encoded] | None = None) -> tuple[str, str, str]:
    """(div, script, root id): what ``bokeh.embed.notebook.notebook_content`` makes for ``root``, its columns of
    repeated strings coded (the script expands them before BokehJS reads the document)."""
    from bokeh.core.templates import DOC_NB_JS
    from bokeh.embed.elements import div_for_render_item
    from bokeh.embed.util import RenderItem

    doc, root_id, coded = document_json(root, cache, coded=True)
    docid, elementid = make_globally_unique_id(), make_globally_unique_css_safe_id()
    item = RenderItem(docid=docid, roots={_Root(root_id, root.name or "", tuple(root.tags)): elementid})
    docs_json = _JSON.encode({docid: doc})
    if coded:
        docs_json = f"{EXPAND_JS}({docs_json})"
    script = DOC_NB_JS.render(docs_json=docs_json, render_items=_JSON.encode([item.to_json()]))
    return div_for_render_item(item), script, root_id


def publish(root: Model, cache: dict[Model, _Encoded] | None = None) -> None:
    """Publish ``root`` to the notebook as ``bokeh.io.show`` does (the div, then the script BokehJS runs), without
    adding it to ``curdoc()``; BokehJS must have been loaded (``inline_setup``)."""
    from bokeh.io.notebook import EXEC_MIME_TYPE, HTML_MIME_TYPE, JS_MIME_TYPE
    from IPython.display import publish_display_data

    div, script, root_id = notebook_bundle(root, cache)
    publish_display_data({HTML_MIME_TYPE: div})
    publish_display_data({JS_MIME_TYPE: script, EXEC_MIME_TYPE: ""}, metadata={EXEC_MIME_TYPE: {"id": root_id}})
