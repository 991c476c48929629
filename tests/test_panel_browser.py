"""The JupyterLab panel in a real JupyterLab, driven through Debian's headless Chromium.

The live test drives the panel's comm with a scripted session in the real kernel: the same
duck-typed surface LabComm needs from the real Session (events, scale, stop_cluster,
max_engines, run_history_rows), so it checks the panel and the comm before `%cluster` exists.
The cluster tests against a real ipyparallel cluster come with the magics.
"""

from __future__ import annotations

import shutil

import pytest
from browser_support import (  # noqa: F401  (fixtures)
    lab_page,
    lab_server,
    open_document,
    open_notebook,
    open_panel,
    run_all_cells,
    screenshot,
    wait_for_kernel_idle,
    widen_right_sidebar,
    write_notebook,
)

pytestmark = pytest.mark.browser

SCRIPTED_SESSION = '''
N_ENGINES = 2
import math
from phalanx import events
from phalanx._bus import EventBus
from phalanx._labcomm import LabComm


class ScriptedSession:
    """What LabComm needs from a session, with engines that are only rows in a table."""

    def __init__(self):
        self.events, self.max_engines, self.requests, self.rows = EventBus(), 4, [], []

    def scale(self, n):
        self.requests.append(("scale", n))
        engines = [{"rank": r, "engine_id": r, "host": "localhost", "pid": 4100 + r,
                    "device": "cpu", "state": "idle", "memory_mb": 310.0 + 12 * r, "step": 140}
                   for r in range(n)]
        self.events.emit(events.cluster_state(engines, self.max_engines))

    def stop_cluster(self):
        self.requests.append(("stop",))
        self.events.emit(events.cluster_state([], self.max_engines))

    def run_history_rows(self):
        return self.rows


session = ScriptedSession()
lab = LabComm(session)
lab.register()
session.scale(N_ENGINES)
session.events.emit(events.run_started("run-1", 2, 200, "allreduce"))
session.rows = [{"rank": r, "step": i, "t": i * 0.05 + r * 1e-3,
                 "metrics": {"loss": 2 * math.exp(-i / 45) + 0.08 * r + 0.03 * math.sin(i / 4),
                             "accuracy": 1 - math.exp(-i / 40)}}
                for i in range(1, 141) for r in range(2) if i <= 140 - 20 * r]
session.events.emit(events.metrics("run-1", session.rows))
session.events.emit(events.progress("run-1", [
    {"rank": 0, "step": 140, "total": 200, "steps_per_s": 20.4, "eta_s": 2.9, "straggler": False},
    {"rank": 1, "step": 120, "total": 200, "steps_per_s": 16.1, "eta_s": 5.0, "straggler": True},
]))
node = lambda i, label, kind, state, est, t=None, params=None, action=None: {
    "id": i, "label": label, "kind": kind, "state": state, "fit_time_s": t, "estimator": est,
    "params": params or {}, "last_action": action}
session.events.emit(events.network_state("stack", [
    node("X", "X", "source", "fresh", None),
    node("scale", "scaler", "machine", "fitted", "StandardScaler()", 0.02, {"with_mean": True},
         "fit"),
    node("pca", "pca", "machine", "fitted", "PCA(n_components=8)", 0.11, {"n_components": 8},
         "fit"),
    node("ridge", "ridge", "machine", "fitting", "Ridge(alpha=1.0)", None, {"alpha": 1.0}, "fit"),
    node("knn", "knn", "machine", "stale", "KNeighborsRegressor()", 0.4, {"n_neighbors": 5}, "fit"),
    node("blend", "blend", "machine", "queued", "LinearRegression()", None, {}, None),
], [("X", "scale"), ("scale", "pca"), ("pca", "ridge"), ("scale", "knn"), ("ridge", "blend"),
    ("knn", "blend")]))
'''


def _sections(panel):
    return {name: panel.locator(f"section[aria-label='{name}']") for name in
            ("Cluster", "Run", "Network")}


