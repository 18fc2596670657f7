"""A Bokeh layout published to the notebook as ``bokeh.io.show`` publishes it (the same div and script), faster.

``bokeh.io.show`` adds every layout it shows to the notebook's ``curdoc()`` (which keeps each cell's figures alive and
walks all of them again on every show), copies the layout into a new Document and serializes each model by asking
every one of its properties whether it still holds its default: on a 1 000-span trace that is most of a traced cell's
time after its code returns. Here the layout is written straight into the same document JSON (``doc_text``), with
fresh model ids each time (two outputs never share an id, so clearing one never disposes of another), and a model
shown again (the cached layouts of ``reuse.py``) is written again only where its properties were given new values:
the rest is the text it had. Only for the default theme and settings; otherwise ``bokeh.io.show`` does it.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

from bokeh import __version__ as bokeh_version
from bokeh.core.has_props import is_DataModel
from bokeh.model import Model
from bokeh.util.serialization import make_globally_unique_css_safe_id, make_globally_unique_id

from .doc_text import CODE_MIN, CODED, JSON, TOKEN, Entry, TextEncoder, ValueEncoder

__all__ = ["CODED", "CODE_MIN", "EXPAND_JS", "document_json", "fast_path_applies", "notebook_bundle", "publish"]

#: The browser's side of ``CODED``: a function of the docs_json that puts each coded column back as the ndarray of
#: strings Bokeh would have written, before BokehJS reads the document.
EXPAND_JS = """(function expand(x) {
  if (Array.isArray(x)) {
    for (let i = 0; i < x.length; i++) { const v = x[i]; if (v !== null && typeof v === "object") x[i] = expand(v) }
    return x
  }
  if (x.type === "CODED") {
    const b = atob(x.codes), bytes = new Uint8Array(b.length)
    for (let i = 0; i < b.length; i++) bytes[i] = b.charCodeAt(i)
    const c = x.width === 1 ? bytes : x.width === 2 ? new Uint16Array(bytes.buffer) : new Uint32Array(bytes.buffer)
    const s = x.strings, a = new Array(c.length)
    for (let i = 0; i < c.length; i++) a[i] = s[c[i]]
    return {type: "ndarray", array: a, shape: [c.length], dtype: "object", order: x.order}
  }
  for (const k in x) { const v = x[k]; if (v !== null && typeof v === "object") x[k] = expand(v) }
  return x
})""".replace("CODED", CODED)


def _new_prefix() -> str:
    """An id prefix no other output of this process has (nor, with the process's random part, of another kernel)."""
    return f"{_ID_PREFIX}{next(_ID_COUNT)}-"


_ID_PREFIX = f"g{os.urandom(4).hex()}-"
_ID_COUNT = itertools.count(1)


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


#: Set once our encoder failed on this Bokeh (its private model store differs): ``bokeh.io.show`` from then on.
FAILED: list[bool] = []


def fast_path_applies() -> bool:
    """Whether ``publish`` writes what ``bokeh.io.show`` would: the notebook's document has Bokeh's default theme,
    Bokeh serializes no defaults (``BOKEH_SERIALIZE_INCLUDE_DEFAULTS``), and our encoder has not failed on it."""
    from bokeh.io import curdoc
    from bokeh.settings import settings
    from bokeh.themes import default as default_theme

    return not FAILED and curdoc().theme is default_theme and not settings.serialize_include_defaults()


def document_json(root: Model, cache: dict[Model, Entry] | None = None, coded: bool = False) -> tuple[str, str, int]:
    """The docs_json text of a document holding only ``root`` (as ``standalone_docs_json_and_render_items`` writes it,
    ids fresh), the root's id in it and how many of its columns are coded (``coded``: see ``doc_text``; the JSON then
    needs ``EXPAND_JS`` before BokehJS reads it). ``cache`` keeps each model's text for the next document of them."""
    encoder = TextEncoder(cache, coded)
    data_models = _data_models()
    defs = JSON.encode(ValueEncoder(encoder).encode(data_models)) if data_models else ""
    config, _ = encoder.model(_config())
    roots, _ = encoder.model(root)
    version = json.dumps(bokeh_version)
    text = f'{{"version":{version},"title":"Bokeh Application","config":{config},"roots":[{roots}]'
    text += f',"defs":{defs}}}' if data_models else "}"
    prefix = _new_prefix()
    root_id = encoder.cache[root].id.replace(TOKEN, prefix)
    return encoder.fill(text.replace(TOKEN, prefix)), root_id, encoder.coded_columns


_DATA_MODELS: dict[int, list[type[Model]]] = {}


def _data_models() -> list[type[Model]]:
    """Bokeh's DataModel classes (a document's ``defs``), looked up again only when a model class was defined since."""
    classes = Model.model_class_reverse_map
    found = _DATA_MODELS.get(len(classes))
    if found is None:
        _DATA_MODELS.clear()
        found = _DATA_MODELS[len(classes)] = [m for m in classes.values() if is_DataModel(m)]
    return found


def notebook_bundle(root: Model, cache: dict[Model, Entry] | None = None) -> tuple[str, str, str]:
    """(div, script, root id): what ``bokeh.embed.notebook.notebook_content`` makes for ``root``, its columns of
    repeated strings coded (the script expands them before BokehJS reads the document)."""
    from bokeh.core.templates import DOC_NB_JS
    from bokeh.embed.elements import div_for_render_item
    from bokeh.embed.util import RenderItem

    doc, root_id, coded = document_json(root, cache, coded=True)
    docid, elementid = make_globally_unique_id(), make_globally_unique_css_safe_id()
    item = RenderItem(docid=docid, roots={_Root(root_id, root.name or "", tuple(root.tags)): elementid})
    docs_json = f"{{{json.dumps(docid)}:{doc}}}"
    if coded:
        docs_json = f"{EXPAND_JS}({docs_json})"
    script = DOC_NB_JS.render(docs_json=docs_json, render_items=JSON.encode([item.to_json()]))
    return div_for_render_item(item), script, root_id


def publish(root: Model, cache: dict[Model, Entry] | None = None) -> None:
    """Publish ``root`` to the notebook as ``bokeh.io.show`` does (the div, then the script BokehJS runs), without
    adding it to ``curdoc()``; BokehJS must have been loaded (``inline_setup``)."""
    from bokeh.io.notebook import EXEC_MIME_TYPE, HTML_MIME_TYPE, JS_MIME_TYPE
    from IPython.display import publish_display_data

    div, script, root_id = notebook_bundle(root, cache)
    publish_display_data({HTML_MIME_TYPE: div})
    publish_display_data({JS_MIME_TYPE: script, EXEC_MIME_TYPE: ""}, metadata={EXEC_MIME_TYPE: {"id": root_id}})
