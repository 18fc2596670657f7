"""The tutorial notebooks as tests: nbval runs each one top to bottom as part of the one test command (``./run test``).

Lax mode: every cell must run without an error, and only cells marked ``# NBVAL_CHECK_OUTPUT`` (whose output is the
same on every machine) must reproduce the output stored with them; clearing a notebook's outputs turns those checks
off rather than failing them. The kernel runs in this interpreter's environment, so the notebooks test the code under
test. Without nbval (``pip install -r binder/requirements.txt`` plus the ``dev`` extra bring it) they are not collected,
and the header says so.
"""

from __future__ import annotations

import os
import tempfile

import pytest

# Mesa's Vulkan loader (WebGPU on lavapipe) warns about a missing XDG_RUNTIME_DIR; the notebooks' kernels inherit this.
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="gpuwb-xdg-"))
# gw.crossover's results go to a cache of this run, not the user's (notebook 11 measures a few small sizes).
os.environ.setdefault("GPUWB_CACHE_DIR", tempfile.mkdtemp(prefix="gpuwb-cache-"))


def pytest_configure(config: pytest.Config) -> None:
    option = config.option
    if not hasattr(option, "nbval_lax"):
        return
    if not option.nbval:  # a strict --nbval given on the command line wins
        option.nbval_lax = True
    if not option.nbval_kernel_name:
        option.nbval_current_env = True


def pytest_report_header(config: pytest.Config) -> str:
    if not hasattr(config.option, "nbval_lax"):
        return "notebooks: not run, nbval is not installed (pip install -e '.[dev]')"
    return "notebooks: run by nbval in lax mode, in this environment's kernel"
