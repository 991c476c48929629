"""The notebook's own widgets while a run trains, in a real JupyterLab in headless Chromium.

A real kernel with a 2-engine CPU cluster; the person uses what is under the cells, not the
side panel:

- the cluster widget's + during a foreground elastic run (``--checkpoint-every``): the click is
  handled during the run (the cell is still running), the cluster reaches 3 engines and the run
  goes on with 3 ranks;
- Stop run in the run view under the cell: the run ends within a few seconds (printed), the cell
  says it was stopped, the engines stay;
- the cluster widget's − during a fixed-size run: queued, the widget says so ("scale to 2 after
  fixed-run") while nothing changes under the run; stopped from the run view, then applied;
- a ``--background`` run: ``1 + 1`` returns while it trains, ``run.wait()`` brings the record
  and the ``--return`` name lands in the namespace.

Kernel-side facts are read from the kernel (a cell), not from the widgets.
"""

from __future__ import annotations

import tempfile
import time
import uuid
import warnings
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    lab_page,
    lab_server,
    open_notebook,
    run_cell,
    screenshot,
    screenshot_on_failure,
    start_cell,
    training_loop,
    wait_for_kernel_idle,
    write_notebook,
)
from conftest import held_until
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

# At 0.05 s a step, at least 75 s: every foreground run here is ended early by Stop run, and
# the elastic run must outlast a third engine starting on a busy machine.
STEPS = 1500
# The background run trains only once this file exists: the test creates it after the cells it
# runs beside the run, so "still running" does not depend on how busy the machine is.
BG_GATE = Path(tempfile.gettempdir()) / f"phalanx-test-bg-gate-{uuid.uuid4().hex[:8]}"
FACTS_SOURCE = ("import phalanx\ns = phalanx.get_session(); r = s.last_run()\n"
                "print(r.name, r.status, s.cluster.size, sorted(k for k, v in r.steps.items() if v))")
CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    "%cluster",
    f"%%distributed_fit --name elastic-run --steps {STEPS} --checkpoint-every 5\n"
    + training_loop(STEPS),
    FACTS_SOURCE,
    f"%%distributed_fit --name fixed-run --steps {STEPS}\n" + training_loop(STEPS),
    FACTS_SOURCE,
    "%%distributed_fit --name bg-run --steps 200 --background --return net\n"
    + held_until(BG_GATE, training_loop(200)),
    "1 + 1",
    "bg = phalanx.runs()[-1]\nprint(bg.status)",
    "record = bg.wait(timeout=300)\nprint(record.status, type(net).__name__, bg.result('net') is net)",
    "%cluster stop",
]
(CLUSTER, WIDGET, ELASTIC, FACTS_1, FIXED, FACTS_2, BACKGROUND, ONE_PLUS_ONE, BG_STATUS, WAIT,
 STOP) = range(len(CELLS))
CLUSTER_TIMEOUT_MS = 180_000
STOP_S = 15.0  # the target is a few seconds (printed); far below the runs' length


def _output(page, cell: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea")


def _running(page, index: int) -> bool:
    """The cell is still executing (its prompt shows ``[*]``)."""
    return page.evaluate(
        """i => /\\[\\*\\]/.test(window.jupyterapp.shell.currentWidget.content.widgets[i]
                                 .node.querySelector('.jp-InputPrompt').textContent)""", index)


def _wait_trains(page, cell: int, at_least: int = 10) -> None:
    """The run view under ``cell`` shows rank 0 past ``at_least`` steps."""
    page.wait_for_function(
        """([i, n]) => { const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[i];
                         const m = c && /(\\d+)\\/\\d+ steps/.exec(c.innerText);
                         return m && Number(m[1]) >= n; }""",
        arg=[cell, at_least], timeout=CLUSTER_TIMEOUT_MS)


def _stream_text(page, index: int) -> str:
    outputs = page.evaluate(
        "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs.toJSON()",
        index)
    return "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")


@pytest.mark.timeout(900)  # engines start slowly on a busy machine; foreground runs are stopped early
def test_widgets_act_during_runs_and_background_run(lab_server, lab_page):
    page, step = lab_page, StepClock()
    page.on("console", lambda m: m.type == "error" and print(f"console error: {m.text}"))
    write_notebook(lab_server.root / "widgets-live.ipynb", CELLS)
    with screenshot_on_failure(page, "phalanx-widgets-live-failure.png"):
        open_notebook(page, lab_server, "widgets-live.ipynb")
        run_cell(page, CLUSTER, timeout_ms=CLUSTER_TIMEOUT_MS)
        run_cell(page, WIDGET)
        widget = _output(page, WIDGET)
        widget.get_by_text("cluster: 2 engine(s)").wait_for()
        step("cluster and its widget up")
        _widget_plus_grows_elastic_run(page, widget)
        step("widget + grew the elastic run to 3 ranks")
        _stop_under_cell(page, ELASTIC, "elastic-run")
        assert run_cell(page, FACTS_1).split() == ["elastic-run", "interrupted", "3",
                                                   "[0,", "1,", "2]"]
        step("stopped from the run view")
        _widget_minus_queued_on_fixed_run(page, widget)
        step("widget − queued on a fixed-size run, stopped, applied")
        _background_run(page)
        step("background run: other cells ran, wait() brought the model")
        run_cell(page, STOP)


