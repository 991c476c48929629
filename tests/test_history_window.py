"""A zoomed panel chart asks the kernel for a step window: answered from the run's whole history.

The run is fed through the kernel's receiving path (:meth:`RunTracker.on_batch`, what the
metrics receiver calls) into a history small enough in memory that most of it is on disk; the
request goes through the lab comm as the panel sends it (a typed ``request_window`` message).
The comm itself is a fake (it only records what is sent); the session, tracker, history and
digest are the real ones.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from phalanx import events
from phalanx._labcomm import LabComm
from phalanx._panel_answers import WINDOW_POINTS
from phalanx._session import Session
from phalanx.fit import MetricHistory
from phalanx.fit.telemetry._downsample import MAX_POINTS
from phalanx.fit.telemetry._tracker import RunTracker
from labcomm_fakes import FakeComm, FakeManager

RANKS, STEPS, BATCH = 2, 60_000, 500


def _loss(rank: int, step: np.ndarray) -> np.ndarray:
    # a slow curve with one spike per rank, so a downsampled window must keep it
    y = 1.0 / (1.0 + step * 1e-3) + rank
    return np.where(step == 31_337 + rank, 100.0 + rank, y)


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    """A session whose current run has 120k rows, most of them spilled to disk.  Fed once for
    the module (about 2 s): the tests only read it, through requests as the panel sends them."""
    history_dir = tmp_path_factory.mktemp("history") / "win-1"
    session = Session()
    tracker = RunTracker("win-1", RANKS, STEPS, session.events.emit, history_dir=str(history_dir))
    tracker.history = MetricHistory(str(history_dir), memory_rows=8192, chunk_rows=4096)
    session.events.emit(events.run_started("win-1", RANKS, STEPS, "allreduce", name="w"))
    session.fits.active = tracker
    for start in range(0, STEPS, BATCH):
        steps = np.arange(start, start + BATCH)
        for rank in range(RANKS):
            loss = _loss(rank, steps).tolist()
            tracker.on_batch({"rank": rank, "step": int(steps[-1]), "rows": [
                [s, 1e9 + s * 0.01, {"loss": v}] for s, v in zip(steps.tolist(), loss)]})
    while tracker.publish():   # what the publisher thread does: the digest follows
        pass
    lab = LabComm(session, comm_manager=FakeManager(), create_comm=lambda **kw: FakeComm())
    lab.register()
    yield session, tracker, lab
    lab.close()
    session.fits.active = None


def _by_rank(rows: list[dict]) -> dict[int, tuple[list, list]]:
    out: dict[int, tuple[list, list]] = {}
    for r in sorted(rows, key=lambda r: (r["rank"], r["step"])):
        steps, values = out.setdefault(r["rank"], ([], []))
        steps.append(r["step"])
        values.append(r["metrics"]["loss"])
    return out


def test_a_window_request_is_answered_at_full_resolution_from_disk(fed):
    session, tracker, lab = fed
    parts = [f for f in os.listdir(tracker.history.directory) if f.startswith("part-")]
    assert len(parts) >= 20, "the history should be mostly on disk for this test"
    panel = lab._comm_manager.open({"v": 1, "type": "request_snapshot"})
    panel.sent.clear()
    panel.request({"v": 1, "type": "request_window", "run": "win-1", "start": 31_000,
                   "end": 32_999})
    [answer] = panel.sent
    assert events.validate_event(answer)["type"] == "history_window"
    assert (answer["start"], answer["end"]) == (31_000, 32_999)
    lines = _by_rank(answer["rows"])
    assert sorted(lines) == [0, 1]
    for rank, (steps, values) in lines.items():
        assert steps == list(range(31_000, 33_000))            # every row of the window
        assert np.allclose(values, _loss(rank, np.arange(31_000, 33_000)))
        assert max(values) == 100.0 + rank                      # the spike, exactly


def test_a_wide_window_is_bounded_and_keeps_the_spike(fed):
    _, _, lab = fed
    answer = lab.window_message({"run": "win-1", "start": 0, "end": STEPS, "max_points": 400})
    for rank, (steps, values) in _by_rank(answer["rows"]).items():
        assert len(steps) <= 400
        assert max(values) == 100.0 + rank
        assert steps[0] == 0 and steps[-1] == STEPS - 1


def test_a_window_of_another_run_gets_no_rows(fed):
    _, _, lab = fed
    answer = lab.window_message({"run": "older-run", "start": 0, "end": 10})
    assert answer["rows"] == [] and answer["run"] == "older-run"


def test_invalid_window_requests_say_what_is_wrong(fed, caplog):
    _, _, lab = fed
    panel = lab._comm_manager.open()
    panel.sent.clear()
    panel.request({"v": 1, "type": "request_window", "run": "win-1", "start": 9, "end": 1})
    assert panel.sent == []
    assert "end (1) is before start (9)" in caplog.text


def test_a_reloaded_panel_gets_bounded_curves_in_step_order(fed):
    session, tracker, lab = fed
    rows = session.run_history_rows()
    lines = _by_rank(rows)
    for rank, (steps, values) in lines.items():
        assert len(steps) <= MAX_POINTS
        assert max(values) == 100.0 + rank and steps[-1] == STEPS - 1
    # step-major: each rank's rows stay in order, and ranks interleave so means settle early
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows)
    assert len(rows) <= RANKS * MAX_POINTS
    assert WINDOW_POINTS > MAX_POINTS


def _exact_mean() -> np.ndarray:
    steps = np.arange(STEPS)
    return (_loss(0, steps) + _loss(1, steps)) / 2


def test_a_reloaded_panel_gets_the_mean_line_taken_from_every_row(fed):
    session, tracker, lab = fed
    panel = lab._comm_manager.open({"v": 1, "type": "request_snapshot"})
    metrics = [events.validate_event(m) for m in panel.sent if m["type"] == "metrics"]
    means = [p for m in metrics for p in m.get("means", {}).get("loss", [])]
    assert 0 < len(means) <= MAX_POINTS
    steps, values = np.array(means).T
    exact = (_loss(0, steps) + _loss(1, steps)) / 2
    assert np.allclose(values, exact)                        # exact at every step drawn
    assert values.max() == _exact_mean().max()               # the ranks' spikes
    assert steps[-1] == STEPS - 1


def test_a_window_answer_carries_the_mean_over_ranks_at_full_resolution(fed):
    _, _, lab = fed
    answer = lab.window_message({"run": "win-1", "start": 31_300, "end": 31_399})
    steps, values = np.array(answer["means"]["loss"]).T
    assert steps.tolist() == list(range(31_300, 31_400))
    assert np.allclose(values, (_loss(0, steps) + _loss(1, steps)) / 2)


def test_a_fast_run_streams_bounded_rows_to_the_panel_with_exact_means(tmp_path):
    """Rows logged faster than the panel draws are thinned per flush (M4), the means not."""
    from labcomm_fakes import FakeTime

    session, clock = Session(), FakeTime()
    lab = LabComm(session, comm_manager=FakeManager(), create_comm=lambda **kw: FakeComm(),
                  clock=clock.clock, schedule=clock.schedule)
    lab.register()
    panel = lab._comm_manager.open()
    tracker = RunTracker("fast-1", RANKS, STEPS, session.events.emit,
                         history_dir=str(tmp_path / "fast-1"))
    session.events.emit(events.run_started("fast-1", RANKS, STEPS, "allreduce"))
    try:
        for start in range(0, STEPS, 2 * BATCH):   # 10,000 rows every 0.1 s: 100k rows/s
            for rank in range(RANKS):
                steps = np.arange(start, start + 2 * BATCH)
                tracker.on_batch({"rank": rank, "step": int(steps[-1]), "rows": [
                    [s, 1e9 + s * 0.01, {"loss": v}]
                    for s, v in zip(steps.tolist(), _loss(rank, steps).tolist())]})
            tracker.publish()
            clock.advance(0.1)
        tracker.drain()
        session.events.emit(events.run_ended("fast-1", "done", 6.0))
        clock.advance(1)
    finally:
        lab.close()
    sent = [events.validate_event(m) for m in panel.sent if m["type"] == "metrics"]
    rows = [r for m in sent for r in m["rows"]]
    flushes = STEPS // (2 * BATCH)
    assert len(rows) <= RANKS * flushes * 64 + RANKS        # not the 120,000 rows logged
    for rank, (steps, values) in _by_rank(rows).items():
        assert max(values) == 100.0 + rank                    # the spike
        assert steps[-1] == STEPS - 1                         # the last point
        assert min(values) == _loss(rank, np.array([STEPS - 1]))[0]
    means = np.array([p for m in sent for p in m["means"].get("loss", [])])
    assert len(means) <= flushes * 64 + 64
    steps, values = means.T
    assert np.allclose(values, (_loss(0, steps) + _loss(1, steps)) / 2)
    assert steps[-1] == STEPS - 1 and values.max() == _exact_mean().max()
