"""End to end: a ``%%gpu`` timeline and a ``%gpu live`` dashboard in a real JupyterLab, in headless Chromium.

Starts ``jupyter-lab`` on a free port with a token and a temporary notebook folder, opens a notebook that loads
gpuworkbench, traces a ``%%gpu`` cell on the CPU backend, starts ``%gpu live`` and then runs a ~8 s loop of copies and
small kernels. Checks that the traced cell rendered a Bokeh timeline, that the live dashboard's numbers changed
in the browser while the loop cell was still running (its prompt still ``[*]``): pushed from the kernel, not polled,
and that tapping a line of the traced cell's source view picks out that line's spans on its timeline.
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
s = dev.create_stream()
scale_add = gw.elementwise("float32 x, float32 y", "y = 2*x + 1", name="scale_add")
a, b = dev.alloc(1 << 20), dev.alloc(1 << 20)
a.copy_from_host(np.ones(1 << 20, np.float32))
for _ in range(4):
    scale_add(a, b).wait()
result = b.copy_to_host()
inputs = [np.full(1 << 20, i, np.float32) for i in range(8)]
outputs = [np.empty(1 << 20, np.float32) for _ in range(8)]
with gw.Pipeline(dev, lambda x, y, st: scale_add(x, y, stream=st), depth=3) as pipe:
    pipe.run(inputs, outputs)"""
#: The traced cell's kernel line run in a loop (its number in the cell's body, after the magic's line) and its spans.
TAPPED_LINE, TAPPED_SPANS = 9, 4
#: The traced cell's statistics: kernels by time, copies by direction and host memory.
STATS_CELL = "traced.statistics()"
LIVE_CELL = "%gpu live"
LOOP_SECONDS = 15.0  # long enough for two reads READ_GAP_S apart on a slow, shared machine
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
    """A Playwright page in the system Chromium; for screenshots, tall enough that each cell's output fits whole."""
    with chromium_page({"width": 1500, "height": 2400} if SHOTS else None) as page:
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


#: The traced cell's source view, from the page's Bokeh documents: each line's row (y) and number, the picked lines,
#: and how many spans of the timeline are picked out.
SOURCE_PICKS = """() => {
  for (const doc of window.Bokeh?.documents ?? []) {
    const rows = doc.get_model_by_name("source rows")
    if (rows == null) continue
    const spans = doc.get_model_by_name("spans").data_source
    return {y: Array.from(rows.data.y), line: Array.from(rows.data.line),
            picked: rows.selected.indices.map((i) => rows.data.line[i]), spans: spans.selected.indices.length}
  }
  return null
}"""
#: Blur what has the keyboard focus, through shadow roots (Bokeh draws inside them).
BLUR = """() => {
  let el = document.activeElement
  while (el?.shadowRoot?.activeElement) el = el.shadowRoot.activeElement
  el?.blur()
}"""
#: How far below its canvas's top the timeline's time axis (with its label) ends: the legends come after it.
AXIS_BOTTOM = """() => {
  for (const doc of window.Bokeh?.documents ?? []) {
    if (doc.get_model_by_name("source rows") == null) continue
    const plot = Bokeh.index.find_one(doc.get_model_by_name("spans"))?.parent
    const axes = (plot?.model.below ?? []).filter((m) => "axis_label" in m).map((m) => Bokeh.index.find_one(m))
    return axes.length ? Math.max(...axes.map((v) => v.bbox.bottom)) : null
  }
  return null
}"""


def _tap_line(page, view, line: int) -> dict:
    """Tap ``line`` of the cell in the source view (``view``: its Bokeh canvas); returns the picks afterwards."""
    from gpuworkbench.viz.source_view import BORDER_PX, ROW_PX, TITLE_PX

    rows = page.evaluate(SOURCE_PICKS)
    assert rows is not None, "no source view in the page's Bokeh documents"
    assert line in rows["line"], f"line {line} is not in the source view: {rows['line']}"
    row = rows["y"][rows["line"].index(line)]
    box = view.bounding_box()
    frame_top = box["y"] + TITLE_PX - BORDER_PX  # the rows start under the title
    page.mouse.click(box["x"] + 60, frame_top + (row + 0.5) * ROW_PX)
    page.mouse.move(0, 0)  # no tooltip over the picture
    page.evaluate(BLUR)  # nor the focus ring the tap left around the view
    page.wait_for_timeout(500)
    return page.evaluate(SOURCE_PICKS)


def test_traced_timeline_and_live_dashboard_update_while_cell_runs(page, lab: tuple[str, str]) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
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
        try:  # the dashboard redraws its numbers: one may be gone between count() and the read
            text = numbers.first.inner_text(timeout=1_000) if numbers.count() else ""
        except PlaywrightTimeout:
            text = ""
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
    if SHOTS:  # the dashboard mid-loop
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        live.screenshot(path=str(Path(SHOTS) / "live-dashboard.png"))
    # The live timeline is a rendered Bokeh canvas too.
    expect(live.locator(".jp-OutputArea .bk-Canvas").first).to_be_attached()

    # And the loop cell does finish, with no error.
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=TIMEOUT_MS)
    expect(loop.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")).to_have_count(0)

    # Above the %%gpu cell's timeline, the source view: tapping the loop's kernel line picks out its kernels' spans.
    output = traced.locator(".jp-OutputArea")
    if SHOTS:  # before anything is picked
        output.screenshot(path=str(Path(SHOTS) / "timeline.png"))
        stats.locator(".jp-OutputArea").screenshot(path=str(Path(SHOTS) / "statistics.png"))
    canvases = output.locator(".bk-Canvas")
    view, timeline = canvases.nth(0), canvases.nth(1)  # the source view comes first, then the timeline
    view.scroll_into_view_if_needed()
    picks = _tap_line(page, view, TAPPED_LINE)
    assert picks["picked"] == [TAPPED_LINE], f"tapping line {TAPPED_LINE} picked {picks['picked']}"
    assert picks["spans"] == TAPPED_SPANS, f"line {TAPPED_LINE} picked out {picks['spans']} spans, not {TAPPED_SPANS}"
    if SHOTS:  # the source view and the timeline, with the tapped line's spans picked out
        top, bottom = view.bounding_box(), timeline.bounding_box()
        axis = page.evaluate(AXIS_BOTTOM)  # down to the time axis; without it, the whole canvas (legends too)
        end = bottom["y"] + (axis + 6 if axis else bottom["height"])
        left = output.bounding_box()["x"]
        clip = {"x": left, "y": top["y"] - 4, "width": bottom["x"] + bottom["width"] - left + 40}
        clip["height"] = end - clip["y"]
        page.screenshot(path=str(Path(SHOTS) / "source-lines.png"), clip=clip)
