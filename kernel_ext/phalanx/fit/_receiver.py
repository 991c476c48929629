"""The kernel end of the metric stream: one ZeroMQ PULL socket for the session's lifetime.

Engines PUSH JSON batches (see ``runtime/_metrics.py``); a daemon thread hands each to the
tracker of its run.  Batches of unknown runs (a late flush of a run already over) are dropped,
and so is anything without this receiver's token: across hosts the port is open to the network,
and the token reaches only this cluster's engines (inside each run's spec).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from typing import Callable

log = logging.getLogger("phalanx")


class MetricsReceiver:
    """Receive metric batches; ``address`` is what engines connect to."""

    def __init__(self, bind_ip: str = "127.0.0.1", advertise_ip: str | None = None) -> None:
        import zmq

        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._ctx.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{bind_ip}")
        self.bind_ip = bind_ip
        self.address = f"tcp://{advertise_ip or bind_ip}:{port}"
        self.token = secrets.token_hex(16)
        self.dropped = 0  # batches without this receiver's token
        self._handlers: dict[str, Callable[[dict], None]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="phalanx-metrics-rx", daemon=True)
        self._thread.start()

    def register(self, run_id: str, handler: Callable[[dict], None]) -> None:
        with self._lock:
            self._handlers[run_id] = handler

    def unregister(self, run_id: str) -> None:
        with self._lock:
            self._handlers.pop(run_id, None)

    def _loop(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._closed.is_set():
            try:
                if not poller.poll(100):
                    continue
                message = self._socket.recv_json()
            except zmq.ZMQError:
                if self._closed.is_set():
                    return
                raise
            except ValueError:
                log.warning("phalanx: dropped a metric batch that was not valid JSON")
                continue
            if not isinstance(message, dict) or not hmac.compare_digest(
                    str(message.get("token", "")), self.token):
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("phalanx: dropped a metric batch from outside this cluster")
                continue
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
        self._socket.close(linger=0)
