"""Notebook views with fake events (real ipywidgets and bokeh models, no cluster): the live run
view and its plot, and the display that picks a live view or text for a run."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bokeh.events import RangesUpdate
from IPython.core.interactiveshell import InteractiveShell

from phalanx._bus import EventBus
from phalanx.events import progress as progress_event
from phalanx.events import metrics as metrics_event
from phalanx.events import run_ended
from phalanx.fit import MetricHistory
from phalanx.widgets import RunDisplay, RunSummary, TextProgress
from phalanx.widgets import _frontend, _plot
from phalanx.widgets._series import MEAN
from widget_fakes import FakeClock, fake_record, rank_progress, rows


def test_run_view_follows_progress_and_streams_points():
    from phalanx.widgets._run_view import RunView

    view = RunView("r-1", "run-1", world_size=2, total_steps=None)
    view.handle(metrics_event("r-1", rows((0, 1, {"loss": 1.0}), (1, 1, {"loss": 2.0}))))
    view.handle(progress_event("r-1", [rank_progress(0, 10, rate=5.0), rank_progress(1, 6, straggler=True)]))
    view.handle(progress_event("other", [rank_progress(0, 99), rank_progress(1, 99)]))
    view.drain()
    bars = view.progress.bars
    # No total: the counts are in the lines; no bar looks full (nor shows) until the run ends.
    assert view.progress.counts == [10, 6] and [b.value for b in bars] == [0, 0]
    assert bars[0].layout.display == "none"
    assert bars[1].bar_style == "warning" and "⚠" in view.progress.lines[1].value
    assert "straggler(s): rank 1" in view.header.value
    view.handle(metrics_event("r-1", rows((0, 2, {"loss": 0.5, "acc": 0.7}))))
    view.handle(run_ended("r-1", "done", 2.0))
    view.finish(fake_record("r-1", steps={0: 12, 1: 12}))
    assert [b.value for b in bars] == [12, 12] and {b.bar_style for b in bars} == {"success"}
    assert bars[0].layout.display == ""                                   # shown at the end
    assert view.plot.metrics == ["loss", "acc"]
    assert view.plot.points("loss", 0) == 2 and view.plot.points("loss", MEAN) == 2
    assert view.plot.lines[("acc", MEAN)].values() == [0.7]
    assert "done" in view.header.value
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "run-1" in bundle["text/plain"]


def test_run_view_coalesces_events_within_its_update_interval():
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


def test_run_view_keeps_drawing_while_a_run_logs_fast():
    """Rows are split as they come: only the widget updates are paced.  (Under a CPU budget
    that charged the splitting, a view whose run logs ~45,000 rows between two progress
    events stayed in debt, and blank, until the run ended.)"""
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
    assert [f.yaxis[0].axis_label.text for f in figures] == ["loss", "loss"]
    assert [type(f.y_scale).__name__ for f in figures] == ["LinearScale", "LogScale"]
    plot.extend({"acc": {1: ([1], [0.5])}})
    assert plot.metrics == ["loss", "acc"] and len(plot.tabs.tabs) == 2


def test_the_page_gets_every_bokehjs_bundle_the_live_view_needs_and_no_more():
    """The loader sends only _bokehjs.COMPONENTS: what bokeh says the view's document needs,
    a metric whose name looks like TeX included (it stays text: the page has no MathJax)."""
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.resources import Resources

    from phalanx.widgets._bokehjs import COMPONENTS

    plot = _plot.LivePlot(world_size=2)
    plot.extend({"loss": {0: ([1], [1.0])}, r"$$\eta$$ (lr)": {1: ([1], [0.1])}})
    files = bundle_for_objs_and_resources([plot.root], Resources(mode="cdn")).js_files
    needed = {str(url).rsplit("/", 1)[1].rsplit("-", 1)[0] for url in files}
    assert needed == set(COMPONENTS), files


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
    assert view.progress.counts == [12, 12, 12]
    assert "3 rank(s)" in view.header.value
    assert view.plot.points("loss", 2) == 1 and view.plot.lines[("loss", MEAN)].values() == [1.5, 2.0]
    legend = view.plot.panels["loss"].figures[0].legend[0]
    assert [item.label["value"] for item in legend.items] == ["rank 0", "rank 1", "rank 2", "mean"]
    # Shrunk back to 2: rank 2's row is hidden, not left showing a stale count.
    view.handle(progress_event("r-1", [rank_progress(r, 20) for r in range(2)]))
    view.drain()
    rows_shown = [row.layout.display for row in view.progress.rows.children]
    assert rows_shown == ["", "", "none"] and "2 rank(s)" in view.header.value



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


def test_a_plot_not_built_ahead_appears_once_the_run_has_trained_a_while():
    """Building and sending the plot costs ~0.3 s of kernel CPU, more than a short run: without
    it a view shows a placeholder, replaced by the plot with every point so far once the run
    has trained PLOT_AFTER_S; a run over sooner keeps the placeholder (its summary has the
    curves)."""
    from phalanx.widgets._run_view import PLOT_AFTER_S, RunView

    clock = FakeClock()
    view = RunView("r-4", "run-4", world_size=2, total_steps=None, clock=clock, plot_ahead=False)
    assert view.plot is None and view.widget.children[-1].value == ""   # no hint at the start
    view.handle(metrics_event("r-4", rows((0, 1, {"loss": 1.0}), (1, 1, {"loss": 3.0}))))
    view.handle(progress_event("r-4", [rank_progress(0, 1), rank_progress(1, 1)]))
    assert view.plot is None and view.progress.counts[0] == 1         # progress shows at once
    clock.now = PLOT_AFTER_S + 1
    view.handle(metrics_event("r-4", rows((0, 2, {"loss": 0.5}), (1, 2, {"loss": 1.5}))))
    view.handle(progress_event("r-4", [rank_progress(0, 2), rank_progress(1, 2)]))
    assert view.plot is not None and view.widget.children[-1] is view.plot.model
    clock.now += 0.5  # building the plot (~0.25 s of CPU) does not hold the next update back
    view.handle(progress_event("r-4", [rank_progress(0, 3), rank_progress(1, 3)]))
    assert view.progress.counts[0] == 3
    view.finish(fake_record("r-4", steps={0: 3, 1: 3}))
    assert view.plot.lines[("loss", MEAN)].values() == [2.0, 1.0]

    short = RunView("r-5", "run-5", world_size=2, total_steps=None, clock=FakeClock(),
                    plot_ahead=False)
    short.handle(metrics_event("r-5", rows((0, 1, {"loss": 1.0}), (1, 1, {"loss": 3.0}))))
    short.finish(fake_record("r-5", steps={0: 1, 1: 1}))
    assert short.plot is None and "summary" in short.widget.children[-1].value
    silent = RunView("r-6", "run-6", world_size=2, total_steps=None, plot_ahead=False)
    silent.finish(fake_record("r-6", steps={0: 1, 1: 1}))
    assert silent.plot is None and "no metrics" in silent.widget.children[-1].value


def test_a_plot_built_during_the_run_is_built_where_the_view_asks_once():
    """Given ``build_with``, the view hands the build to it (the run's wait loop) once, keeps
    taking events meanwhile, and the build draws every point that arrived before it ran."""
    from phalanx.fit.run._control import RunControl
    from phalanx.widgets._run_view import PLOT_AFTER_S, RunView

    clock, control = FakeClock(), RunControl()
    view = RunView("r-11", "run-11", world_size=1, total_steps=None, clock=clock,
                   plot_ahead=False, build_with=control.call_soon)
    clock.now = PLOT_AFTER_S + 1
    for step in (1, 2, 3):
        view.handle(metrics_event("r-11", rows((0, step, {"loss": 1.0 / step}))))
        view.handle(progress_event("r-11", [rank_progress(0, step)]))
        clock.now += 1
    assert view.plot is None and view.progress.counts[0] == 3       # asked, not built here
    control.pump()                                                    # the wait loop's next poll
    assert view.plot is not None and view.widget.children[-1] is view.plot.model
    assert view.plot.lines[("loss", MEAN)].values() == [1.0, 0.5, 1.0 / 3]
    control.pump()                                                    # built once
    view.handle(metrics_event("r-11", rows((0, 4, {"loss": 0.25}))))
    view.handle(progress_event("r-11", [rank_progress(0, 4)]))
    assert view.plot.points("loss", 0) == 4

    asked: list = []
    late = RunView("r-12", "run-12", world_size=1, total_steps=None, clock=clock,
                   plot_ahead=False, build_with=asked.append)
    clock.now += PLOT_AFTER_S + 1
    late.handle(metrics_event("r-12", rows((0, 1, {"loss": 1.0}))))
    late.handle(progress_event("r-12", [rank_progress(0, 1)]))
    assert late.plot is None and len(asked) == 1
    late.finish(fake_record("r-12", steps={0: 1}))      # over before the loop polled again
    asked[0]()
    assert late.plot is None and "summary" in late.widget.children[-1].value


def test_tasks_handed_to_the_wait_loop_run_once_and_a_failing_one_ends_nothing(caplog):
    from phalanx.fit.run._control import RunControl

    control, ran = RunControl(), []
    control.call_soon(lambda: ran.append(1))
    control.call_soon(lambda: 1 / 0)
    control.call_soon(lambda: ran.append(2))
    control.pump()
    control.pump()
    assert ran == [1, 2] and "ZeroDivisionError" in caplog.text
    control.call_soon(lambda: ran.append(3))
    control.begin()                          # asked after the last run's final poll: dropped
    control.pump()
    assert ran == [1, 2]


def test_the_plot_is_built_ahead_for_a_logging_cell_unless_its_last_run_was_short(monkeypatch):
    from phalanx.widgets._run_view import calls_log

    assert calls_log("loss = f(x)\nlog(loss=loss.item())") and calls_log("phalanx.log (a=1)")
    assert not calls_log("opt.step()\ncatalog(1)\nlogits = model(X)")
    monkeypatch.setattr(_frontend, "widgets_available", lambda shell: True)
    session = SimpleNamespace(events=EventBus(), last_record=None)

    def run(body, run_id, wall_s):
        shown = RunDisplay(session, None, widget=True, show=lambda view: None, body=body)
        shown.start(SimpleNamespace(run_id=run_id, world_size=2, total_steps=None), run_id)
        session.last_record = fake_record(run_id, steps={0: 1, 1: 1})
        session.last_record.wall_s = wall_s
        shown.finish()
        return shown.view.plot is not None

    logging = "opt.step()\nlog(loss=1.0)"
    assert not run("opt.step()", "r-7", 0.1)                 # calls no log(): no plot ahead
    assert run(logging, "r-8", 0.1)                          # first run of a logging cell
    assert not run(logging, "r-9", 30.0)                     # its last run was over at once
    assert run(logging, "r-10", 0.1)                         # ... and this one's was long


def test_a_quick_cells_rerun_shows_its_view_only_once_it_has_trained_a_while(monkeypatch):
    """The live widgets cost about as much as a warm one-step run: re-running a cell whose last
    run was over within LIVE_AFTER_S shows only its summary, unless this run trains that long;
    then the view appears with what happened so far."""
    from phalanx.fit.run._control import RunControl
    from phalanx.widgets._display import LIVE_AFTER_S
    from phalanx.widgets._run_view import RunView

    monkeypatch.setattr(_frontend, "widgets_available", lambda shell: True)
    clock = FakeClock()
    control, shown_views = RunControl(clock), []
    session = SimpleNamespace(events=EventBus(), last_record=None, call_in_wait_loop=control.call_soon)
    body = "opt.step()  # a quick one"

    def start(run_id):
        control.begin()
        shown = RunDisplay(session, None, widget=True, show=shown_views.append, body=body)
        shown.start(SimpleNamespace(run_id=run_id, world_size=2, total_steps=4), run_id)
        return shown

    def end(shown, run_id, wall_s):
        session.last_record = fake_record(run_id, steps={0: 4, 1: 4})
        session.last_record.wall_s = wall_s
        return shown.finish()

    first = start("r-20")                    # never run before: the view at once
    assert isinstance(first.view, RunView) and shown_views == [first.view]
    end(first, "r-20", 0.05)
    quick = start("r-21")                    # its last run was quick: nothing shown yet
    session.events.emit(progress_event("r-21", [rank_progress(0, 2, 4), rank_progress(1, 2, 4)]))
    control.pump()                           # not due: the run is still young
    assert quick.view is None and len(shown_views) == 1
    summary = end(quick, "r-21", 0.05)       # over before the view was due: the summary alone
    assert summary.record.run_id == "r-21" and quick.view is None and len(shown_views) == 1
    longer = start("r-22")
    session.events.emit(progress_event("r-22", [rank_progress(0, 3, 4), rank_progress(1, 1, 4)]))
    clock.now += LIVE_AFTER_S
    control.pump()                           # this run has trained long enough: the view
    assert isinstance(longer.view, RunView) and shown_views[-1] is longer.view
    longer.view.drain()
    assert [bar.value for bar in longer.view.progress.bars] == [3, 1]   # what came before it
    session.events.emit(progress_event("r-22", [rank_progress(0, 4, 4), rank_progress(1, 4, 4)]))
    longer.view.drain()
    assert [bar.value for bar in longer.view.progress.bars] == [4, 4]   # and what comes after


def test_the_end_of_a_run_renders_the_plot_again_only_when_it_changed():
    plot = _plot.LivePlot(world_size=1)
    rendered = plot.model.render_bundle
    plot.refresh()                              # nothing was sent since the first render
    assert plot.model.render_bundle is rendered and not plot.model.patched
    plot.extend({"loss": {0: ([1, 2], [1.0, 0.5])}})
    assert plot.model.patched
    plot.refresh()                              # a reloaded page starts from the points drawn
    assert plot.model.render_bundle is not rendered and not plot.model.patched
    assert '"shape": [2]' not in json.dumps(rendered)                    # empty lines at first
    assert '"shape": [2]' in json.dumps(plot.model.render_bundle)        # both points now


def test_zooming_a_finished_plot_redraws_the_window_at_full_resolution(monkeypatch):
    from phalanx.fit.telemetry._digest import window_points

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
    linear, log_scale = plot.panels["loss"].figures
    downsampled = line.source.data["x"]
    # The browser fits the x range to the data by itself: that is no zoom, and redrawing on it
    # would change the data and so the range again, for as long as the page is open.
    linear.x_range.start, linear.x_range.end = 5000, 5040
    assert line.source.data["x"] is downsampled                  # not redrawn
    linear._trigger_event(RangesUpdate(linear, x0=5000, x1=5040))   # the zoom tool's announcement
    data = line.source.data
    inside = [(x, y) for x, y in zip(data["x"], data["y"]) if 5000 <= x <= 5040]
    assert inside == [(float(s), float(s % 7 + 1)) for s in range(5000, 5041)]
    assert list(data["x"]) == sorted(data["x"]) and data["x"][-1] == 19_999   # the rest still drawn
    log_scale._trigger_event(RangesUpdate(log_scale, x0=5000, x1=5040))  # the linked figure's
    assert line.source.data is data                                       # the same window: kept
    linear._trigger_event(RangesUpdate(linear, x0=0, x1=19_999))  # zoomed out: downsampled again
    assert len(line) <= 104


def test_the_chart_keeps_up_every_half_second_however_costly_its_updates():
    """No CPU budget to wait for: every LIVE_INTERVAL_S of the view's clock the chart holds
    every point logged so far, with the counters and the elapsed time (a budget in debt froze
    the curve for seconds while the bars and the panel's chart went on)."""
    from phalanx.widgets._run_view import LIVE_INTERVAL_S, RunView

    clock = FakeClock()
    view = RunView("r-1", "run-1", world_size=2, total_steps=None, clock=clock)
    view.handle(metrics_event("r-1", rows((0, 1, {"loss": 1.0}))))
    view.handle(progress_event("r-1", [rank_progress(0, 1), rank_progress(1, 1)]))
    shown, step = [], 1
    for tick in range(1, 11):
        for tenth in range(5):  # five events per half second, each logging 1,000 rows
            clock.now = (tick - 1) * LIVE_INTERVAL_S + (tenth + 1) * LIVE_INTERVAL_S / 5
            batch = rows(*((0, s, {"loss": 1.0 / s}) for s in range(step + 1, step + 1001)))
            step += 1000
            view.handle(metrics_event("r-1", batch))
            view.handle(progress_event("r-1", [rank_progress(0, step), rank_progress(1, step)]))
        shown.append((view.plot.lines[("loss", 0)].logged, view.progress.counts[0]))
    assert shown == [(1 + 5000 * t, 1 + 5000 * t) for t in range(1, 11)], shown
    assert view.header.value.split(" · ")[2] == "5 s"
    view.finish(fake_record("r-1", steps={0: step, 1: step}))
    assert view.plot.lines[("loss", 0)].logged == step  # and lost nothing


def test_a_failed_run_reddens_only_the_rank_at_fault():
    """The rank the error names is red; the ranks it released are amber, not failed too."""
    from phalanx.widgets._run_view import RunView

    view = RunView("r-9", "run-9", world_size=3, total_steps=None)
    view.handle(progress_event("r-9", [rank_progress(r, 4) for r in range(3)]))
    record = fake_record("r-9", steps={0: 4, 1: 3, 2: 4}, status="failed")
    record.failed_rank = 1
    view.finish(record)
    assert [b.bar_style for b in view.progress.bars] == ["warning", "danger", "warning"]
    done = RunView("r-10", "run-10", world_size=2, total_steps=None)
    done.finish(fake_record("r-10", steps={0: 4, 1: 4}, status="done"))
    assert {b.bar_style for b in done.progress.bars} == {"success"}
