"""What a newcomer sees under a run (fake events and clock, real ipywidgets, no cluster): one
line per rank with the time breakdown behind a toggle, a cell that trains nothing as one line,
indicators that say only what the run shows (a total the loop went past, no full bar without a
total, straggler and slow marks with evidence, the "call log()" hint only when it is due), and
the engines of a run shown busy."""

from __future__ import annotations

import pytest

from phalanx import events
from phalanx.events import metrics as metrics_event
from phalanx.events import progress as progress_event
from phalanx.fit.telemetry import _tracker
from phalanx.fit.telemetry._timing import SLOW_MIN_STEP_S, CollectiveTimes
from phalanx.fit.telemetry._tracker import RunTracker
from phalanx.widgets import RunSummary
from phalanx.widgets._cluster_table import ClusterStatus
from phalanx.widgets._parts_bar import PART_COLOURS
from phalanx.widgets._progress import DETAILS_TITLE
from phalanx.widgets._run_view import NO_METRICS_HINT_AFTER_S, RunView
from phalanx.widgets._summary import summary_curves_class
from widget_fakes import FakeClock, fake_record, rank_progress, rows

PARTS = {"steps": 4, "forward_s": 0.25, "backward_s": 0.2, "collective_s": 5.0,
         "optimizer_s": 0.05, "log_s": 0.05, "other_s": 0.0}


def test_each_rank_is_one_line_and_the_time_breakdown_waits_behind_a_toggle():
    view = RunView("r-1", "run-1", world_size=2, total_steps=100)
    assert view.progress.widget.layout.display == "none"          # nothing before a step
    view.handle(progress_event("r-1", [rank_progress(0, 10, 100, 5.0, loss=0.5),
                                       rank_progress(1, 10, 100, 5.0, loss=0.7)]))
    view.handle(events.memory("r-1", [{"rank": 0, "t": 1.0, "rss_mb": 512.0}]))
    view.handle(events.time_parts("r-1", [{"rank": r, "collective_s": 1.2, "collective_wait_s": 0.9,
                                           "collective_move_s": 0.3, "collectives": 4, "log_s": 0.01,
                                           "parts": {"data": 1.0, "wait": 0.2}, "step_s": 1.2,
                                           "steps": 4} for r in (0, 1)]))
    view.drain()
    line = view.progress.lines[0].value
    assert "10/100 steps · 5.0 steps/s · ETA 18 s · loss 0.5" in line and "nowrap" in line
    for hidden in ("RSS", "collectives", "data-part", "s/step"):   # all behind the toggle
        assert hidden not in line
    toggle = view.progress.toggle
    assert type(toggle).__name__ == "Accordion" and toggle.selected_index is None   # collapsed
    assert toggle.titles == (DETAILS_TITLE,) and toggle.layout.display == ""
    assert "RSS 512 MB" in view.progress.details[0].value
    assert 'data-part="data"' in view.progress.details[1].value
    legend = view.progress.legend
    assert legend.layout.display == "" and all(colour in legend.value for colour in PART_COLOURS.values())
    assert "waiting for a peer" in legend.value and "moving bytes" in legend.value


def test_a_cell_that_trains_nothing_shows_one_line():
    view = RunView("r-2", "check", world_size=2, total_steps=None, plot_ahead=False)
    view.handle(progress_event("r-2", [rank_progress(0, 0), rank_progress(1, 0)]))
    view.drain()
    record = fake_record("r-2", steps={0: 0, 1: 0})
    view.finish(record)
    assert view.progress.widget.layout.display == "none"              # no empty bars
    assert view._placeholder.layout.display == "none" and "log(" not in view._placeholder.value
    assert "steps/s" not in view.header.value and "done" in view.header.value
    page = RunSummary(record)._repr_html_()
    assert "no steps counted, no metrics logged" in page and "<table" not in page
    assert "metric rows" not in page and "<img" not in page
    assert "\n" not in repr(RunSummary(record))

    ahead = RunView("r-3", "check", world_size=2, total_steps=4)       # built ahead: hidden too
    ahead.finish(fake_record("r-3", steps={0: 0, 1: 0}))
    assert ahead.plot.model.layout.display == "none"


