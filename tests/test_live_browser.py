"""Live while it trains: the panel during a run, in a real JupyterLab in headless Chromium.

A real kernel with a 2-engine CPU cluster runs ``%%distributed_fit`` cells of about 30 s while
the person reloads the page, scales and stops from the panel:

- reload at about a third of an elastic run (``--checkpoint-every``): the panel shows the job
  ("busy" and its name), its ranks and the rows logged so far, within 2 s of the page being
  back, without waiting for the cell;
- + during that run: the kernel's cluster reaches 3 engines and the run continues on 3 ranks;
- Stop run: the run ends within about 2 s (printed), the engines stay;
- on a fixed-size run, − is queued and said so ("scale to 2 after fixed-run"), Stop run ends it,
  the cell says it was stopped, the queued scale is applied, and the next run works.

Kernel-side facts are read from the kernel, not from the panel.  Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import time

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    cell_outputs,
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
from test_panel_browser import _engine_rows, _status
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

# At 0.05 s a step, at least 45 s; every run here is ended early by Stop run, and a page reload
# on a busy 2-core machine takes tens of seconds, so the run must outlast it.
STEPS = 900
LOOP = training_loop(STEPS)
CELLS = [
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    f"%%distributed_fit --name elastic-run --steps {STEPS} --checkpoint-every 5 --no-widget\n" + LOOP,
    "import phalanx\ns = phalanx.get_session()\nprint(s.last_run().status, s.cluster.size)",
    f"%%distributed_fit --name fixed-run --steps {STEPS} --no-widget\n" + LOOP,
    "%%distributed_fit --name after-run --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)",
    "%cluster stop",
]
CLUSTER, ELASTIC, FACTS, FIXED, AFTER, STOP = range(len(CELLS))
CLUSTER_TIMEOUT_MS = 180_000
# The target is 2 s (measured and printed); the assertion leaves room for a machine shared by many
# test runs, while still failing when the panel waits behind the cell (the run's length).
ATTACH_S = 5.0
STOP_S = 15.0
RELOAD_AT = 100  # steps


def _rank_step(page, rank: int) -> int:
    return page.evaluate(
        """r => { const e = document.querySelector(`#phalanx .jp-Phalanx-rank[data-rank='${r}']`);
                  return e ? Number(e.dataset.step) : -1; }""", rank)


def _wait_rank_step(page, rank: int, at_least: int, timeout_ms: int = hang_limit(120_000)) -> None:
    page.wait_for_function(
        """([r, n]) => { const e = document.querySelector(
                             `#phalanx .jp-Phalanx-rank[data-rank='${r}']`);
                         return e && Number(e.dataset.step) >= n; }""",
        arg=[rank, at_least], timeout=timeout_ms)


@pytest.mark.timeout(900)  # engines start slowly on a busy machine; every run is stopped early
def test_reload_scale_and_stop_during_runs(lab_server, lab_page):
    page, step = lab_page, StepClock()
    # The page's own warnings and errors are printed with a failure: they say why.
    page.on("console", lambda m: m.type in ("warning", "error") and "Plugin" not in m.text
            and print(f"console {m.type}: {m.text}"))
    write_notebook(lab_server.root / "live.ipynb", CELLS)
    with screenshot_on_failure(page, "phalanx-live-failure.png"):
        open_notebook(page, lab_server, "live.ipynb")
        panel = open_panel(page)
        run_cell(page, CLUSTER, timeout_ms=CLUSTER_TIMEOUT_MS)
        _engine_rows(panel).nth(1).wait_for(timeout=CLUSTER_TIMEOUT_MS)
        step("cluster started")
        _reload_mid_run(page)
        step("reloaded during the elastic run")
        panel = open_panel(page)
        _scale_up_elastic(page, panel)
        step("scaled the running run to 3 ranks")
        _stop_from_panel(page, panel)
        step("stopped the elastic run")
        assert run_cell(page, FACTS).split() == ["interrupted", "3"]
        _queued_scale_and_stop(page, panel)
        step("fixed-size run: - queued, stopped, applied")
        run_cell(page, AFTER)
        assert run_cell(page, FACTS).split() == ["done", "2"]
        run_cell(page, STOP)
        step("next run done, cluster stopped")


def _reload_mid_run(page) -> None:
    """Reload a while into the run: job, ranks and rows come back within 2 s."""
    start_cell(page, ELASTIC)
    _wait_rank_step(page, 0, RELOAD_AT)
    page.reload()
    page.wait_for_function("() => window.jupyterapp")
    page.evaluate("() => window.jupyterapp.restored.then(() => true)")
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
                   const k = w && w.sessionContext && w.sessionContext.session
                             && w.sessionContext.session.kernel;
                   return k && k.connectionStatus === 'connected'; }""",
        timeout=hang_limit(60_000))
    back = time.monotonic()
    panel = open_panel(page)
    _status(panel).filter(has_text="busy · elastic-run").wait_for(timeout=hang_limit(30_000))
    page.wait_for_function(
        """() => document.querySelectorAll('#phalanx .jp-Phalanx-rank').length === 2
                 && Number(document.querySelector('#phalanx .jp-Phalanx-chart')
                           ?.dataset.points || 0) >= 1""", timeout=hang_limit(30_000))
    attach_s = time.monotonic() - back
    print(f"measured: the running job reached the reloaded panel in {attach_s:.2f} s")
    assert _rank_step(page, 0) >= RELOAD_AT  # the rows logged so far, not a fresh start
    screenshot(page, "phalanx-live-reloaded.png")
    assert attach_s < ATTACH_S, f"the reloaded panel took {attach_s:.2f} s to show the job"


