"""A real JupyterLab server and the system Chromium for the browser tests (``from lab_browser import ...``).

Shared by tests/notebook/test_lab_e2e.py (the side panel) and tests/viz/test_live_e2e.py (``%%gpu`` and
``%gpu live``): each starts its own server on a free port with a token and private folders, and skips, saying why,
where a piece is missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("GPUWB_CHROMIUM", "/usr/bin/chromium")
#: The flags that make the system Chromium work headless in a container without reaching the network.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def notebook(*sources: str) -> dict:
    """An nbformat-4 notebook of code cells with these sources."""
    cells = [
        {"cell_type": "code", "execution_count": None, "id": f"cell{i}", "metadata": {}, "outputs": [], "source": s}
        for i, s in enumerate(sources)
    ]
    kernelspec = {"display_name": "Python 3", "language": "python", "name": "python3"}
    return {"cells": cells, "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5}


def _jupyter_lab() -> str:
    """The jupyter-lab next to this Python (the venv's), else the one on PATH; skips the test without one."""
    beside = Path(sys.executable).with_name("jupyter-lab")
    found = str(beside) if beside.exists() else shutil.which("jupyter-lab")
    if found is None:
        pytest.skip("jupyter-lab is not installed (pip install jupyterlab, or ./run test)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_lab(
    base: Path, notebooks: dict[str, dict], extensions: dict[str, Path] | None = None, args: Sequence[str] = ()
) -> Iterator[tuple[str, str]]:
    """A JupyterLab serving ``notebooks`` (file name → notebook) from ``base``; yields (base URL, token), then stops it.

    ``extensions`` (name → built labextension folder) come first on the extension path, over any installed copy.
    """
    lab_exe = _jupyter_lab()
    folder, data, config, runtime = (base / d for d in ("notebooks", "data", "config", "runtime"))
    for path in (folder, data / "labextensions", config / "labconfig", runtime):
        path.mkdir(parents=True)
    for name, built in (extensions or {}).items():
        (data / "labextensions" / name).symlink_to(built, target_is_directory=True)
    # The news prompt is a toast that may cover what the test looks at: switch it off.
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    for name, nb in notebooks.items():
        (folder / name).write_text(json.dumps(nb))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_PATH=str(data),
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(runtime),
        XDG_RUNTIME_DIR=str(runtime),
        BOKEH_RESOURCES="inline",  # offline: BokehJS from the output itself, never from a CDN
        GPUWB_DEVICE="cpu",
    )
    command = [
        lab_exe,
        "--allow-root",
        "--ServerApp.open_browser=False",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={folder}",
        *args,
    ]
    log = (base / "lab.log").open("wb")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"jupyter-lab did not start:\n{(base / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@contextmanager
def chromium_page(viewport: dict[str, int] | None = None) -> Iterator[Any]:
    """A Playwright page in the system Chromium; skips the test without Playwright or Chromium."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (./run test does)")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; ./run test does as root)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            context = browser.new_context(viewport=viewport or {"width": 1500, "height": 950})
            yield context.new_page()
        finally:
            browser.close()