def _widget_plus_grows_elastic_run(page, widget) -> None:
    """+ under ``%cluster`` during an elastic run: 3 engines and 3 ranks while it still runs."""
    start_cell(page, ELASTIC)
    _wait_trains(page, ELASTIC)
    widget.locator("button", has_text="+").click()
    grown = widget.get_by_text("cluster: 3 engine(s)")
    try:
        grown.wait_for(timeout=hang_limit(20_000))
    except PlaywrightTimeout:
        # In the full suite a click once came to nothing (the run ended on 2 ranks and the
        # widget said 2 engines): clicked again, as a person would; issue 56 follows the cause
        assert widget.get_by_text("cluster: 2 engine(s)").is_visible(), "scaling failed"
        # What the widget said of the first click (busy, refused, queued, or nothing): evidence
        said = f"the first + came to nothing in 20 s; the widget said: {widget.inner_text()!r}"
        print(said)
        warnings.warn(said, UserWarning, stacklevel=1)  # kept in the warnings summary of a pass
        screenshot(page, "phalanx-widgets-live-first-plus.png")
        widget.locator("button", has_text="+").click()
        grown.wait_for(timeout=CLUSTER_TIMEOUT_MS)
    assert _running(page, ELASTIC), "the cluster grew only after the run"
    run = _output(page, ELASTIC)
    run.locator(".widget-hprogress").nth(2).wait_for(timeout=CLUSTER_TIMEOUT_MS)
    run.get_by_text("3 rank(s)").first.wait_for(timeout=hang_limit(10_000))  # header and rows are two widgets
    assert _running(page, ELASTIC)
    screenshot(page, "phalanx-widgets-live-grown.png")


def _stop_under_cell(page, cell: int, name: str) -> float:
    """Stop run in the run view: the cell ends within seconds and says it was stopped."""
    run = _output(page, cell)
    clicked = time.monotonic()
    run.get_by_role("button", name="Stop run").click()
    page.wait_for_function("i => !(/\\[\\*\\]/.test(window.jupyterapp.shell.currentWidget"
                           ".content.widgets[i].node.querySelector('.jp-InputPrompt')"
                           ".textContent))", arg=cell, timeout=hang_limit(60_000))
    stopped_s = time.monotonic() - clicked
    print(f"measured: {name} ended {stopped_s:.2f} s after Stop run under the cell")
    wait_for_kernel_idle(page)
    said = _stream_text(page, cell)
    assert f"{name} was stopped (Stop under the cell)" in said, said
    assert "interrupted" in run.inner_text()
    assert stopped_s < STOP_S, f"the run took {stopped_s:.2f} s to stop"
    return stopped_s


def _widget_minus_queued_on_fixed_run(page, widget) -> None:
    """− during a fixed-size run is queued and said in the widget; applied after the stop."""
    start_cell(page, FIXED)
    _wait_trains(page, FIXED)
    widget.locator("button", has_text="−").click()
    widget.get_by_text("scale to 2 after fixed-run").wait_for(timeout=hang_limit(30_000))
    assert _running(page, FIXED)
    assert "cluster: 3 engine(s)" in widget.inner_text()  # nothing changed under the run
    screenshot(page, "phalanx-widgets-live-queued.png")
    _stop_under_cell(page, FIXED, "fixed-run")
    widget.get_by_text("cluster: 2 engine(s)").wait_for(timeout=CLUSTER_TIMEOUT_MS)
    assert run_cell(page, FACTS_2).split() == ["fixed-run", "interrupted", "2",
                                               "[0,", "1,", "2]"]


def _background_run(page) -> None:
    """--background returns at once; 1 + 1 meanwhile; wait() brings the record and ``net``."""
    run_cell(page, BACKGROUND)
    try:
        assert run_cell(page, ONE_PLUS_ONE).strip() == "2"
        assert run_cell(page, BG_STATUS).strip() == "running"
    finally:
        BG_GATE.touch()  # released either way: a failed check must not leave the run waiting
    try:
        assert run_cell(page, WAIT, timeout_ms=hang_limit(360_000)).split() == ["done", "Linear", "True"]
    finally:
        BG_GATE.unlink(missing_ok=True)
    page.wait_for_function(
        "i => JSON.stringify(window.jupyterapp.shell.currentWidget.content.widgets[i]"
        ".model.outputs.toJSON()).includes('net now in the namespace')",
        arg=BACKGROUND, timeout=hang_limit(30_000))
