"""A run of a million rows in the JupyterLab panel and under its cell, in a real JupyterLab in
headless Chromium.

The rows go through the kernel's real receiving path (:meth:`RunTracker.on_batch`, the function
the metrics receiver calls, then the run's publisher, the event bus and the lab comm) without
training a million steps: two ranks of 500,000 logged steps each, with a spike on one rank.
The cell shows the live view a ``%%distributed_fit`` cell shows (:class:`RunDisplay`, the
magic's own), then the run's static summary.  The panel gets a bounded number of rows per
update (the kernel thins them) and keeps a bounded number of points per line, and so does the
view under the cell; a click stays quick while the rows stream in; the summary stays small; a
reloaded page gets the downsampled curves, not every row (its time is printed beside
JupyterLab's own reload before the run); a drag across the chart is answered with that window at full
resolution from the kernel's history (on disk by then).  Times are printed, not asserted.
"""

from __future__ import annotations

import time

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    lab_page,
    lab_server,
    open_notebook,
    open_panel,
    reload_lab,
    run_cell,
    screenshot,
    screenshot_on_failure,
    widen_right_sidebar,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RANKS, STEPS = 2, 500_000
MAX_LINE_POINTS = 4000           # the panel's budget per line (src/m4.ts MAX_POINTS)
WINDOW_POINTS = 20_000           # what a zoomed chart asks for per line (src/panel/panel.ts)
SPIKE_STEP, SPIKE = 123_457, 5.0
FEED_TIMEOUT_MS = 900_000        # a million rows through the kernel and the comm on a busy machine

FEED = f"""import time
import numpy as np
import phalanx
from phalanx import events
from phalanx.fit.telemetry._record import RunRecord
from phalanx.fit.telemetry._tracker import RunTracker
from phalanx.widgets._display import RunDisplay

session = phalanx.get_session()
tracker = RunTracker("day-run-1", {RANKS}, {STEPS}, session.events.emit)
session.events.emit(events.run_started("day-run-1", {RANKS}, {STEPS}, "allreduce", name="day-long"))
session.fits.active = tracker
shown = RunDisplay(session, get_ipython())   # what the magic shows under the cell
shown.start(tracker, "day-long")
tracker.start()
began = time.perf_counter()
BATCH = 2_500
for start in range(0, {STEPS}, BATCH):
    steps = np.arange(start, start + BATCH)
    for rank in range({RANKS}):
        loss = 1.0 / (1.0 + steps / 1e4) + 0.1 * rank + 0.01 * np.sin(steps * 0.7 + rank)
        if rank == 1:
            loss[steps == {SPIKE_STEP}] = {SPIKE}
        rows = [[s, 1e9 + s * 0.05, {{"loss": v}}] for s, v in zip(steps.tolist(), loss.tolist())]
        tracker.on_batch({{"rank": rank, "step": start + BATCH - 1, "rows": rows}})
    time.sleep(0)   # the receiver thread yields between batches too
fed = time.perf_counter() - began
tracker.stop()      # publishes the rest, finishes the curves, moves the history to disk
session.events.emit(events.run_ended("day-run-1", "done", time.perf_counter() - began))
# The record a finished run leaves (as fit/run/_run.py makes it): the summary is drawn from it.
session.fits.last = RunRecord("day-run-1", "day-long", "done", {RANKS}, fed,
                              {{r: {STEPS} for r in range({RANKS})}}, tracker.history,
                              digest=tracker.digest)
summary = shown.finish()
if summary is not None:
    display(summary, metadata=summary.metadata)
print(len(tracker.history), round(fed, 1))"""

LOAD, FEED_CELL = range(2)

# One click on the log-scale box, timed in the page: from the click until the frame after the
# chart redrew (the panel redraws synchronously on a control's change).
TIME_CLICK = """async () => {
    const box = document.querySelector('#phalanx .jp-Phalanx-log');
    const chart = document.querySelector('#phalanx .jp-Phalanx-chart');
    const want = String(!box.checked);
    const t0 = performance.now();
    box.click();
    while (chart.dataset.log !== want) {
        await new Promise(r => setTimeout(r, 1));
    }
    await new Promise(r => requestAnimationFrame(() => r()));
    return performance.now() - t0;
}"""


def _chart(panel):
    return panel.locator(".jp-Phalanx-chart")


