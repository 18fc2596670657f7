"""The one palette of the pictures: a colour per span kind and per overlap state, shared by timeline, memory and live.

Colours are chosen to read on the white Bokeh canvas that a picture carries into both the light and the dark
JupyterLab theme (the canvas keeps its own background), and text drawn on a bar takes the ink its fill needs.
"""

from __future__ import annotations

from gpuworkbench.trace.analysis import STATES
from gpuworkbench.trace.spans import KINDS

#: Fill colour of each span kind (alloc, free and markers are host bookkeeping: greys and red).
KIND_COLORS: dict[str, str] = {
    "h2d": "#1f77b4",
    "d2h": "#ff7f0e",
    "d2d": "#9467bd",
    "memset": "#8c564b",
    "kernel": "#2ca02c",
    "alloc": "#7f7f7f",
    "free": "#c7c7c7",
    "marker": "#d62728",
    "api": "#17becf",
    "range": "#bcbd22",
}

#: A host call that blocks its thread (a synchronize, a blocking copy): an ``api`` span drawn in this style instead.
HOST_WAIT = "host wait"
HOST_WAIT_COLOR = "#b2182b"
HOST_WAIT_HATCH = "/"

#: Every colour key a timeline bar can have: the kinds, then host waits. The ``style`` column of a timeline holds these.
STYLES: tuple[str, ...] = (*KINDS, HOST_WAIT)
STYLE_COLORS: dict[str, str] = {**KIND_COLORS, HOST_WAIT: HOST_WAIT_COLOR}

#: Fill colour of each of the 8 states on a device's strip: H blue, D orange, K green, darker where they overlap.
STATE_COLORS: dict[str, str] = {
    "idle": "#f2f2f2",
    "K": "#a1d99b",
    "H": "#9ecae1",
    "D": "#fdd0a2",
    "H+K": "#1b9e77",
    "D+K": "#b8a30b",
    "H+D": "#8c6bb1",
    "H+D+K": "#3f007d",
}

#: What a state's letters stand for, in its legend entry.
STATE_LABELS: dict[str, str] = {
    "idle": "idle (nothing runs)",
    "K": "K: kernel only",
    "H": "H: copy to device only",
    "D": "D: copy from device only",
    "H+K": "H+K: upload under a kernel",
    "D+K": "D+K: download under a kernel",
    "H+D": "H+D: both copies",
    "H+D+K": "H+D+K: all three",
}

#: Line colour of each device in the memory plot (device i takes entry i modulo the length): not the kinds' colours.
DEVICE_COLORS: tuple[str, ...] = ("#08519c", "#a63603", "#54278f", "#006d2c", "#7a0177", "#525252")


def ink(color: str) -> str:
    """Black or white, whichever reads better on ``color`` (``#rrggbb``), by its relative luminance."""
    r, g, b = (int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    luminance = 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)
    # Contrast against white (1.05 / (L + 0.05)) beats contrast against black ((L + 0.05) / 0.05) below L ≈ 0.18.
    return "#ffffff" if luminance < 0.18 else "#000000"


#: The text colour of a kernel name written on a bar of each style.
STYLE_INK: dict[str, str] = {style: ink(color) for style, color in STYLE_COLORS.items()}

assert set(STATE_COLORS) == set(STATES) == set(STATE_LABELS)