def test_panel_opens_with_three_empty_sections(lab_server, lab_page):
    write_notebook(lab_server.root / "empty.ipynb", ["1 + 1"])
    open_notebook(lab_page, lab_server, "empty.ipynb")
    panel = open_panel(lab_page)
    sections = _sections(panel)
    for section in sections.values():
        assert section.is_visible()
    assert "No cluster" in sections["Cluster"].inner_text()
    assert "No run" in sections["Run"].inner_text()
    assert "No learning network" in sections["Network"].inner_text()
    assert panel.locator(".jp-Phalanx-status").inner_text() == "phalanx not loaded"
    screenshot(lab_page, "phalanx-panel-empty.png")


def test_panel_attaches_after_load_and_round_trips_requests(lab_server, lab_page):
    write_notebook(lab_server.root / "live.ipynb", [SCRIPTED_SESSION])
    open_notebook(lab_page, lab_server, "live.ipynb")
    panel = open_panel(lab_page)  # opened before the kernel side exists
    assert panel.locator(".jp-Phalanx-status").inner_text() == "phalanx not loaded"

    run_all_cells(lab_page)
    status = panel.locator(".jp-Phalanx-status")
    status.filter(has_text="live").wait_for()
    rows = panel.locator(".jp-Phalanx-cluster tbody tr")
    assert rows.count() == 2
    assert panel.locator(".jp-Phalanx-rank").count() == 2
    assert panel.locator(".jp-Phalanx-rank.jp-mod-straggler").count() == 1
    chart = panel.locator(".jp-Phalanx-chart")
    assert chart.get_attribute("data-points") == "140"
    assert chart.locator("canvas").count() == 1
    states = panel.locator(".jp-Phalanx-dagNode").evaluate_all(
        "nodes => nodes.map(n => n.dataset.state)")
    assert sorted(states) == ["fitted", "fitted", "fitting", "fresh", "queued", "stale"]

    panel.locator(".jp-Phalanx-dagNode[data-node='pca']").click()
    assert "PCA(n_components=8)" in panel.locator(".jp-Phalanx-details").inner_text()

    panel.get_by_role("button", name="scale up").click()  # the kernel scales and answers
    panel.locator(".jp-Phalanx-cluster tbody tr").nth(2).wait_for()
    assert rows.count() == 3
    widen_right_sidebar(lab_page, 260)
    panel.locator(".jp-Phalanx-dag").evaluate("dag => { dag.scrollLeft = 0; }")  # after click()
    path = screenshot(lab_page, "phalanx-panel-live.png")
    shutil.copy(path, "/tmp/phalanx-panel.png")

    lab_page.reload()  # a reloaded page re-attaches and gets the state back
    wait_for_kernel_idle(lab_page)
    panel = open_panel(lab_page)
    panel.locator(".jp-Phalanx-status").filter(has_text="live").wait_for()
    assert panel.locator(".jp-Phalanx-cluster tbody tr").count() == 3
    assert panel.locator(".jp-Phalanx-chart").get_attribute("data-points") == "140"

    lab_page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()")
    panel.locator(".jp-Phalanx-status").filter(has_text="phalanx not loaded").wait_for()
    assert "No cluster" in panel.locator(".jp-Phalanx-cluster").inner_text()


def test_each_notebook_shows_its_own_kernel(lab_server, lab_page):
    for name, n in (("one.ipynb", 1), ("three.ipynb", 3)):
        source = SCRIPTED_SESSION.replace("N_ENGINES = 2", f"N_ENGINES = {n}")
        write_notebook(lab_server.root / name, [source])
    write_notebook(lab_server.root / "plain.ipynb", ["1 + 1"])
    open_notebook(lab_page, lab_server, "one.ipynb")
    run_all_cells(lab_page)
    panel = open_panel(lab_page)
    rows = panel.locator(".jp-Phalanx-cluster tbody tr")
    panel.locator(".jp-Phalanx-status").filter(has_text="live").wait_for()
    assert rows.count() == 1

    open_document(lab_page, "three.ipynb")
    run_all_cells(lab_page)
    rows.nth(2).wait_for()
    assert rows.count() == 3
    assert panel.locator(".jp-Phalanx-kernel").inner_text() == "three.ipynb"

    open_document(lab_page, "plain.ipynb")
    panel.locator(".jp-Phalanx-status").filter(has_text="phalanx not loaded").wait_for()

    open_document(lab_page, "one.ipynb")  # back: its state was kept, no new snapshot needed
    panel.locator(".jp-Phalanx-status").filter(has_text="live").wait_for()
    assert rows.count() == 1