def _scale_up_elastic(page, panel) -> None:
    """+ on an elastic run: the cluster reaches 3 engines and the run goes on with 3 ranks."""
    panel.get_by_role("button", name="scale up").click()
    _engine_rows(panel).nth(2).wait_for(timeout=CLUSTER_TIMEOUT_MS)
    page.wait_for_function(
        "() => document.querySelectorAll('#phalanx .jp-Phalanx-rank').length === 3",
        timeout=CLUSTER_TIMEOUT_MS)
    _wait_rank_step(page, 2, 1 + _rank_step(page, 2))  # rank 2 trains
    assert _status(panel).inner_text() == "busy · elastic-run"


def _stop_from_panel(page, panel) -> float:
    """Stop run: the run ends within 2 s (measured in the panel); the kernel goes idle."""
    stop = panel.get_by_role("button", name="stop run")
    clicked = time.monotonic()
    stop.click()
    panel.locator("section[aria-label='Run'][data-status='interrupted']").wait_for(timeout=hang_limit(30_000))
    stopped_s = time.monotonic() - clicked
    print(f"measured: the run ended {stopped_s:.2f} s after Stop run")
    wait_for_kernel_idle(page)
    assert _status(panel).inner_text() == "live"
    assert stopped_s < STOP_S, f"the run took {stopped_s:.2f} s to stop"
    return stopped_s


def _queued_scale_and_stop(page, panel) -> None:
    """− on a fixed-size run is queued and shown; Stop ends it; the scale follows."""
    start_cell(page, FIXED)
    _status(panel).filter(has_text="busy · fixed-run").wait_for(timeout=hang_limit(60_000))
    _wait_rank_step(page, 0, 5)
    panel.get_by_role("button", name="scale down").click()
    notice = panel.locator(".jp-Phalanx-notice")
    notice.filter(has_text="scale to 2 after fixed-run").wait_for(timeout=hang_limit(10_000))
    assert _engine_rows(panel).count() == 3  # nothing changed under the run
    screenshot(page, "phalanx-live-queued.png")
    _stop_from_panel(page, panel)
    page.wait_for_function(  # the cell's own words, on stderr, right after the run ended
        """i => JSON.stringify(window.jupyterapp.shell.currentWidget.content.widgets[i]
                              .model.outputs.toJSON()).includes('was stopped')""",
        arg=FIXED, timeout=hang_limit(30_000))
    outputs = cell_outputs(page, FIXED)
    said = "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    assert "fixed-run was stopped (Stop in the phalanx panel)" in said, outputs
    assert not [o for o in outputs if o.get("output_type") == "error"]  # next cells not aborted
    _engine_rows(panel).nth(2).wait_for(state="detached", timeout=CLUSTER_TIMEOUT_MS)
    assert _engine_rows(panel).count() == 2
    assert notice.inner_text() == ""
