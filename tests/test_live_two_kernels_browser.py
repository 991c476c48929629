"""Two notebooks, two kernels, two runs at once, in a real JupyterLab in headless Chromium.

Each notebook's kernel has its own 1-engine cluster and trains its own run.  The panel follows
the current notebook: it shows that kernel's job ("busy · run-a" or "busy · run-b"), before and
after a page reload, switching back and forth; Stop run stops only that kernel's run.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    execute_command,
    lab_page,
    lab_server,
    open_notebook,
    open_panel,
    run_cell,
    screenshot_on_failure,
    start_cell,
    training_loop,
    wait_for_kernel_idle,
    write_notebook,
)
from test_panel_browser import _status
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

STEPS = 3000  # at 0.05 s a step, at least 150 s: both runs are stopped from the panel
CLUSTER_TIMEOUT_MS = 180_000


def _cells(name: str) -> list[str]:
    return ["%load_ext phalanx\n%cluster start -n 1 --gpus none",
            f"%%distributed_fit --name {name} --steps {STEPS} --no-widget\n"
            + training_loop(STEPS),
            "import phalanx\nr = phalanx.get_session().last_run()\nprint(r.name, r.status)",
            "%cluster stop"]


START, RUN, FACTS, STOP = range(4)


def _switch_to(page, name: str) -> None:
    """Make ``name`` the current notebook (its kernel may be busy: no wait for idle)."""
    execute_command(page, "docmanager:open", {"path": name})
    page.wait_for_function(
        """name => { const w = window.jupyterapp.shell.currentWidget;
                     const k = w && w.context && w.context.path === name && w.sessionContext
                               && w.sessionContext.session && w.sessionContext.session.kernel;
                     return k && k.connectionStatus === 'connected'; }""", arg=name,
        timeout=hang_limit(150_000))  # a reload on a busy 2-core machine: JupyterLab itself takes tens of seconds


def _shows(page, panel, notebook: str, run: str, timeout_s: float = 60) -> None:
    """Switch to ``notebook``; the panel names it and says its run is going.

    Shortly after a page load, the notebook restored as current can take the focus back; the
    switch is then made again until the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        _switch_to(page, notebook)
        try:
            panel.locator(".jp-Phalanx-kernel").filter(has_text=notebook).wait_for(timeout=hang_limit(10_000))
            _status(panel).filter(has_text=f"busy · {run}").wait_for(timeout=hang_limit(10_000))
            if page.evaluate(_CURRENT_PATH) == notebook:
                return
        except PlaywrightTimeout:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the panel did not show {run} of {notebook} in {timeout_s} s")


_CURRENT_PATH = "() => window.jupyterapp.shell.currentWidget.context.path"


@pytest.mark.timeout(900)
def test_each_panel_follows_its_own_kernels_run(lab_server, lab_page):
    page, step = lab_page, StepClock()
    for name, run in (("a.ipynb", "run-a"), ("b.ipynb", "run-b")):
        write_notebook(lab_server.root / name, _cells(run))
    # Cells are run and read in the notebook named, not in the current one: after the reload
    # either notebook can take the focus back between two steps of the test.
    with screenshot_on_failure(page, "phalanx-two-kernels-failure.png"):
        open_notebook(page, lab_server, "a.ipynb")
        panel = open_panel(page)
        run_cell(page, START, timeout_ms=CLUSTER_TIMEOUT_MS, notebook="a.ipynb")
        _switch_to(page, "b.ipynb")
        wait_for_kernel_idle(page, notebook="b.ipynb")
        run_cell(page, START, timeout_ms=CLUSTER_TIMEOUT_MS, notebook="b.ipynb")
        step("two kernels, two clusters")
        start_cell(page, RUN, notebook="b.ipynb")
        _shows(page, panel, "b.ipynb", "run-b")
        start_cell(page, RUN, notebook="a.ipynb")
        _shows(page, panel, "a.ipynb", "run-a")
        _shows(page, panel, "b.ipynb", "run-b")
        step("both train; the panel shows each kernel's run")
        page.reload()
        page.wait_for_function("() => window.jupyterapp")
        page.evaluate("() => window.jupyterapp.restored.then(() => true)")
        panel = open_panel(page)
        _shows(page, panel, "a.ipynb", "run-a")
        _shows(page, panel, "b.ipynb", "run-b")
        step("after a reload, each kernel's run again")
        _stop_from_panel(page, panel, "b.ipynb", "run-b")
        wait_for_kernel_idle(page, notebook="b.ipynb")
        assert run_cell(page, FACTS, notebook="b.ipynb").split() == ["run-b", "interrupted"]
        _stop_from_panel(page, panel, "a.ipynb", "run-a")  # a trained on meanwhile
        wait_for_kernel_idle(page, notebook="a.ipynb")
        assert run_cell(page, FACTS, notebook="a.ipynb").split() == ["run-a", "interrupted"]
        step("each stopped from its own panel view")
        run_cell(page, STOP, notebook="a.ipynb")
        run_cell(page, STOP, notebook="b.ipynb")


def _stop_from_panel(page, panel, notebook: str, run: str, timeout_s: float = 60) -> None:
    """Press the panel's Stop run while it shows ``run``.

    The check and the press are one step in the page: the focus cannot move to the other
    notebook between them, so the press is sure to reach the run the panel showed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        _shows(page, panel, notebook, run)
        if page.evaluate(_PRESS_STOP_IF_SHOWN, run):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the panel's Stop run could not be pressed on {run}")


_PRESS_STOP_IF_SHOWN = """run => {
    const panel = document.querySelector('#phalanx');
    const status = panel.querySelector('.jp-Phalanx-status');
    const stop = panel.querySelector('.jp-Phalanx-stopRun');
    if (!status || status.textContent !== `busy · ${run}` || !stop || stop.disabled) return false;
    stop.click();
    return true;
}"""
