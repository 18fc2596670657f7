"""What a summary holds: ``DeviceSummary``, the DESIGN §6 figures of one device over one window W, and ``Summary``,
every device's plus the figures across devices, with their advice; both print as text and as HTML."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .render import summary_html, summary_text

if TYPE_CHECKING:
    from .advice import Advice
    from .cross import CrossDevice


def covered(states: dict[str, int], *engines: str) -> int:
    """Time (ns) during which any of ``engines`` ("H", "D", "K") was busy, read off the 8 states."""
    return sum(ns for state, ns in states.items() if any(e in state.split("+") for e in engines))


@dataclass(frozen=True)
class DeviceSummary:
    """The DESIGN §6 figures of one device over one window W (times in ns, percentages 0–100).

    ``window_source`` is "ops" (first op start to last op end) or "cell" (a window passed in, e.g. a cell's wall time).
    ``gap_ns`` holds per stream the gap time per cause; gaps are never summed across streams.
    """

    device: int
    window_start_ns: int
    window_end_ns: int
    window_source: str  # "ops" or "cell"
    window_ns: int  # |W|
    overlap_pct: float | None  # 100·|C ∩ K| / |C|; None without copies
    exposed_copy_ns: int  # |C \ K|
    h2d_overlap_pct: float | None  # 100·|H ∩ K| / |H|
    d2h_overlap_pct: float | None  # 100·|D ∩ K| / |D|
    idle_pct: float | None  # 100·(|W| − |A|) / |W|; None when |W| = 0
    states: dict[str, int]  # the 8 states (STATES) -> ns; sums to window_ns
    pipeline_efficiency: float | None  # max(|H|, |K|, |D|) / |W|: the busiest engine's share (fill/drain not known)
    stream_busy: dict[int, float]  # stream -> |S| / |W| (0–1), S the union of that stream's ops
    bandwidth_gbps: dict[str, float | None]  # "h2d"/"d2h" -> bytes / summed copy durations (bytes/ns = GB/s)
    op_counts: dict[str, int]  # kind -> spans in the window, alloc/free/marker included
    gap_ns: dict[int, dict[str, int]]  # stream -> gap cause -> ns
    gap_counts: dict[str, int]  # gap cause -> number of gaps on all streams
    advice: list[Advice]
    #: The mean of the device's "SM active" counter (else "GPU busy") over W, from a trace's counters; None without.
    sm_active_pct: float | None = None
    sm_counter: str = ""  # the counter it came from

    @property
    def kernel_ns(self) -> int:
        """|K|: time some kernel, device copy or memset ran."""
        return covered(self.states, "K")

    @property
    def h2d_ns(self) -> int:
        """|H|: time some host-to-device copy ran."""
        return covered(self.states, "H")

    @property
    def d2h_ns(self) -> int:
        """|D|: time some device-to-host copy ran."""
        return covered(self.states, "D")

    @property
    def copy_ns(self) -> int:
        """|C| = |H ∪ D|."""
        return covered(self.states, "H", "D")

    @property
    def active_ns(self) -> int:
        """|A| = |K ∪ C|: time the device did anything."""
        return self.window_ns - self.states["idle"]

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        return asdict(self)

    def __str__(self) -> str:
        return summary_text({self.device: self}, self.advice)

    def _repr_html_(self) -> str:
        return summary_html({self.device: self}, self.advice)


#: The DeviceSummary fields that ``Summary`` forwards to its first device.
_FORWARDED = (
    "window_start_ns",
    "window_end_ns",
    "window_source",
    "window_ns",
    "overlap_pct",
    "exposed_copy_ns",
    "h2d_overlap_pct",
    "d2h_overlap_pct",
    "idle_pct",
    "states",
    "pipeline_efficiency",
    "stream_busy",
    "bandwidth_gbps",
    "op_counts",
    "gap_ns",
    "gap_counts",
    "kernel_ns",
    "h2d_ns",
    "d2h_ns",
    "copy_ns",
    "active_ns",
)


@dataclass(frozen=True)
class Summary:
    """A trace's figures, one ``DeviceSummary`` per device; ``summary.overlap_pct`` etc. read the first device.

    Most traces use one device, so its figures are one attribute away; ``advice`` gathers every device's, then the
    cross-device advice. ``cross_device`` holds the figures across devices (None with one device and no peer copy).
    """

    devices: dict[int, DeviceSummary]
    cross_device: CrossDevice | None = None

    @property
    def first_device(self) -> DeviceSummary:
        """The summary of the lowest-numbered device (the only one, usually)."""
        if not self.devices:
            raise ValueError("the trace holds no spans, so there is no device to summarise")
        return self.devices[min(self.devices)]

    @property
    def advice(self) -> list[Advice]:
        """Advice for every device, device by device, then the cross-device advice."""
        per_device = [item for device in sorted(self.devices) for item in self.devices[device].advice]
        return per_device + (self.cross_device.advice if self.cross_device is not None else [])

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        out: dict[str, Any] = {"devices": {device: ds.to_dict() for device, ds in sorted(self.devices.items())}}
        if self.cross_device is not None:
            out["cross_device"] = self.cross_device.to_dict()
        return out

    def __str__(self) -> str:
        return summary_text(self.devices, self.advice, self.cross_device)

    def _repr_html_(self) -> str:
        return summary_html(self.devices, self.advice, self.cross_device)


def _forward(name: str) -> property:
    return property(lambda self: getattr(self.first_device, name), doc=f"``{name}`` of the first device.")


for _name in _FORWARDED:
    setattr(Summary, _name, _forward(_name))
del _name
