"""Tests of ``gw.crossover``: library ops timed on the CPU and PoCL backends over tiny sizes, the cache, the table and
its crossovers (computed here from the measured times), the figure, ``%gpu bench crossover``, the advice
``too-small-for-gpu`` on hand-built traces, and errors that name the problem."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

import gpuworkbench as gw
from gpuworkbench import library as lib
from gpuworkbench.library import crossover_cache, crossover_measure, crossover_ops
from gpuworkbench.library.crossover_result import COLUMNS, Crossing, CrossoverResult, crossing
from gpuworkbench.trace.analysis import CrossoverPoint, summarize
from gpuworkbench.trace.spans import table_from_records

TINY = {"matmul": [8, 16], "softmax": [256, 1024], "sum": [256, 2048]}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test caches in its own folder."""
    monkeypatch.setenv(crossover_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def expected_crossing(sizes, baseline, times):
    """The smallest size from which the device stays faster, found by checking every suffix (not the module's
    walk from the top)."""
    for i, size in enumerate(sizes):
        if all(t < b for t, b in zip(times[i:], baseline[i:])):
            return size
    return None


def test_crossover_on_tiny_sizes(device):
    result = gw.crossover(list(TINY), device=device, sizes=TINY, repeats=2)
    assert isinstance(result, CrossoverResult)
    assert result.device == device.spec and result.backend == device.backend_kind.value
    table = result.table
    pd = pytest.importorskip("pandas")
    assert isinstance(table, pd.DataFrame)
    assert list(table.columns) == list(COLUMNS)
    assert list(table["op"]) == [op for op, sizes in TINY.items() for _ in sizes]
    assert list(table["size"]) == [s for sizes in TINY.values() for s in sizes]
    assert (table[["numpy_s", "device_s", "device_with_copies_s"]] > 0).all().all()
    assert np.allclose(table["speedup"], table["numpy_s"] / table["device_s"])
    assert np.allclose(table["speedup_with_copies"], table["numpy_s"] / table["device_with_copies_s"])
    by_op = result.crossover
    assert set(by_op) == set(TINY)
    for op, sizes in TINY.items():
        rows = table[table["op"] == op]
        assert list(rows["bytes"]) == [crossover_ops.OPS[op].nbytes(s) for s in sizes]
        numpy_s = list(rows["numpy_s"])
        assert by_op[op] == Crossing(
            expected_crossing(sizes, numpy_s, list(rows["device_s"])),
            expected_crossing(sizes, numpy_s, list(rows["device_with_copies_s"])),
        )
    assert not result.warnings, result.warnings  # the device's results agreed with NumPy's
    text = str(result)
    assert f"crossover on {device.spec}" in text and "softmax" in text and "n = 16" in text
    assert "<table>" in result._repr_html_() and "matmul" in result._repr_html_()


def test_every_op_runs_and_agrees_with_numpy(cpu):
    result = gw.crossover("all", device=cpu, sizes=[256], repeats=1)
    assert result.ops == list(crossover_ops.OPS)
    assert len(result.rows) == len(crossover_ops.OPS)
    assert not result.warnings, result.warnings


def test_the_table_without_pandas(cpu, monkeypatch):
    result = gw.crossover("sum", device=cpu, sizes=[256, 512], repeats=1)
    monkeypatch.setitem(sys.modules, "pandas", None)
    table = result.table
    assert isinstance(table, dict) and list(table) == list(COLUMNS)
    assert table["size"].tolist() == [256, 512] and table["op"].tolist() == ["sum", "sum"]
    assert np.allclose(table["speedup"], table["numpy_s"] / table["device_s"])


def test_cache_written_reused_and_refreshed(cpu, cache, monkeypatch):
    first = gw.crossover("softmax", device=cpu, sizes=[256, 1024], repeats=1)
    assert first.from_cache == {"softmax": False}
    data = json.loads((cache / crossover_cache.CACHE_FILE).read_text())
    key = crossover_cache.device_key("cpu", cpu.name)
    assert list(data["devices"]) == [key]
    assert data["devices"][key]["ops"]["softmax"]["256,1024"]["rows"][0]["size"] == 256

    def no_measuring(*args, **kw):
        raise AssertionError("measured although cached")

    with monkeypatch.context() as m:
        m.setattr(crossover_measure, "_measure", no_measuring)
        again = gw.crossover("softmax", device=cpu, sizes=[1024, 256], repeats=1)  # the same sizes, in any order
    assert again.from_cache == {"softmax": True} and again.rows == first.rows
    assert "cached: softmax" in str(again)

    calls = []
    real = crossover_measure._measure
    monkeypatch.setattr(crossover_measure, "_measure", lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    fresh = gw.crossover("softmax", device=cpu, sizes=[256, 1024], repeats=1, refresh=True)
    assert fresh.from_cache == {"softmax": False} and calls == [256, 1024]
    other = gw.crossover("softmax", device=cpu, sizes=[512], repeats=1)  # other sizes: measured, kept beside
    assert other.from_cache == {"softmax": False} and calls[-1] == 512
    runs = json.loads((cache / crossover_cache.CACHE_FILE).read_text())["devices"][key]["ops"]["softmax"]
    assert set(runs) == {"256,1024", "512"}


def test_results_of_another_library_version_are_not_reused(cpu, cache, monkeypatch):
    gw.crossover("sum", device=cpu, sizes=[256], repeats=1)
    monkeypatch.setattr(crossover_cache, "_VERSION", "0.0.0+changed")
    again = gw.crossover("sum", device=cpu, sizes=[256], repeats=1)
    assert again.from_cache == {"sum": False}
    keys = list(json.loads((cache / crossover_cache.CACHE_FILE).read_text())["devices"])
    assert keys == [crossover_cache.device_key("cpu", cpu.name, "0.0.0+changed")]  # the stale entry is dropped


def test_readers_parse_the_cache_file_once_per_version_of_it(monkeypatch, tmp_path):
    path = tmp_path / "crossover.json"
    path.write_text(json.dumps({"format": crossover_cache.FORMAT, "devices": {"a": {}}}))
    parsed: list = []
    read = crossover_cache.read_cache
    monkeypatch.setattr(crossover_cache, "read_cache", lambda p: parsed.append(p) or read(p))
    assert crossover_cache._shared_cache(path)["devices"] == {"a": {}}
    assert crossover_cache._shared_cache(path)["devices"] == {"a": {}} and len(parsed) == 1
    tmp = tmp_path / "new.json"  # as the writer does: a new file renamed over the old
    tmp.write_text(json.dumps({"format": crossover_cache.FORMAT, "devices": {"b": {}}}))
    tmp.replace(path)
    assert crossover_cache._shared_cache(path)["devices"] == {"b": {}} and len(parsed) == 2
    path.unlink()
    assert crossover_cache._shared_cache(path)["devices"] == {}


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(crossover_cache.CACHE_ENV, str(tmp_path / "here"))
    assert crossover_cache.cache_path() == tmp_path / "here" / "crossover.json"
    monkeypatch.delenv(crossover_cache.CACHE_ENV)
    platformdirs = pytest.importorskip("platformdirs")
    assert crossover_cache.cache_dir() == crossover_cache.Path(
        platformdirs.user_cache_dir("gpuworkbench", appauthor=False)
    )
    monkeypatch.setitem(sys.modules, "platformdirs", None)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert crossover_cache.cache_dir() == tmp_path / ".cache" / "gpuworkbench"


def test_a_corrupt_cache_file_is_measured_over(cpu, cache):
    cache.mkdir(parents=True)
    (cache / crossover_cache.CACHE_FILE).write_text("{not json")
    result = gw.crossover("sum", device=cpu, sizes=[256], repeats=1)
    assert result.from_cache == {"sum": False}
    assert json.loads((cache / crossover_cache.CACHE_FILE).read_text())["format"] == crossover_cache.FORMAT


def test_time_budget_skips_the_larger_sizes(cpu):
    result = gw.crossover("matmul", device=cpu, sizes=[8, 16, 1024], repeats=1, budget_s=1e-6)
    assert [r["size"] for r in result.rows] == [8]  # the first size always runs: nothing predicts it
    assert [(s, why.startswith("time budget")) for _, s, why in result.skipped] == [(16, True), (1024, True)]
    assert "skipped matmul n = 1024: time budget" in str(result)
    assert result.crossover["matmul"] == Crossing(None, None)


def test_a_one_off_cost_of_the_first_size_does_not_skip_the_next(cpu, monkeypatch):
    """A size's one-off costs (a kernel's first compile: seconds on PoCL with 2 cores) are not scaled up into the next
    size's prediction: that comes from the steady medians."""
    measure, calls = crossover_measure._measure, []

    def slow_first(*args):
        if not calls:
            time.sleep(0.3)  # as a first compile would
        calls.append(args[1])
        return measure(*args)

    monkeypatch.setattr(crossover_measure, "_measure", slow_first)
    result = gw.crossover("matmul", device=cpu, sizes=[8, 16], repeats=2, budget_s=1.0)
    assert [r["size"] for r in result.rows] == [8, 16] and result.skipped == []  # 0.3 s x 8 would pass 1 s


def test_device_memory_caps_the_sizes(cpu, monkeypatch):
    monkeypatch.setattr(cpu, "memory_info", lambda: (100_000, 10**9))
    result = gw.crossover("matmul", device=cpu, sizes=[8, 64], repeats=1)
    assert [r["size"] for r in result.rows] == [8]
    assert len(result.skipped) == 1 and "device memory" in result.skipped[0][2]


def test_crossing():
    sizes = [1, 2, 4, 8]
    assert crossing(sizes, [1, 1, 1, 1], [2, 0.5, 2, 0.5]) == 8
    assert crossing(sizes, [1, 1, 1, 1], [2, 0.5, 0.5, 0.5]) == 2
    assert crossing(sizes, [1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]) == 1
    assert crossing(sizes, [1, 1, 1, 1], [0.5, 0.5, 0.5, 1]) is None  # a tie is not a win
    assert crossing([], [], []) is None


def synthetic() -> CrossoverResult:
    """A device that wins matmul from n = 64 (with copies from 128) and never wins sum."""
    rows = []
    for n, numpy_s, device_s, copies_s in [(16, 1e-5, 1e-4, 2e-4), (32, 8e-5, 1.5e-4, 3e-4),
                                           (64, 6e-4, 2e-4, 7e-4), (128, 5e-3, 5e-4, 2e-3)]:  # fmt: skip
        rows.append({"op": "matmul", "size": n, "bytes": 12 * n * n, "numpy_s": numpy_s, "device_s": device_s,
                     "device_with_copies_s": copies_s, "speedup": numpy_s / device_s,
                     "speedup_with_copies": numpy_s / copies_s})  # fmt: skip
    for s in (256, 1024):
        rows.append({"op": "sum", "size": s, "bytes": 4 * s + 4, "numpy_s": 1e-6, "device_s": 1e-4,
                     "device_with_copies_s": 2e-4, "speedup": 0.01, "speedup_with_copies": 0.005})  # fmt: skip
    return CrossoverResult(
        device="cuda:0", device_name="a GPU", backend="cuda", version="v", rows=rows,
        units={"matmul": "n", "sum": "elements"}, kernels={"matmul": "matmul_tiled", "sum": "row_sum"},
    )  # fmt: skip


def test_crossover_and_points_when_the_device_wins():
    result = synthetic()
    assert result.crossover == {"matmul": Crossing(64, 128), "sum": Crossing(None, None)}
    points = result.points()
    assert points["matmul_tiled"] == CrossoverPoint("matmul", "matmul_tiled", 12 * 64 * 64, 64, "n", 128, 128)
    assert points["row_sum"].size is None and points["row_sum"].bytes == 4 * 1024 + 4 + 1
    text = str(result)
    assert "matmul: the device beats NumPy from n = 64; counting the copies, from n = 128" in text
    assert "sum: the device does not beat NumPy up to 1,024 elements, with or without the copies" in text


def test_figure_is_a_document_with_the_crossovers_marked():
    pytest.importorskip("bokeh")
    from bokeh.document import Document
    from bokeh.embed import json_item
    from bokeh.models import ColumnDataSource, Plot, Span

    layout = synthetic().figure()
    doc = Document()
    doc.add_root(layout)
    doc.validate()
    json.dumps(json_item(layout))  # serialises as a whole
    spans = {m.name: m.location for m in doc.select({"type": Span})}
    assert spans == {"crossover-matmul-device": 64, "crossover-matmul-with copies": 128}
    marks = {m.name: m.data for m in doc.select({"type": ColumnDataSource}) if m.name.startswith("crossovers-")}
    assert marks["crossovers-matmul"]["size"] == [64, 128]
    assert marks["crossovers-matmul"]["seconds"] == [2e-4, 2e-3]  # on the device's and the copies' lines
    assert marks["crossovers-sum"]["size"] == []  # never won: nothing marked
    figures = [m for m in doc.select({"type": Plot}) if m.name and m.name.startswith("crossover-")]
    assert {f.name for f in figures} == {"crossover-matmul", "crossover-sum"}
    assert all(type(f.x_scale).__name__ == "LogScale" and type(f.y_scale).__name__ == "LogScale" for f in figures)


# ------------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"op": "matmull"}, "unknown op 'matmull'"),
        ({"op": []}, "no op given"),
        ({"op": "sum", "sizes": [256, 0]}, "size 0 for sum is not a positive int"),
        ({"op": "sum", "sizes": [-3]}, "size -3 for sum"),
        ({"op": "sum", "sizes": [True]}, "size True"),
        ({"op": "sum", "sizes": [2.5]}, "size 2.5"),
        ({"op": "sum", "sizes": 256}, "sizes must be a list"),
        ({"op": "sum", "sizes": []}, "no sizes given for sum"),
        ({"op": "matmul", "sizes": [1 << 16]}, "kernels take at most"),
        ({"op": "sum", "sizes": {"matmul": [8]}}, "sizes given for matmul"),
        ({"op": "sum", "repeats": 0}, "repeats must be a positive int"),
        ({"op": "sum", "budget_s": -1}, "budget_s must be a positive number"),
        ({"op": "sum", "device": 3.5}, "device must be a gw.Device"),
    ],
)
def test_bad_arguments_name_the_problem(cpu, kwargs, message):
    kwargs.setdefault("device", cpu)
    with pytest.raises(gw.InvalidArgument, match=message.replace("(", r"\(")):
        gw.crossover(**kwargs)


