"""The CUPTI record joins (trace/cupti/join.py, trace/cupti/ops.py) on hand-made record columns: runs without a GPU.

On a GPU the same code is exercised end to end by tests/backends/test_cuda.py and the CUDA runs of test_trace.py."""

from __future__ import annotations

import numpy as np

from gpuworkbench.trace.cupti.join import ExternalIdJoin
from gpuworkbench.trace.cupti.ops import LOST_AFTER, QUERY_AFTER, CuptiOps
from gpuworkbench.trace.spans import KIND_CODE


def records(corr, start, runtime=None):
    corr = np.asarray(corr, np.int64)
    start = np.asarray(start, np.int64)
    return {
        "kind": np.full(corr.size, "kernel", dtype=object),
        "start": start,
        "end": start + 10,
        "correlation_id": corr,
        "runtime_correlation_id": np.zeros(corr.size, np.int64) if runtime is None else np.asarray(runtime, np.int64),
    }


def ids(*values):
    return np.asarray(values, np.int64)


def test_join_attaches_ids_and_orders_by_start():
    j = ExternalIdJoin()
    out = j.join(records([5, 6, 7], [300, 100, 200]), ids(5, 6, 7), ids(50, 60, 70))
    assert out["start"].tolist() == [100, 200, 300]
    assert out["external_id"].tolist() == [60, 70, 50]
    assert j.held == 0


def test_a_record_waits_for_an_entry_that_comes_a_flush_later():
    j = ExternalIdJoin(hold_flushes=2)
    assert j.join(records([8], [10])) is None  # held: its entry is not in yet
    assert j.held == 1
    out = j.join(None, ids(8), ids(80))
    assert out["external_id"].tolist() == [80]
    assert j.held == 0


def test_a_record_with_no_entry_is_released_with_minus_one_after_the_hold():
    j = ExternalIdJoin(hold_flushes=2)
    assert j.join(records([9], [10])) is None
    assert j.join(None) is None  # still waiting, one flush later
    out = j.join(None)
    assert out["external_id"].tolist() == [-1]


def test_the_last_flush_releases_everything():
    j = ExternalIdJoin(hold_flushes=5)
    out = j.join(records([9, 10], [20, 10]), ids(10), ids(100), wait=False)
    assert out["external_id"].tolist() == [100, -1]


def test_copies_tagged_by_the_runtime_api_join_by_runtime_correlation_id():
    j = ExternalIdJoin()
    out = j.join(records([11], [10], runtime=[4]), ids(4), ids(40))
    assert out["external_id"].tolist() == [40]


def test_an_entry_serves_later_records_until_it_goes_unused():
    j = ExternalIdJoin(keep_flushes=2)
    j.join(records([3], [10]), ids(3), ids(30))  # a graph launch: one entry, records over several flushes
    assert j.join(records([3], [20]))["external_id"].tolist() == [30]
    for _ in range(3):
        j.join(None)
    assert len(j) == 0
    assert j.join(records([3], [30]), wait=False)["external_id"].tolist() == [-1]


def test_the_map_is_bounded_and_keeps_the_newest():
    j = ExternalIdJoin(map_max=8)
    j.add(np.arange(20), np.arange(20) + 1000)
    j.join(None)
    assert len(j) == 4
    assert j.lookup(ids(19, 2))[0].tolist() == [1019, -1]


def test_a_repeated_correlation_id_keeps_its_newest_external_id():
    j = ExternalIdJoin()
    j.add(ids(1, 2), ids(10, 20))
    j.add(ids(2), ids(21))
    assert j.lookup(ids(1, 2, 3))[0].tolist() == [10, 21, -1]


class Handle:
    """A completion handle whose done() the test sets, counting the queries."""

    def __init__(self, done=False):
        self.is_done, self.queries = done, 0

    def done(self):
        self.queries += 1
        return self.is_done


def op(op_id, kind="kernel", device=0, name="k", handle=None, many=False, nbytes=0):
    return (op_id, device, 7, KIND_CODE[kind], nbytes, name, -1, 1000 + op_id, handle or Handle(), many)


def cupti_records(pairs):
    ext = np.asarray([p[0] for p in pairs], np.int64)
    start = np.asarray([p[1] for p in pairs], np.int64)
    end = np.asarray([p[2] for p in pairs], np.int64)
    return {"external_id": ext, "start": start, "end": end}


def test_a_kernel_becomes_a_span_on_its_first_record_without_a_query():
    ops = CuptiOps()
    h = Handle()
    ops.add(*op(1, handle=h, name="first"))
    ops.add(*op(2, device=1, name="second"))
    ops.add_records(cupti_records([(2, 500, 600), (1, 100, 150), (-1, 0, 5)]), cycle=1)
    rows = ops.harvest(1, np.array([10, 20]))
    assert rows["name"].tolist() == ["first", "second"]
    assert rows["start_ns"].tolist() == [90, 480]
    assert rows["end_ns"].tolist() == [140, 580]
    assert rows["enqueue_ns"].tolist() == [1001, 1002]
    assert rows["kind"].tolist() == [KIND_CODE["kernel"]] * 2
    assert h.queries == 0
    assert len(ops) == 0


def test_a_record_that_arrives_before_its_op_is_handed_over_is_kept():
    ops = CuptiOps()
    ops.add_records(cupti_records([(3, 100, 200)]), cycle=1)
    assert ops.harvest(1, np.array([0])) is None
    ops.add(*op(3))
    assert ops.harvest(2, np.array([0]))["start_ns"].tolist() == [100]


