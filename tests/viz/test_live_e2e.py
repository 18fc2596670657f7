"""End to end: a ``%%gpu`` timeline and a ``%gpu live`` dashboard in a real JupyterLab, in headless Chromium.

Starts ``jupyter-lab`` on a free port with a token and a temporary notebook folder, opens a notebook that loads
gpuworkbench, traces a ``%%gpu`` cell on the CPU backend, starts ``%gpu live`` and then runs a ~8 s loop of copies and
small kernels. Checks that the traced cell rendered a Bokeh timeline, and that the live dashboard's numbers changed
in the browser while the loop cell was still running (its prompt still ``[*]``): pushed from the kernel, not polled.
Skips, saying why, without Chromium, Playwright or jupyter-lab. Needs no built JupyterLab extension.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_browser import chromium_page, notebook, running_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TRACED_CELL = """\
%%gpu -o traced
import gpuworkbench as gw
import numpy as np
dev = gw.Device('cpu')
b = dev.alloc(1 << 20)
s = dev.create_stream()
scale_add = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
inputs = [np.full(1 << 20, i, np.float32) for i in range(8)]
outputs = [np.empty(1 << 20, np.float32) for _ in range(8)]
with gw.Pipeline(dev, lambda x, y, st: scale_add(x, y, stream=st), depth=3) as pipe:
    pipe.run(inputs, outputs)"""
#: The traced cell's statistics: kernels by time, copies by direction and host memory.
STATS_CELL = "traced.statistics()"
LIVE_CELL = "%gpu live"
LOOP_SECONDS = 8.0
#: Copies and small kernels for LOOP_SECONDS: the live dashboard has to follow them while this cell runs.
LOOP_CELL = f"""\
import time
y = dev.alloc(1 << 20)
host = np.ones(1 << 20, np.float32)
end = time.monotonic() + {LOOP_SECONDS}
while time.monotonic() < end:
    b.copy_from_host_async(host, s).wait()
    scale_add(b, y).wait()
    time.sleep(0.005)"""
TIMEOUT_MS = 90_000
#: How far apart (seconds) the two reads of the live numbers are.
READ_GAP_S = 2.0
#: A folder to save screenshots in (scripts/screenshots.sh uses it for the README), e.g. GPUWB_E2E_SHOTS=/tmp/shots.
SHOTS = os.environ.get("GPUWB_E2E_SHOTS")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A running JupyterLab (base URL, token) serving a notebook folder with ``live.ipynb``; stopped afterwards."""
    nb = notebook("%load_ext gpuworkbench", TRACED_CELL, STATS_CELL, LIVE_CELL, LOOP_CELL)
    with running_lab(tmp_path_factory.mktemp("live-lab"), {"live.ipynb": nb}) as served:
        yield served


@pytest.fixture(scope="module")
def page() -> Iterator:
    """A Playwright page in the system Chromium."""
    with chromium_page() as page:
        yield page


def _spans(text: str) -> int:
    """The span count at the head of the live dashboard's numbers ("1,234 spans · ...")."""
    match = re.search(r"([\d,]+)\s+spans\b", text)
    assert match, f"no span count in the live dashboard's numbers: {text!r}"
    return int(match.group(1).replace(",", ""))


def _run_all_cells(page, cells) -> None:
    """Run All Cells from the Run menu ("Run All Cells" has no default shortcut).

    Under load the menu command can find no current notebook yet and do nothing; a queued cell shows ``[*]`` at once,
    so try again (focusing the notebook first) until the first cell has left ``[ ]``.
    """
    from playwright.sync_api import expect

    first_prompt = cells.first.locator(".jp-InputArea-prompt")
    for attempt in range(4):
        first_prompt.click()  # make this notebook the current widget
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
        try:
            expect(first_prompt).not_to_have_text(re.compile(r"\[ \]"), timeout=5_000)
            return
        except AssertionError:
            if attempt == 3:
                raise
            page.keyboard.press("Escape")  # close the menu if it is still open


def test_traced_timeline_and_live_dashboard_update_while_cell_runs(page, lab: tuple[str, str]) -> None:
    from playwright.sync_api import expect

    url, token = lab
    page.goto(f"{url}/lab/tree/live.ipynb?token={token}")
    notebook = page.locator(".jp-NotebookPanel .jp-Notebook")
    expect(notebook).to_be_visible(timeout=TIMEOUT_MS)
    cells = notebook.locator(".jp-Cell")
    expect(cells).to_have_count(5, timeout=TIMEOUT_MS)
    # Run All before the kernel is connected is silently lost: wait for the toolbar's kernel status to read idle.
    expect(page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_attached(
        timeout=TIMEOUT_MS
    )

    _run_all_cells(page, cells)

    # The %%gpu cell shows a rendered Bokeh timeline (locators pierce Bokeh's shadow DOM).
    traced, stats, live, loop = cells.nth(1), cells.nth(2), cells.nth(3), cells.nth(4)
    expect(traced.locator(".jp-OutputArea .bk-Canvas").first).to_be_attached(timeout=TIMEOUT_MS)
    # The statistics of the pipeline: its one kernel by name, and the copies both ways.
    expect(stats.locator(".jp-OutputArea")).to_contain_text("scale_add", timeout=TIMEOUT_MS)
    expect(stats.locator(".jp-OutputArea")).to_contain_text("h2d")

    # While the loop cell has not finished (its prompt still [*]), the dashboard's span count grows: two reads
    # READ_GAP_S apart, each taken before the prompt was seen still running. Polled, so a slow page loses nothing.
    numbers = live.locator(".gpuworkbench-live")
    prompt = loop.locator(".jp-InputArea-prompt")
    samples: list[tuple[float, str]] = []  # (when, numbers) read while the loop cell was still running
    first: tuple[float, str] | None = None
    changed = None
    state = ""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while changed is None and time.monotonic() < deadline:
        text = numbers.first.inner_text(timeout=1_000) if numbers.count() else ""
        when = time.monotonic()
        state = prompt.inner_text()
        if re.search(r"\[\d+\]", state):
            break  # the loop cell finished
        if "[*]" in state and re.search(r"[1-9][\d,]*\s+spans", text):
            samples.append((when, text))
            if first is None:
                first = (when, text)
            elif when - first[0] >= READ_GAP_S and _spans(text) > _spans(first[1]):
                changed = (when, text)
        page.wait_for_timeout(250)
    assert first is not None, f"the live dashboard showed no spans while the loop cell ran (prompt {state!r})"
    assert changed is not None, (
        f"the live dashboard did not change {READ_GAP_S} s apart while the loop cell ran; "
        f"read {len(samples)} times: first {first[1]!r}, last {samples[-1][1]!r}"
    )
    assert changed[1] != first[1]
    if SHOTS:  # the dashboard mid-loop, and the %%gpu cell's timeline
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        live.screenshot(path=str(Path(SHOTS) / "live-dashboard.png"))
        traced.locator(".jp-OutputArea").screenshot(path=str(Path(SHOTS) / "timeline.png"))
        stats.locator(".jp-OutputArea").screenshot(path=str(Path(SHOTS) / "statistics.png"))
    # The live timeline is a rendered Bokeh canvas too.
    expect(live.locator(".jp-OutputArea .bk-Canvas").first).to_be_attached()

    # And the loop cell does finish, with no error.
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=TIMEOUT_MS)
    expect(loop.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")).to_have_count(0)
