"""The kernel end of the lab panel's comm, with a fake session, fake comms and a fake clock.

Pure logic (routing, throttling, coalescing, validation), so fakes are fine here; the real
comm through a real JupyterLab is exercised by the browser tests. The fakes are shared in
labcomm_fakes.py; the outbox that coalesces events between flushes is tested in test_outbox.py.
"""

from __future__ import annotations

import logging

import pytest

from phalanx import events
from phalanx._labcomm import MAX_COMMS, LabComm
from phalanx._panel_answers import HISTORY_CHUNK_ROWS
from phalanx.events import COMM_TARGET, validate_event
from labcomm_fakes import (FakeComm, FakeManager, FakeSession, FakeTime, _engine, _row,
                           finish_run)


@pytest.fixture
def rig():
    session, manager, fake_time = FakeSession(), FakeManager(), FakeTime()
    announced: list[dict] = []

    def create_comm(**kwargs):
        announced.append(kwargs)
        return FakeComm()

    lab = LabComm(session, comm_manager=manager, create_comm=create_comm,
                  clock=fake_time.clock, schedule=fake_time.schedule)
    lab.register()
    yield session, manager, fake_time, lab, announced
    lab.close()


def test_register_installs_target_and_announces(rig):
    session, manager, _, lab, announced = rig
    assert manager.targets[COMM_TARGET] == lab._on_open
    assert announced == [{"target_name": COMM_TARGET, "data": {}}]
    lab.register()  # idempotent: no second subscription, no second announcement
    assert len(announced) == 1


def test_open_answers_with_a_valid_snapshot(rig):
    session, manager, *_ = rig
    session.events.emit(events.cluster_state([_engine(0), _engine(1)], 4))
    comm = manager.open({"v": 1, "type": "request_snapshot"})
    assert comm.types() == ["snapshot"]
    snap = validate_event(comm.sent[0])
    assert [e["type"] for e in snap["events"]] == ["cluster"]
    assert len(snap["events"][0]["engines"]) == 2


def test_snapshot_carries_progress_and_the_whole_history_in_chunks(rig):
    session, manager, fake_time, *_ = rig
    session.events.emit(events.run_started("r1", 2, 10, "allreduce"))
    session.events.emit(events.progress("r1", [{"rank": 0, "step": 3}]))
    fake_time.advance(1)
    session.events.emit(events.progress("r1", [{"rank": 1, "step": 4}]))
    n_rows = HISTORY_CHUNK_ROWS + 7
    session.rows = [_row(i % 2, i) for i in range(n_rows)]
    comm = manager.open()
    assert comm.types() == ["snapshot", "metrics", "metrics"]
    inner = comm.sent[0]["events"]
    assert [e["type"] for e in inner] == ["runs", "run_started", "progress"]
    assert [r["step"] for r in inner[2]["ranks"]] == [3, 4]  # merged over both updates
    assert sum(len(m["rows"]) for m in comm.sent[1:]) == n_rows
    assert all(m["run"] == "r1" for m in comm.sent[1:])


