"""The JupyterLab panel against the real product, in a real JupyterLab in headless Chromium.

One notebook drives a real kernel as a person would: ``%load_ext phalanx``, a 2-engine CPU
cluster, a short ``%%distributed_fit`` that logs a loss, a run that fails on one rank and a
validation run after it, scaling from the command palette, a small learning network fitted on
the cluster with ``%distributed_fit yhat``, ``%cluster stop``.  Along the way the panel is checked
for what a person relies on: the command palette opens it (at a useful width) and lists its
commands, it attaches when it was opened before ``%load_ext``, its engines are busy while a run
trains, a failed run says which rank raised what at which step, the run list shows an earlier
run when picked (and keeps it shown through a newer run), the layout holds in the narrowest
sidebar, a page reload re-attaches with the state, each notebook shows its own kernel, a kernel
restart clears it.  Kernel-side facts (engine counts, process ids) are read from the kernel, not
from the panel.  Screenshots go to ``test-artifacts/``.

The scenarios share one cluster (starting engines is the slow part), so they are steps of one
test rather than separate tests.
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_all_gone
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    cell_outputs,
    execute_command,
    lab_page,
    lab_server,
    open_document,
    open_notebook,
    open_panel,
    reload_lab,
    run_cell,
    screenshot,
    screenshot_on_failure,
    start_cell,
    wait_for_kernel_idle,
    widen_right_sidebar,
    write_notebook,
)
from deadlines import hang_limit

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

STEPS = 40

TRAIN = [
    # 0
    "%load_ext phalanx\n%cluster start -n 2 --gpus none",
    # 1: a short loop; random batches give each rank its own noisy curve, the sleep keeps it
    # going long enough to be seen live.
    f"""%%distributed_fit --steps {STEPS} --name panel-run --seed 0 --no-widget
