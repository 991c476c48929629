"""The kernel's wait for each rank's final metrics batch (RunTracker.wait_final): it ends when
the last batch arrives, keeps waiting while batches keep coming, and gives up after a quiet
``timeout``.  Real threads deliver the batches, as the metrics receiver does."""

from __future__ import annotations

import threading
import time

from phalanx.fit._tracker import RunTracker


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
    assert tracker.wait_final([0, 1], timeout=30.0)
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
