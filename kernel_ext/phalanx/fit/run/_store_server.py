"""The kernel's rendezvous store across hosts: key/value over CurveZMQ, for this cluster only.

torch's ``TCPStore`` answers anyone who connects: a peer on the network could list the keys,
read the group's addresses and overwrite them.  This server keeps the same data but speaks
CurveZMQ: traffic is encrypted, and the handshake completes only for the one client key made
for this server (a ZAP handler in the server's own thread checks it: ``wire/_curve.py``, which
the metric receiver shares).  A peer without that key
gets no answer at all: its handshake is refused before any request is read.

The engines reach it with :class:`~phalanx.runtime.run._store_client.CurveStore`; the client key
pair and the server's public key travel in each run's ``GroupSpec`` over ipyparallel's
authenticated channel.  Requests follow :mod:`phalanx.wire._store_protocol`; a bad one is answered
with an error and never stops the server.

Example::

    server = StoreServer("10.0.0.1")   # never 0.0.0.0: only the address on the engines' route
    spec_store = server.spec()          # ("curve", ip, port, server_public, client_public, ...)
    server.close()                      # thread gone, nothing listening
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass

import zmq

from ...wire._curve import CurveKeys, ZapGate, bind_server, require_curve
from ...wire._store_protocol import (BLOCKING, MAX_MESSAGE_BYTES, Request, WireError,
                                   decode_request, encode_reply)

log = logging.getLogger("phalanx")

MAX_PARKED = 10_000                        # blocking requests held at once; more are told "pending"
_wake_ids = itertools.count()


@dataclass
class _Parked:
    """A blocking request whose keys are not there yet: answered when they are, or at deadline."""

    peer: bytes
    request: Request
    deadline: float


class StoreTable:
    """The store's data and its blocking requests (no IO: the server thread carries replies).

    >>> table = StoreTable()
    >>> table.serve(b"p", Request(1, "add", ["n"], [], n=2), now=0.0)[0]
    b'{"v": 1, "id": 1, "ok": true, "n": 2}'
    >>> table.serve(b"p", Request(2, "get", ["x"], [], block_ms=100), now=0.0) is None  # parked
    True
    >>> table.serve(b"q", Request(3, "set", ["x"], [b"1"]), now=0.0) and table.woken()
    [(b'p', [b'{"v": 1, "id": 2, "ok": true, "n": 0}', b'1'])]
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self._parked: list[_Parked] = []

    def serve(self, peer: bytes, req: Request, now: float) -> list[bytes] | None:
        """The reply to ``req``, or None when it is parked until its keys appear."""
        if req.op in BLOCKING:
            if all(k in self.data for k in req.keys):
                return self._blocking_reply(req)
            if req.block_ms == 0 or len(self._parked) >= MAX_PARKED:
                return encode_reply(req.id, pending=True)
            self._parked.append(_Parked(peer, req, now + req.block_ms / 1000))
            return None
        return getattr(self, f"_op_{req.op}")(req)

    def woken(self) -> list[tuple[bytes, list[bytes]]]:
        """Replies to the parked requests whose keys are all there now."""
        ready = [p for p in self._parked if all(k in self.data for k in p.request.keys)]
        if ready:
            taken = {id(p) for p in ready}
            self._parked = [p for p in self._parked if id(p) not in taken]
        return [(p.peer, self._blocking_reply(p.request)) for p in ready]

    def expired(self, now: float) -> list[tuple[bytes, list[bytes]]]:
        """"Pending" to the parked requests whose slice is over (the client asks again)."""
        over = [p for p in self._parked if p.deadline <= now]
        self._parked = [p for p in self._parked if p.deadline > now]
        return [(p.peer, encode_reply(p.request.id, pending=True)) for p in over]

    def next_timeout_ms(self, now: float) -> int | None:
        if not self._parked:
            return None
        return max(0, int((min(p.deadline for p in self._parked) - now) * 1000) + 1)

    def _blocking_reply(self, req: Request) -> list[bytes]:
        if req.op == "wait":
            return encode_reply(req.id)
        return encode_reply(req.id, values=[self.data[k] for k in req.keys])

    def _op_set(self, req: Request) -> list[bytes]:
        self.data[req.keys[0]] = req.values[0]
        return encode_reply(req.id)

    def _op_multi_set(self, req: Request) -> list[bytes]:
        self.data.update(zip(req.keys, req.values))
        return encode_reply(req.id)

    def _op_append(self, req: Request) -> list[bytes]:
        self.data[req.keys[0]] = self.data.get(req.keys[0], b"") + req.values[0]
        return encode_reply(req.id)

    def _op_add(self, req: Request) -> list[bytes]:
        key = req.keys[0]
        try:
            value = int(self.data.get(key, b"0")) + req.n
        except ValueError:
            return encode_reply(req.id, error=f"the value of {key!r} is not an integer")
        self.data[key] = str(value).encode()
        return encode_reply(req.id, n=value)

    def _op_compare_set(self, req: Request) -> list[bytes]:
        # torch's TCPStore semantics: set when the current value is the expected one (or the
        # key is missing and nothing was expected); answer the value the key has afterwards
        key, (expected, desired) = req.keys[0], req.values
        current = self.data.get(key)
        if (current is None and expected == b"") or current == expected:
            self.data[key] = desired
            return encode_reply(req.id, values=[desired])
        return encode_reply(req.id, values=[expected if current is None else current])

    def _op_check(self, req: Request) -> list[bytes]:
        return encode_reply(req.id, n=int(all(k in self.data for k in req.keys)))

    def _op_delete_key(self, req: Request) -> list[bytes]:
        return encode_reply(req.id, n=int(self.data.pop(req.keys[0], None) is not None))

    def _op_num_keys(self, req: Request) -> list[bytes]:
        return encode_reply(req.id, n=len(self.data))


