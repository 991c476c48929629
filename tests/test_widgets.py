"""Notebook views: pure logic with fakes (fast), then the live view and the cluster widget on a
real 2-engine cluster, driven through a real IPython shell and real widget objects."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from conftest import run_cell
from phalanx._bus import EventBus
from phalanx.events import progress as progress_event
from phalanx.events import metrics as metrics_event
from phalanx.events import run_ended
from phalanx.fit import MetricHistory, RunRecord
from phalanx.widgets import ClusterStatus, RunDisplay, RunSummary, TextProgress, cluster_view, widgets_available
from phalanx.widgets import _display, _frontend, _plot
from phalanx.widgets._cluster_table import merge_rows, table_html
from phalanx.widgets._format import bar_range, overall, progress_line, rank_text
from phalanx.widgets._series import MEAN, SeriesBuilder, full_series
from phalanx.widgets._summary import curves_png, thin, wants_log_scale
from phalanx.widgets._throttle import CpuBudget, Throttle


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rows(*items):
    """Wire rows from (rank, step, {metrics}) triples."""
    return [{"rank": r, "step": s, "t": 0.0, "metrics": m} for r, s, m in items]


def rank_progress(rank, step, total=None, rate=None, straggler=False, **metrics):
    eta = None if total is None or not rate else (total - step) / rate
    return {"rank": rank, "step": step, "total": total, "steps_per_s": rate, "eta_s": eta,
            "metrics": metrics, "straggler": straggler}


def fake_record(run_id="r-1", steps=None, status="done", history_rows=()):
    history = MetricHistory()
    for rank, step, metrics in history_rows:
        history.extend(rank, [[step, 0.0, metrics]])
    steps = steps or {0: 0, 1: 0}
    return RunRecord(run_id, "run-1", status, len(steps), 1.5, steps, history, {"seed": 1})


# --- pure logic ----------------------------------------------------------------------------------

def test_throttle_allows_one_update_per_interval():
    clock = FakeClock()
    throttle = Throttle(0.1, clock=clock)
    seen = []
    for tick in range(100):          # 1 s of events at 100/s
        clock.now = tick / 100
        seen.append(throttle.ready())
    assert sum(seen) == 10 and seen[0]


def test_cpu_budget_spaces_costly_updates_and_refills():
    clock = FakeClock()
    budget = CpuBudget(share=0.02, burst_s=0.1, min_interval_s=0.1, clock=clock)
    allowed = []
    for tick in range(100):          # 10 s of chances, every update costing 10 ms of CPU
        clock.now = tick / 10
        if budget.ready():
            allowed.append(clock.now)
            budget.spend(0.010)
    # 2% of a core pays for 10 ms every 0.5 s, after the 100 ms burst is spent
    assert 25 <= len(allowed) <= 32, len(allowed)
    assert allowed[:3] == [0.0, 0.1, 0.2]
    clock.now = 100.0
    assert budget.ready()             # a full bucket again, never more than the burst


def test_series_split_per_rank_with_the_mean_of_settled_steps():
    builder = SeriesBuilder(world_size=2)
    first = builder.add(rows((0, 1, {"loss": 1.0}), (0, 2, {"loss": 0.8}), (1, 1, {"loss": 3.0})))
    assert first["loss"][0] == ([1, 2], [1.0, 0.8])
    assert first["loss"][MEAN] == ([1], [2.0])            # step 2 waits for rank 1
    second = builder.add(rows((1, 2, {"loss": 1.2})))
    assert second["loss"][MEAN] == ([2], [1.0])
    assert builder.flush() == {}


def test_series_mean_of_a_metric_only_one_rank_logs():
    builder = SeriesBuilder(world_size=2)
    out = builder.add(rows((0, 1, {"val": 0.5}), (1, 1, {"loss": 1.0}), (1, 2, {"loss": 0.9})))
    assert out["val"][MEAN] == ([1], [0.5])                # rank 1 went past step 1 without it


def test_series_flush_settles_what_is_left_and_ignores_late_duplicates():
    builder = SeriesBuilder(world_size=3)
    builder.add(rows((0, 1, {"loss": 1.0}), (1, 1, {"loss": 2.0})))
    assert builder.flush()["loss"][MEAN] == ([1], [1.5])
    late = builder.add(rows((2, 1, {"loss": 9.0})))
    assert late["loss"][2] == ([1], [9.0]) and MEAN not in late["loss"]


def test_full_series_keeps_every_point():
    data = rows(*[(r, s, {"loss": 1.0 / s, "acc": s / 10}) for s in range(1, 6) for r in (0, 1)])
    points = full_series(data, 2)
    assert set(points) == {"loss", "acc"}
    assert all(len(points[m][r][0]) == 5 for m in points for r in (0, 1, MEAN))


def test_progress_text_with_and_without_total():
    assert rank_text(rank_progress(0, 50, 200, 25.0, loss=0.5)) == \
        "50/200 steps · 25.0 steps/s · ETA 6 s · loss 0.5"
    assert rank_text(rank_progress(1, 7, straggler=True)) == "7 steps · – steps/s · straggler"
    assert bar_range([rank_progress(0, 30), rank_progress(1, 40)]) == 40
    assert bar_range([rank_progress(0, 30, 100)]) == 100
    summary = overall([rank_progress(0, 10, 20, 2.0), rank_progress(1, 4, 20, 1.0, straggler=True)])
    assert summary["step"] == 4 and summary["eta_s"] == 16.0 and summary["stragglers"] == [1]
    line = progress_line("run-1", [rank_progress(0, 10, 20, 2.0, loss=0.25)], 5.0)
    assert line.startswith("run-1 running 5 s") and "10/20 steps" in line and "loss 0.25" in line


def test_text_progress_prints_a_throttled_line_and_a_final_one():
    clock, out = FakeClock(), io.StringIO()
    text = TextProgress("r-1", "run-1", stream=out, interval_s=1.0, clock=clock)
    for tick in range(25):           # 2.5 s of progress events at 10/s
        clock.now = tick / 10
        text.handle(progress_event("r-1", [rank_progress(0, tick, 30, 10.0)]))
    text.handle(progress_event("other-run", [rank_progress(0, 99)]))
    assert text.lines == 3
    text.finish(fake_record("r-1", steps={0: 30}))
    written = out.getvalue()
    assert written.endswith("\n") and written.count("\n") == 1
    assert "run-1 done" in written.split("\r")[-1] and "30/30 steps" in written.split("\r")[-1]


def test_log_scale_choice_and_thinning():
    assert wants_log_scale([5.0, 0.01]) and not wants_log_scale([0.0, 1.0])
    xs, ys = thin(list(range(10_001)), list(range(10_001)), limit=1000)
    assert len(xs) <= 1001 and xs[-1] == 10_000 and xs == ys


def test_summary_embeds_the_curves_and_keeps_the_manifest():
    record = fake_record(history_rows=[(r, s, {"loss": 1.0 / s}) for s in range(1, 6) for r in (0, 1)],
                         steps={0: 5, 1: 5})
    summary = RunSummary(record)
    page = summary._repr_html_()
    assert "data:image/png;base64," in page and "<table>" in page and "10 metric rows" in page
    assert repr(summary) == repr(record)
    assert summary.metadata == {"phalanx": {"manifest": {"seed": 1}}}
    assert curves_png(record.curves(), 2).startswith(b"\x89PNG")
    assert RunSummary(fake_record())._repr_html_().count("<img") == 0   # nothing logged


def test_engine_table_rows_and_html():
    engines = [{"rank": r, "engine_id": r, "host": "h", "pid": None, "device": "cpu",
                "state": "idle", "memory_mb": None, "step": None} for r in range(3)]
    merged = merge_rows(engines, {0: 5, 1: 4}, running=2, memory=lambda pid, host: 12.5)
    assert [r["state"] for r in merged] == ["busy", "busy", "idle"]
    assert [r["step"] for r in merged] == [5, 4, None] and merged[0]["memory_mb"] == 12.5
    page = table_html(merged)
    assert page.count("<tr>") == 4 and "memory (MB)" in page


def test_widgets_only_where_a_kernel_frontend_can_draw_them():
    assert not widgets_available(None)
    assert not widgets_available(InteractiveShell.instance())
    zmq_like = type("ZMQInteractiveShell", (), {})()
    assert widgets_available(zmq_like)


# --- widget views with fake events (real ipywidgets and bokeh models, no cluster) ----------------

def test_run_view_follows_progress_and_streams_points():
    from phalanx.widgets._run_view import RunView

    view = RunView("r-1", "run-1", world_size=2, total_steps=None)
    view.handle(metrics_event("r-1", rows((0, 1, {"loss": 1.0}), (1, 1, {"loss": 2.0}))))
    view.handle(progress_event("r-1", [rank_progress(0, 10, rate=5.0), rank_progress(1, 6, straggler=True)]))
    view.handle(progress_event("other", [rank_progress(0, 99), rank_progress(1, 99)]))
    view.drain()
    bars = view.progress.bars
    assert [b.value for b in bars] == [10, 6] and bars[0].max == 10      # no total: leader is full
    assert bars[1].bar_style == "warning" and "⚠" in view.progress.details[1].value
    assert "straggler(s): rank 1" in view.header.value
    view.handle(metrics_event("r-1", rows((0, 2, {"loss": 0.5, "acc": 0.7}))))
    view.handle(run_ended("r-1", "done", 2.0))
    view.finish(fake_record("r-1", steps={0: 12, 1: 12}))
    assert [b.value for b in bars] == [12, 12] and {b.bar_style for b in bars} == {"success"}
    assert view.plot.metrics == ["loss", "acc"]
    assert view.plot.points("loss", 0) == 2 and view.plot.points("loss", MEAN) == 2
    assert view.plot.lines[("acc", MEAN)].values() == [0.7]
    assert "done" in view.header.value
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "run-1" in bundle["text/plain"]


def test_run_view_coalesces_events_within_its_cpu_budget():
    from phalanx.widgets._run_view import RunView

    clock = FakeClock()
    view = RunView("r-1", "run-1", world_size=1, total_steps=100, clock=clock)
    view.handle(metrics_event("r-1", rows((0, 1, {"loss": 1.0}))))
    view.handle(progress_event("r-1", [rank_progress(0, 1, 100)]))       # applied at once
    assert view.progress.bars[0].value == 1 and view.plot.points("loss", 0) == 1
    for step in range(2, 6):                                             # same instant: queued
        view.handle(metrics_event("r-1", rows((0, step, {"loss": 1.0 / step}))))
        view.handle(progress_event("r-1", [rank_progress(0, step, 100)]))
    assert view.progress.bars[0].value == 1 and view.plot.points("loss", 0) == 1
    assert view.rows_seen == 5                                           # taken, not drawn yet
    clock.now = 1.0
    view.handle(progress_event("r-1", [rank_progress(0, 6, 100)]))       # one update for all
    assert view.progress.bars[0].value == 6 and view.plot.points("loss", 0) == 5


def test_run_view_keeps_drawing_while_a_run_logs_faster_than_its_budget():
    """Rows are split as they come, whatever the budget: only the widget updates are paced.
    Charged for the splitting too, a view whose run logs ~45,000 rows between two progress
    events stayed in debt, and blank, until the run ended."""
    from phalanx.widgets._run_view import RunView

    clock = FakeClock()
    view = RunView("r-1", "run-1", world_size=1, total_steps=None, clock=clock)
    drawn, step = [], 0
    for _ in range(5):
        for _ in range(3):   # 15,000 rows each: tens of ms of splitting, over the 30 ms burst
            batch = rows(*((0, s, {"loss": 1.0 / (1 + s)}) for s in range(step, step + 15_000)))
            view.handle(metrics_event("r-1", batch))
            step += 15_000
        clock.now += 60.0    # refills the whole burst (a first update costs ~0.1 s more)
        view.handle(progress_event("r-1", [rank_progress(0, step)]))
        drawn.append(view.plot.lines[("loss", 0)].logged if ("loss", 0) in view.plot.lines else 0)
    assert view.rows_seen == step
    assert sum(b > a for a, b in zip([0] + drawn, drawn)) >= 4, drawn   # updated nearly each time


def test_first_metric_relabels_the_panel_built_ahead():
    plot = _plot.LivePlot(world_size=2)
    prebuilt = plot.tabs.tabs[0].child
    assert not plot.tabs.visible
    plot.extend({"loss": {0: ([1], [1.0])}})
    assert plot.tabs.visible and plot.tabs.tabs[0].child is prebuilt and plot.metrics == ["loss"]
    figures = [panel.child for panel in prebuilt.tabs]
    assert [f.yaxis[0].axis_label for f in figures] == ["loss", "loss"]
    assert [type(f.y_scale).__name__ for f in figures] == ["LinearScale", "LogScale"]
    plot.extend({"acc": {1: ([1], [0.5])}})
    assert plot.metrics == ["loss", "acc"] and len(plot.tabs.tabs) == 2


def test_live_plot_lines_stay_bounded_and_keep_spikes_and_the_last_point(monkeypatch):
    monkeypatch.setattr(_plot, "MAX_POINTS", 40)
    plot = _plot.LivePlot(world_size=1)
    for start in range(0, 10, 3):  # short: every point drawn as logged
        steps = list(range(start, min(start + 3, 10)))
        plot.extend({"loss": {0: (steps, [float(s) for s in steps])}})
    line = plot.lines[("loss", 0)]
    assert len(line) == 10 and line.values() == [float(s) for s in range(10)]
    values = [1.0] * 5000
    values[1234], values[4321] = 50.0, -7.0   # a spike and a dip, long scrolled past
    for start in range(10, 5000, 97):
        steps = list(range(start, min(start + 97, 5000)))
        plot.extend({"loss": {0: (steps, [values[s] for s in steps])}})
        data = line.source.data
        assert len(data["x"]) == len(line) <= 44 and list(data["x"]) == sorted(data["x"])
    drawn = line.values()
    assert max(drawn) == 50.0 and min(drawn) == -7.0 and line.logged == 5000
    assert list(line.source.data["x"])[-1] == 4999.0


def test_one_update_leaves_as_one_patch_message():
    plot = _plot.LivePlot(world_size=2)
    plot.extend({"loss": {0: ([1], [1.0]), 1: ([1], [2.0]), MEAN: ([1], [1.5])}})
    sent = []
    plot.model.send = lambda content, buffers=None: sent.append(content)
    plot.extend({"loss": {0: ([2], [0.5]), 1: ([2], [1.0]), MEAN: ([2], [0.75])}})
    headers = [json.loads(m["payload"]) for m in sent if '"msgtype"' in m.get("payload", "")]
    assert [h["msgtype"] for h in headers] == ["PATCH-DOC"]
    content = json.loads(sent[2]["payload"])
    assert [e["kind"] for e in content["events"]] == ["ColumnsStreamed"] * 3


def test_run_view_follows_an_elastic_run_that_grows_and_shrinks():
    from phalanx.widgets._run_view import RunView

    view = RunView("r-1", "run-1", world_size=2, total_steps=100)
    view.handle(progress_event("r-1", [rank_progress(0, 10), rank_progress(1, 10)]))
    view.handle(metrics_event("r-1", rows((0, 1, {"loss": 1.0}), (1, 1, {"loss": 2.0}))))
    view.drain()
    # Resized to 3 ranks at a commit: a bar, a line and a legend entry for rank 2.
    view.handle(metrics_event("r-1", rows((0, 2, {"loss": 1.0}), (1, 2, {"loss": 2.0}),
                                          (2, 2, {"loss": 3.0}))))
    view.handle(progress_event("r-1", [rank_progress(r, 12) for r in range(3)]))
    view.drain()
    assert [b.value for b in view.progress.bars] == [12, 12, 12]
    assert "3 rank(s)" in view.header.value
    assert view.plot.points("loss", 2) == 1 and view.plot.lines[("loss", MEAN)].values() == [1.5, 2.0]
    legend = view.plot.panels["loss"].figures[0].legend[0]
    assert [item.label["value"] for item in legend.items] == ["rank 0", "rank 1", "rank 2", "mean"]
    # Shrunk back to 2: rank 2's row is hidden, not left showing a stale count.
    view.handle(progress_event("r-1", [rank_progress(r, 20) for r in range(2)]))
    view.drain()
    rows_shown = [row.layout.display for row in view.progress.widget.children]
    assert rows_shown == ["", "", "none"] and "2 rank(s)" in view.header.value


def test_cluster_widget_says_what_waits_for_the_run():
    from phalanx.events import cluster_state
    from phalanx.widgets import ClusterWidget

    bus = EventBus()
    engine = {"rank": 0, "engine_id": 0, "host": "h", "pid": None, "device": "cpu",
              "state": "busy", "memory_mb": None, "step": None}
    session = SimpleNamespace(events=bus, max_engines=4, status=None, size=1, running=False,
                              launcher="local")
    panel = ClusterWidget(session)
    bus.emit(cluster_state([engine], 4, notice="scale to 2 after run-3"))   # + during a run
    assert "scale to 2 after run-3" in panel.message.value
    bus.emit(cluster_state([engine, {**engine, "rank": 1}], 4))               # applied after it
    assert "after run-3" not in panel.message.value
    panel.close()


def test_cluster_widget_shows_a_change_made_elsewhere():
    from phalanx.events import cluster_state
    from phalanx.widgets import ClusterWidget

    bus = EventBus()
    session = SimpleNamespace(events=bus, max_engines=4, status=None, size=0, running=False,
                              launcher="local")
    panel = ClusterWidget(session)
    assert "not running" in panel.title.value and not panel.start_button.disabled
    engine = {"rank": 0, "engine_id": 0, "host": "h", "pid": None, "device": "cpu",
              "state": "starting", "memory_mb": None, "step": None}
    bus.emit(cluster_state([engine], 4, busy=True))                 # e.g. %cluster start elsewhere
    assert panel.plus.disabled and panel.start_button.disabled
    assert "the cluster is changing" in panel.message.value
    bus.emit(cluster_state([{**engine, "state": "idle"}], 4))
    assert not panel.plus.disabled and panel.count.value == 1 and "limit 4" in panel.title.value
    assert panel.message.value == ""
    panel.close()


def test_the_sessions_engine_status_shows_as_the_table_of_cluster_status():
    from phalanx._magics import register
    from phalanx._session import EngineStatus

    shell = InteractiveShell.instance()
    register(shell)     # %load_ext phalanx
    engine = {"rank": 0, "engine_id": 3, "host": "h", "pid": 9, "device": "cpu",
              "state": "idle", "memory_mb": None, "step": None}
    shown, _ = shell.display_formatter.format(EngineStatus([engine], "local"))
    assert shown["text/plain"] == repr(ClusterStatus([engine], "local"))
    assert shown["text/plain"].startswith("1 engine(s), local launcher")
    assert "<table>" in shown["text/html"]
    session = SimpleNamespace(status=lambda: EngineStatus([], "local"), shell=shell)
    assert "no cluster is running" in repr(cluster_view(session))   # a terminal: the table


def test_run_display_chooses_text_outside_a_widget_frontend(capsys):
    bus = EventBus()
    session = SimpleNamespace(events=bus, last_record=None)
    shown = RunDisplay(session, InteractiveShell.instance(), widget=True)
    tracker = SimpleNamespace(run_id="r-9", world_size=2, total_steps=4)
    shown.start(tracker, "run-9")
    assert isinstance(shown.view, TextProgress) and not shown.live
    bus.emit(progress_event("r-9", [rank_progress(0, 2, 4), rank_progress(1, 2, 4)]))
    session.last_record = fake_record("r-9", steps={0: 4, 1: 4})
    summary = shown.finish()
    assert isinstance(summary, RunSummary) and summary.record.run_id == "r-9"
    assert "run-9 done" in capsys.readouterr().out
    bus.emit(progress_event("r-9", [rank_progress(0, 3, 4)]))   # detached: nothing more printed
    assert capsys.readouterr().out == ""


def test_run_display_shows_the_live_view_in_a_widget_frontend(monkeypatch):
    from phalanx.widgets._run_view import RunView

    monkeypatch.setattr(_frontend, "widgets_available", lambda shell: True)
    shown_objects = []
    bus = EventBus()
    session = SimpleNamespace(events=bus, last_record=fake_record("older"))
    shown = RunDisplay(session, None, widget=True, show=shown_objects.append)
    shown.start(SimpleNamespace(run_id="r-2", world_size=2, total_steps=None), "run-2")
    assert shown_objects == [shown.view] and isinstance(shown.view, RunView)
    assert RunDisplay(session, None, widget=False).live is False      # --no-widget
    assert shown.finish() is None            # the run left no record: no summary of another run


# --- real cluster ----------------------------------------------------------------------------------

from test_fit import SETUP  # the same data and model as the fit tests  # noqa: E402

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
    summaries = [o for o in outputs if "data:image/png;base64," in o.data.get("text/html", "")]
    assert len(widget_outputs) == 1 and len(summaries) == 1
    assert "widget-run" in summaries[0].data["text/html"] and "12" in summaries[0].data["text/plain"]
    assert summaries[0].metadata["phalanx"]["manifest"] == record.manifest


@pytest.mark.cluster
def test_no_widget_prints_progress_and_still_keeps_the_summary(two_engines, shell, live_views, capsys):
    run_cell(shell, SETUP)
    with capture_output() as captured:
        run_cell(shell, "%%distributed_fit --shard X,y --no-widget --name text-run\n" + LOOP)
    assert live_views == []                                     # no live view was built
    assert "text-run done" in captured.stdout and "12 steps" in captured.stdout
    assert any("data:image/png;base64," in o.data.get("text/html", "") for o in captured.outputs)


@pytest.mark.cluster
def test_a_failed_run_keeps_its_curves_in_the_view_and_the_summary(two_engines, shell, live_views):
    from phalanx.fit import DistributedFitError

    cell = ("%%distributed_fit --name bad-run\nfrom phalanx import log\n"
            "for i in range(5):\n    log(loss=1.0 / (i + 1))\nif rank == 1:\n    raise ValueError('boom')\n")
    with capture_output() as captured, pytest.raises(DistributedFitError, match="rank 1"):
        run_cell(shell, cell)
    [view] = live_views
    assert "failed" in view.header.value and view.progress.bars[0].bar_style == "danger"
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
    assert any(widget in o.get("data", {}) for o in run)                        # live view
    [summary] = [o for o in run if "phalanx" in o.get("metadata", {})]
    page = summary["data"]["text/html"]
    assert "data:image/png;base64," in page and "nb-run" in page
    assert summary["metadata"]["phalanx"]["manifest"]["world_size"] == 2
    assert "[(0, 15), (1, 15)] errors: []" in "".join(o.get("text", "") for o in outputs[3])


@pytest.mark.parametrize("name", ["_format", "_series", "_throttle", "_frontend", "_summary",
                                  "_cluster_table"])
def test_docstring_examples(name):
    """The examples in the widgets' pure modules run and say what they show."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"phalanx.widgets.{name}"))
    assert result.attempted > 0 and result.failed == 0, name


