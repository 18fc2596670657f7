"""NVIDIA compute-sanitizer on the workbench's generated CUDA: a racy shared-memory kernel is caught by racecheck,
its barriered twin passes racecheck and synccheck, and memcheck finds nothing in a library call. GPU machine only;
skipped where compute-sanitizer or a CUDA device is missing. ``scripts/sanitize.sh`` runs whole test files so."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, open_device

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).parent / "sanitize" / "racy.py"


def _sanitizer() -> str:
    found = shutil.which("compute-sanitizer") or next(
        (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"))), None
    )
    if found is None:
        pytest.skip("compute-sanitizer is not installed (it ships with the CUDA toolkit)")
    open_device("cuda")  # skips without a CUDA device
    return found


def _run(tool: str, *args: str) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [_sanitizer(), "--tool", tool, "--error-exitcode", "9", sys.executable, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    return done.returncode, done.stdout + done.stderr


def _errors(report: str) -> int:
    """Errors in the summary: "ERROR SUMMARY: N errors", or racecheck's "RACECHECK SUMMARY: H hazards displayed
    (N errors, W warnings)"."""
    found = re.search(r"ERROR SUMMARY: (\d+) error", report) or re.search(
        r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", report
    )
    assert found, f"no sanitizer summary in:\n{report[-2000:]}"
    return int(found.group(1))


def test_racecheck_catches_the_racy_kernel():
    code, report = _run("racecheck", str(SCRIPT), "racy")
    assert "launched racy" in report
    assert _errors(report) > 0 and code == 9, report[-2000:]
    assert re.search(r"(Race reported|hazard)", report, re.IGNORECASE), report[-2000:]


@pytest.mark.parametrize("tool", ["racecheck", "synccheck", "memcheck"])
def test_the_barriered_kernel_is_clean(tool):
    code, report = _run(tool, str(SCRIPT), "clean")
    assert "launched clean" in report
    assert _errors(report) == 0 and code == 0, report[-2000:]


def test_memcheck_finds_nothing_in_a_library_matmul():
    program = (
        "import numpy as np, gpuworkbench as gw\n"
        "a = np.random.default_rng(0).random((67, 45), dtype=np.float32)\n"
        "b = np.random.default_rng(1).random((45, 71), dtype=np.float32)\n"
        "for method in ('naive', 'tiled'):\n"
        "    c = gw.library.matmul(a, b, device='cuda:0', method=method)\n"
        "    assert np.allclose(c, a @ b, rtol=1e-4, atol=1e-4)\n"
    )
    _memcheck_clean(program)


def test_memcheck_finds_nothing_in_the_persistent_kernel():
    """Its commands on a buffer allocated before it starts and on one allocated while it runs (from the arena made
    before its launch: see docs/architecture.md)."""
    program = (
        "import numpy as np, gpuworkbench as gw\n"
        "dev = gw.Device('cuda:0')\n"
        "buf = dev.alloc(1000, 'float32')\n"
        "buf.copy_from_host(np.arange(1000, dtype=np.float32))\n"
        "pk = dev.persistent()\n"  # under memcheck it runs many times slower: generous timeouts
        "assert pk.call('echo', 1.5, 2.25, timeout_s=120) == 3.75\n"
        "assert pk.call('sum', buf, timeout_s=120) == 499500.0\n"
        "pk.call('scale', buf, 2.0, n=10, timeout_s=120)\n"
        "assert pk.call('sum', buf, n=10, timeout_s=120) == 90.0\n"
        "later = dev.alloc(4096, 'int64')\n"  # while it runs: a piece of its arena
        "later.copy_from_host(np.arange(4096, dtype=np.int64))\n"
        "assert pk.call('sum', later, timeout_s=120) == 4096 * 4095 // 2\n"
        "pk.stop(timeout_s=120)\n"
        "buf.free()\n"
        "later.free()\n"
    )
    _memcheck_clean(program)


def _memcheck_clean(program: str) -> None:
    """Run ``program`` under memcheck: it must reach its end and memcheck must report no error."""
    code, report = _run("memcheck", "-c", program + "print('program done')\n")
    assert "program done" in report
    assert _errors(report) == 0 and code == 0, report[-2000:]