# ------------------------------------------------------------------------------------------------------- the magic
def test_magic_runs_crossover_and_shows_the_table(shell, capsys):
    shell.run_line_magic("gpu", "use cpu")
    shell.run_line_magic("gpu", "bench crossover sum softmax --sizes 256,1024 --repeats 1")
    out = capsys.readouterr().out
    assert "crossover [1/4] sum 256 elements" in out  # progress, as text outside a notebook
    assert "crossover on cpu:0" in out and "softmax" in out and "1,024 elements" in out
    last = shell.magics_manager.registry["GpuMagics"].last_bench
    assert last["device"] == "cpu:0" and set(last["crossover"]) == {"sum", "softmax"}
    assert last["result"].crossover == last["crossover"]
    shell.run_line_magic("gpu", "bench crossover sum --sizes=256,1024 --repeats 1")  # from the cache now
    assert "cached: sum" in capsys.readouterr().out
    shell.run_line_magic("gpu", "bench crossover sum --sizes 256,1024 --repeats 1 --refresh")
    assert "cached" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("bench crossover summ", "unknown op 'summ'"),
        ("bench crossover sum --sizes 0", "size 0 for sum"),
        ("bench crossover sum --sizes big", "--sizes takes a number"),
        ("bench crossover --frob", "unknown option --frob"),
        ("bench cross", "choose one of: copy, launch, pipeline, crossover"),
    ],
)
def test_magic_errors(shell, capsys, line, message):
    shell.run_line_magic("gpu", "use cpu")
    shell.run_line_magic("gpu", line)
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------- the advice
def kernels(name: str, sizes: list[int], device: int = 0) -> list[dict]:
    """Back-to-back kernel spans of ``name`` with these ``bytes``."""
    return [{"kind": "kernel", "device": device, "stream": 1, "start_ns": 1000 * i, "end_ns": 1000 * i + 900,
             "name": name, "bytes": b} for i, b in enumerate(sizes)]  # fmt: skip


