"""Overlap, idle time, the 8-state breakdown, gap causes and advice: pure functions of span tables (DESIGN §6).

``intervals`` is the algebra every figure is measured with; ``columns`` slices one device's spans to a window;
``device`` computes each device's figures and ``advice`` its findings; ``cross`` the figures across devices;
``summary`` holds the results and ``render`` prints them. The names below are the ones the rest of the package and
its users import from ``gpuworkbench.trace.analysis``.
"""

from __future__ import annotations

from .advice import Advice, CrossoverPoint, Crossovers
from .cross import CrossDevice, PeerCopies, cross_device
from .device import DEFAULT_THETA_NS, GAP_CAUSES, STATE_OF_MASK, STATES, gap_causes, state_segments, summarize
from .intervals import Intervals, clip, difference, intersection, total_length, union
from .summary import DeviceSummary, Summary

__all__ = [
    "DEFAULT_THETA_NS",
    "GAP_CAUSES",
    "STATES",
    "Advice",
    "CrossDevice",
    "CrossoverPoint",
    "Crossovers",
    "DeviceSummary",
    "Intervals",
    "PeerCopies",
    "Summary",
    "clip",
    "cross_device",
    "difference",
    "gap_causes",
    "intersection",
    "STATE_OF_MASK",
    "state_segments",
    "summarize",
    "total_length",
    "union",
]
