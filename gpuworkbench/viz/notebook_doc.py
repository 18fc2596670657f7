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

import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bokeh import __version__ as bokeh_version
from bokeh.core.has_props import is_DataModel
from bokeh.core.serialization import Serializer
from bokeh.model import Model
from bokeh.util.serialization import make_globally_unique_css_safe_id, make_globally_unique_id, make_id


@dataclass
class _Encoded:
    """A model's properties as last serialized: names in Bokeh's order, the values then (as the model stores them),
    their encodings (None where the value may hold other models: encoded again every time)."""

    selected: frozenset[str]
    keys: list[str]
    values: list[Any] = field(default_factory=list)
    reps: list[Any] = field(default_factory=list)


class DocEncoder(Serializer):
    """Bokeh's serializer (inline base64 buffers) with fresh ids and each model's encoded properties kept in
    ``cache`` (model -> ``_Encoded``) for the next time the same model is shown."""

    def __init__(self, cache: dict[Model, _Encoded] | None = None) -> None:
        super().__init__(deferred=False)
        self.cache = cache if cache is not None else {}
        self.ids: dict[Model, str] = {}

    def _encode(self, obj: Any) -> Any:
        if isinstance(obj, Model):
            return self._model(obj)
        if isinstance(obj, np.ndarray) and obj.dtype == object and obj.ndim == 1:
            items = obj.tolist()  # strings as Bokeh writes them, without an encode call per item
            if all(type(x) is str for x in items):
                return {"type": "ndarray", "array": items, "shape": [len(items)], "dtype": "object",
                        "order": _BYTE_ORDER}  # fmt: skip
        return super()._encode(obj)

    def _model(self, model: Model) -> dict[str, Any]:
        new_id = make_id()
        self.ids[model] = new_id
        self.add_ref(model, {"id": new_id})
        values = model._property_values  # other library: Bokeh's store of explicitly set properties
        unstable = model._unstable_default_values  # other library: defaults Bokeh materialised (child models)
        selected = frozenset(values) | frozenset(unstable)
        entry = self.cache.get(model)
        attributes: dict[str, Any] = {}
        if entry is None or entry.selected != selected:  # first time, or other properties set: as Bokeh does it
            props = model.properties_with_values(include_defaults=False)
            entry = _Encoded(selected, list(props))
            lookup = type(model).lookup
            for key, value in props.items():
                attributes[key] = rep = self.encode(value)
                static = not lookup(key).property.has_ref  # a value holding models is encoded every time
                entry.values.append((values[key] if key in values else unstable[key]) if static else _AGAIN)
                entry.reps.append(rep if static else None)
            self.cache[model] = entry
        else:
            for i, key in enumerate(entry.keys):
                value = values[key] if key in values else unstable[key]
                rep = entry.reps[i]
                if rep is None or value is not entry.values[i]:
                    rep = self.encode(type(model).lookup(key).get_value(model))  # as Bokeh serializes it
                    if entry.reps[i] is not None:
                        entry.values[i], entry.reps[i] = value, rep
                attributes[key] = rep
        out: dict[str, Any] = {"type": "object", "name": model.__qualified_model__, "id": new_id}
        if attributes:
            out["attributes"] = attributes
        return out


_AGAIN = object()  # the value of a property encoded every time
_BYTE_ORDER = sys.byteorder


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


def document_json(root: Model, cache: dict[Model, _Encoded] | None = None) -> tuple[dict[str, Any], str]:
    """The docs_json of a document holding only ``root`` (as ``standalone_docs_json_and_render_items`` writes it) and
    the root's id in it."""
    encoder = DocEncoder(cache)
    data_models = [m for m in Model.model_class_reverse_map.values() if is_DataModel(m)]
    defs = encoder.encode(data_models)
    config = encoder.encode(_config())
    roots = encoder.encode([root])
    doc: dict[str, Any] = {"version": bokeh_version, "title": "Bokeh Application", "config": config, "roots": roots}
    if data_models:
        doc["defs"] = defs
    return doc, encoder.ids[root]


def notebook_bundle(root: Model, cache: dict[Model, _Encoded] | None = None) -> tuple[str, str, str]:
    """(div, script, root id): what ``bokeh.embed.notebook.notebook_content`` makes for ``root``."""
    from bokeh.core.json_encoder import serialize_json
    from bokeh.core.templates import DOC_NB_JS
    from bokeh.embed.elements import div_for_render_item
    from bokeh.embed.util import RenderItem

    doc, root_id = document_json(root, cache)
    docid, elementid = make_globally_unique_id(), make_globally_unique_css_safe_id()
    item = RenderItem(docid=docid, roots={_Root(root_id, root.name or "", tuple(root.tags)): elementid})
    script = DOC_NB_JS.render(docs_json=serialize_json({docid: doc}), render_items=serialize_json([item.to_json()]))
    return div_for_render_item(item), script, root_id


def publish(root: Model, cache: dict[Model, _Encoded] | None = None) -> None:
    """Publish ``root`` to the notebook as ``bokeh.io.show`` does (the div, then the script BokehJS runs), without
    adding it to ``curdoc()``; BokehJS must have been loaded (``inline_setup``)."""
    from bokeh.io.notebook import EXEC_MIME_TYPE, HTML_MIME_TYPE, JS_MIME_TYPE
    from IPython.display import publish_display_data

    div, script, root_id = notebook_bundle(root, cache)
    publish_display_data({HTML_MIME_TYPE: div})
    publish_display_data({JS_MIME_TYPE: script, EXEC_MIME_TYPE: ""}, metadata={EXEC_MIME_TYPE: {"id": root_id}})
