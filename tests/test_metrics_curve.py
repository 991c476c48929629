"""The metric stream under CurveZMQ (``fit/telemetry/_receiver.py``, ``runtime/telemetry/_metrics.py``), in process.

Across hosts the receiver is a CURVE server that admits only its own client key; here it is bound
on 127.0.0.1 with ``curve=True`` so the real sockets run without a second host:

* an engine's sender with the receiver's keys gets its rows to the run's handler;
* a peer with plain ZeroMQ or with a CURVE key of its own, sending well-formed batches with the
  right run id and even the right token, gets nothing to the handler (refused at the handshake);
* a peer with the key but without the token is still dropped (the second layer);
* on the wire the batches are ciphertext (a TCP relay in between sees neither token nor names);
* loopback without CURVE is as before; the engine keeps one socket per (address, keys); a sender
  to an unreachable receiver never blocks the loop.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq

from phalanx.fit.telemetry._receiver import MetricsReceiver
from phalanx.runtime.telemetry import _metrics
from phalanx.runtime.telemetry._metrics import MetricsSender
from deadlines import hang_limit

RUN = "run-curve-1"


class Inbox:
    """The run's handler: what reached the tracker."""

    def __init__(self) -> None:
        self.batches: list[dict] = []

    def __call__(self, message: dict) -> None:
        self.batches.append(message)

    def rows(self) -> list[list]:
        return [row for b in self.batches for row in b["rows"]]


@pytest.fixture
def curve_receiver():
    receiver = MetricsReceiver("127.0.0.1", curve=True)
    inbox = Inbox()
    receiver.register(RUN, inbox)
    yield receiver, inbox
    receiver.close()


def _wait(check, what: str, timeout: float = hang_limit(10.0)) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.02)


def _send_rows(address: str, token: str, keys: tuple, memory: float = 0.0) -> None:
    sender = MetricsSender(address, RUN, 0, token, memory_interval_s=memory, keys=keys)
    for step in range(3):
        sender.record(step, {"loss": 1.0 / (step + 1)})
    sender.close()


def _forged(token: str) -> dict:
    return {"run": RUN, "token": token, "rank": 99, "rows": [[99, 0.0, {"forged": 1.0}]],
            "step": 99, "warnings": [], "final": False}


def _push(address: str, message: dict, keys: tuple | None = None) -> None:
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    if keys is not None:
        push.curve_serverkey, push.curve_publickey, push.curve_secretkey = keys
    push.connect(address)
    for _ in range(2):
        push.send_json(message)
    push.close()
    ctx.term()


def test_a_sender_with_the_keys_gets_its_rows_to_the_run(curve_receiver):
    receiver, inbox = curve_receiver
    assert receiver.curve and len(receiver.keys) == 3
    _send_rows(receiver.address, receiver.token, receiver.keys)
    _wait(lambda: any(b["final"] for b in inbox.batches), "the final batch")
    assert [r[0] for r in inbox.rows()] == [0, 1, 2]
    assert receiver.dropped == receiver.refused == 0


@pytest.mark.parametrize("client", ["plain zeromq", "another curve key"])
def test_a_peer_without_the_key_gets_nothing_in_even_with_the_token(curve_receiver, client):
    receiver, inbox = curve_receiver
    own_public, own_secret = zmq.curve_keypair()
    keys = None if client == "plain zeromq" else (receiver.keys[0].encode(), own_public,
                                                  own_secret)
    _push(receiver.address, _forged(receiver.token), keys)  # right run id, right token
    _wait(lambda: receiver.refused >= 1, "the handshake refused")
    assert receiver.dropped >= receiver.refused
    assert not inbox.batches, "a batch from a peer without the key reached the run"
    _send_rows(receiver.address, receiver.token, receiver.keys)  # the engines are unharmed
    _wait(lambda: any(b["final"] for b in inbox.batches), "the real final batch")
    assert {r[0] for r in inbox.rows()} == {0, 1, 2}


def test_a_peer_with_the_key_but_not_the_token_is_still_dropped(curve_receiver):
    receiver, inbox = curve_receiver
    server_public, client_public, client_secret = receiver.keys
    _push(receiver.address, _forged("guess"),
          (server_public.encode(), client_public.encode(), client_secret.encode()))
    _wait(lambda: receiver.dropped >= 2, "batches without the token dropped")
    assert receiver.refused == 0 and not inbox.batches


def _relay(target_port: int) -> tuple[int, bytearray, threading.Event]:
    """A TCP relay to ``target_port``: its port, every byte it carried, and a stop switch."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    seen, stop = bytearray(), threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not stop.is_set():
            try:
                data = src.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            seen.extend(data)
            dst.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            upstream = socket.create_connection(("127.0.0.1", target_port))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()
        listener.close()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1], seen, stop


@pytest.mark.parametrize("curve", [True, False])
def test_on_the_wire_batches_are_ciphertext_under_curve(curve):
    receiver = MetricsReceiver("127.0.0.1", curve=curve)
    inbox = Inbox()
    receiver.register(RUN, inbox)
    port, seen, stop = _relay(int(receiver.address.rsplit(":", 1)[1]))
    try:
        _send_rows(f"tcp://127.0.0.1:{port}", receiver.token, receiver.keys)
        _wait(lambda: any(b["final"] for b in inbox.batches), "the final batch via the relay")
    finally:
        stop.set()
        receiver.close()
    visible = [s for s in (receiver.token.encode(), b"loss", RUN.encode()) if s in seen]
    # plain loopback (the one-host case) is the control: the relay does see the batch
    assert visible == ([] if curve else [receiver.token.encode(), b"loss", RUN.encode()])


def test_loopback_stays_plain_and_checks_the_token():
    receiver = MetricsReceiver("127.0.0.1")
    inbox = Inbox()
    receiver.register(RUN, inbox)
    try:
        assert not receiver.curve and receiver.keys == ()
        _push(receiver.address, _forged("guess"))
        _send_rows(receiver.address, receiver.token, ())
        _wait(lambda: any(b["final"] for b in inbox.batches) and receiver.dropped >= 2,
              "rows in, forged batches dropped")
        assert {r[2].get("loss") is not None for r in inbox.rows()} == {True}
    finally:
        receiver.close()


def test_the_engine_keeps_one_socket_per_address_and_keys(curve_receiver):
    receiver, _ = curve_receiver
    first = _metrics._socket_to(receiver.address, receiver.keys)
    assert _metrics._socket_to(receiver.address, receiver.keys) is first
    other = MetricsReceiver("127.0.0.1", curve=True)  # a new receiver: new address, new keys
    try:
        second = _metrics._socket_to(other.address, other.keys)
        assert second is not first and first.closed
        assert list(_metrics._SOCKETS) == [(other.address, other.keys)]
    finally:
        other.close()


def test_a_sender_to_an_unreachable_receiver_never_blocks_the_loop():
    receiver = MetricsReceiver("127.0.0.1", curve=True)
    address, keys, token = receiver.address, receiver.keys, receiver.token
    receiver.close()  # the kernel is gone: nothing listens, nothing answers the handshake
    sender = MetricsSender(address, RUN, 0, token, memory_interval_s=0.0, keys=keys)
    done = threading.Event()

    def train() -> None:
        for step in range(200):
            sender.record(step, {"loss": 0.5})
            sender.flush_periodic()  # what the flusher does every 50 ms, here at once
        sender.close()
        done.set()

    threading.Thread(target=train, daemon=True).start()
    assert done.wait(30), "the metric sender blocked on an unreachable kernel"