POINT = CrossoverPoint("softmax", "row_softmax", bytes=8 << 20, size=1 << 20, unit="elements", largest=1 << 26,
                       with_copies=1 << 22)  # fmt: skip


def small_advice(table, crossover):
    return [a for a in summarize(table, crossover=crossover).advice if a.code == "too-small-for-gpu"]


def test_advice_fires_when_most_kernels_ran_below_the_crossover():
    table = table_from_records(kernels("row_softmax", [8 << 10] * 7 + [16 << 20] * 3))
    found = small_advice(table, {0: {"row_softmax": POINT}})
    assert len(found) == 1
    message = found[0].message
    assert "7 of 10 softmax kernels (row_softmax)" in message
    assert "below 1,048,576 elements" in message and "4,194,304 elements counting the copies" in message
    assert summarize(table).advice == []  # no crossover known: no such advice


def test_advice_stays_quiet_when_most_kernels_ran_above():
    table = table_from_records(kernels("row_softmax", [8 << 10] * 5 + [16 << 20] * 5 + [0] * 9))
    assert small_advice(table, {0: {"row_softmax": POINT}}) == []  # half below is not most; bytes 0: size unknown


def test_advice_only_for_the_device_and_kernels_it_was_measured_for():
    table = table_from_records(kernels("row_softmax", [1024] * 4, device=1) + kernels("other", [1024] * 4))
    assert small_advice(table, {0: {"row_softmax": POINT}}) == []
    found = small_advice(table, {1: {"row_softmax": POINT}})
    assert [a.device for a in found] == [1]


