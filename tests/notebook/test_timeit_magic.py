"""``%gpu timeit`` and ``%%gpu timeit`` through IPython's InteractiveShell on the CPU backend: the table printed, ``-o``
storing the result, options reaching ``gw.timeit``, usage errors as one line."""

from __future__ import annotations

import pytest

pytest.importorskip("IPython")

from gpuworkbench.notebook import timeit_magic  # noqa: E402
from gpuworkbench.trace import recorder  # noqa: E402
from gpuworkbench.trace.timeit_result import Timing  # noqa: E402

SETUP = """\
import numpy as np
import gpuworkbench as gw
dev = gw.Device("cpu")
a, b = dev.alloc(1 << 16), dev.alloc(1 << 16)
h = np.ones(1 << 16, np.float32)
k = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
"""
QUICK = "--warmup 1 --budget 0.1"


@pytest.fixture
def ns(shell):
    """The shell with ``SETUP`` run (a CPU device, two buffers, a kernel) and ``%gpu use cpu``; buffers freed after."""
    shell.run_cell(SETUP)
    shell.run_line_magic("gpu", "use cpu")
    yield shell
    shell.user_ns["dev"].synchronize()
    for name in ("a", "b"):
        shell.user_ns[name].free()


def test_line_magic_prints_the_table_and_stores_the_result(ns, capsys):
    ns.run_line_magic("gpu", f"timeit {QUICK} -o r k(a, b)")
    out = capsys.readouterr().out
    assert "timeit k(a, b) on cpu:0" in out
    assert "device time" in out and "host time" in out and "scale_add" in out
    result = ns.user_ns["r"]
    assert isinstance(result, Timing)
    assert result.kernels["scale_add"].per_call == 1 and result.device_time_ns > 0
    assert result.statement == "k(a, b)"


def test_cell_magic_times_the_cell(ns, capsys):
    ns.run_cell_magic("gpu", f"timeit {QUICK} -o r2", "k(a, b)\na.copy_from_host(h)\n")
    out = capsys.readouterr().out
    assert "timeit k(a, b) … on cpu:0" in out
    result = ns.user_ns["r2"]
    assert set(result.kernels) == {"scale_add"}
    assert [op.kind for op in result.copies.values()] == ["h2d"]


def test_options_reach_timeit(ns, capsys):
    ns.run_line_magic("gpu", f"timeit {QUICK} --flush-l2 --graph -o r3 k(a, b)")
    result = ns.user_ns["r3"]
    assert set(result.kernels) == {"timeit/scale_add"}  # replayed from the recorded graph
    notes = " ".join(result.notes)
    assert "L2 flushed" in notes and "no native graphs" in notes
    assert result.warmup == 1


def test_names_the_statement_assigns_stay_its_own(ns):
    ns.run_line_magic("gpu", f"timeit {QUICK} kept_local = k(a, b)")
    assert "kept_local" not in ns.user_ns


def test_an_error_in_the_statement_propagates_and_the_trace_stops(ns):
    with pytest.raises(NameError):
        ns.run_line_magic("gpu", f"timeit {QUICK} no_such_name(a)")
    assert recorder.active() == []


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("timeit --budget k(a, b)", None, "--budget takes a number"),
        ("timeit --budget 0 k(a, b)", None, "budget_s"),
        ("timeit --frobnicate k(a, b)", None, "unknown option --frobnicate"),
        ("timeit -o 1x k(a, b)", None, "-o takes a Python name"),
        ("timeit --warmup 1", None, "give a statement"),
        ("timeit k(a, b)", "k(a, b)", "the cell is the statement"),
        ("timeit k(a,", None, "does not parse"),
    ],
)
def test_usage_errors_are_one_line_not_a_traceback(ns, capsys, line, cell, message):
    if cell is None:
        ns.run_line_magic("gpu", line)
    else:
        ns.run_cell_magic("gpu", line, cell)
    captured = capsys.readouterr()
    assert message in captured.err
    assert "Traceback" not in captured.out + captured.err


def test_parse_keeps_the_statement_raw():
    options, statement = timeit_magic.parse("--warmup=3 --graph  -o res x = f('a  b', -1)")
    assert options == {"warmup": 3, "graph": True, "o": "res"}
    assert statement == "x = f('a  b', -1)"
