"""The engine's metrics flusher (``runtime/telemetry/_metrics.py``) with a real receiver, in
process: between progress batches it naps instead of waking every 50 ms, and a row logged
during the nap still goes out at once, not when the next progress batch is due.

The progress interval is raised to 30 s here, so a row that waited for the nap's end would
miss the 10 s wait below by far: the test tells a woken flusher from a sleeping one without
timing anything finer than that.
"""

from __future__ import annotations

import threading
import time

import pytest

from phalanx.fit.telemetry._receiver import MetricsReceiver
from phalanx.runtime.telemetry import _metrics
from phalanx.runtime.telemetry._metrics import MetricsSender
from deadlines import hang_limit
from test_reliability_helpers import wait_for

RUN = "run-flusher-1"


@pytest.fixture
def receiver_inbox():
    receiver = MetricsReceiver("127.0.0.1")
    batches: list[dict] = []
    receiver.register(RUN, batches.append)
    yield receiver, batches
    receiver.close()


def _wait(check, what: str) -> None:
    wait_for(check, hang_limit(10.0), interval=0.01, what=what)


def test_a_row_logged_while_the_flusher_naps_goes_out_at_once(receiver_inbox, monkeypatch):
    receiver, batches = receiver_inbox
    monkeypatch.setattr(_metrics, "_PROGRESS_INTERVAL_S", 30.0)
    sender = MetricsSender(receiver.address, RUN, 0, receiver.token, memory_interval_s=0.0)
    try:
        sender.set_step(1)
        _wait(lambda: batches, "the first progress batch")
        _wait(lambda: _metrics._FLUSHER.napping, "the flusher napping until the next one")
        sent = len(batches)
        sender.set_step(2)   # progress alone does not wake it
        time.sleep(0.3)
        assert len(batches) == sent, [b["step"] for b in batches]
        sender.record(2, {"loss": 0.5})
        _wait(lambda: any(b["rows"] for b in batches), "the row logged during the nap")
        assert [b["rows"] for b in batches if b["rows"]] == [[[2, pytest.approx(time.time(), abs=60),
                                                              {"loss": 0.5}]]]
    finally:
        sender.close()
    _wait(lambda: batches[-1]["final"], "the final batch")
    assert batches[-1]["step"] == 2


def test_a_quiet_loop_wakes_the_flusher_only_for_its_progress_batches(receiver_inbox, monkeypatch):
    """A loop that logs nothing: the thread runs for each progress batch, not every 50 ms."""
    receiver, batches = receiver_inbox
    monkeypatch.setattr(_metrics, "_PROGRESS_INTERVAL_S", 30.0)
    calls = []
    original = MetricsSender.flush_periodic

    def counted(self: MetricsSender) -> None:
        calls.append(threading.get_ident())
        original(self)

    monkeypatch.setattr(MetricsSender, "flush_periodic", counted)
    sender = MetricsSender(receiver.address, RUN, 0, receiver.token, memory_interval_s=0.0)
    try:
        for step in range(1, 40):   # a second of steps, no log()
            sender.set_step(step)
            time.sleep(0.025)
    finally:
        sender.close()
    # the first flush after attach, then a nap of 30 s; woken every 50 ms it would be ~20
    assert len(calls) <= 2, f"the flusher ran {len(calls)} times in a second of a quiet loop"
    _wait(lambda: batches[-1]["final"], "the final batch")
    assert batches[-1]["step"] == 39
