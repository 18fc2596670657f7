"""Tracing: spans on one clock per device (recorder), their analysis, and export."""

from .recorder import Trace, active
from .spans import KINDS, Span

__all__ = ["KINDS", "Span", "Trace", "active"]
