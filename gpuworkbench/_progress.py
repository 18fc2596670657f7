"""Progress of a long measurement: an ipywidgets bar in a notebook, one line of text per step elsewhere.

Shared by the ``%gpu bench`` magics and ``gw.crossover``; ipywidgets and IPython are imported only when a bar is drawn.
"""

from __future__ import annotations

from typing import Any


class Progress:
    """``step(what)`` after each of ``total`` steps; ``close()`` at the end. ``quiet``: neither bar nor text."""

    def __init__(self, title: str, total: int, notebook: bool, quiet: bool = False) -> None:
        self.title, self.total, self.done, self.quiet = title, total, 0, quiet
        self._bar: Any = None
        if notebook and not quiet:
            try:
                import ipywidgets as widgets
                from IPython.display import display
            except ImportError:
                widgets = None
            if widgets is not None:
                self._bar = widgets.IntProgress(value=0, min=0, max=max(total, 1), description=title)
                self._label = widgets.Label("")
                display(widgets.HBox([self._bar, self._label]))

    def step(self, what: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.value, self._label.value = self.done, what
        elif not self.quiet:
            print(f"{self.title} [{self.done}/{self.total}] {what}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.bar_style = "success"
