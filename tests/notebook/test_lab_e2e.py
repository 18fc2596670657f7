"""End to end: the GPU Workbench panel in a real JupyterLab, driven by headless Chromium through Playwright.

Starts ``jupyter-lab`` on a free port with a token and a temporary notebook folder, with the freshly built extension
(``extension/labextension``) first on its labextensions path; opens a notebook, loads gpuworkbench in the kernel, runs
``%%gpu`` cells on the CPU backend (the second with ``--counters``), then checks the panel's device (with memory
pushed while a cell runs), its traces (the second with its counters' summary) and that clicking a trace opens the
timeline tab. Skips, saying why, without Chromium, Playwright, jupyter-lab or a built extension.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_browser import chromium_page, notebook, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

from support import ROOT  # noqa: E402

EXTENSION = ROOT / "extension" / "labextension"
TRACED_CELL = """\
%%gpu
import numpy as np
import gpuworkbench as gw
scale_add = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
dev = gw.Device("cpu")
host = np.ones(1 << 16, np.float32)
x, y = dev.alloc(1 << 16), dev.alloc(1 << 16)
x.copy_from_host(host)
scale_add(x, y).wait()
out = y.copy_to_host()"""
#: A second traced cell, with counters (sampled at 10 Hz over its 0.3 s): the panel then offers to compare it with the
#: first, and shows its counters' summary under its figures.
SECOND_CELL = """\
%%gpu --counters
import time
x.copy_from_host(host)
out = x.copy_to_host()
time.sleep(0.3)"""
#: Holds 48 MiB for 3 s, then frees it: the panel can only show that figure while the cell is still running.
BUSY_CELL = """\
import time
held = [dev.alloc(16 << 20, "uint8") for _ in range(3)]
time.sleep(3)
for buf in held:
    buf.free()"""
TIMEOUT_MS = 90_000
#: A folder to save screenshots of the panel and the timeline in (to look at them), e.g. GPUWB_E2E_SHOTS=/tmp/shots.
SHOTS = os.environ.get("GPUWB_E2E_SHOTS")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A running JupyterLab (base URL, token) serving a notebook folder with ``gpu.ipynb``; stopped afterwards."""
    if not (EXTENSION / "package.json").exists():
        pytest.skip("the extension is not built: run `npm install && npm run build` in extension/ (./run test does)")
    nb = notebook("%load_ext gpuworkbench", TRACED_CELL, SECOND_CELL, BUSY_CELL)
    with running_lab(
        tmp_path_factory.mktemp("lab"),
        {"gpu.ipynb": nb},
        extensions={"gpuworkbench": EXTENSION},  # first on the path: this build wins over an installed copy
        args=["--LabApp.expose_app_in_browser=True"],
    ) as served:
        yield served


@pytest.fixture(scope="module")
def page() -> Iterator:
    """A Playwright page in the system Chromium, with the extension's console warnings collected on ``page.notes``."""
    with chromium_page() as page:
        page.notes = []
        page.on(
            "console",
            lambda m: (
                page.notes.append(m.text) if "gpuworkbench" in m.text and m.type in ("warning", "error") else None
            ),
        )
        page.on("pageerror", lambda e: page.notes.append(f"page error: {e}"))
        yield page