def test_advice_where_the_device_never_won():
    never = CrossoverPoint("matmul", "matmul_tiled", bytes=12 * 256 * 256 + 1, size=None, unit="n", largest=256)
    table = table_from_records(kernels("matmul_tiled", [12 * 64 * 64] * 3))
    (advice,) = small_advice(table, {0: {"matmul_tiled": never}})
    assert "3 of 3 matmul kernels" in advice.message and "did not beat NumPy" in advice.message
    assert "up to n = 256" in advice.message


def test_library_kernels_record_their_bytes_and_the_cache_feeds_the_advice(cpu):
    x = np.ones((4, 256), np.float32)
    with gw.trace() as t:
        lib.softmax(x, device=cpu)
        lib.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32), device=cpu)
    table = t.table()
    kernel = table["kind"] == 4
    assert dict(zip(table["name"][kernel], table["bytes"][kernel].tolist())) == {
        "row_softmax": 8 * x.size,
        "matmul_tiled": 12 * 64,
    }
    assert crossover_cache.cached_crossovers(t) == {}  # nothing measured yet
    gw.crossover(["softmax", "matmul"], device=cpu, sizes={"softmax": [1024, 4096], "matmul": [8, 16]}, repeats=1)
    points = crossover_cache.cached_crossovers(t)
    assert set(points[0]) == {"row_softmax", "matmul_tiled"}
    codes = [a.code for a in summarize(table, crossover=points).advice]
    # the CPU backend runs kernels as NumPy code plus a launch: it never beats NumPy itself, so the advice fires
    assert points[0]["row_softmax"].size is None and codes.count("too-small-for-gpu") == 2
    assert [a.code for a in t.summary().advice].count("too-small-for-gpu") == 2  # the trace's own summary reads it
    assert crossover_cache.cached_result(cpu).ops == ["matmul", "softmax"]  # the library's order


