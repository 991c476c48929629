"""Notebook views on a real 2-engine cluster, driven through a real IPython shell and real widget
objects: the live view and summary of real runs, the cluster widget scaling, restarting and
stopping the real cluster, and the views in a real kernel run by nbclient."""

from __future__ import annotations

import time

import pytest
from IPython.utils.capture import capture_output

from conftest import run_cell
from phalanx.widgets import ClusterStatus, cluster_view
from phalanx.widgets import _display, _frontend, _plot
from phalanx.widgets._series import MEAN
from test_fit import SETUP  # the same data and model as the fit tests

LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(12):
    opt.zero_grad()
    loss = ((model(X).squeeze(1) - y) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item(), lr=0.05)
"""


@pytest.fixture
def live_views(monkeypatch):
    """Make the shell count as a widget frontend and keep what the magic displays."""
    shown = []
    monkeypatch.setattr(_frontend, "widgets_available", lambda shell: True)
    real = _display._display
    monkeypatch.setattr(_display, "_display", lambda obj: (shown.append(obj), real(obj)))
    return shown


@pytest.mark.cluster
def test_live_view_and_summary_of_a_real_two_rank_run(two_engines, shell, live_views):
    run_cell(shell, SETUP)
    with capture_output() as captured:
        run_cell(shell, "%%distributed_fit --shard X,y --steps 12 --name widget-run\n" + LOOP)
    record = two_engines.last_run()
    assert record.steps == {0: 12, 1: 12}
    [view] = live_views
    assert [bar.value for bar in view.progress.bars] == [record.steps[0], record.steps[1]]
    assert all(bar.max == 12 for bar in view.progress.bars)
    history = record.history.rows()
    assert len(history) == 24 and view.rows_seen == 24
    for rank in (0, 1):
        logged = [r["loss"] for r in history if r["rank"] == rank]
        assert view.plot.lines[("loss", rank)].values() == logged
    assert sum(view.plot.points("loss", r) for r in (0, 1)) == len(history)
    assert view.plot.points("loss", MEAN) == 12 and view.plot.metrics == ["loss", "lr"]
    outputs = captured.outputs
    widget_outputs = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.data]
    summaries = [o for o in outputs if "data:image/svg+xml;base64," in o.data.get("text/html", "")]
    assert len(widget_outputs) == 1 and len(summaries) == 1
    assert "widget-run" in summaries[0].data["text/html"] and "12" in summaries[0].data["text/plain"]
    assert summaries[0].metadata["phalanx"]["manifest"] == record.manifest


@pytest.mark.cluster
def test_a_cell_calling_log_through_a_function_gets_its_plot_during_the_run(
        two_engines, shell, live_views, monkeypatch):
    """The cell calls no log() itself, so its plot is not built ahead: it is built once the run
    has trained a while, by the cell's own thread in the run's wait loop (where a widget's
    messages are addressed to the cell), not by the thread that delivers the events."""
    import threading

    built_on = []
    real_init = _plot.LivePlot.__init__

    def recording_init(self, *args, **kwargs):
        built_on.append(threading.current_thread())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(_plot.LivePlot, "__init__", recording_init)
    run_cell(shell, "from phalanx import log\ndef report(i):\n    log(loss=1.0 / (i + 1))")
    with capture_output():
        run_cell(shell, "%%distributed_fit --name lazy-run\nimport time\n"
                        "for i in range(30):\n    report(i)\n    time.sleep(0.1)\n")
    [view] = live_views
    assert built_on == [threading.current_thread()] and view.widget.children[-1] is view.plot.model
    logged = [r["loss"] for r in two_engines.last_run().history.rows() if r["rank"] == 0]
    assert len(logged) == 30 and view.plot.lines[("loss", 0)].values() == logged


@pytest.mark.cluster
def test_no_widget_prints_progress_and_still_keeps_the_summary(two_engines, shell, live_views, capsys):
    run_cell(shell, SETUP)
    with capture_output() as captured:
        run_cell(shell, "%%distributed_fit --shard X,y --no-widget --name text-run\n" + LOOP)
    assert live_views == []                                     # no live view was built
    assert "text-run done" in captured.stdout and "12 steps" in captured.stdout
    assert any("data:image/svg+xml;base64," in o.data.get("text/html", "") for o in captured.outputs)


@pytest.mark.cluster
def test_a_failed_run_keeps_its_curves_in_the_view_and_the_summary(two_engines, shell, live_views):
    from phalanx.fit import DistributedFitError

    cell = ("%%distributed_fit --name bad-run\nfrom phalanx import log\n"
            "for i in range(5):\n    log(loss=1.0 / (i + 1))\nif rank == 1:\n    raise ValueError('boom')\n")
    with capture_output() as captured, pytest.raises(DistributedFitError, match="rank 1"):
        run_cell(shell, cell)
    [view] = live_views
    assert "failed" in view.header.value
    # the rank that raised is red; the rank it released is amber
    assert [b.bar_style for b in view.progress.bars] == ["warning", "danger"]
    assert view.plot.points("loss", 0) == view.plot.points("loss", 1) == 5
    [summary] = [o for o in captured.outputs if "phalanx" in o.metadata]
    assert "bad-run</b>: failed" in summary.data["text/html"] and "<img" in summary.data["text/html"]


@pytest.mark.cluster
def test_metrics_under_load_lose_no_row_and_updates_stay_throttled(two_engines, shell, live_views):
    calls = 8000
    updates = []
    unsubscribe = two_engines.events.subscribe(
        lambda e: updates.append(time.monotonic()) if e["type"] == "progress" else None)
    try:
        run_cell(shell, f"""%%distributed_fit
