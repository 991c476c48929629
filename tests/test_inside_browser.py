"""Inside a run, in the panel: each rank's step parts as a stacked bar, the slow part named, and
each engine's memory in the cluster table, in a real JupyterLab in headless Chromium.

Rank 1 sleeps before its forward pass every step (a slow data loader); its peer waits for it in
the gradient allreduce.  After the run the Run section shows a bar per rank whose largest part is
"data & forward" on rank 1 and "waiting for a peer" on rank 0, rank 1 marked slow with "data";
the cluster table has a memory column with a figure per engine.  A reloaded page shows the bars
again (the kernel keeps the latest breakdown).
"""

from __future__ import annotations

import pytest
from browser_support import (  # noqa: F401  (fixtures)
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

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    """%%distributed_fit --steps 40 --name inside-run --no-widget
import time, torch
from phalanx import log
net = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for _ in range(40):                # 6 s of steps: a slow mark needs 5 s of evidence
    if rank == 1:
        time.sleep(0.15)          # a slow data loader on rank 1 only
    x = torch.randn(64, 32)
    loss = (net(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    log(loss=loss.item())""",
    "%cluster stop",
]


def _dominant_parts(panel) -> dict[str, str]:
    """``{rank: dominant part}`` as the Run section's bars say it."""
    return dict(panel.locator(".jp-Phalanx-rank").evaluate_all(
        """ranks => ranks.map(r => [r.dataset.rank,
              (r.querySelector('.jp-Phalanx-parts') || {dataset: {}}).dataset.dominant])"""))


def _assert_bars(panel) -> None:
    panel.locator(".jp-Phalanx-rank .jp-Phalanx-parts").nth(1).wait_for()
    assert _dominant_parts(panel) == {"0": "wait", "1": "data"}
    for rank in ("0", "1"):
        row = panel.locator(f".jp-Phalanx-rank[data-rank='{rank}']")
        widths = row.locator(".jp-Phalanx-part").evaluate_all(
            "parts => parts.map(p => parseFloat(p.style.width))")
        assert len(widths) >= 3 and sum(widths) == pytest.approx(100, abs=0.5), widths
        assert "s/step" in row.locator(".jp-Phalanx-partsText").inner_text()
    slow = panel.locator(".jp-Phalanx-rank[data-rank='1'] .jp-Phalanx-slow")
    assert "slow: data & forward" in slow.inner_text()
    assert panel.locator(".jp-Phalanx-rank[data-rank='0'] .jp-Phalanx-slow").count() == 0


def test_panel_shows_step_parts_and_memory_per_rank(lab_server, lab_page):
    page = lab_page
    write_notebook(lab_server.root / "inside.ipynb", CELLS)
    with screenshot_on_failure(page, "phalanx-inside-failure.png"):
        open_notebook(page, lab_server, "inside.ipynb")
        panel = open_panel(page)
        run_cell(page, 0, timeout_ms=hang_limit(240_000))
        panel.locator(".jp-Phalanx-cluster tbody tr").nth(1).wait_for()
        run_cell(page, 1)
        panel.locator("section[aria-label='Run'][data-status='done']").wait_for()
        _assert_bars(panel)
        headers = panel.locator(".jp-Phalanx-cluster thead th").all_inner_texts()
        assert "memory" in headers and "gpu memory" not in headers  # CPU engines: no GPU column
        rss = panel.locator(".jp-Phalanx-cluster .jp-Phalanx-rss").all_inner_texts()
        assert len(rss) == 2 and all(t.endswith(("MB", "GB")) for t in rss), rss
        widen_right_sidebar(page, 260)
        screenshot(page, "phalanx-inside-parts.png")
        reload_lab(page)
        panel = open_panel(page)
        _assert_bars(panel)   # the kernel kept the latest breakdown for a reloaded page
        run_cell(page, 2)
        panel.locator(".jp-Phalanx-cluster").filter(has_text="No cluster").wait_for()