def test_a_copy_of_several_records_waits_until_it_was_done_before_a_flush():
    ops = CuptiOps()
    h = Handle(done=False)
    ops.add(*op(4, kind="h2d", handle=h, nbytes=64))
    ops.add_records(cupti_records([(4, 100, 200)]), cycle=1)  # the first staged chunk
    assert ops.harvest(1, np.array([0])) is None
    h.is_done = True
    ops.add_records(cupti_records([(4, 250, 400)]), cycle=2)
    assert ops.harvest(2, np.array([0])) is None  # seen done now: the next flush may still bring records
    ops.add_records(cupti_records([(4, 420, 500)]), cycle=3)
    rows = ops.harvest(3, np.array([0]))
    assert (rows["start_ns"].tolist(), rows["end_ns"].tolist()) == ([100], [500])


def test_a_graph_launch_gathers_its_kernels_into_one_span():
    ops = CuptiOps()
    ops.add(*op(5, handle=Handle(done=True), many=True, name="graph g"))
    ops.add_records(cupti_records([(5, 10, 20), (5, 30, 40)]), cycle=1)
    assert ops.harvest(1, np.array([0])) is None
    rows = ops.harvest(2, np.array([0]))
    assert (rows["start_ns"].tolist(), rows["end_ns"].tolist(), rows["name"].tolist()) == ([10], [40], ["graph g"])


def test_an_op_done_without_a_record_is_counted_lost():
    ops = CuptiOps()
    h = Handle(done=True)
    ops.add(*op(6, handle=h, name="ghost"))
    cycle = 0
    while len(ops) and cycle < 500:
        cycle += 1
        assert ops.harvest(cycle, np.array([0])) is None
    assert (ops.lost, ops.first_lost) == (1, "ghost")
    assert cycle >= LOST_AFTER
    assert h.queries == 1  # queried once its record was late, never again


def test_an_op_still_running_is_neither_lost_nor_queried_at_every_cycle_early():
    ops = CuptiOps()
    h = Handle(done=False)
    ops.add(*op(7, handle=h))
    for cycle in range(1, 200):
        ops.harvest(cycle, np.array([0]))
    assert ops.lost == 0 and len(ops) == 1
    assert h.queries == 199 - QUERY_AFTER  # from the cycle it had waited QUERY_AFTER cycles on
    ops.add_records(cupti_records([(7, 1, 2)]), cycle=200)
    assert ops.harvest(200, np.array([0]))["end_ns"].tolist() == [2]


def test_only_ops_of_several_records_keep_their_completion_and_only_until_their_span():
    ops = CuptiOps()
    ops.add(*op(1))
    ops.add(*op(2, kind="h2d", handle=Handle(done=True), nbytes=8))
    assert list(ops.completions) == [2]  # a kernel's completion is not held: the launching thread releases it
    ops.add_records(cupti_records([(1, 10, 20), (2, 30, 40)]), cycle=1)
    assert ops.harvest(1, np.array([0]))["name"].tolist() == ["k"]
    assert ops.harvest(2, np.array([0]))["start_ns"].tolist() == [30]
    assert ops.completions == {} and len(ops) == 0


def test_a_late_kernel_is_judged_by_the_newest_completion_on_its_stream():
    ops = CuptiOps()
    older, newer = Handle(done=False), Handle(done=True)
    ops.add(*op(1, handle=older, name="late"))
    ops.add(*op(2, handle=newer))  # same stream, enqueued after: done means op 1 is done too
    ops.add_records(cupti_records([(2, 10, 20)]), cycle=1)
    ops.harvest(1, np.array([0]))
    for cycle in range(2, QUERY_AFTER + LOST_AFTER + 2):
        ops.harvest(cycle, np.array([0]))
    assert (ops.lost, ops.first_lost, len(ops)) == (1, "late", 0)
    assert older.queries == 0 and newer.queries == 1


def test_names_past_the_table_are_kept_per_op(monkeypatch):
    from gpuworkbench.trace.cupti import ops as cupti_ops

    monkeypatch.setattr(cupti_ops, "NAMES_MAX", 2)
    ops = CuptiOps()
    for i, name in enumerate(["a", "b", "c", "a", "d"], start=1):
        ops.add(*op(i, name=name))
    ops.add_records(cupti_records([(i, i, i + 1) for i in range(1, 6)]), cycle=1)
    assert ops.harvest(1, np.array([0]))["name"].tolist() == ["a", "b", "c", "a", "d"]
    assert ops.names == ["a", "b"] and ops.spilled == {}


def test_records_of_ops_not_ready_stay_when_others_are_made_spans():
    ops = CuptiOps()
    h = Handle(done=False)
    ops.add(*op(1, kind="h2d", handle=h, nbytes=64))  # several records: waits until it was seen done
    ops.add(*op(2))
    ops.add(*op(3))
    ops.add_records(cupti_records([(3, 70, 80), (1, 100, 200), (2, 50, 60), (1, 300, 400)]), cycle=1)  # unsorted
    assert ops.harvest(1, np.array([0]))["start_ns"].tolist() == [50, 70]
    h.is_done = True
    ops.harvest(2, np.array([0]))  # seen done now
    rows = ops.harvest(3, np.array([0]))
    assert (rows["start_ns"].tolist(), rows["end_ns"].tolist()) == ([100], [400])
