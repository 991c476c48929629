"""Time in phalanx collectives, split into waiting for the slowest peer vs moving bytes; log() time."""

from __future__ import annotations

import pytest

from conftest import run_cell
from phalanx import events
from phalanx.fit.telemetry._timing import CollectiveTimes

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


def run_capturing_events(session, shell, body: str) -> list[dict]:
    """Run ``body`` as a ``%%distributed_fit`` cell; the events the session emitted meanwhile."""
    captured: list[dict] = []
    unsubscribe = session.events.subscribe(captured.append)
    try:
        run_cell(shell, "%%distributed_fit --no-widget\n" + body)
    finally:
        unsubscribe()
    return captured


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
    captured = run_capturing_events(two_engines, shell, WAITING)
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


# Rank 1 sleeps in its "data" step (before forward) every step; both ranks time their own loop.
SLOW_DATA = """
import time, torch
from phalanx import log
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 64), torch.randn(256, 1)
began = time.perf_counter()
for step in range(6):
    if rank == 1:
        time.sleep(0.25)                      # a slow data loader, on this rank only
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    log(loss=loss.item())
log(loop_s=time.perf_counter() - began)
"""


def _scaled(parts: dict, by: float) -> dict:
    return {k: v if k == "steps" else v * by for k, v in parts.items()}


def test_step_parts_add_up_and_mark_the_slow_part():
    # 5x the seconds of a short run: a slow mark needs SLOW_MIN_STEP_S of steps as evidence
    t, short = CollectiveTimes(world_size=2), CollectiveTimes(world_size=2)
    slow = {"steps": 4, "forward_s": 1.0, "backward_s": 0.04, "collective_s": 0.04,
            "optimizer_s": 0.01, "log_s": 0.01, "other_s": 0.0}
    waiting = {**slow, "forward_s": 0.05, "collective_s": 1.0}
    short.add(0, {"collectives": [[0, 1.0, 1.0]], "log_s": 0.01, "parts": waiting})
    short.add(1, {"collectives": [[0, 1.96, 0.04]], "log_s": 0.01, "parts": slow})
    assert not any("slow" in v for v in short.totals().values())     # 1.1 s: no evidence yet
    t.add(0, {"collectives": [[0, 5.0, 5.0]], "log_s": 0.05, "parts": _scaled(waiting, 5)})
    t.add(1, {"collectives": [[0, 9.8, 0.2]], "log_s": 0.05, "parts": _scaled(slow, 5)})
    slow = _scaled(slow, 5)
    totals = t.totals()
    for r in (0, 1):
        assert sum(totals[r]["parts"].values()) == pytest.approx(totals[r]["step_s"])
    assert totals[0]["dominant"] == "wait" and "slow" not in totals[0]
    assert totals[1]["dominant"] == "data"
    assert totals[1]["slow"] == "data & forward 91% of step time"
    events.validate_event(events.time_parts("r", t.take_changed()))
    t.add(1, {"collectives": [], "log_s": 0.01, "parts": {**slow, "steps": 3}})  # an old batch
    assert t.totals()[1]["steps"] == 4


@pytest.mark.cluster
def test_slow_data_rank_is_marked_data_and_its_peer_waits(two_engines, shell, monkeypatch):
    # A 1.5 s run: below the evidence a slow mark needs in a notebook (SLOW_MIN_STEP_S), which
    # protects short runs from start-up noise; this run's rank 1 is slow by construction.
    monkeypatch.setattr("phalanx.fit.telemetry._timing.SLOW_MIN_STEP_S", 1.0)
    captured = run_capturing_events(two_engines, shell, SLOW_DATA)
    record = two_engines.last_run()
    slow, waiter = record.timing[1], record.timing[0]
    assert slow["steps"] == waiter["steps"] == 6
    assert slow["dominant"] == "data", slow
    assert "data" in record.slow_ranks()[1] and 0 not in record.slow_ranks(), record.slow_ranks()
    assert waiter["dominant"] == "wait", waiter
    assert waiter["parts"]["wait"] >= 0.8 * 6 * 0.25 * 0.8, waiter   # ~0.25 s a step, waited for
    assert waiter["parts"]["backward"] > 0 and waiter["parts"]["optimizer"] > 0
    for rank, t in record.timing.items():  # the parts add up to the loop's own measured time
        loop_s = record.history.latest(rank)["loop_s"]
        assert sum(t["parts"].values()) == pytest.approx(t["step_s"])
        assert t["step_s"] == pytest.approx(loop_s, rel=0.05), (rank, t, loop_s)
    # ... and through the run, step by step: where each rank's time went, and when
    for rank, t in record.timing.items():
        points = record.step_parts_over_time(rank)
        assert points and points[-1]["step"] == 6 and sum(p["steps"] for p in points) == 6
        spent = sum(p["steps"] * sum(p[k] for k in p if k.endswith("_s")) for p in points)
        assert spent == pytest.approx(t["step_s"], rel=1e-6), (rank, points)
    slow_points, waiter_points = record.step_parts_over_time(1), record.step_parts_over_time(0)
    assert all(p["forward_s"] > 0.2 for p in slow_points), slow_points         # sleeps 0.25 s a step
    assert all(p["collective_s"] > 0.1 for p in waiter_points[1:]), waiter_points
    text = repr(record)
    assert "data & forward" in text and "slow: data & forward" in text, text
    seen = [e for e in captured if e.get("type") == "time" and e["ranks"][0].get("parts")]
    assert seen, "no time event carried the step parts"
    for e in seen:
        events.validate_event(e)


def test_run_view_draws_each_ranks_step_parts_as_a_stacked_bar():
    from phalanx.widgets._run_view import RunView

    t = CollectiveTimes(world_size=2)   # 5.5 s of steps: enough evidence for a slow mark
    base = {"steps": 4, "backward_s": 0.2, "optimizer_s": 0.05, "log_s": 0.05, "other_s": 0.0}
    t.add(0, {"collectives": [[0, 5.0, 5.0]], "log_s": 0.05,
              "parts": {**base, "forward_s": 0.25, "collective_s": 5.0}})
    t.add(1, {"collectives": [[0, 9.8, 0.2]], "log_s": 0.05,
              "parts": {**base, "forward_s": 5.0, "collective_s": 0.2}})
    view = RunView("r1", "t-run", world_size=2, total_steps=None)
    view.handle(events.time_parts("r1", t.take_changed()))
    view.drain()
    waiter, slow = (d.value for d in view.progress.details)
    assert 'data-part="wait"' in waiter and "waiting for a peer 86%" in waiter and "slow:" not in waiter
    assert 'data-part="data"' in slow and "slow: data &amp; forward 91% of step time" in slow


@pytest.mark.parametrize("module", ["runtime.telemetry._timing", "runtime.telemetry._profile", "fit.telemetry._timing",
                                    "fit.telemetry._step_parts",
                                    "fit.telemetry._parts_series", "widgets._parts_bar"])
def test_examples_in_the_docstrings_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"phalanx.{module}"))
    assert result.attempted and not result.failed
