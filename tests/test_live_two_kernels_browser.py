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
    training_loop,
    wait_for_kernel_idle,
    write_notebook,
)
from test_live_browser import _start_cell
from test_panel_browser import _status

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
        timeout=150_000)  # a reload on a busy 2-core machine: JupyterLab itself takes tens of seconds


def _shows(page, panel, notebook: str, run: str, timeout_s: float = 60) -> None:
    """Switch to ``notebook``; the panel names it and says its run is going.

    Shortly after a page load, the notebook restored as current can take the focus back; the
    switch is then made again until the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        _switch_to(page, notebook)
        try:
            panel.locator(".jp-Phalanx-kernel").filter(has_text=notebook).wait_for(timeout=10_000)
            _status(panel).filter(has_text=f"busy · {run}").wait_for(timeout=10_000)
            if page.evaluate(_CURRENT_PATH) == notebook:
                return
        except PlaywrightTimeout:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the panel did not show {run} of {notebook} in {timeout_s} s")


_CURRENT_PATH = "() => window.jupyterapp.shell.currentWidget.context.path"


@pytest.mark.skip(reason="flaky in CI: after the reload the other notebook takes the focus back "
                         "between the test's steps, so a cell runs in the wrong notebook; the "
                         "test must address notebooks by path, not shell.currentWidget")
@pytest.mark.timeout(900)
def test_each_panel_follows_its_own_kernels_run(lab_server, lab_page):
    page, step = lab_page, StepClock()
    for name, run in (("a.ipynb", "run-a"), ("b.ipynb", "run-b")):
        write_notebook(lab_server.root / name, _cells(run))
    with screenshot_on_failure(page, "phalanx-two-kernels-failure.png"):
        open_notebook(page, lab_server, "a.ipynb")
        panel = open_panel(page)
        run_cell(page, START, timeout_ms=CLUSTER_TIMEOUT_MS)
        _switch_to(page, "b.ipynb")
        wait_for_kernel_idle(page)
        run_cell(page, START, timeout_ms=CLUSTER_TIMEOUT_MS)
        step("two kernels, two clusters")
        _start_cell(page, RUN)
        _shows(page, panel, "b.ipynb", "run-b")
        _switch_to(page, "a.ipynb")
        _start_cell(page, RUN)
        _shows(page, panel, "a.ipynb", "run-a")
        _shows(page, panel, "b.ipynb", "run-b")
        step("both train; the panel shows each kernel's run")
        page.reload()
        page.wait_for_function("() => window.jupyterapp")
        page.evaluate("() => window.jupyterapp.restored.then(() => true)")
        _switch_to(page, "a.ipynb")
        panel = open_panel(page)
        _shows(page, panel, "a.ipynb", "run-a")
        _shows(page, panel, "b.ipynb", "run-b")
        step("after a reload, each kernel's run again")
        panel.get_by_role("button", name="stop run").click()  # b's run only
        wait_for_kernel_idle(page)
        assert run_cell(page, FACTS).split() == ["run-b", "interrupted"]
        _shows(page, panel, "a.ipynb", "run-a")  # a still trains
        panel.get_by_role("button", name="stop run").click()
        wait_for_kernel_idle(page)
        assert run_cell(page, FACTS).split() == ["run-a", "interrupted"]
        step("each stopped from its own panel view")
        run_cell(page, STOP)
        _switch_to(page, "b.ipynb")
        wait_for_kernel_idle(page)
        run_cell(page, STOP)
