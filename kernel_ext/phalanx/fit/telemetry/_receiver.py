"""The kernel end of the metric stream: one ZeroMQ PULL socket for the session's lifetime.

Engines PUSH JSON batches (see ``runtime/telemetry/_metrics.py``); a daemon thread hands each to the
tracker of its run.  Batches of unknown runs (a late flush of a run already over) are dropped.

Across hosts the port is open to the network, so it is guarded twice:

- it speaks CurveZMQ (``wire/_curve.py``, as the rendezvous store does): the batches are
  encrypted, and the handshake completes only for the one client key made for this receiver,
  which reaches this cluster's engines inside each run's spec (``RunSpec.metrics_keys``).  A peer
  without it - plain ZeroMQ, or CURVE with a key of its own - never gets a batch to the socket;
- every batch carries this receiver's token (``RunSpec.metrics_token``), checked again here.

On loopback (local engines) only the token is checked: nothing off this machine can reach the
port, and whoever can watch loopback can read the kernel's memory anyway, so encryption would
buy nothing for its cost on every batch.

Example::

    receiver = MetricsReceiver("10.0.0.1")       # CURVE: not loopback
    receiver.register(run_id, tracker.on_batch)
    receiver.address, receiver.token, receiver.keys   # what the engines get in their RunSpec
    receiver.close()
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
from typing import Any, Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from ...wire._curve import CurveKeys, ZapGate, bind_server, require_curve, tcp_host

log = logging.getLogger("phalanx")

# A peer whose handshake failed: wrong mechanism (plain ZeroMQ), refused by ZAP (another key)
_REFUSED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class MetricsReceiver:
    """Receive metric batches; ``address`` is what engines connect to, ``keys`` how (CURVE).

    ``curve`` defaults to "not loopback"; tests switch it on for a receiver on 127.0.0.1."""

    def __init__(self, bind_ip: str = "127.0.0.1", advertise_ip: str | None = None,
                 curve: bool | None = None) -> None:
        self.bind_ip = bind_ip
        self.curve = not ipaddress.ip_address(bind_ip).is_loopback if curve is None else curve
        self.token = secrets.token_hex(16)
        self.keys: tuple[str, ...] = ()  # (server public, client public, client secret) for CURVE
        self.dropped = 0   # from outside this cluster: batches without the token + refused peers
        self.refused = 0   # handshakes refused (CURVE only): a peer without this receiver's key
        # Its own context: a context has one ZAP endpoint, which must answer for this socket only
        # (the store server has its own; ipyparallel's client uses the shared instance).
        self._ctx: zmq.Context = zmq.Context(io_threads=1)
        self._zap: ZapGate | None = None
        self._monitor: Any = None
        try:
            port = self._open(bind_ip)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        host = advertise_ip or bind_ip
        self.address = f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
        self._handlers: dict[str, Callable[[dict], None]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phalanx-metrics-rx", daemon=True)
        self._thread.start()

    def _open(self, bind_ip: str) -> int:
        if not self.curve:
            self._socket = self._ctx.socket(zmq.PULL)
            self._socket.setsockopt(zmq.LINGER, 0)
            return self._socket.bind_to_random_port(f"tcp://{tcp_host(bind_ip, self._socket)}")
        require_curve("the metric stream across hosts")
        keys = CurveKeys.new()
        self.keys = keys.for_client()
        self._zap = ZapGate(self._ctx, keys.client_public)  # before the server socket exists
        self._socket = self._ctx.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        # counted and logged: the one trace a refused peer leaves (it never sends a batch)
        self._monitor = self._socket.get_monitor_socket(_REFUSED_EVENTS)
        return bind_server(self._socket, keys, bind_ip)

    def register(self, run_id: str, handler: Callable[[dict], None]) -> None:
        with self._lock:
            self._handlers[run_id] = handler

    def unregister(self, run_id: str) -> None:
        with self._lock:
            self._handlers.pop(run_id, None)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        if self._zap is not None:
            poller.register(self._zap.socket, zmq.POLLIN)
            poller.register(self._monitor, zmq.POLLIN)
        while not self._closed.is_set():
            try:
                ready = dict(poller.poll(100))
                if self._zap is not None and self._zap.socket in ready:
                    self._zap.answer()
                if self._monitor is not None and self._monitor in ready:
                    recv_monitor_message(self._monitor)
                    self._refuse()
                if self._socket in ready:
                    self._receive(self._socket.recv_json())
            except zmq.ZMQError:
                if self._closed.is_set():
                    return
                raise
            except ValueError:
                log.warning("phalanx: dropped a metric batch that was not valid JSON")

    def _refuse(self) -> None:
        self.refused += 1
        self.dropped += 1
        if self.refused == 1:
            log.warning("phalanx: refused a connection to the metric stream without this "
                        "cluster's key")

    def _receive(self, message: Any) -> None:
        if not isinstance(message, dict) or not hmac.compare_digest(
                str(message.get("token", "")), self.token):
            self.dropped += 1
            if self.dropped == 1:
                log.warning("phalanx: dropped a metric batch from outside this cluster")
            return
        run = message.get("run")
        with self._lock:
            handler = self._handlers.get(run) if isinstance(run, str) else None
        if handler is not None:
            try:
                handler(message)
            except Exception:
                log.exception("phalanx: metric batch handler failed")

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2)
        self._ctx.destroy(linger=0)
