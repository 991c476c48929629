"""The JupyterLab panel against the real product, in a real JupyterLab in headless Chromium.

One notebook drives a real kernel as a person would: ``%load_ext phalanx``, a 2-engine CPU
cluster, a short ``%%distributed_fit`` that logs a loss, the panel's + button, a small learning
network fitted on the cluster with ``%distributed_fit yhat``, ``%cluster stop``.  Along the way
the panel is checked for what a person relies on: it attaches when it was opened before
``%load_ext``, a page reload re-attaches with the state, each notebook shows its own kernel,
a kernel restart clears it.  Kernel-side facts (engine counts, process ids) are read from the
kernel, not from the panel.  Screenshots go to ``test-artifacts/``.

The scenarios share one cluster (starting engines is the slow part), so they are steps of one
test rather than separate tests.
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_all_gone
from browser_support import (  # noqa: F401  (fixtures)
    StepClock,
    lab_page,
    lab_server,
    open_document,
    open_notebook,
    open_panel,
    reload_lab,
    run_cell,
    screenshot,
    screenshot_on_failure,
    widen_right_sidebar,
    write_notebook,
)

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
]
LOAD_CLUSTER, FIT, COUNT_ENGINES, NETWORK, PROCESS_IDS, STOP = range(6)
FITTED = {"X": "fitted", "y": "fitted", "scaler": "fitted", "ridge": "fitted"}
CLUSTER_TIMEOUT_MS = 180_000  # engines start slowly on a busy 2-core machine


def _status(panel):
    return panel.locator(".jp-Phalanx-status")


def _engine_rows(panel):
    return panel.locator(".jp-Phalanx-cluster tbody tr")


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
    assert _rank_steps(panel) == {"0": [str(STEPS)] * 2, "1": [str(STEPS)] * 2}
    assert panel.locator(".jp-Phalanx-rank.jp-mod-done").count() == 2
    chart = panel.locator(".jp-Phalanx-chart")
    assert int(chart.get_attribute("data-points")) == STEPS  # one x point per logged step
    assert chart.locator("canvas").count() == 1


def _assert_gone(pids: list[int], timeout: float = 30.0) -> None:
    assert_all_gone(pids, timeout=timeout)


def test_panel_follows_a_real_cluster_run_scale_and_network(lab_server, lab_page):
    page, step = lab_page, StepClock()
    write_notebook(lab_server.root / "train.ipynb", TRAIN)
    write_notebook(lab_server.root / "other.ipynb", ["%load_ext phalanx"])
    write_notebook(lab_server.root / "plain.ipynb", ["1 + 1"])
    with screenshot_on_failure(page, "phalanx-panel-failure.png"):
        open_notebook(page, lab_server, "train.ipynb")
        panel = _opened_before_load(page)
        step("panel opened before %load_ext")
        _start_and_train(page, panel)
        step("cluster started, run done")
        _scale_up_from_panel(page, panel)
        step("scaled to 3 from the panel")
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
    """Opened before %load_ext: the panel says so, and how to fix it."""
    panel = open_panel(page)
    assert _status(panel).inner_text() == "phalanx not loaded"
    assert "%load_ext phalanx" in panel.locator(".jp-Phalanx-hint").inner_text()
    for name, empty in (("Cluster", "No cluster"), ("Run", "No run"),
                        ("Network", "No learning network")):
        assert empty in panel.locator(f"section[aria-label='{name}']").inner_text()
    screenshot(page, "phalanx-panel-not-loaded.png")
    return panel


def _start_and_train(page, panel) -> None:
    """%load_ext + %cluster start attach the panel by itself; a short run fills bars and chart."""
    run_cell(page, LOAD_CLUSTER, timeout_ms=CLUSTER_TIMEOUT_MS)
    _status(panel).filter(has_text="live").wait_for()
    _engine_rows(panel).nth(1).wait_for()
    assert _engine_rows(panel).count() == 2
    assert panel.locator(".jp-Phalanx-kernel").inner_text() == "train.ipynb"
    run_cell(page, FIT)
    _assert_run_done(panel)
    assert panel.locator(".jp-Phalanx-metric").input_value() == "loss"


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
    """+ scales the kernel's cluster: checked from the kernel, not from the panel."""
    page.evaluate(RECORD_CLUSTER_SECTION)
    panel.get_by_role("button", name="scale up").click()
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
    widen_right_sidebar(page, 260)
    screenshot(page, "phalanx-panel-live.png")


def _cluster_pids(page) -> list[int]:
    pids = json.loads(run_cell(page, PROCESS_IDS))
    assert len(pids["engines"]) >= 3
    return pids["controller"] + pids["engines"]


def _reload(page):
    """A reloaded page re-attaches and gets the whole state back from the kernel."""
    reload_lab(page)
    panel = open_panel(page)
    _status(panel).filter(has_text="live").wait_for()
    _engine_rows(panel).nth(2).wait_for()
    assert _engine_rows(panel).count() == 3
    _assert_run_done(panel)
    assert _node_states(panel) == FITTED
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
