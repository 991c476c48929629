"""CurveZMQ for the kernel's listeners across hosts: one key set each, one client key admitted.

Two kernel sockets face the engines' network: the rendezvous store (``fit/run/_store_server.py``) and
the metric stream (``fit/telemetry/_receiver.py``).  Both are guarded the same way: a server key pair and one
client key pair made when the listener starts; the client half travels to the engines inside each
run's spec, over ipyparallel's authenticated channel; a ZAP handler (RFC 27) in the listener's own
context admits the handshake of that one client key and nobody else's.  The engines' sockets
(``_store_client.py``, ``_metrics.py``) take the client half with :func:`connect_client`.

Example::

    keys = CurveKeys.new()
    ctx = zmq.Context(io_threads=1)           # its own: a context has one ZAP endpoint
    gate = ZapGate(ctx, keys.client_public)   # bound before the server socket exists
    server = ctx.socket(zmq.PULL)
    port = bind_server(server, keys, "10.0.0.1")
    # the listener's thread polls gate.socket beside its own and calls gate.answer()
    push = zmq.Context.instance().socket(zmq.PUSH)
    connect_client(push, f"tcp://10.0.0.1:{port}", keys.for_client())
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

import zmq
from zmq.utils import z85

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks who may connect (RFC 27)


def require_curve(what: str) -> None:
    """Raise when this pyzmq cannot speak CURVE (``what`` says what needed it)."""
    if not zmq.has("curve"):
        raise RuntimeError(f"this pyzmq's libzmq has no CURVE support, which {what} needs to "
                           "keep others out: install a pyzmq wheel")


@dataclass(frozen=True)
class CurveKeys:
    """A listener's key pair and the one client key pair it admits (Z85 text)."""

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @classmethod
    def new(cls) -> CurveKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public.decode(), server_secret.decode(), client_public.decode(),
                   client_secret.decode())

    def for_client(self) -> tuple[str, str, str]:
        """What an engine needs to connect: ``(server_public, client_public, client_secret)``."""
        return (self.server_public, self.client_public, self.client_secret)


class ZapGate:
    """The ZAP handler of one context, admitting one client key.

    It must be bound before the server socket exists: with no handler, libzmq lets every CURVE
    client in, whatever its key.  Not thread-safe (a ZeroMQ socket): the listener's thread polls
    :attr:`socket` and calls :meth:`answer`."""

    def __init__(self, ctx: zmq.Context, client_public: str) -> None:
        self._allowed = z85.decode(client_public.encode())  # ZAP hands over the raw 32 bytes
        self.socket = ctx.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)

    def answer(self) -> bool:
        """Answer one waiting request; whether it was admitted."""
        frames = self.socket.recv_multipart()
        request_id = frames[1] if len(frames) > 1 else b""
        allowed = (len(frames) >= 7 and frames[0] == b"1.0" and frames[5] == b"CURVE"
                   and hmac.compare_digest(frames[6], self._allowed))
        status = [b"200", b"OK"] if allowed else [b"400", b"unknown key"]
        self.socket.send_multipart([b"1.0", request_id, *status, b"", b""])
        return allowed


def tcp_host(host: str, sock: zmq.Socket) -> str:
    """``host`` as a ZeroMQ TCP endpoint wants it (IPv6 bracketed and switched on for ``sock``)."""
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
        return f"[{host}]"
    return host


def bind_server(sock: zmq.Socket, keys: CurveKeys, host: str) -> int:
    """Make ``sock`` a CURVE server with ``keys`` and bind it on a random port of ``host``;
    the port.  The ZAP domain makes libzmq ask the context's :class:`ZapGate` for every peer."""
    sock.curve_server = True
    sock.curve_secretkey = keys.server_secret.encode()
    sock.setsockopt(zmq.ZAP_DOMAIN, b"phalanx")
    return sock.bind_to_random_port(f"tcp://{tcp_host(host, sock)}")


def connect_client(sock: zmq.Socket, address: str, keys: tuple[str, str, str]) -> None:
    """Make ``sock`` a CURVE client with ``keys`` (see :meth:`CurveKeys.for_client`) and connect
    it to ``address`` (``tcp://host:port``)."""
    server_public, client_public, client_secret = keys
    sock.curve_serverkey = server_public.encode()
    sock.curve_publickey = client_public.encode()
    sock.curve_secretkey = client_secret.encode()
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    sock.connect(address)
