"""JupyterLab's kernel indicator says busy while a cell runs, though the panel talks meanwhile.

The panel speaks on a kernel subshell (JEP 91); ipykernel publishes a busy and an idle status
around each of its requests, and JupyterLab took that idle for the whole kernel's: the status
bar said "Idle" during a run as soon as the panel asked anything.  A real JupyterLab in
Chromium runs a ``%%distributed_fit`` cell on a 2-engine cluster while the panel asks for its
state several times; every status message the notebook's connection receives is recorded.
"""

from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    execute_command,
    lab_page,
    lab_server,
    open_notebook,
    open_panel,
    run_cell,
    screenshot,
    screenshot_on_failure,
    start_cell,
    training_loop,
    wait_for_kernel_idle,
    write_notebook,
)
from deadlines import hang_limit
from test_live_browser import _rank_step, _wait_rank_step

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

STEPS = 400  # 0.05 s a step: 20 s at least, long enough for the panel's requests
CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    f"%%distributed_fit --name busy-run --steps {STEPS} --no-widget\n" + training_loop(STEPS),
    "%cluster stop",
]
CLUSTER, RUN, STOP = range(len(CELLS))
REQUESTS = 3

# Every status message of the notebook's kernel connection, with its parent's type and id.
RECORD = """() => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    window.__statuses = [];
    kernel.iopubMessage.connect((_, msg) => {
        if (msg.header.msg_type === 'status') {
            window.__statuses.push({state: msg.content.execution_state,
                                    type: msg.parent_header.msg_type,
                                    id: msg.parent_header.msg_id});
        }
    });
}"""
STATUS_BAR_BUSY = """() => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const bar = document.querySelector('#jp-main-statusbar');
    return kernel.status === 'busy' && bar && /Busy/.test(bar.innerText);
}"""


@pytest.mark.timeout(600)
def test_the_kernel_is_busy_while_a_cell_runs_though_the_panel_asks(lab_server, lab_page):
    page = lab_page
    write_notebook(lab_server.root / "busy.ipynb", CELLS)
    with screenshot_on_failure(page, "phalanx-kernel-busy-failure.png"):
        open_notebook(page, lab_server, "busy.ipynb")
        open_panel(page)
        run_cell(page, CLUSTER, timeout_ms=hang_limit(180_000))
        page.evaluate(RECORD)
        start_cell(page, RUN)
        asked_at = 20
        for _ in range(REQUESTS):  # the panel asks for the kernel's state, on its subshell
            _wait_rank_step(page, 0, asked_at)
            execute_command(page, "phalanx:refresh")
            asked_at = _rank_step(page, 0) + 20
            # the status bar says busy again after the panel's request (without the fix it
            # stays "Idle" until the cell ends, and this wait runs out)
            page.wait_for_function(STATUS_BAR_BUSY, timeout=hang_limit(20_000))
        still_running = _rank_step(page, 0) < STEPS
        screenshot(page, "phalanx-kernel-busy.png")
        wait_for_kernel_idle(page, timeout_ms=hang_limit(180_000))
        statuses = page.evaluate("() => window.__statuses")
        run_cell(page, STOP)
    assert still_running, "the run ended before the panel's requests: lengthen it"
    execute = [s for s in statuses if s["type"] == "execute_request"]
    run_id = execute[-1]["id"] if execute else None
    during = _during(statuses, run_id)
    others = [i for i, s in enumerate(during) if s["id"] != run_id]
    assert [s for s in during if s["type"] == "comm_msg"], during  # the panel did ask
    for i in others:  # each of another request's idles is followed by the run's busy
        if during[i]["state"] == "idle":
            after = during[i + 1] if i + 1 < len(during) else None
            assert after == {"state": "busy", "type": "execute_request", "id": run_id}, during
    assert during[-1]["state"] == "busy", during[-6:]  # busy until the run's own idle


def _during(statuses: list[dict], run_id: str | None) -> list[dict]:
    """The status messages from the run's first busy up to (not including) its own idle."""
    ids = [s["id"] for s in statuses]
    assert run_id in ids, statuses
    start = ids.index(run_id)
    end = max(i for i, s in enumerate(statuses) if s["id"] == run_id and s["state"] == "idle")
    return statuses[start:end]