class StoreServer:
    """A :class:`StoreTable` served over CurveZMQ on ``bind_ip``, to one client key only."""

    def __init__(self, bind_ip: str) -> None:
        require_curve("the rendezvous across hosts")
        keys = CurveKeys.new()
        self.bind_ip = bind_ip
        self.server_public, self.client_public = keys.server_public, keys.client_public
        self._client_secret = keys.client_secret
        self._table = StoreTable()
        self._table_lock = threading.Lock()  # the server thread's, and keys() from elsewhere
        # Its own context: a context has one ZAP endpoint, and this one must answer for this
        # server only (ipyparallel's client and the metric receiver use the shared instance).
        self._ctx: zmq.Context = zmq.Context(io_threads=1)
        try:
            self.port = self._open_sockets(keys)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._closing = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="phalanx-rendezvous", daemon=True)
        self._thread.start()

    def spec(self) -> tuple:
        """What a rank needs to reach this store: the ``store`` of its ``GroupSpec``."""
        return ("curve", self.bind_ip, self.port, self.server_public, self.client_public,
                self._client_secret)

    def keys(self) -> list[str]:
        """The keys the store holds now (a snapshot, for tests and diagnostics)."""
        with self._table_lock:
            return list(self._table.data)

    def _open_sockets(self, keys: CurveKeys) -> int:
        self._zap = ZapGate(self._ctx, keys.client_public)  # before the server socket: see ZapGate
        wake = f"inproc://phalanx-rendezvous-wake-{next(_wake_ids)}"
        self._wake_rx = self._ctx.socket(zmq.PAIR)
        self._wake_rx.bind(wake)
        self._wake_tx = self._ctx.socket(zmq.PAIR)
        self._wake_tx.connect(wake)
        sock = self._socket = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        return bind_server(sock, keys, self.bind_ip)

    def _loop(self) -> None:
        poller = zmq.Poller()
        for sock in (self._socket, self._zap.socket, self._wake_rx):
            poller.register(sock, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(self._table.next_timeout_ms(time.monotonic())))
            if self._wake_rx in ready:
                return
            try:
                if self._zap.socket in ready:
                    self._zap.answer()
                with self._table_lock:
                    if self._socket in ready:
                        self._serve_waiting()
                    self._send(self._table.expired(time.monotonic()))
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ETERM:
                    return
                log.warning("phalanx: rendezvous server: %s", exc)
            except Exception:  # a bug must not leave every rank waiting on a dead server
                log.exception("phalanx: rendezvous server failed on a request")

    def _serve_waiting(self) -> None:
        while self._socket.poll(0):
            peer, *frames = self._socket.recv_multipart()
            try:
                req = decode_request(frames)
            except WireError as exc:
                self._send([(peer, encode_reply(_request_id(frames), error=str(exc)))])
                continue
            reply = self._table.serve(peer, req, time.monotonic())
            if reply is not None:
                self._send([(peer, reply)])
            if req.op not in BLOCKING:
                self._send(self._table.woken())

    def _send(self, replies: list[tuple[bytes, list[bytes]]]) -> None:
        for peer, frames in replies:
            self._socket.send_multipart([peer, *frames])

    def close(self) -> None:
        """Stop the thread and close every socket: nothing listens afterwards (idempotent)."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._wake_tx.send(b"")
        self._thread.join(timeout=10)
        self._ctx.destroy(linger=0)


def _request_id(frames: list[bytes]) -> int:
    """The id of a request that failed to decode, when it has one (else 0)."""
    import json

    try:
        req_id = json.loads(frames[0]).get("id", 0)
    except Exception:
        return 0
    return req_id if isinstance(req_id, int) else 0