def _line_points(panel) -> int:
    return int(_chart(panel).get_attribute("data-line-points") or 0)


def _range(panel) -> tuple[int, int]:
    lo, hi = _chart(panel).get_attribute("data-range").split(",")
    return int(float(lo)), int(float(hi))


# The points of every line of the live view under the cell, as BokehJS holds them in the page.
CELL_VIEW_POINTS = """() => {
    const lines = [];
    for (const doc of (window.Bokeh && window.Bokeh.documents) || []) {
        for (const model of doc.all_models) {
            if (model.type === 'ColumnDataSource' && model.data.y !== undefined) {
                const y = Array.from(model.data.y);
                const x = Array.from(model.data.x);
                lines.push({n: y.length, max: y.length ? Math.max(...y) : null,
                            last: x.length ? x[x.length - 1] : null});
            }
        }
    }
    return lines;
}"""


def _cell_view_lines(page) -> list[dict]:
    return page.evaluate(CELL_VIEW_POINTS)


def _timed_click(page) -> float:
    return float(page.evaluate(TIME_CLICK))


def test_a_million_row_run_stays_bounded_quick_and_zoomable(lab_server, lab_page):
    page, step = lab_page, StepClock()
    write_notebook(lab_server.root / "day.ipynb", ["%load_ext phalanx", FEED])
    with screenshot_on_failure(page, "phalanx-history-failure.png"):
        open_notebook(page, lab_server, "day.ipynb")
        panel = open_panel(page)
        widen_right_sidebar(page, 200)
        run_cell(page, LOAD)
        panel.locator(".jp-Phalanx-status").filter(has_text="live").wait_for()
        step("phalanx loaded, panel live")
        # JupyterLab's own reload, before any run: what the reload with a run is compared to.
        began = time.perf_counter()
        reload_lab(page)
        print(f"\nreload before the run: JupyterLab back in {time.perf_counter() - began:.1f} s")
        panel = open_panel(page)
        panel.locator(".jp-Phalanx-status").filter(has_text="live").wait_for()
        step("page reloaded before the run")
        clicks, live_cell_points = _feed_while_clicking(page, panel)
        step("a million rows fed, the panel and the cell's view followed them")
        print(f"\nclick answered while rows streamed in: {', '.join(f'{c:.0f}' for c in clicks)} ms")
        _assert_bounded_whole_run(panel)
        _assert_cell_view_bounded(page, live_cell_points)
        screenshot(page, "phalanx-history-million.png")
        _zoom_shows_full_resolution(page, panel)
        step("zoomed window at full resolution")
        began = time.perf_counter()
        reload_lab(page)
        reloaded = time.perf_counter()
        panel = open_panel(page)
        page.wait_for_function(
            "() => Number(document.querySelector('#phalanx .jp-Phalanx-chart')"
            "?.dataset.linePoints || 0) > 0", timeout=hang_limit(120_000))
        shown = time.perf_counter()
        print(f"reload: JupyterLab back in {reloaded - began:.1f} s, the panel's curves "
              f"{shown - reloaded:.2f} s later")
        step("page reloaded")
        _assert_bounded_whole_run(panel)
        print(f"click answered after the reload: {_timed_click(page):.0f} ms")
        _zoom_shows_full_resolution(page, panel)
        step("zoomed again after the reload")


def _feed_while_clicking(page, panel) -> list[float]:
    """Start the feed, time clicks on the chart's controls while rows arrive, wait for the end."""
    page.evaluate(
        """() => {
            const nb = window.jupyterapp.shell.currentWidget;
            nb.content.activeCellIndex = 1;
            window.jupyterapp.commands.execute('notebook:run-cell');
        }""")
    page.wait_for_function(
        "() => Number(document.querySelector('#phalanx .jp-Phalanx-chart')"
        "?.dataset.linePoints || 0) > 0", timeout=FEED_TIMEOUT_MS)
    clicks, cell_points = [], []
    for _ in range(4):
        clicks.append(_timed_click(page))
        assert _line_points(panel) <= MAX_LINE_POINTS
        cell_points.extend(line["n"] for line in _cell_view_lines(page))
        page.wait_for_timeout(500)
    panel.locator("section[aria-label='Run'][data-status='done']").wait_for(timeout=FEED_TIMEOUT_MS)
    page.wait_for_function(
        """() => {
            const nb = window.jupyterapp.shell.currentWidget;
            const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
            return nb.content.widgets[1].model.executionCount !== null && kernel.status === 'idle';
        }""", timeout=FEED_TIMEOUT_MS)
    out = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets[1].model.outputs.toJSON()")
    text = "".join("".join(o.get("text", "")) for o in out if o.get("output_type") == "stream")
    assert text.split()[0] == str(RANKS * STEPS), f"the feed cell said {out!r}"
    print(f"\nkernel took {RANKS * STEPS} rows through on_batch in {text.split()[1]} s")
    if _chart(panel).get_attribute("data-log") == "true":
        _timed_click(page)   # back to a linear scale
    return clicks, cell_points


