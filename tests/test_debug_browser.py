"""The post-mortem of a failed run, once, in a real JupyterLab in Chromium.

A notebook starts a 2-engine cluster and runs a cell in which rank 1 raises; the next cell is
``%debug``.  The person types ``p secret`` (a local of rank 1's frame) and ``q`` into
JupyterLab's input box under the cell, as they would; the value appears in the cell, and the
cell after it trains on both ranks of the same cluster.
"""

from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    cell_outputs,
    lab_page,
    lab_server,
    open_notebook,
    run_cell,
    screenshot_on_failure,
    start_cell,
    wait_for_kernel_idle,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    """%%distributed_fit --no-widget
from phalanx import allreduce
for step in range(10):
    allreduce(1.0)
    if rank == 1 and step == 4:
        secret = 1234.5 + step
        raise RuntimeError("diverged")""",
    "%debug",
    "%%distributed_fit --no-widget --return total\nfrom phalanx import allreduce\n"
    "total = allreduce(float(rank + 1), op='sum')",
    "print('total after the debugger:', total)",
    "%cluster stop",
]
CLUSTER, FAILS, DEBUG, TRAINS, TOTAL, STOP = range(len(CELLS))
INPUT_BOX = ".jp-OutputArea .jp-Stdin-input"


def _text(outputs: list[dict]) -> str:
    return "".join("".join(o.get("text", "")) if "text" in o
                   else "".join(o.get("data", {}).get("text/plain", "")) for o in outputs)


def _type(page, line: str, cell: int) -> None:
    """Type ``line`` into the cell's input box and press Enter, as a person does; wait until
    the cell has taken it (JupyterLab keeps each answered line as the cell's stdin output)."""
    taken = sum(o.get("name") == "stdin" for o in cell_outputs(page, cell))
    box = page.locator(INPUT_BOX).last
    box.wait_for(state="visible", timeout=hang_limit(60_000))
    box.fill(line)
    box.press("Enter")
    page.wait_for_function(
        """([i, n]) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs
                       .toJSON().filter(o => o.name === 'stdin').length > n""",
        arg=[cell, taken], timeout=hang_limit(60_000))


@pytest.mark.timeout(600)
def test_debug_after_a_failed_run_in_jupyterlab(lab_server, lab_page):
    page = lab_page
    write_notebook(lab_server.root / "debug.ipynb", CELLS)
    with screenshot_on_failure(page, "phalanx-debug-browser-failure.png"):
        open_notebook(page, lab_server, "debug.ipynb")
        run_cell(page, CLUSTER, timeout_ms=hang_limit(180_000))
        with pytest.raises(AssertionError, match="DistributedFitError"):
            run_cell(page, FAILS)
        failed = "".join(o.get("evalue", "") for o in cell_outputs(page, FAILS))
        assert "%debug opens a debugger in rank 1's frames" in failed, failed

        start_cell(page, DEBUG)
        _type(page, "p secret", DEBUG)
        page.wait_for_function(
            "() => /\\n1238\\.5\\n/.test(window.jupyterapp.shell.currentWidget.content"
            ".widgets[2].node.querySelector('.jp-OutputArea').innerText)",
            timeout=hang_limit(60_000))
        _type(page, "q", DEBUG)
        wait_for_kernel_idle(page, timeout_ms=hang_limit(60_000))
        shown = _text(cell_outputs(page, DEBUG))
        assert shown.startswith("rank 1: RuntimeError: diverged"), shown
        assert "(Pdb)  p secret\n1238.5\n(Pdb)  q\n" in shown, shown  # the box echoes each line

        run_cell(page, TRAINS)
        assert run_cell(page, TOTAL) == "total after the debugger: 3.0\n"
        run_cell(page, STOP)
