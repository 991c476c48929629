"""The kernel's wait for each rank's final metrics batch (RunTracker.wait_final): it ends when
the last batch arrives, keeps waiting while batches keep coming, and gives up after a quiet
``timeout``.  Real threads deliver the batches, as the metrics receiver does."""

from __future__ import annotations

import threading
import time

from phalanx.fit.telemetry._tracker import RunTracker
from deadlines import hang_limit


def _tracker() -> RunTracker:
    return RunTracker("wait-1", 2, None, lambda event: None)


def _batch(rank: int, step: int, final: bool = False) -> dict:
    return {"rank": rank, "step": step, "rows": [{"step": step, "loss": 1.0}], "final": final}


def _later(delay: float, *batches: dict, tracker: RunTracker) -> threading.Thread:
    def deliver():
        for batch in batches:
            time.sleep(delay)
            tracker.on_batch(batch)

    thread = threading.Thread(target=deliver)
    thread.start()
    return thread


def test_wait_ends_when_the_last_final_batch_arrives():
    tracker = _tracker()
    tracker.on_batch(_batch(0, 3, final=True))
    started = time.monotonic()
    thread = _later(0.2, _batch(1, 3, final=True), tracker=tracker)
    assert tracker.wait_final([0, 1], timeout=hang_limit(30.0))
    waited = time.monotonic() - started
    thread.join()
    assert 0.2 <= waited < 10.0  # woken by the batch, not by the 30 s deadline


def test_wait_keeps_going_while_batches_arrive_and_gives_up_when_quiet():
    tracker = _tracker()
    # ten batches 0.1 s apart outlast a 0.5 s quiet timeout only if each batch restarts it
    thread = _later(0.1, *[_batch(0, s) for s in range(10)], _batch(0, 10, final=True),
                    tracker=tracker)
    assert tracker.wait_final([0], timeout=0.5)
    thread.join()
    started = time.monotonic()
    assert not tracker.wait_final([0, 1], timeout=0.3)  # rank 1 never sends its final batch
    assert time.monotonic() - started >= 0.3


def test_progress_is_sent_when_batches_arrive_and_seldom_while_none_do(monkeypatch):
    """A long step that logs nothing: the publisher (every 0.1 s) sends progress once a second,
    not ten times, so the kernel idles while the engines train; any batch is shown at once."""
    from phalanx.fit.telemetry import _tracker

    now = [100.0]
    monkeypatch.setattr(_tracker, "_now", lambda: now[0])
    sent: list[dict] = []
    tracker = RunTracker("idle-1", 2, None, sent.append)

    def tick(seconds: float = _tracker.PUBLISH_INTERVAL_S) -> list[str]:
        now[0] += seconds
        before = len(sent)
        tracker.publish()
        return [e["type"] for e in sent[before:]]

    assert tick() == ["progress"]                                   # the first one
    assert [tick() for _ in range(5)] == [[]] * 5                   # nothing arrived
    tracker.on_batch({"rank": 0, "step": 1, "rows": [[1, 0.5, {"loss": 1.0}]]})  # the wire form
    assert tick() == ["metrics", "progress"]                        # a batch: shown at once
    assert tick() == []
    assert tick(_tracker.IDLE_PROGRESS_S) == ["progress"]           # the clocks keep moving
    assert sent[-1]["ranks"][0]["step"] == 1


def test_the_publisher_runs_only_between_start_and_stop_and_a_stopped_run_starts_none():
    def publishers():
        return [t for t in threading.enumerate() if t.name.startswith("phalanx-publish-wait-")]

    events: list[dict] = []
    quick = RunTracker("wait-quick", 2, None, events.append)
    quick.on_batch({"rank": 0, "step": 1, "rows": [], "final": True})
    quick.stop()   # a run over before its wait loop started the publisher: none was made
    quick.start()  # asked too late: nothing starts
    assert not publishers()
    assert any(e["type"] == "progress" for e in events), "the stop published what came"

    long = RunTracker("wait-long", 2, None, events.append)
    long.start()
    long.start()  # once
    assert len(publishers()) == 1
    long.stop()
    assert not publishers()