import time, torch
from phalanx import log
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.03)
for _ in range({STEPS}):
    x = torch.randn(16, 3)
    opt.zero_grad()
    loss = ((net(x) - x.sum(1, keepdim=True)) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
    time.sleep(0.02)""",
    # 2
    "import phalanx\nprint(len(phalanx.get_session().cluster.slots()))",
    # 3
    """from sklearn.datasets import load_diabetes
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from phalanx.network import machine, source
Xd, yd = load_diabetes(return_X_y=True)
X, y = source(Xd, name="X"), source(yd, name="y")
scaler = machine(StandardScaler(), X, name="scaler")
Z = scaler.transform(X)
ridge = machine(Ridge(alpha=1.0), Z, y, name="ridge")
yhat = ridge.predict(Z)
%distributed_fit yhat""",
    # 4
    "import json\nprint(json.dumps(phalanx.get_session().cluster.process_ids()))",
    # 5
    "%cluster stop",
    # 6: rank 1 raises in the third pass of its loop; rank 0 runs on to the end
    """%%distributed_fit --name bad-run --no-widget
import os
from phalanx import log
from phalanx.runtime import steps
for step in steps(5):
    log(loss=1.0 / (step + 1))
    if os.environ["RANK"] == "1" and step == 2:
        raise ValueError("a bad batch")""",
    # 7: a validation run after the training run
    """%%distributed_fit --name val-run --no-widget
from phalanx import log
from phalanx.runtime import steps
for step in steps(3):
    log(val_loss=0.5 - 0.1 * step)""",
]
LOAD_CLUSTER, FIT, COUNT_ENGINES, NETWORK, PROCESS_IDS, STOP, FAIL, VALIDATE = range(8)
FITTED = {"X": "fitted", "y": "fitted", "scaler": "fitted", "ridge": "fitted"}
CLUSTER_TIMEOUT_MS = 180_000  # engines start slowly on a busy 2-core machine


def _status(panel):
    return panel.locator(".jp-Phalanx-status")


def _engine_rows(panel):
    return panel.locator(".jp-Phalanx-cluster tbody tr")


def _run_items(panel):
    """The run list's entries, newest first."""
    return panel.locator(".jp-Phalanx-runItem")


def _pick(panel, name: str) -> None:
    """Pick a run in the run list and wait until the Run section shows it whole."""
    _run_items(panel).filter(has_text=name).click()
    panel.locator("section[aria-label='Run'][data-loaded='true'] .jp-Phalanx-summary").filter(
        has_text=name).wait_for()


def _node_states(panel) -> dict[str, str]:
    return dict(panel.locator(".jp-Phalanx-dagNode").evaluate_all(
        "nodes => nodes.map(n => [n.dataset.node, n.dataset.state])"))


def _rank_steps(panel) -> dict[str, list[str]]:
    """``{rank: [step, total]}`` as the progress bars show them."""
    return dict(panel.locator(".jp-Phalanx-rank").evaluate_all(
        """ranks => ranks.map(r => [r.dataset.rank, [r.dataset.step,
              r.querySelector('[role=progressbar]').getAttribute('aria-valuemax')]])"""))


def _assert_run_done(panel) -> None:
    panel.locator("section[aria-label='Run'][data-status='done']").wait_for()
    panel.locator(f".jp-Phalanx-chart[data-points='{STEPS}']").wait_for()
    assert _rank_steps(panel) == {"0": [str(STEPS)] * 2, "1": [str(STEPS)] * 2}
    assert panel.locator(".jp-Phalanx-rank.jp-mod-done").count() == 2
    chart = panel.locator(".jp-Phalanx-chart")
    assert int(chart.get_attribute("data-points")) == STEPS  # one x point per logged step
    assert chart.locator("canvas").count() == 1


def _assert_gone(pids: list[int], timeout: float = hang_limit(30.0)) -> None:
    assert_all_gone(pids, timeout=timeout)


def test_panel_follows_a_real_cluster_run_scale_and_network(lab_server, lab_page):
    page, step = lab_page, StepClock()
    write_notebook(lab_server.root / "train.ipynb", TRAIN)
    write_notebook(lab_server.root / "other.ipynb", ["%load_ext phalanx"])
    write_notebook(lab_server.root / "plain.ipynb", ["1 + 1"])
    with screenshot_on_failure(page, "phalanx-panel-failure.png"):
        open_notebook(page, lab_server, "train.ipynb")
        panel = _opened_before_load(page)
        step("panel opened from the palette before %load_ext")
        _start_and_train(page, panel)
        step("cluster started, run done")
        _failed_run_and_the_run_list(page, panel)
        step("failed run, run list, validation run")
        _narrowest_sidebar(page, panel)
        step("narrowest sidebar")
        _scale_up_from_panel(page, panel)
        step("scaled to 3 from the palette")
        _fit_network(page, panel)
        step("network fitted")
        cluster_pids = _cluster_pids(page)
        panel = _reload(page)
        step("page reloaded")
        _each_notebook_its_own_kernel(page, panel)
        step("other notebooks")
        _stop_and_restart(page, panel, cluster_pids)
        step("cluster stopped, kernel restarted")


def _opened_before_load(page):
    """The palette lists phalanx's commands and opens the panel, some 400 px wide; opened before
    %load_ext, the panel says phalanx is not loaded, and how to fix it."""
    execute_command(page, "apputils:activate-command-palette")
    page.locator(".lm-CommandPalette-input").fill("phalanx")
    items = page.locator(".lm-CommandPalette-item")
    items.first.wait_for()
    labels = set(items.locator(".lm-CommandPalette-itemLabel").all_inner_texts())
    assert {"Open Panel", "Stop Run", "Scale Cluster…", "Add an Engine",
            "Remove an Engine"} <= labels, labels
    assert "phalanx" in page.locator(".lm-CommandPalette-header").all_inner_texts()
    items.filter(has_text="Open Panel").click()
    panel = page.locator("#phalanx")
    panel.wait_for(state="visible")
    page.wait_for_function("() => document.querySelector('#phalanx').offsetWidth >= 390")
    assert panel.bounding_box()["width"] <= 410
    assert _status(panel).inner_text() == "phalanx not loaded"
    assert "%load_ext phalanx" in panel.locator(".jp-Phalanx-hint").inner_text()
    for name, empty in (("Cluster", "No cluster"), ("Run", "No run"),
                        ("Network", "No learning network")):
        assert empty in panel.locator(f"section[aria-label='{name}']").inner_text()
    screenshot(page, "phalanx-panel-not-loaded.png")
    return panel


# Each state the engine table shows, recorded as it changes (a short run is busy for a second).
RECORD_ENGINE_STATES = """() => {
  const body = document.querySelector('#phalanx .jp-Phalanx-cluster tbody');
  const seen = (window.phalanxEngineStates = []);
  const note = () => seen.push(
    [...body.querySelectorAll('.jp-Phalanx-state')].map(s => s.textContent).join(','));
  new MutationObserver(note).observe(body, {subtree: true, childList: true, characterData: true});
}"""


def _start_and_train(page, panel) -> None:
    """%load_ext + %cluster start attach the panel by itself; a short run fills bars and chart,
    its engines busy while it trains."""
    run_cell(page, LOAD_CLUSTER, timeout_ms=CLUSTER_TIMEOUT_MS)
    _status(panel).filter(has_text="live").wait_for()
    _engine_rows(panel).nth(1).wait_for()
    assert _engine_rows(panel).count() == 2
    assert panel.locator(".jp-Phalanx-kernel").inner_text() == "train.ipynb"
    page.evaluate(RECORD_ENGINE_STATES)
    run_cell(page, FIT)
    _assert_run_done(panel)
    assert panel.locator(".jp-Phalanx-metric").input_value() == "loss"
    assert "busy,busy" in page.evaluate("window.phalanxEngineStates")
    assert panel.locator(".jp-Phalanx-cluster .jp-Phalanx-state").all_inner_texts() == [
        "idle", "idle"]


def _failed_run_and_the_run_list(page, panel) -> None:
    """A failed run shows the line the cell's error starts with (rank, exception, step); the run
    list picks the training run back, and a validation run after it does not take its place."""
    start_cell(page, FAIL)
    wait_for_kernel_idle(page)
    panel.locator("section[aria-label='Run'][data-status='failed']").wait_for()
    [error] = [o for o in cell_outputs(page, FAIL) if o["output_type"] == "error"]
    line = error["evalue"].splitlines()[0].rstrip(":")
    assert line.startswith("rank 1 ") and "ValueError" in line and "step" in line, line
    assert panel.locator(".jp-Phalanx-runError").inner_text() == line
    assert _run_items(panel).all_inner_texts()[0].split()[:2] == ["bad-run", "failed"]
    _pick(panel, "panel-run")
    _assert_run_done(panel)
    run_cell(page, VALIDATE)
    _run_items(panel).filter(has_text="val-run").filter(has_text="done").wait_for()
    assert _run_items(panel).count() == 3
    _assert_run_done(panel)  # still the run picked
    panel.get_by_role("button", name="follow latest").click()
    panel.locator("section[aria-label='Run'] .jp-Phalanx-summary").filter(
        has_text="val-run").wait_for()
    assert panel.locator(".jp-Phalanx-metric").input_value() == "val_loss"
    _pick(panel, "panel-run")  # the layout check next: its step parts have the longest captions


# Whether each timing caption of the panel is one line, the panel overflows sideways, and how
# many step ticks the chart keeps.
NARROW_LAYOUT = """() => {
  const panel = document.querySelector('#phalanx');
  const captions = [...panel.querySelectorAll(
    '.jp-Phalanx-rankStats, .jp-Phalanx-partsText, .jp-Phalanx-slow')];
  return {
    width: panel.offsetWidth,
    captions: captions.length,
    multiLine: captions.filter(c => c.offsetHeight > 1.6 * parseFloat(getComputedStyle(c).fontSize))
                       .map(c => c.textContent),
    overflow: panel.scrollWidth - panel.clientWidth,
    ticks: Number(panel.querySelector('.jp-Phalanx-chart').dataset.xTicks)
  };
}"""


def _narrowest_sidebar(page, panel) -> None:
    """Dragged to JupyterLab's narrowest sidebar, the panel keeps each timing caption on one line,
    fits its width and still labels several steps on the chart."""
    before = panel.bounding_box()["width"]
    widen_right_sidebar(page, -int(before))
    page.wait_for_function("() => document.querySelector('#phalanx').offsetWidth <= 250")
    page.wait_for_function(
        "() => document.querySelector('#phalanx .jp-Phalanx-chart canvas').offsetWidth <= 240")
    layout = page.evaluate(NARROW_LAYOUT)
    assert layout["captions"] >= 4 and not layout["multiLine"], layout
    assert layout["overflow"] <= 1 and layout["ticks"] > 1, layout
    screenshot(page, "phalanx-panel-narrow.png")
    widen_right_sidebar(page, int(before - layout["width"]))


# Every state the cluster section shows, recorded as it changes: "scaling to 3" lasts only until
# the kernel answers, which a forked engine can make shorter than a poll from the test.
RECORD_CLUSTER_SECTION = """() => {
  const section = document.querySelector('#phalanx .jp-Phalanx-cluster');
  const seen = (window.phalanxClusterStates = []);
  const note = () => seen.push({
    summary: section.querySelector('.jp-Phalanx-summary')?.textContent ?? '',
    plusDisabled: section.querySelector('button[aria-label="scale up"]')?.disabled ?? null
  });
  new MutationObserver(note).observe(section, {subtree: true, childList: true,
                                               characterData: true, attributes: true});
}"""


def _scale_up_from_panel(page, panel) -> None:
    """The palette's Scale Cluster… scales the kernel's cluster through the panel's own control
    (the + button's path; the live tests press +): checked from the kernel, not from the panel."""
    page.evaluate(RECORD_CLUSTER_SECTION)
    execute_command(page, "apputils:activate-command-palette")
    page.locator(".lm-CommandPalette-input").fill("phalanx scale")
    page.locator(".lm-CommandPalette-item").filter(has_text="Scale Cluster…").click()
    page.locator(".jp-Dialog input").fill("3")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    _engine_rows(panel).nth(2).wait_for(timeout=CLUSTER_TIMEOUT_MS)
    # Engines take a moment to start: until the kernel answers, the panel says what it waits for
    # and takes no second click.
    states = page.evaluate("window.phalanxClusterStates")
    waiting = [s for s in states if "scaling to 3" in s["summary"]]
    assert waiting and all(s["plusDisabled"] for s in waiting), states
    assert run_cell(page, COUNT_ENGINES).strip() == "3"


def _fit_network(page, panel) -> None:
    """A learning network fitted on the cluster: its DAG appears with every node fitted."""
    run_cell(page, NETWORK, timeout_ms=CLUSTER_TIMEOUT_MS)
    page.wait_for_function(
        """() => [...document.querySelectorAll('#phalanx .jp-Phalanx-dagNode')]
                 .filter(n => n.dataset.state === 'fitted').length === 4""")
    assert _node_states(panel) == FITTED
    panel.locator(".jp-Phalanx-dagNode[data-node='ridge']").click()
    details = panel.locator(".jp-Phalanx-details").inner_text()
    assert "Ridge" in details and "alpha" in details
    screenshot(page, "phalanx-panel-live.png")


def _cluster_pids(page) -> list[int]:
    pids = json.loads(run_cell(page, PROCESS_IDS))
    assert len(pids["engines"]) >= 3
    return pids["controller"] + pids["engines"]


def _reload(page):
    """A reloaded page re-attaches and gets the whole state back from the kernel: the newest
    run, the list of its runs, and an earlier run's curves and step parts when picked."""
    reload_lab(page)
    panel = open_panel(page)
    _status(panel).filter(has_text="live").wait_for()
    _engine_rows(panel).nth(2).wait_for()
    assert _engine_rows(panel).count() == 3
    assert _node_states(panel) == FITTED
    assert [t.split()[0] for t in _run_items(panel).all_inner_texts()] == [
        "val-run", "bad-run", "panel-run"]
    _pick(panel, "panel-run")
    _assert_run_done(panel)
    panel.locator(".jp-Phalanx-rank .jp-Phalanx-parts").nth(1).wait_for()
    return panel


def _each_notebook_its_own_kernel(page, panel) -> None:
    """Another notebook's kernel has phalanx but no cluster; a third has no phalanx."""
    open_document(page, "other.ipynb")
    run_cell(page, 0)
    panel.locator(".jp-Phalanx-kernel").filter(has_text="other.ipynb").wait_for()
    _status(panel).filter(has_text="live").wait_for()
    assert "No cluster" in panel.locator(".jp-Phalanx-cluster").inner_text()
    assert "No run" in panel.locator("section[aria-label='Run']").inner_text()
    open_document(page, "plain.ipynb")
    _status(panel).filter(has_text="phalanx not loaded").wait_for()
    open_document(page, "train.ipynb")  # back: its state is shown again at once
    _status(panel).filter(has_text="live").wait_for()
    assert _engine_rows(panel).count() == 3
    assert _node_states(panel) == FITTED


def _stop_and_restart(page, panel, cluster_pids: list[int]) -> None:
    """%cluster stop empties the panel and leaves no process; a kernel restart clears it."""
    run_cell(page, STOP)
    panel.locator(".jp-Phalanx-cluster").filter(has_text="No cluster").wait_for()
    _assert_gone(cluster_pids)
    page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    _status(panel).filter(has_text="phalanx not loaded").wait_for()
    assert "No run" in panel.locator("section[aria-label='Run']").inner_text()
    assert "No learning network" in panel.locator("section[aria-label='Network']").inner_text()