def test_a_total_the_loop_went_past_is_dropped_and_said_once_at_the_end(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(_tracker, "_now", lambda: now[0])
    tracker = RunTracker("r-4", 2, 240, lambda event: None)
    for step in (100, 200):
        now[0] += 1.0
        for rank in (0, 1):
            tracker.on_batch({"rank": rank, "step": step, "rows": []})
    assert [r["total"] for r in tracker.progress_rows()] == [240, 240]
    tracker.on_batch({"rank": 0, "step": 260, "rows": []})
    ranks = tracker.progress_rows()
    assert [r["total"] for r in ranks] == [None, None] and all(r["eta_s"] is None for r in ranks)
    tracker.on_batch({"rank": 1, "step": 230, "rows": []})
    assert tracker.progress_rows()[1]["total"] is None                 # wrong once, wrong after

    view = RunView("r-4", "quickstart", world_size=2, total_steps=240)
    view.handle(progress_event("r-4", [{**rank_progress(0, 260, 240, 25.0), "eta_s": 0.0},
                                       rank_progress(1, 250, 240, 25.0)]))
    view.drain()
    text = view.progress.lines[0].value + view.header.value
    assert "260 steps" in text and "/240" not in text and "ETA" not in text
    record = fake_record("r-4", steps={0: 260, 1: 260})
    record.total_steps = 240
    view.finish(record)
    assert "/240" not in view.progress.lines[0].value
    page = RunSummary(record)._repr_html_()
    assert page.count("--steps 240 did not match the 260 steps counted") == 1
    assert "did not match" in repr(RunSummary(record))


def test_without_a_total_no_bar_looks_full_until_the_run_ends():
    view = RunView("r-5", "run-5", world_size=2, total_steps=None)
    view.handle(progress_event("r-5", [rank_progress(0, 5, rate=5.0), rank_progress(1, 4, rate=4.0)]))
    view.drain()
    bars = view.progress.bars
    assert all(bar.value < bar.max or bar.layout.display == "none" for bar in bars)
    assert [bar.value for bar in bars] == [0, 0] and bars[0].layout.display == "none"
    assert view.progress.counts == [5, 4]
    view.finish(fake_record("r-5", steps={0: 50, 1: 50}))
    assert [bar.value for bar in bars] == [50, 50] and bars[0].layout.display == ""

    counted = RunView("r-6", "run-6", world_size=1, total_steps=100)   # a total fills towards it
    counted.handle(progress_event("r-6", [rank_progress(0, 5, 100, 5.0)]))
    counted.drain()
    assert (counted.progress.bars[0].value, counted.progress.bars[0].max) == (5, 100)


def test_straggler_and_slow_marks_wait_for_evidence(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(_tracker, "_now", lambda: now[0])
    tracker = RunTracker("r-7", 2, None, lambda event: None)
    tracker.on_batch({"rank": 0, "step": 20, "rows": []})
    tracker.on_batch({"rank": 1, "step": 10, "rows": []})
    now[0] = 0.8                                                         # a 0.8 s run
    assert not any(r["straggler"] for r in tracker.progress_rows())
    now[0] = 30.0                                                        # long: the lag holds
    assert [r["straggler"] for r in tracker.progress_rows()] == [False, True]
    close = RunTracker("r-8", 2, None, lambda event: None)              # 1 step: a batch in flight
    close.on_batch({"rank": 0, "step": 4, "rows": []})
    close.on_batch({"rank": 1, "step": 2, "rows": []})
    now[0] = 60.0
    assert not any(r["straggler"] for r in close.progress_rows())

    def view_of(seconds: float) -> RunView:
        t = CollectiveTimes(world_size=2)
        t.add(0, {"collectives": [[0, 5.0, 5.0]], "log_s": 0.05,
                  "parts": {k: v * seconds / 5.5 if k != "steps" else v for k, v in PARTS.items()}})
        t.add(1, {"collectives": [[0, 9.8, 0.2]], "log_s": 0.05, "parts": {
            k: v * seconds / 5.5 if k != "steps" else v
            for k, v in {**PARTS, "forward_s": 5.0, "collective_s": 0.2}.items()}})
        view = RunView("r-9", "run-9", world_size=2, total_steps=None)
        view.handle(events.time_parts("r-9", t.take_changed()))
        view.drain()
        return view

    assert all("slow:" not in d.value for d in view_of(0.8).progress.details)
    assert "slow: data &amp; forward" in view_of(SLOW_MIN_STEP_S + 1).progress.details[1].value


def test_the_call_log_hint_waits_for_seconds_of_steps_without_a_row():
    clock = FakeClock()
    view = RunView("r-10", "run-10", world_size=1, total_steps=None, clock=clock, plot_ahead=False)
    for second in range(1, int(NO_METRICS_HINT_AFTER_S)):
        clock.now = float(second)
        view.handle(progress_event("r-10", [rank_progress(0, second * 10, rate=10.0)]))
        assert "log(" not in view._placeholder.value, second              # metrics may be coming
    clock.now = NO_METRICS_HINT_AFTER_S + 2
    view.handle(progress_event("r-10", [rank_progress(0, 200, rate=10.0)]))
    assert "log(" in view._placeholder.value

    ahead = RunView("r-11", "run-11", world_size=1, total_steps=None, clock=clock)
    assert ahead.plot is not None and ahead.plot._waiting.text == ""
    clock.now += 1
    ahead.handle(progress_event("r-11", [rank_progress(0, 5)]))
    clock.now += NO_METRICS_HINT_AFTER_S + 1
    ahead.handle(metrics_event("r-11", rows((0, 6, {"loss": 1.0}))))    # a logging run
    ahead.handle(progress_event("r-11", [rank_progress(0, 6)]))
    assert "log(" not in ahead.plot._waiting.text

    ended = RunView("r-12", "run-12", world_size=1, total_steps=None, clock=clock)
    ended.finish(fake_record("r-12", steps={0: 3}))                      # stepped, logged nothing
    assert "log(" in ended.plot._waiting.text


def test_the_summary_picture_is_hidden_only_where_the_live_plot_draws_its_curves():
    view = RunView("ab-1", "run-1", world_size=1, total_steps=None)
    view.handle(metrics_event("ab-1", rows((0, 1, {"loss": 1.0}), (0, 2, {"loss": 0.5}))))
    view.handle(progress_event("ab-1", [rank_progress(0, 2)]))
    record = fake_record("ab-1", steps={0: 2}, history_rows=[(0, 1, {"loss": 1.0}), (0, 2, {"loss": 0.5})])
    view.finish(record)
    css_class = summary_curves_class("ab-1")
    assert f".{css_class}{{display:none}}" in view.header.value
    assert f'class="{css_class}"' in RunSummary(record)._repr_html_()
    short = RunView("ab-2", "run-2", world_size=1, total_steps=None, plot_ahead=False)
    short.handle(metrics_event("ab-2", rows((0, 1, {"loss": 1.0}))))
    short.finish(fake_record("ab-2", steps={0: 1}))                      # no live plot was built
    assert "<style>" not in short.header.value


@pytest.mark.parametrize("step, state", [(12, "busy"), (None, "idle")])
def test_cluster_status_shows_the_ranks_of_a_run_busy(step, state):
    row = {"rank": 0, "engine_id": 0, "host": "h", "pid": 1, "device": "cpu", "state": "idle",
           "memory_mb": None, "step": step}
    status = type("EngineStatus", (), {"rows": [row], "launcher": "local"})()
    assert ClusterStatus.of(status).rows[0]["state"] == state
