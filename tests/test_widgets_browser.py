"""The live run view and the cluster widget in a real JupyterLab (headless Chromium), on a real
cluster: the widgets render through ipywidgets and jupyter_bokeh, update live, and the cluster
widget's buttons scale the cluster from the browser."""

from __future__ import annotations

import ast
import time

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    lab_page,
    lab_server,
    open_notebook,
    run_all_cells,
    run_cell,
    screenshot,
    wait_for_kernel_idle,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    """%%distributed_fit --steps 40 --name lab-run
import time, torch
from phalanx import log
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for _ in range(40):
    opt.zero_grad()
    loss = ((net(torch.ones(8, 3)) - 1) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
    time.sleep(0.05)            # ~2 s: the view updates while it trains
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
    # The x window each finished plot has redrawn at full resolution, read off the plots.
    "import gc\nfrom phalanx.widgets._plot import LivePlot\n"
    "print(sorted(p._windows.get('loss', ()) for p in gc.get_objects() if type(p) is LivePlot))",
]
WINDOWS = 5


def _output(page, cell: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".jp-OutputArea")


def _settled_box(locator, timeout_s: float = 10.0) -> dict:
    """``locator``'s box once it has stopped moving: running a cell scrolls the notebook to it
    after the cell ends, and a drag measured before that scroll lands somewhere else."""
    deadline = time.monotonic() + timeout_s
    box = locator.bounding_box()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        again = locator.bounding_box()
        if again == box:
            break
        box = again
    return box


def _drag_right(page, canvas, pixels: int = 120) -> None:
    canvas.scroll_into_view_if_needed()
    box = _settled_box(canvas)
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + pixels, y, steps=8)
    page.mouse.up()


def _windows_after_pan(page, canvas, timeout_s: float = 60.0) -> list:
    """The plots' redrawn windows, once the pan's announcement has reached the kernel (it
    travels on the widget's comm, ahead of the cell that reads them, but is sent by the page).
    A drag that reached no chart (the page still moving under the pointer) is made again."""
    deadline = time.monotonic() + timeout_s
    dragged = time.monotonic()
    _drag_right(page, canvas)
    while True:
        windows = ast.literal_eval(run_cell(page, WINDOWS).strip())
        if any(windows) or time.monotonic() > deadline:
            return windows
        if time.monotonic() - dragged > 15:
            dragged = time.monotonic()
            _drag_right(page, canvas)


def test_live_view_summary_and_cluster_widget_in_jupyterlab(lab_server, lab_page):
    console = []
    lab_page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    write_notebook(lab_server.root / "views.ipynb", CELLS)
    open_notebook(lab_page, lab_server, "views.ipynb")
    run_all_cells(lab_page)
    wait_for_kernel_idle(lab_page, timeout_ms=hang_limit(240_000))
    run = _output(lab_page, 1)
    run.locator(".widget-hprogress").first.wait_for()
    assert run.locator(".widget-hprogress").count() == 2                      # one bar per rank
    assert "lab-run" in run.inner_text() and "done" in run.inner_text()
    errors = [c for c in console if c.startswith("error")]
    assert run.locator(".jupyter-widgets-error-widget").count() == 0, errors
    run.get_by_text("loss", exact=True).first.wait_for()                     # the metric's tab
    assert run.locator(".bk-Canvas, canvas").count() > 0, errors             # the bokeh plot drew
    run.get_by_text("log", exact=True).first.click()                         # the scale toggle
    summary = run.locator('img[alt="metric curves of lab-run"]')
    assert summary.count() == 1 and summary.evaluate("img => img.naturalWidth") > 100
    screenshot(lab_page, "widgets-run-view.png")

    lazy = _output(lab_page, 4)   # its curves were built during the run, in the placeholder's place
    lazy.get_by_text("loss", exact=True).first.wait_for()
    assert "lazy-run" in lazy.inner_text() and "done" in lazy.inner_text()
    assert lazy.locator(".bk-Canvas, canvas").count() > 0, errors
    assert "waiting for the first" not in lazy.inner_text() and "summary below" not in lazy.inner_text()

    # Panning a finished plot redraws the window it shows from the run's history, once: the
    # kernel hears of the pan (and not of the browser fitting the range to the new data).
    assert run_cell(lab_page, WINDOWS).strip() == "[(), ()]"           # nothing zoomed yet
    untouched, panned = _windows_after_pan(lab_page, run.locator("canvas").first)
    assert untouched == () and len(panned) == 2, (untouched, panned)  # lab-run's plot only
    start, end = panned
    assert start < 0 < end < 40, panned  # dragged right: the view moved before step 0

    panel = _output(lab_page, 2)
    panel.get_by_text("cluster: 2 engine(s)").wait_for()
    panel.locator("button", has_text="+").click()                            # scale from the page
    panel.get_by_text("cluster: 3 engine(s)").wait_for(timeout=hang_limit(120_000))
    panel.locator("button", has_text="−").click()
    panel.get_by_text("scaling to 2 engine(s): done").wait_for(timeout=hang_limit(120_000))
    assert "cluster: 2 engine(s)" in panel.inner_text()
    screenshot(lab_page, "widgets-cluster.png")