def test_panel_shows_device_and_trace_and_opens_timeline(
    page, lab: tuple[str, str]
) -> None:  # browser first: skips sooner
    from playwright.sync_api import expect

    url, token = lab
    page.goto(f"{url}/lab/tree/gpu.ipynb?token={token}")
    expect(page.locator(".jp-NotebookPanel")).to_be_visible(timeout=TIMEOUT_MS)

    page.locator('.lm-TabBar-tab[data-id="gpuworkbench-panel"]').click()
    panel = page.locator("#gpuworkbench-panel")
    expect(panel).to_be_visible()
    # Before %load_ext the panel says how to load gpuworkbench (once the kernel is up and answered).
    expect(panel.locator(".jp-gpuwb-notice")).to_contain_text("not loaded in this kernel", timeout=TIMEOUT_MS)
    expect(panel.locator(".jp-gpuwb-code")).to_have_text("%load_ext gpuworkbench")

    page.evaluate("void window.jupyterapp.commands.execute('notebook:run-all-cells')")  # not awaiting the cells

    device = panel.locator('.jp-gpuwb-device[data-device-id="cpu:0"]')
    expect(device).to_be_visible(timeout=TIMEOUT_MS)
    # Memory is pushed from a kernel thread while a cell runs: the 48 MiB the last cell holds for 3 s shows up.
    # The cells before it may take a while on a slow machine: wait for its window as long as for the rest.
    expect(device.locator(".jp-gpuwb-memory")).to_contain_text(re.compile(r"48\.\d MiB used of"), timeout=TIMEOUT_MS)
    traces = panel.locator(".jp-gpuwb-trace[data-trace-id]")
    expect(traces).to_have_count(2, timeout=TIMEOUT_MS)
    # The cell's execution count, as %%gpu recorded it.
    expect(traces.first.locator(".jp-gpuwb-trace-cell")).to_have_text(re.compile(r"^\[\d+\]$"))
    # The newest trace recorded counters: per device their means and peaks, and what sampled them; the first none.
    host = traces.first.locator('.jp-gpuwb-trace-counter[data-device="host"]')
    expect(host).to_have_text(re.compile(r"^host \(psutil, 10 Hz\): host CPU [\d.]+ % of all cores \(peak [\d.]+ %\)"))
    expect(host).to_contain_text(re.compile(r"process RSS [\d.]+ [MG]iB \(peak [\d.]+ [MG]iB\)"))
    assert "psutil, 10 Hz" in host.get_attribute("title")
    cpu = traces.first.locator('.jp-gpuwb-trace-counter[data-device="cpu:0"]')
    expect(cpu).to_have_text("cpu:0: the host's counters")  # why, on hover
    assert "the CPU backend runs on the host's cores" in cpu.get_attribute("title")
    expect(traces.last.locator(".jp-gpuwb-trace-counters")).to_have_count(0)

    traces.first.locator(".jp-gpuwb-trace-cell").click()  # the row, not one of its buttons
    tab = page.locator(".jp-gpuwb-TimelineTab")
    expect(tab).to_be_visible(timeout=TIMEOUT_MS)
    # Bokeh draws inside shadow DOM in the sandboxed iframe: Playwright's locators pierce both.
    canvas = page.frame_locator(".jp-gpuwb-TimelineTab iframe").locator(".bk-Canvas").first
    expect(canvas).to_be_attached(timeout=TIMEOUT_MS)
    expect(
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=re.compile(r"Timeline: cell \[\d+\]"))
    ).to_be_visible()
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        # Room for the source views (cell and tab) side by side: a wider page, the file browser folded away.
        page.set_viewport_size({"width": 1920, "height": 1000})
        page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
        page.wait_for_timeout(1500)  # let Bokeh finish drawing
        page.screenshot(path=str(Path(SHOTS) / "light.png"))
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_timeout(5000)
        page.screenshot(path=str(Path(SHOTS) / "dark.png"))
    # "Compare with…" on the newest trace: a tab with both timelines and the table of what changed.
    expect(traces.last.locator(".jp-gpuwb-compare")).to_have_count(0)  # the oldest has nothing before it
    traces.first.locator(".jp-gpuwb-compare").click()
    expect(
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=re.compile(r"Compare: cell \[\d+\].* → cell"))
    ).to_be_visible(timeout=TIMEOUT_MS)
    compared = page.frame_locator(".jp-gpuwb-TimelineTab iframe").last
    expect(compared.get_by_text("wall time").first).to_be_attached(timeout=TIMEOUT_MS)
    assert page.notes == [], f"the extension warned in the browser console: {page.notes}"
