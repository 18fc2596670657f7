"""BokehJS loaded into a notebook from the Python package (``bokeh.resources.INLINE``), never from a CDN: the machine
may be offline, and an offline notebook then renders nothing while ``jupyter_bokeh.BokehModel`` waits forever.

The loader (~4 MB of script, 25-50 ms to make) can be made ahead (``prepare_inline``, by the warm-up between cells)
and is published with the first picture, as ``output_notebook(resources=INLINE, hide_banner=True)`` publishes it."""

from __future__ import annotations

from .._format import in_notebook

_inline_loaded = False
_loader: list[tuple[str, str]] = []  # (the classic notebook's script, JupyterLab's), made ahead


def prepare_inline() -> None:
    """Make the BokehJS loader that ``inline_setup`` publishes (as Bokeh's ``load_notebook`` makes it), once."""
    if _loader or _inline_loaded:
        return
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.io import notebook
    from bokeh.resources import INLINE

    bundle = bundle_for_objs_and_resources(None, INLINE)
    make = notebook._loading_js  # other library: what load_notebook publishes, made without publishing it
    _loader.append((make(bundle, None, 5000, register_mime=True), make(bundle, None, 5000, register_mime=False)))


def inline_setup(force: bool = False) -> bool:
    """Load BokehJS into the notebook from the Python package (no CDN), once; False outside a notebook kernel.

    Without it an offline notebook renders nothing and ``jupyter_bokeh.BokehModel`` waits forever.
    """
    global _inline_loaded
    if _inline_loaded and not force:
        return True
    if not in_notebook():
        return False
    from bokeh.io import notebook, output_notebook
    from bokeh.io.state import curstate
    from bokeh.resources import INLINE
    from IPython.display import publish_display_data

    try:
        prepare_inline()
        script, lab_script = _loader.pop()
    except (AttributeError, TypeError, IndexError):  # a Bokeh whose private loader differs: its own public call
        output_notebook(resources=INLINE, hide_banner=True)
    else:
        curstate().output_notebook("jupyter")  # as output_notebook: bokeh.io.show then shows in the notebook
        notebook._NOTEBOOK_LOADED = INLINE  # other library: as load_notebook records what it loaded
        publish_display_data({notebook.JS_MIME_TYPE: script, notebook.LOAD_MIME_TYPE: lab_script})
    _inline_loaded = True
    return True
