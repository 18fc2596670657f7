"""A cluster trace's summary: each worker's busy and idle time, the straggler, waits between tasks, and the devices'
DESIGN §6 figures, with the advice of both (pure: a function of tables, as ``trace/analysis`` is)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._format import count, duration_ns
from ..trace.analysis import Advice, Summary, summarize
from ..trace.analysis.columns import IS_WORK
from ..trace.analysis.intervals import difference, intersection, total_length, union, union_of

#: Columns of a cluster trace's task table: the worker (an index into its workers), the task key, the action (an index
#: into TASK_ACTIONS), start and end on the trace's clock, and the host row (stream) it was drawn on.
TASK_COLUMNS: dict[str, Any] = {
    "worker": np.int32,
    "key": object,
    "action": np.int8,
    "start_ns": np.int64,
    "end_ns": np.int64,
    "stream": np.int32,
}
TASK_ACTIONS: tuple[str, ...] = ("compute", "transfer")
_IMBALANCE_WAIT_SHARE = 0.2  # the other workers' mean wait for the straggler / |W|
_BETWEEN_TASKS_SHARE = 0.2  # device idle between a worker's tasks / its active window
_BETWEEN_TASKS_MIN_NS = 1_000_000


@dataclass(frozen=True)
class WorkerSummary:
    """One Dask worker over the cluster's window W (ns): T is the union of its tasks' compute intervals (over all its
    threads), X of its incoming transfers, A of its devices' work; its active window runs from its first task or op
    to its last (``last_ns``, when it finished). ``idle_transfer_ns`` / ``idle_scheduler_ns``: time in the active
    window when no task computed and its devices were idle, while data came in (X) / while nothing did (it waited
    for the scheduler to hand it work)."""

    worker: str
    tasks: int
    first_ns: int
    last_ns: int
    compute_ns: int  # |T|
    transfer_ns: int  # |X|
    device_ns: int  # |A|
    busy_ns: int  # |T ∪ A|
    idle_ns: int  # |W| − |T ∪ A|
    waited_ns: int  # the straggler's last_ns − this worker's last_ns
    idle_transfer_ns: int
    idle_scheduler_ns: int


def summarize_workers(
    table: Mapping[str, np.ndarray],
    tasks: Mapping[str, np.ndarray],
    workers: list[str],
    worker_devices: Mapping[int, list[int]],
) -> tuple[dict[str, WorkerSummary], tuple[int, int]]:
    """Each worker's busy and idle time, its waits between tasks and its wait for the straggler, over the cluster's
    window W (first task or device op of any worker to the last); returns the summaries by worker and W.

    ``tasks``: TASK_COLUMNS; ``worker_devices``: worker index -> the device numbers of its device work."""
    kind, device = np.asarray(table["kind"]), np.asarray(table["device"])
    start, end = np.asarray(table["start_ns"], np.int64), np.asarray(table["end_ns"], np.int64)
    t_worker, t_action = np.asarray(tasks["worker"]), np.asarray(tasks["action"])
    t_start, t_end = np.asarray(tasks["start_ns"], np.int64), np.asarray(tasks["end_ns"], np.int64)
    parts = {}
    for w in range(len(workers)):
        work = IS_WORK[kind] & np.isin(device, list(worker_devices.get(w, [])))
        mine = t_worker == w
        compute, transfer = mine & (t_action == 0), mine & (t_action == 1)
        parts[w] = (
            union(t_start[compute], t_end[compute]),
            union(t_start[transfer], t_end[transfer]),
            union(start[work], end[work]),
            int(compute.sum()),
        )
    bounds = [(int(p[0].min()), int(p[1].max())) for part in parts.values() for p in part[:3] if p[0].size]
    window = (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (0, 0)
    spans = {w: [p for p in part[:3] if p[0].size] for w, part in parts.items()}
    first = {w: min((int(p[0][0]) for p in s), default=window[0]) for w, s in spans.items()}
    last = {w: max((int(p[1][-1]) for p in s), default=window[0]) for w, s in spans.items()}
    finish = max(last.values(), default=window[0])
    out = {}
    for w, (compute, transfer, device_work, n_tasks) in parts.items():
        busy = union_of(compute, device_work)
        waiting = difference((np.array([first[w]]), np.array([last[w]])), busy)
        on_transfer = intersection(waiting, transfer)
        out[workers[w]] = WorkerSummary(
            worker=workers[w],
            tasks=n_tasks,
            first_ns=first[w],
            last_ns=last[w],
            compute_ns=total_length(compute),
            transfer_ns=total_length(transfer),
            device_ns=total_length(device_work),
            busy_ns=total_length(busy),
            idle_ns=(window[1] - window[0]) - total_length(busy),
            waited_ns=finish - last[w] if spans[w] else 0,
            idle_transfer_ns=total_length(on_transfer),
            idle_scheduler_ns=total_length(waiting) - total_length(on_transfer),
        )
    return out, window


def advise_workers(workers: Mapping[str, WorkerSummary], window: tuple[int, int]) -> list[Advice]:
    """The cluster's advice codes, each decided by one rule (``device`` is -1: they name workers, not devices).

    - ``worker-imbalance``: ≥ 2 workers ran tasks and the others waited for the one that finished last (the
      straggler) for ≥ 20 % of |W| on average.
    - ``gpu-idle-between-tasks``: a worker with device work had its devices idle, no task computing, for ≥ 20 % of
      its active window and ≥ 1 ms, waiting on transfers or on the scheduler.
    """
    found: list[Advice] = []
    w_ns = window[1] - window[0]
    ran = [s for s in workers.values() if s.tasks]
    if len(ran) >= 2 and w_ns > 0:
        straggler = max(ran, key=lambda s: s.last_ns)
        others = [s for s in ran if s is not straggler]
        mean_wait = sum(s.waited_ns for s in others) / len(others)
        if mean_wait >= _IMBALANCE_WAIT_SHARE * w_ns:
            median_busy = float(np.median([s.busy_ns for s in ran]))
            found.append(
                Advice(
                    "worker-imbalance",
                    f"worker {straggler.worker} finished last: the other {count(len(others), 'worker', 'workers')} "
                    f"waited for it {duration_ns(mean_wait)} on average ({100 * mean_wait / w_ns:.0f} % of W); it "
                    f"was busy {duration_ns(straggler.busy_ns)} against a median of {duration_ns(median_busy)} with "
                    f"{straggler.tasks} tasks. Split the work into more, smaller tasks (smaller chunks) so that the "
                    "scheduler can even it out, or look at what makes that worker slow.",
                    device=-1,
                )
            )
    for s in workers.values():
        active = s.last_ns - s.first_ns
        idle = s.idle_transfer_ns + s.idle_scheduler_ns
        if s.device_ns and active > 0 and idle >= _BETWEEN_TASKS_MIN_NS and idle >= _BETWEEN_TASKS_SHARE * active:
            found.append(
                Advice(
                    "gpu-idle-between-tasks",
                    f"on worker {s.worker} the devices sat idle between tasks for {duration_ns(idle)} "
                    f"({100 * idle / active:.0f} % of its active time): {duration_ns(s.idle_transfer_ns)} waiting for "
                    f"data from other workers, {duration_ns(s.idle_scheduler_ns)} waiting for the scheduler. Give "
                    "each task more device work (larger chunks), keep data where it is used (client.persist, "
                    "scatter), and submit work ahead so that the next task is ready when one ends.",
                    device=-1,
                )
            )
    return found


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
                f"{duration_ns(s.busy_ns)} ({100 * s.busy_ns / w:.0f} %)",
                f"{duration_ns(s.idle_ns)} ({100 * s.idle_ns / w:.0f} %)",
                duration_ns(s.compute_ns),
                duration_ns(s.device_ns),
                duration_ns(s.idle_transfer_ns),
                duration_ns(s.idle_scheduler_ns),
                duration_ns(s.waited_ns),
            ]
            for s in self.workers.values()
        ]

    _HEAD = ("worker", "tasks", "busy", "idle", "compute", "device", "idle: transfers", "idle: scheduler", "waited")

    def _straggler_line(self) -> str:
        if self.straggler is None:
            return "no tasks traced"
        return (
            f"window W {duration_ns(self.window_ns)}; straggler {self.straggler}: the others waited "
            f"{duration_ns(self.straggler_wait_ns)} for it in all"
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
