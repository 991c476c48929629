"""The lab comm's outbox, pure logic: which pending events are kept, merged or replaced between
two flushes, and how events are made safe for the wire."""

from __future__ import annotations

from phalanx import events
from phalanx._outbox import Outbox, wire_safe
from labcomm_fakes import _row


def test_outbox_keeps_order_of_run_boundaries_and_latest_network():
    box = Outbox()
    box.add(events.run_started("a", 1, None, "allreduce"))
    box.add(events.network_state("net", [], []))
    box.add(events.run_ended("a", "done", 1.0))
    box.add(events.network_state("net", [{"id": "n", "label": "n", "kind": "model",
                                          "state": "fitted"}], []))
    drained = box.drain()
    assert [e["type"] for e in drained] == ["run_started", "network", "run_ended"]
    assert drained[1]["nodes"][0]["state"] == "fitted"
    assert len(box) == 0


def test_outbox_does_not_mutate_the_producers_rows():
    rows = [_row(0, 0)]
    box = Outbox()
    box.add(events.metrics("r", rows))
    box.add(events.metrics("r", [_row(0, 1)]))
    assert len(rows) == 1
    assert len(box.drain()[0]["rows"]) == 2


def test_wire_safe_leaves_other_events_alone():
    ev = events.cluster_state([], 2)
    assert wire_safe(ev) is ev