def test_zooming_a_finished_plot_redraws_the_window_at_full_resolution(monkeypatch):
    from phalanx.fit._digest import window_points

    monkeypatch.setattr(_plot, "MAX_POINTS", 100)
    history = MetricHistory()
    plot = _plot.LivePlot(world_size=2)
    for start in range(0, 20_000, 500):
        for rank in (0, 1):
            rows = [[s, 0.0, {"loss": float(s % 7 + rank)}] for s in range(start, start + 500)]
            history.extend(rank, rows)
            steps = [r[0] for r in rows]
            plot.extend({"loss": {rank: (steps, [r[2]["loss"] for r in rows])}})
    line = plot.lines[("loss", 1)]
    assert len(line) <= 104
    plot.zoom_from(lambda name, key, start, end: window_points(history, name, key, start, end, 100))
    x_range = plot.panels["loss"].figures[0].x_range
    x_range.start, x_range.end = 5000, 5040          # what the browser's zoom tool sends
    data = line.source.data
    inside = [(x, y) for x, y in zip(data["x"], data["y"]) if 5000 <= x <= 5040]
    assert inside == [(float(s), float(s % 7 + 1)) for s in range(5000, 5041)]
    assert list(data["x"]) == sorted(data["x"]) and data["x"][-1] == 19_999   # the rest still drawn
    x_range.start, x_range.end = 0, 19_999           # zoomed out again: the downsampled curve
    assert len(line) <= 104
