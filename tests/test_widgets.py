"""Notebook views, pure logic with fakes (fast): throttling, per-rank series
and their mean, progress text, the run summary, the engine table, and where widgets can be drawn."""

from __future__ import annotations

import base64
import io
import threading

import pytest
from IPython.core.interactiveshell import InteractiveShell

from phalanx._cell_line import say, writing
from phalanx.events import progress as progress_event
from phalanx.widgets import RunSummary, TextProgress, widgets_available
from phalanx.widgets._cluster_table import merge_rows, table_html
from phalanx.widgets._format import bar_range, overall, progress_line, rank_text
from phalanx.widgets._series import MEAN, SeriesBuilder, full_series
from phalanx.widgets._throttle import Throttle
from widget_fakes import FakeClock, fake_record, rank_progress, rows


def test_throttle_allows_one_update_per_interval():
    clock = FakeClock()
    throttle = Throttle(0.1, clock=clock)
    seen = []
    for tick in range(100):          # 1 s of events at 100/s
        clock.now = tick / 100
        seen.append(throttle.ready())
    assert sum(seen) == 10 and seen[0]


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
    # No total: nothing to fill a bar towards (the leader's full bar looked finished at once).
    assert bar_range([rank_progress(0, 30), rank_progress(1, 40)]) is None
    assert bar_range([rank_progress(0, 30, 100)]) == 100
    summary = overall([rank_progress(0, 10, 20, 2.0), rank_progress(1, 4, 20, 1.0, straggler=True)])
    assert summary["step"] == 4 and summary["eta_s"] == 16.0 and summary["stragglers"] == [1]
    line = progress_line("run-1", [rank_progress(0, 10, 20, 2.0, loss=0.25)], 5.0)
    assert line.startswith("run-1 running 5 s") and "10/20 steps" in line and "loss 0.25" in line


def test_a_total_the_loop_went_past_is_dropped_with_its_eta():
    """--steps 240 on a loop of 260: "260/240 steps · ETA 0 s" said two wrong things."""
    past = {**rank_progress(0, 260, 240, 25.0, loss=0.5), "eta_s": 0.0}
    assert rank_text(past) == "260 steps · 25.0 steps/s · loss 0.5"
    assert bar_range([past, rank_progress(1, 230, 240, 25.0)]) is None
    o = overall([past, rank_progress(1, 230, 240, 25.0)])
    assert o["total"] is None and o["eta_s"] is None
    line = progress_line("run-1", [past], 10.0)
    assert "260 steps" in line and "/240" not in line and "ETA" not in line
    assert rank_text(rank_progress(0, 10, 240)) == "10/240 steps · – steps/s"   # no "ETA –"


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


def test_text_written_during_a_run_starts_on_a_line_of_its_own():
    """A rank's output, or the debugger's answer, after the open progress line does not join it
    (it read ``... steps/s5``), even while the publisher thread redraws as fast as it can."""
    out = io.StringIO()
    text = TextProgress("r-1", "run-1", stream=out, interval_s=0.0)
    text.handle(progress_event("r-1", [rank_progress(0, 1, 30, 10.0)]))
    say("5", file=out)
    assert out.getvalue().endswith("ETA 3 s\n5\n"), out.getvalue()

    stop = threading.Event()

    def redraw() -> None:
        tick = 0
        while not stop.is_set():
            tick += 1
            text.handle(progress_event("r-1", [rank_progress(0, tick, 10**6, 10.0)]))

    drawer = threading.Thread(target=redraw)
    drawer.start()
    try:
        for i in range(300):
            with writing():
                out.write(f"[rank 0] line {i}\n")
    finally:
        stop.set()
        drawer.join()
    lines = out.getvalue().split("\n")
    said = [line for line in lines if "[rank 0]" in line]
    assert len(said) == 300 and all(line.startswith("[rank 0]") for line in said), \
        [line for line in said if not line.startswith("[rank 0]")][:3]


def test_no_progress_is_drawn_while_a_rank_is_in_its_debugger():
    out = io.StringIO()
    text = TextProgress("r-1", "run-1", stream=out, interval_s=0.0)
    paused = {**rank_progress(0, 3, 30, 10.0), "paused": {"line": 8, "source": "breakpoint()"}}
    text.handle(progress_event("r-1", [paused]))
    assert out.getvalue() == ""  # the debugger's lines and prompt own the cell
    text.handle(progress_event("r-1", [rank_progress(0, 4, 30, 10.0)]))
    assert "4/30 steps" in out.getvalue()


def test_summary_embeds_the_curves_and_keeps_the_manifest():
    record = fake_record(history_rows=[(r, s, {"loss": 1.0 / s}) for s in range(1, 6) for r in (0, 1)],
                         steps={0: 5, 1: 5})
    summary = RunSummary(record)
    page = summary._repr_html_()
    assert "data:image/svg+xml;base64," in page and "<table>" in page and "10 metric rows" in page
    assert repr(summary) == repr(record)
    assert summary.metadata == {"phalanx": {"manifest": {"seed": 1}}}
    picture = base64.b64decode(page.split("data:image/svg+xml;base64,")[1].split('"')[0])
    assert picture.decode() == summary.svg() and b">loss (log scale)<" not in picture
    assert RunSummary(fake_record())._repr_html_().count("<img") == 0   # nothing logged


def test_a_summary_whose_picture_fails_keeps_its_table(monkeypatch, caplog):
    import phalanx.widgets._summary as summary_module

    def broken(*_args):
        raise ValueError("no room on the canvas")

    monkeypatch.setattr(summary_module, "curves_svg", broken)
    record = fake_record(history_rows=[(0, 1, {"loss": 0.5})], steps={0: 1})
    page = RunSummary(record)._repr_html_()
    assert "<table>" in page and "<img" not in page and "1 metric rows" in page
    assert "could not be drawn" in caplog.text and "no room on the canvas" in caplog.text


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



@pytest.mark.parametrize("name", ["_format", "_series", "_throttle", "_frontend", "_svg_curves",
                                  "_cluster_table"])
def test_docstring_examples(name):
    """The examples in the widgets' pure modules run and say what they show."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"phalanx.widgets.{name}"))
    assert result.attempted > 0 and result.failed == 0, name
