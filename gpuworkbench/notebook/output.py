"""How the magics answer: tables and rich objects shown as HTML in a notebook and as text elsewhere; one-line errors
on stderr instead of tracebacks."""

from __future__ import annotations

import html
import sys
from collections.abc import Sequence
from typing import Any

from IPython.display import display

from .._format import in_notebook


def error(what: str, message: object) -> None:
    """Print ``what: message`` on stderr (a usage error or a device that cannot be used, never a traceback)."""
    print(f"{what}: {message}", file=sys.stderr)


def present(obj: Any) -> None:
    """Show ``obj`` as rich output in a notebook and as its text (``str``) elsewhere."""
    if in_notebook():
        display(obj)
    else:
        print(obj)


class Table:
    """A small table shown as HTML in a notebook and as aligned text elsewhere (IPython's display picks)."""

    def __init__(self, headers: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> None:
        self.headers, self.rows, self.notes = list(headers), [list(r) for r in rows], list(notes)

    def __repr__(self) -> str:
        cells = [self.headers, *self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.headers))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        return "\n".join(lines + self.notes)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        notes = "".join(f"<div>{html.escape(n)}</div>" for n in self.notes)
        return f"<table class='gpuworkbench-devices'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"