import time
for i in range({calls}):
    log(i=float(i))
    if i % 100 == 99:
        time.sleep(0.02)          # about 4,000 calls/s per rank, for ~2 s
""")
    finally:
        unsubscribe()
    history = two_engines.last_run().history.rows()
    assert len(history) == 2 * calls
    for rank in (0, 1):
        assert [r["i"] for r in history if r["rank"] == rank] == [float(i) for i in range(calls)]
    [view] = live_views
    # every row reached the plot; each line draws a bounded number of them
    assert sum(view.plot.lines[("i", r)].logged for r in (0, 1)) == 2 * calls
    assert all(view.plot.points("i", r) <= _plot.MAX_POINTS + 4 for r in (0, 1))
    span = updates[-1] - updates[0]
    assert len(updates) <= 12 * span + 2, (len(updates), span)   # ~10 updates/s at most


@pytest.mark.cluster
def test_cluster_widget_plus_and_minus_scale_the_real_cluster(two_engines):
    panel = cluster_view(two_engines, widget=True)
    try:
        assert panel.count.value == 2 and panel.table.value.count("<tr>") == 3
        panel.plus.click()
        assert panel.busy is not None and panel.plus.disabled        # busy while it changes
        assert panel.wait(120)
        assert panel.error is None, panel.error
        assert two_engines.cluster.size == 3 and panel.count.value == 3
        assert panel.table.value.count("<tr>") == 4 and not panel.plus.disabled
        assert "scaling to 3 engine(s): done" in panel.message.value
        panel.minus.click()
        assert panel.wait(120) and panel.error is None
        assert two_engines.cluster.size == 2 and panel.count.value == 2
        assert "2 engine(s)" in repr(ClusterStatus.of(two_engines.status()))
    finally:
        panel.close()


@pytest.mark.cluster
def test_cluster_widget_says_why_an_invalid_scale_is_refused(two_engines, monkeypatch):
    panel = cluster_view(two_engines, widget=True)
    ids = two_engines.cluster.engine_ids()
    try:
        panel.count.value = 0                                       # typed into the number box
        assert panel.wait(30)
        assert "at least 1 engine" in panel.error and "at least 1 engine" in panel.message.value
        assert panel.count.value == 2 and two_engines.cluster.engine_ids() == ids
        monkeypatch.setattr(two_engines.cluster, "max_engines", 2)
        panel.plus.click()
        assert panel.wait(30)
        assert "above this cluster's limit of 2" in panel.error
        assert two_engines.cluster.engine_ids() == ids and not panel.plus.disabled
    finally:
        panel.close()


@pytest.mark.cluster
def test_cluster_widget_restart_stop_and_start_buttons(two_engines):
    panel = cluster_view(two_engines, widget=True)
    try:
        before = two_engines.cluster.engine_ids()
        panel.restart_button.click()
        assert panel.wait(120) and panel.error is None, panel.error
        after = two_engines.cluster.engine_ids()
        assert len(after) == 2 and not set(after) & set(before)            # every engine is new
        panel.stop_button.click()
        assert panel.wait(60) and panel.error is None, panel.error
        assert not two_engines.cluster.running and "not running" in panel.title.value
        assert panel.plus.disabled and not panel.start_button.disabled
        panel.count.value = 2                                             # a count to start with
        panel.start_button.click()
        assert panel.wait(120) and panel.error is None, panel.error
        assert two_engines.cluster.size == 2 and panel.start_button.disabled
    finally:
        panel.close()
        if not two_engines.cluster.running:
            two_engines.start_cluster(n=2, gpus="none")


@pytest.mark.cluster
def test_cluster_widget_follows_cluster_events_and_text_elsewhere(two_engines, shell):
    assert isinstance(cluster_view(two_engines), ClusterStatus)    # a terminal shell: the table
    panel = cluster_view(two_engines, widget=True)
    try:
        two_engines.scale(3)                                        # changed from elsewhere
        assert panel.count.value == 3 and panel.table.value.count("<tr>") == 4
        assert "3 engine(s)" in panel._repr_mimebundle_()["text/plain"]
    finally:
        two_engines.scale(2)
        panel.close()


NOTEBOOK_RUN = """%%distributed_fit --steps 15 --name nb-run
import torch
from phalanx import log
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(15):
    opt.zero_grad()
    loss = ((net(torch.ones(4, 3)) - 1) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
"""


@pytest.mark.cluster
@pytest.mark.slow
def test_views_in_a_real_kernel_leave_a_summary_that_needs_none():
    """nbclient runs a notebook in a real ipykernel: the widgets are really built and sent."""
    import nbformat
    from nbclient import NotebookClient

    catch = ("import logging\nerrors = []\nclass Catch(logging.Handler):\n"
             "    def emit(self, record): errors.append(record.getMessage())\n"
             "logging.getLogger('phalanx').addHandler(Catch(logging.ERROR))\n")
    cells = [catch + "%load_ext phalanx\n%cluster start -n 2 --gpus none", "%cluster", NOTEBOOK_RUN,
             "import phalanx\nprint(sorted(phalanx.last_run().steps.items()), 'errors:', errors)\n"
             "%cluster stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    finally:
        outputs = [cell.get("outputs", []) for cell in nb.cells]
    widget = "application/vnd.jupyter.widget-view+json"
    assert any(widget in o.get("data", {}) for o in outputs[1])                 # cluster widget
    run = outputs[2]
    assert not [o for o in run if o["output_type"] == "error"]
    assert not [o for o in run if o.get("name") == "stderr" and "Traceback" in o["text"]]
    # The live view was drawn in the run's first line and the summary took its place: the
    # saved cell holds nothing a reopened page could not draw ("model not found").
    assert not any(widget in o.get("data", {}) for o in run), run
    assert not any("phalanx-status" in str(o.get("data", {})) for o in run), run
    [summary] = [o for o in run if "phalanx" in o.get("metadata", {})]
    assert run.index(summary) == 0, "the summary sits where the cell's first line was"
    started = outputs[0]                              # the start's line became the engine table
    assert not any("phalanx-status" in str(o.get("data", {})) for o in started), started
    assert any("idle" in str(o.get("data", {}).get("text/html", "")) for o in started), started
    page = summary["data"]["text/html"]
    assert "data:image/svg+xml;base64," in page and "nb-run" in page
    assert summary["metadata"]["phalanx"]["manifest"]["world_size"] == 2
    assert "[(0, 15), (1, 15)] errors: []" in "".join(o.get("text", "") for o in outputs[3])