def test_events_are_throttled_and_metric_rows_never_dropped(rig):
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    comm.sent.clear()
    session.events.emit(events.run_started("r1", 2, None, "allreduce"))  # sent at once
    assert comm.types() == ["run_started"]
    for step in range(50):  # a burst within one interval: coalesced, not sent yet
        session.events.emit(events.metrics("r1", [_row(0, step), _row(1, step)]))
        session.events.emit(events.progress("r1", [{"rank": step % 2, "step": step}]))
        session.events.emit(events.cluster_state([_engine(0)], 4))
    assert comm.types() == ["run_started"]
    fake_time.advance(0.1)
    assert sorted(comm.types()[1:]) == ["cluster", "metrics", "progress"]
    rows = [r for m in comm.sent if m["type"] == "metrics" for r in m["rows"]]
    assert len(rows) == 100
    assert [(r["rank"], r["step"]) for r in rows] == [(s % 2, s // 2) for s in range(100)]
    progress = next(m for m in comm.sent if m["type"] == "progress")
    assert {r["rank"]: r["step"] for r in progress["ranks"]} == {0: 48, 1: 49}


def test_rate_stays_near_ten_messages_per_second(rig):
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    comm.sent.clear()
    session.events.emit(events.run_started("r1", 1, None, "allreduce"))
    for i in range(1000):  # 10 s of events at 100 Hz, two kinds each time
        session.events.emit(events.metrics("r1", [_row(0, i)]))
        session.events.emit(events.progress("r1", [{"rank": 0, "step": i}]))
        fake_time.advance(0.01)
    fake_time.advance(1)
    assert len(comm.sent) <= 10 * 11 + 2
    assert sum(len(m["rows"]) for m in comm.sent if m["type"] == "metrics") == 1000


def test_every_panel_gets_every_event_and_closed_ones_are_forgotten(rig):
    session, manager, fake_time, lab, _ = rig
    a, b = manager.open(), manager.open()
    assert lab.comm_count == 2
    b.close_cb({})
    assert lab.comm_count == 1
    session.events.emit(events.run_ended("r1", "done", 1.0))
    assert a.types()[-1] == "run_ended"
    assert b.types() == ["snapshot"]


def test_a_broken_comm_is_dropped_and_does_not_stop_others(rig, caplog):
    session, manager, fake_time, lab, _ = rig
    good = manager.open()
    bad = manager.open()
    bad.fail = True
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        session.events.emit(events.run_ended("r1", "done", 1.0))
    assert good.types()[-1] == "run_ended"
    assert lab.comm_count == 1
    assert "failed to send" in caplog.text


def test_too_many_comms_close_the_oldest(rig):
    _, manager, _, lab, _ = rig
    comms = [manager.open() for _ in range(MAX_COMMS + 2)]
    assert lab.comm_count == MAX_COMMS
    assert [c.closed for c in comms[:3]] == [True, True, False]


def test_scale_and_stop_requests_reach_the_session(rig):
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    comm.request({"v": 1, "type": "scale", "n": 3})
    comm.request({"v": 1, "type": "stop"})
    assert session.scaled == [3]
    assert session.stopped == 1
    fake_time.advance(1)
    assert comm.types()[-1] == "cluster"
    assert len(comm.sent[-1]["engines"]) == 3


def test_the_panel_that_asks_gets_the_cluster_logs_last_lines(rig):
    session, manager, *_ = rig
    session.log_lines = [f"engine said {i}" for i in range(300)]
    asking, other = manager.open(), manager.open()
    asking.request({"v": 1, "type": "request_log"})
    answer = validate_event(asking.sent[-1])
    assert answer["type"] == "engine_log" and answer["path"] == "/profile/log/phalanx-abc.log"
    assert answer["lines"] == session.log_lines[-200:]
    asking.request({"v": 1, "type": "request_log", "lines": 5})
    assert asking.sent[-1]["lines"] == session.log_lines[-5:]
    assert "engine_log" not in other.types()


def test_scale_above_the_limit_is_refused_with_an_error_event(rig, caplog):
    session, manager, *_ = rig
    session.events.emit(events.cluster_state([_engine(0), _engine(1)], 4))
    comm = manager.open()
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        comm.request({"v": 1, "type": "scale", "n": 5})
    assert session.scaled == []
    error = validate_event(comm.sent[-1])
    assert error["type"] == "cluster" and "at most 4" in error["error"]
    assert len(error["engines"]) == 2  # the current engines, unchanged
    assert "cannot scale to 5" in caplog.text


def test_a_failing_scale_becomes_an_error_event_and_the_comm_keeps_working(rig):
    session, manager, *_ = rig
    session.max_engines = 99
    comm = manager.open()
    comm.request({"v": 1, "type": "scale", "n": 3})
    assert "engine 2 did not start" in comm.sent[-1]["error"]
    comm.request({"v": 1, "type": "request_snapshot"})
    assert comm.types()[-1] == "snapshot"


@pytest.mark.parametrize("bad", [
    None, "scale", [], {"type": "scale", "n": 2}, {"v": 2, "type": "scale", "n": 2},
    {"v": 1, "type": "exec", "code": "import os"}, {"v": 1, "type": "scale", "n": "3"},
    {"v": 1, "type": "scale", "n": 0}, {"v": 1, "type": "scale", "n": True},
])
def test_invalid_requests_are_logged_and_ignored(rig, caplog, bad):
    session, manager, *_ = rig
    comm = manager.open()
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        comm.request(bad)
    assert session.scaled == [] and session.stopped == 0
    assert comm.types() == ["snapshot"]
    assert "invalid request" in caplog.text


def test_an_invalid_open_request_still_gets_the_snapshot(rig, caplog):
    _, manager, *_ = rig
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        comm = manager.open({"v": 1, "type": "nonsense"})
    assert comm.types() == ["snapshot"]
    assert "invalid request" in caplog.text


def test_invalid_bus_events_are_not_forwarded(rig, caplog):
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        session.events.emit({"v": 1, "type": "progress", "run": "r", "ranks": [{"rank": "x"}]})
    fake_time.advance(1)
    assert comm.types() == ["snapshot"]
    assert "invalid event" in caplog.text


def test_a_metrics_batch_with_a_broken_row_is_dropped_and_later_ones_still_sent(rig, caplog):
    """Rows are checked when they are sent (a flush sends a few hundred of the thousands a
    heavy run logs), so a broken row costs its flush's batch, with a warning, and no more."""
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    with caplog.at_level(logging.WARNING, logger="phalanx"):
        session.events.emit(events.metrics("r", [_row(0, 1), {"rank": 0, "step": "two", "t": 0.0,
                                                              "metrics": {"loss": 1.0}}]))
        fake_time.advance(1)
        session.events.emit({"v": 1, "type": "metrics", "rows": []})       # no run: refused now
    assert "invalid event" in caplog.text and comm.types() == ["snapshot"]
    session.events.emit(events.metrics("r", [_row(0, 3)]))
    fake_time.advance(1)
    [metrics] = [m for m in comm.sent if m["type"] == "metrics"]
    assert [r["step"] for r in metrics["rows"]] == [3]


def test_non_finite_metrics_are_left_out_and_the_row_kept(rig):
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    session.events.emit(events.metrics("r", [{"rank": 0, "step": 1, "t": 0.5,
                                              "metrics": {"loss": float("nan"), "acc": 0.9}}],
                                       means={"acc": [[0, float("inf")], [1, 0.9]]}))
    session.events.emit(events.progress("r", [{"rank": 0, "step": 1, "eta_s": float("inf"),
                                               "metrics": {"loss": float("-inf")}}]))
    fake_time.advance(1)
    metrics = next(m for m in comm.sent if m["type"] == "metrics")
    progress = next(m for m in comm.sent if m["type"] == "progress")
    assert metrics["rows"][0]["metrics"] == {"acc": 0.9}
    assert metrics["means"] == {"acc": [[1, 0.9]]}
    assert progress["ranks"][0]["eta_s"] is None and progress["ranks"][0]["metrics"] == {}


def test_history_failure_still_sends_the_snapshot(rig, caplog):
    session, manager, *_ = rig
    session.events.emit(events.run_started("r1", 1, None, "allreduce"))
    session.run_history_rows = lambda: 1 / 0
    comm = manager.open()
    assert comm.types() == ["snapshot"]
    assert "could not read the run history" in caplog.text


def test_close_unregisters_and_closes_comms(rig):
    session, manager, fake_time, lab, _ = rig
    comm = manager.open()
    lab.close()
    assert COMM_TARGET not in manager.targets
    assert comm.closed
    session.events.emit(events.run_ended("r1", "done", 1.0))
    fake_time.advance(1)
    assert comm.types() == ["snapshot"]


def test_register_uses_the_comm_package_by_default():
    """Outside a kernel the comm package's defaults work (no frontend: nothing is sent)."""
    import comm

    session = FakeSession()
    lab = LabComm(session)
    lab.register()
    try:
        assert comm.get_comm_manager().targets[COMM_TARGET] == lab._on_open
    finally:
        lab.close()
    assert COMM_TARGET not in comm.get_comm_manager().targets


def test_a_panel_attaching_mid_stream_gets_pending_rows_only_through_its_snapshot(rig):
    session, manager, fake_time, *_ = rig
    first = manager.open()
    session.events.emit(events.run_started("r1", 1, None, "allreduce"))
    session.events.emit(events.metrics("r1", [_row(0, 1)]))  # pending: within the interval
    session.rows = [_row(0, 1)]
    second = manager.open()
    assert first.types()[-1] == "metrics"  # flushed to the panel already attached
    assert second.types() == ["snapshot", "metrics"]  # the row once, from the history
    fake_time.advance(1)
    assert second.types() == ["snapshot", "metrics"]


def test_the_panel_and_the_kernel_agree_on_the_schema():
    """labextension/test/fixtures/messages.json is also checked by the TypeScript validator."""
    import json
    from pathlib import Path

    from phalanx.events import SchemaError, validate_request

    path = Path(__file__).parents[1] / "labextension" / "test" / "fixtures" / "messages.json"
    shared = json.loads(path.read_text())
    for event in shared["valid_events"]:
        validate_event(event)
    for request in shared["valid_requests"]:
        validate_request(request)
    for event in shared["invalid_events"]:
        with pytest.raises(SchemaError):
            validate_event(event)
    for request in shared["invalid_requests"]:
        with pytest.raises(SchemaError):
            validate_request(request)


def test_stop_run_reaches_the_session_and_no_run_is_said(rig):
    session, manager, fake_time, *_ = rig
    comm = manager.open()
    comm.request({"v": 1, "type": "stop_run"})
    assert session.stop_reasons == ["Stop in the phalanx panel"]
    session.running = False
    comm.request({"v": 1, "type": "stop_run"})
    assert comm.sent[-1]["type"] == "cluster" and comm.sent[-1]["error"] == "no run is going"


def test_scale_from_the_panel_may_wait_for_the_run(rig, monkeypatch):
    session, manager, *_ = rig
    asked = []
    monkeypatch.setattr(session, "scale", lambda n, queue=False: asked.append((n, queue)))
    manager.open().request({"v": 1, "type": "scale", "n": 2})
    assert asked == [(2, True)]  # queued (or resized at a commit) while a run goes, never lost


def test_a_panel_lists_the_kernels_runs_and_gets_an_earlier_ones_record(rig):
    """The run list a reloaded panel gets, and what picking an earlier run brings: its end, its
    ranks' last steps and step parts, its curves (the digest of its real record)."""
    session, manager, *_ = rig
    finish_run(session, "k-1", "train", steps=10)
    line = "rank 1 (engine 1 on host h, pid 11) raised ValueError after 3 step(s)"
    finish_run(session, "k-2", "bad", steps=3, status="failed", error=line)
    comm = manager.open()
    listed = comm.sent[0]["events"][0]
    assert [(e["name"], e["status"], e["wall_s"], e["error"]) for e in listed["runs"]] == [
        ("train", "done", 1.5, None), ("bad", "failed", 1.5, line)]
    comm.sent.clear()
    comm.request({"v": 1, "type": "request_run", "run": "k-1"})
    assert comm.types() == ["run_record", "metrics"]
    record = validate_event(comm.sent[0])
    assert (record["name"], record["status"], record["total_steps"]) == ("train", "done", 10)
    assert [(r["rank"], r["step"]) for r in record["ranks"]] == [(0, 10), (1, 10)]
    assert [t["parts"]["data"] for t in record["times"]] == [0.6, 0.6]
    rows = validate_event(comm.sent[1])["rows"]
    assert {(r["rank"], r["step"]) for r in rows} == {(r, s) for r in (0, 1) for s in range(10)}
    assert comm.sent[1]["run"] == "k-1" and len(comm.sent[1]["means"]["loss"]) == 10


def test_an_earlier_runs_zoomed_window_and_a_run_no_longer_kept(rig):
    session, manager, *_ = rig
    finish_run(session, "k-1", "train", steps=100)
    finish_run(session, "k-2", "val", steps=5)
    comm = manager.open()
    comm.request({"v": 1, "type": "request_window", "run": "k-1", "start": 20, "end": 29})
    window = validate_event(comm.sent[-1])
    assert sorted({r["step"] for r in window["rows"]}) == list(range(20, 30))
    assert [p[0] for p in window["means"]["loss"]] == list(range(20, 30))
    comm.request({"v": 1, "type": "request_run", "run": "gone-7"})  # the panel lets it go
    assert comm.types()[-1] == "runs" and len(comm.sent[-1]["runs"]) == 2


def test_the_panel_picks_the_subshell_its_requests_run_on(rig):
    """ipykernel would route a comm's requests to where it last sent from (a timer thread:
    the main shell, behind the running cell); the panel's own choice must win."""
    _, manager, *_ = rig
    comm = manager.open()
    assert comm._reply_subshell_for({"v": 1, "type": "stop_run"}, "subshell-1") == "subshell-1"
    assert comm._reply_subshell_for({}, None) is None