def test_crossover_of_another_dtype_is_cached_apart_and_feeds_the_advice(cpu, cache):
    """``dtype="int32"``: int32 inputs, the int64 sum NumPy gives, the kernel named with its type, bytes of 4-byte
    elements and 8-byte sums, cached under "sum:int32" beside float32's "sum"."""
    ints = gw.crossover("sum", device=cpu, sizes=[256, 2048], repeats=1, dtype="int32")
    floats = gw.crossover("sum", device=cpu, sizes=[256, 2048], repeats=1)
    assert ints.dtype == "int32" and floats.dtype == "float32" and not ints.warnings
    assert ints.kernels == {"sum": "row_sum_i32"} and floats.kernels == {"sum": "row_sum"}
    rows = crossover_ops.row_shape(2048)[0]
    assert [r["bytes"] for r in ints.rows] == [4 * 256 + 8, 4 * 2048 + 8 * rows]
    assert "crossover on cpu:0 (" in str(ints) and ", int32" in str(ints)
    ops = json.loads((cache / crossover_cache.CACHE_FILE).read_text())["devices"]
    assert set(next(iter(ops.values()))["ops"]) == {"sum", "sum:int32"}
    assert crossover_cache.cached_result(cpu, "sum", dtype="int32").rows == ints.rows
    with gw.trace() as t:
        lib.sum(np.ones((2, 256), np.int32), axis=-1, device=cpu)
    assert set(crossover_cache.cached_crossovers(t)[0]) == {"row_sum", "row_sum_i32"}
    half = gw.crossover("softmax", device=cpu, sizes=[1024], repeats=1, dtype=np.float16)
    assert half.kernels == {"softmax": "row_softmax_f16"} and half.rows[0]["bytes"] == 2 * 2 * 1024
    assert not half.warnings  # checked against NumPy in float64: float16's own sums would be off


def test_a_dtype_an_op_does_not_take_is_named(cpu):
    with pytest.raises(gw.InvalidArgument, match="crossover: softmax does not take int32; it takes float16, bfloat16"):
        gw.crossover(["sum", "softmax"], device=cpu, dtype="int32")
