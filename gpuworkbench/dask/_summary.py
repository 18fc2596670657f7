"""A cluster trace's summary: each worker's busy and idle time, the straggler, waits between tasks, and the devices'
DESIGN §6 figures, with the advice of both (pure: a function of tables, as ``trace/analysis.py``)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trace.analysis import (
    Advice,
    Summary,
    WorkerSummary,
    _format_ns,
    advise_workers,
    summarize,
    summarize_workers,
)


@dataclass(frozen=True)
class ClusterSummary:
    """Per worker: busy / idle over the cluster's window W, its waits between tasks and for the straggler (the worker
    that finished last); ``devices``: every device's own summary (overlap, idle, 8 states ...)."""

    window_start_ns: int
    window_end_ns: int
    workers: dict[str, WorkerSummary]
    straggler: str | None  # the worker that finished last (None without tasks)
    straggler_wait_ns: int  # how long the other workers waited for it, summed over them
    devices: Summary
    worker_advice: list[Advice]

    @property
    def window_ns(self) -> int:
        return self.window_end_ns - self.window_start_ns

    @property
    def advice(self) -> list[Advice]:
        """The cluster's advice (workers), then every device's."""
        return self.worker_advice + self.devices.advice

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only, ready for ``json.dumps``."""
        return {
            "window_start_ns": self.window_start_ns,
            "window_end_ns": self.window_end_ns,
            "workers": {w: vars(s).copy() for w, s in self.workers.items()},
            "straggler": self.straggler,
            "straggler_wait_ns": self.straggler_wait_ns,
            "advice": [vars(a).copy() for a in self.worker_advice],
            **self.devices.to_dict(),
        }

    def _rows(self) -> list[list[str]]:
        w = max(self.window_ns, 1)
        return [
            [
                s.worker,
                str(s.tasks),
                f"{_format_ns(s.busy_ns)} ({100 * s.busy_ns / w:.0f} %)",
                f"{_format_ns(s.idle_ns)} ({100 * s.idle_ns / w:.0f} %)",
                _format_ns(s.compute_ns),
                _format_ns(s.device_ns),
                _format_ns(s.idle_transfer_ns),
                _format_ns(s.idle_scheduler_ns),
                _format_ns(s.waited_ns),
            ]
            for s in self.workers.values()
        ]

    _HEAD = ("worker", "tasks", "busy", "idle", "compute", "device", "idle: transfers", "idle: scheduler", "waited")

    def _straggler_line(self) -> str:
        if self.straggler is None:
            return "no tasks traced"
        return (
            f"window W {_format_ns(self.window_ns)}; straggler {self.straggler}: the others waited "
            f"{_format_ns(self.straggler_wait_ns)} for it in all"
        )

    def __str__(self) -> str:
        rows = [list(self._HEAD), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        lines = [self._straggler_line()] + ["  ".join(c.ljust(n) for c, n in zip(r, widths)) for r in rows]
        if self.worker_advice:
            lines.append("advice (workers)")
            lines += [f"  [{a.code}] {a.message}" for a in self.worker_advice]
        return "\n".join(lines) + "\n" + str(self.devices)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self._rows()
        )
        out = f"<p>{html.escape(self._straggler_line())}</p>"
        out += f"<table class='gpuworkbench-workers'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        if self.worker_advice:
            items = "".join(
                f"<li><b>{html.escape(a.code)}</b>: {html.escape(a.message)}</li>" for a in self.worker_advice
            )
            out += f"<ul class='gpuworkbench-advice'>{items}</ul>"
        return out + self.devices._repr_html_()


def summarize_cluster(
    table: Mapping[str, np.ndarray],
    tasks: Mapping[str, np.ndarray],
    workers: list[str],
    worker_devices: Mapping[int, list[int]],
    host_devices: list[int],
    window: tuple[int, int] | None = None,
) -> ClusterSummary:
    """The summary of a merged cluster table: ``worker_devices`` maps worker index -> its device numbers, and
    ``host_devices`` are the workers' host rows (tasks, threads), left out of the device figures."""
    figures, w = summarize_workers(table, tasks, workers, worker_devices)
    devices = np.asarray(table["device"])
    keep = ~np.isin(devices, host_devices)
    device_summary = summarize({c: np.asarray(v)[keep] for c, v in table.items()}, window=window)
    ran = [s for s in figures.values() if s.tasks]
    straggler = max(ran, key=lambda s: s.last_ns).worker if ran else None
    return ClusterSummary(
        window_start_ns=w[0],
        window_end_ns=w[1],
        workers=figures,
        straggler=straggler,
        straggler_wait_ns=sum(s.waited_ns for s in ran),
        devices=device_summary,
        worker_advice=advise_workers(figures, w),
    )