def _assert_cell_view_bounded(page, live_points: list[int]) -> None:
    """The view under the cell drew a bounded number of points per line while the rows came (a
    rank's line and the mean's: M4's budget, plus the bucket that was filling); the run's static
    summary, which takes its place at the end, is small."""
    # While rows came: whatever the view had drawn when sampled (BokehJS may still be loading).
    assert max(live_points, default=0) <= MAX_LINE_POINTS + 4, live_points
    # At the end the run's summary takes the view's place (the whole run's lines: the panel's,
    # checked by _assert_bounded_whole_run)
    html = page.evaluate(
        """() => window.jupyterapp.shell.currentWidget.content.widgets[1].model.outputs.toJSON()
                 .filter(o => o.data && o.data['text/html'])
                 .map(o => [].concat(o.data['text/html']).join(''))""")
    assert html and len(html[-1]) < 300_000, [len(h) for h in html]   # the summary: a small image
    print(f"view under the cell: at most {max(live_points, default=0)} points per line while rows "
          f"came; the summary's HTML {len(html[-1]) / 1e3:.0f} kB")


def _assert_bounded_whole_run(panel) -> None:
    """Every line of the whole run drawn with a bounded number of points; the last step and the
    spike (the maximum of rank 1's line) are there."""
    panel.page.wait_for_function(
        f"""() => document.querySelector('#phalanx .jp-Phalanx-chart')?.dataset.range
                  ?.endsWith(',{STEPS - 1}')""", timeout=hang_limit(120_000))
    points = _line_points(panel)
    assert 500 < points <= MAX_LINE_POINTS, points
    assert _range(panel) == (0, STEPS - 1)
    drawn = int(_chart(panel).get_attribute("data-points"))
    assert drawn <= (RANKS + 1) * MAX_LINE_POINTS   # x values of every line together
    peak = panel.page.evaluate(
        """() => {
            const chart = document.querySelector('#phalanx .jp-Phalanx-chart');
            return chart.dataset.max ? Number(chart.dataset.max) : null;
        }""")
    assert peak == SPIKE
    print(f"whole run drawn with {points} points per line at most ({drawn} x values)")


def _zoom_shows_full_resolution(page, panel) -> None:
    """Drag a few pixels across the plot: the kernel's answer has every step of that window."""
    over = _chart(panel).locator(".u-over")
    box = over.bounding_box()
    per_px = STEPS / box["width"]
    width_px = max(2, int(WINDOW_POINTS / per_px / 2))   # comfortably inside the window budget
    x0, y = box["x"] + box["width"] * 0.4, box["y"] + box["height"] / 2
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(x0 + width_px, y, steps=4)
    page.mouse.up()
    page.wait_for_function(
        "() => document.querySelector('#phalanx .jp-Phalanx-chart').hasAttribute('data-zoom')",
        timeout=hang_limit(60_000))
    start, end = (int(float(v)) for v in _chart(panel).get_attribute("data-zoom").split(","))
    assert 0 < start < end < STEPS and end - start + 1 <= WINDOW_POINTS
    assert _line_points(panel) == end - start + 1     # every step of the window, each rank
    assert _range(panel) == (start, end)
    screenshot(page, "phalanx-history-zoomed.png")
    print(f"zoomed into steps {start}..{end}: {end - start + 1} points per line")
    panel.get_by_role("button", name="full view").click()
    page.wait_for_function(
        "() => !document.querySelector('#phalanx .jp-Phalanx-chart').hasAttribute('data-zoom')")
    assert _range(panel) == (0, STEPS - 1)
