"""Time in phalanx collectives, split into waiting for the slowest peer vs moving bytes; log() time."""

from __future__ import annotations

import pytest

from conftest import run_cell
from phalanx import events
from phalanx.fit._timing import CollectiveTimes

# Rank 1 sleeps before each of 4 allreduces: rank 0 enters first and waits for it every time.
WAITING = """
import time, torch
from phalanx import allreduce, log
for step in range(4):
    if rank == 1:
        time.sleep(0.3)
    allreduce(torch.ones(1000))
    log(loss=1.0)
"""


def test_calls_settle_only_when_every_rank_reported_and_attempts_restart_numbering():
    t = CollectiveTimes(world_size=2)
    t.add(0, {"collectives": [[0, 1.0, 0.5], [1, 2.0, 0.2]], "log_s": 0.1})
    assert t.totals()[0]["collectives"] == 0          # rank 1 has not reported yet
    t.add(1, {"collectives": [[0, 1.3, 0.2]], "log_s": 0.05})
    totals = t.totals()
    assert totals[0]["collectives"] == 1 and totals[0]["collective_wait_s"] == pytest.approx(0.3)
    assert totals[0]["collective_move_s"] == pytest.approx(0.2) and totals[1]["collective_wait_s"] == 0
    t.add(0, {"collectives": [], "log_s": 0.08})      # a running total never goes back
    assert t.totals()[0]["log_s"] == 0.1
    changed = t.take_changed()
    assert [c["rank"] for c in changed] == [0, 1] and t.take_changed() is None
    events.validate_event(events.time_parts("r", changed))
    t.rewind(2)
    t.add(1, {"collectives": [[1, 2.5, 0.1]], "log_s": 0.05})
    assert t.totals()[1]["collectives"] == 1          # the old attempt's call 1 was dropped


@pytest.mark.cluster
def test_rank_kept_waiting_in_allreduce_is_shown_waiting_for_its_peer(two_engines, shell):
    captured = []
    unsubscribe = two_engines.events.subscribe(captured.append)
    try:
        run_cell(shell, "%%distributed_fit --no-widget\n" + WAITING)
    finally:
        unsubscribe()
    record = two_engines.last_run()
    waiter, sleeper = record.timing[0], record.timing[1]
    # The loop's 4, plus the run's own end-of-run agreement on who ran out of data (join).
    assert waiter["collectives"] == sleeper["collectives"] >= 4
    assert waiter["collective_wait_s"] >= 0.8, waiter        # ~4 x 0.3 s spent waiting
    assert waiter["collective_wait_s"] > 5 * waiter["collective_move_s"], waiter
    assert sleeper["collective_wait_s"] < 0.2 * waiter["collective_wait_s"], (sleeper, waiter)
    for t in (waiter, sleeper):  # the two parts are the whole time in collectives
        assert t["collective_wait_s"] + t["collective_move_s"] == pytest.approx(t["collective_s"])
        assert t["log_s"] > 0
    assert "waiting for the slowest peer" in repr(record)
    seen = [e for e in captured if e.get("type") == "time"]
    assert seen and seen[-1]["ranks"][0]["collectives"] == waiter["collectives"]
    assert record.manifest["time_s"]["0"]["collective_wait_s"] == waiter["collective_wait_s"]


def test_run_view_shows_the_waiting_share_per_rank():
    from phalanx.widgets._run_view import RunView

    view = RunView("r1", "t-run", world_size=2, total_steps=None)
    view.handle(events.time_parts("r1", [
        {"rank": 0, "collective_s": 1.2, "collective_wait_s": 0.9, "collective_move_s": 0.3,
         "collectives": 4, "log_s": 0.01}]))
    view.drain()
    assert "collectives 1.2 s, 75% waiting for a peer" in view.progress.details[0].value
    assert "waiting" not in view.progress.details[1].value
