"""The cluster's own log in the panel, in a real JupyterLab in headless Chromium.

What the engines say that is not the user's goes to the cluster's log file, not under a cell
(test_engine_log.py); the panel's Log button in the Cluster section shows that log's last lines,
what the running engines said so far included, asked of the kernel over the panel's comm.  An
engine logs a line outside any cell's output; the cell shows none of it, the panel's Log does.
"""

from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    lab_page,
    lab_server,
    open_notebook,
    open_panel,
    run_cell,
    screenshot,
    screenshot_on_failure,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster]

SAID = "engine-log-browser: a line of the engine's own, not the cell's"
CELLS = [
    "%load_ext phalanx\n%cluster start -n 1 --gpus none",
    f"""import phalanx

def say():
    from ipyparallel.engine.app import IPEngine
    IPEngine.instance().log.warning({SAID!r})

phalanx.get_session().cluster.view().apply_sync(say)
print("said")""",
    "%cluster stop",
]


def test_the_panels_log_shows_what_the_engines_said(lab_server, lab_page):
    page = lab_page
    write_notebook(lab_server.root / "engine-log.ipynb", CELLS)
    with screenshot_on_failure(page, "phalanx-engine-log-failure.png"):
        open_notebook(page, lab_server, "engine-log.ipynb")
        panel = open_panel(page)
        run_cell(page, 0)
        assert run_cell(page, 1) == "said\n"  # the cell shows only what the cell printed
        panel.locator(".jp-Phalanx-cluster tbody tr").first.wait_for()
        panel.get_by_role("button", name="Log").click()
        log = panel.locator(".jp-Phalanx-engineLog")
        log.get_by_text(SAID).wait_for(timeout=hang_limit(10_000))
        assert "(running)" in log.inner_text()  # the live engine's output, under its name
        assert log.get_attribute("title").endswith(".log")
        screenshot(page, "phalanx-engine-log.png")
        run_cell(page, 2)
