"""The live run view and the cluster widget in a real JupyterLab (headless Chromium), on a real
cluster: the widgets render through ipywidgets and jupyter_bokeh, update live, and the cluster
widget's buttons scale the cluster from the browser."""

from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    lab_page,
    lab_server,
    open_notebook,
    run_cell,
    screenshot,
    start_cell,
    wait_for_kernel_idle,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    """%%distributed_fit --steps 60 --name lab-run
import time, torch
from phalanx import log
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for _ in range(60):
    opt.zero_grad()
    loss = ((net(torch.ones(8, 3)) - 1) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
    time.sleep(0.3)             # ~18 s: the view is looked at while it trains
""",
    "%cluster",
    # log() called from a notebook function: the cell calls none itself, so its live curves are
    # built during the run, once it has trained 2 s (widgets/_run_view.py, PLOT_AFTER_S).
    "import torch\nfrom phalanx import log\n\ndef train_step(net, opt):\n    opt.zero_grad()\n"
    "    loss = ((net(torch.ones(8, 3)) - 1) ** 2).mean()\n    loss.backward()\n    opt.step()\n"
    "    log(loss=loss.item())",
    """%%distributed_fit --steps 40 --name lazy-run
import time, torch
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for _ in range(40):
    train_step(net, opt)
    time.sleep(0.1)             # ~4 s: the curves appear after 2 s
""",
]


def _output(page, cell: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea")


def test_live_view_summary_and_cluster_widget_in_jupyterlab(lab_server, lab_page):
    console = []
    lab_page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    write_notebook(lab_server.root / "views.ipynb", CELLS)
    open_notebook(lab_page, lab_server, "views.ipynb")
    run_cell(lab_page, 0, timeout_ms=hang_limit(240_000))  # the cluster
    start_cell(lab_page, 1)
    # While lab-run trains: a bar per rank and the metric's tab (the cell's chart beside a busy
    # machine's load: test_live_busy_browser.py)
    run = _output(lab_page, 1)
    run.locator(".widget-hprogress").first.wait_for(timeout=hang_limit(120_000))
    assert run.locator(".widget-hprogress").count() == 2                      # one bar per rank
    assert "lab-run" in run.inner_text()
    run.get_by_text("loss", exact=True).first.wait_for(timeout=hang_limit(60_000))
    wait_for_kernel_idle(lab_page, timeout_ms=hang_limit(240_000))
    for cell in (2, 3, 4):
        run_cell(lab_page, cell)
    # Once it ended, its summary in the view's place: what a saved notebook shows anywhere
    errors = [c for c in console if c.startswith("error")]
    assert run.locator(".jupyter-widgets-error-widget").count() == 0, errors
    assert "lab-run" in run.inner_text() and "done" in run.inner_text()
    summary = run.locator('img[alt="metric curves of lab-run"]')
    assert summary.count() == 1 and summary.evaluate("img => img.naturalWidth") > 100
    assert run.locator(".widget-hprogress").count() == 0                      # the view is gone
    screenshot(lab_page, "widgets-run-view.png")

    lazy = _output(lab_page, 4)   # curves built during the run, then its summary in their place
    assert "lazy-run" in lazy.inner_text() and "done" in lazy.inner_text()
    assert lazy.locator('img[alt="metric curves of lazy-run"]').count() == 1
    assert "waiting for the first" not in lazy.inner_text() and "summary below" not in lazy.inner_text()

    panel = _output(lab_page, 2)
    panel.get_by_text("cluster: 2 engine(s)").wait_for()
    panel.locator("button", has_text="+").click()                            # scale from the page
    panel.get_by_text("cluster: 3 engine(s)").wait_for(timeout=hang_limit(120_000))
    panel.locator("button", has_text="−").click()
    panel.get_by_text("scaling to 2 engine(s): done").wait_for(timeout=hang_limit(120_000))
    assert "cluster: 2 engine(s)" in panel.inner_text()
    screenshot(lab_page, "widgets-cluster.png")
