"""Fixtures shared by the tests: one parametrised ``device`` over every backend present, cpu/opencl, a gate, the
IPython ``shell`` with the extension loaded, and ``fake_cupti`` (a fresh CUPTI lifecycle on a fake libcupti).

The tests mirror the package, a folder per layer (core/, kernels/, flows/, library/, backends/, trace/ with
trace/cupti/, viz/, notebook/, dask/); test_layering.py reads the whole package. Plain helpers live in ``support.py``
(``from support import span``) and ``cupti_fakes.py``: test modules must not import from a conftest, whose module
name ``conftest`` other conftest files (notebooks/) share.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from cupti_fakes import fake_lifecycle
from support import BACKENDS, Gate, open_device, release_leftovers

import gpuworkbench as gw

# Trace.summary reads gw.crossover's cache for its advice: the tests see a cache of their own, empty at the start.
os.environ.setdefault("GPUWB_CACHE_DIR", tempfile.mkdtemp(prefix="gpuwb-cache-"))


@pytest.fixture(params=BACKENDS)
def device(request: pytest.FixtureRequest) -> Iterator[gw.Device]:
    """Each backend present, with nothing allocated on entry; a test that leaves a buffer behind fails on exit."""
    dev = open_device(request.param)
    release_leftovers(dev)
    assert dev.held_bytes == 0, f"{dev.spec} holds {dev.held_bytes} B before the test"
    yield dev
    if dev.closed:
        return
    leaked = release_leftovers(dev)
    assert not leaked, f"the test left {len(leaked)} live buffers on {dev.spec}"
    assert dev.held_bytes == 0


@pytest.fixture
def cpu() -> gw.Device:
    return open_device("cpu")


@pytest.fixture
def opencl() -> gw.Device:
    return open_device("opencl")


@pytest.fixture
def gate(cpu: gw.Device) -> Iterator[Gate]:
    with Gate(cpu) as g:
        yield g


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """IPython's InteractiveShell with ``%load_ext gpuworkbench``; after the test the magics' current device, live
    view and last bench, the traces' history and ``GPUWB_DEVICE`` are as they were."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    from gpuworkbench.notebook import history

    monkeypatch.delenv("GPUWB_DEVICE", raising=False)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpuworkbench")
    yield ip
    magics = ip.magics_manager.registry["GpuMagics"]
    if magics.live is not None:
        magics.live.stop()
    magics.device, magics.live, magics.last_bench = None, None, None
    history.history.clear()


@pytest.fixture(autouse=True)
def _cupti_outside_notebooks() -> Iterator[None]:
    """``%load_ext`` (run by the magics tests' shell) marks the process as a notebook for CUPTI's lifetime: the mark
    is taken off after each test, so that the tests after it see a script's CUPTI."""
    from gpuworkbench.trace import cupti

    yield
    cupti.set_notebook(False)


@pytest.fixture
def fake_cupti(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fresh CUPTI lifecycle on a fake libcupti and cupti-python (tests/cupti_fakes.py): runs without a GPU."""
    yield from fake_lifecycle(monkeypatch)
