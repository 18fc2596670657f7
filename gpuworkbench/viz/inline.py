"""BokehJS loaded into a notebook from the Python package (``bokeh.resources.INLINE``), never from a CDN: the machine
may be offline, and an offline notebook then renders nothing while ``jupyter_bokeh.BokehModel`` waits forever."""

from __future__ import annotations

from .._format import in_notebook

_inline_loaded = False


def inline_setup(force: bool = False) -> bool:
    """Load BokehJS into the notebook from the Python package (no CDN), once; False outside a notebook kernel.

    Without it an offline notebook renders nothing and ``jupyter_bokeh.BokehModel`` waits forever.
    """
    global _inline_loaded
    if _inline_loaded and not force:
        return True
    if not in_notebook():
        return False
    from bokeh.io import output_notebook
    from bokeh.resources import INLINE

    output_notebook(resources=INLINE, hide_banner=True)
    _inline_loaded = True
    return True
