"""The engines' end of the kernel's authenticated rendezvous: a torch ``Store`` over CurveZMQ.

Across hosts the process group meets in a store the kernel serves (``fit/run/_store_server.py``).
torch's ``TCPStore`` has no authentication: anyone on the network could list, read and overwrite
it.  This store speaks CurveZMQ instead: the connection is encrypted, the kernel knows this
engine by its client key and answers nobody else.  The keys come inside the run's ``GroupSpec``,
over ipyparallel's own authenticated channel.

torch accepts a Python subclass of ``torch.distributed.Store`` wherever it takes a store (its
``PythonStore`` trampoline calls these methods from C++, ``PrefixStore``, gloo and NCCL
included); the C++ names ``getNumKeys``/``deleteKey`` are what that trampoline looks up.

Example::

    store = CurveStore("10.0.0.1", 41234, server_public, client_public, client_secret,
                       timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("group-1", store), rank=r,
                            world_size=2)
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import torch.distributed as dist
import zmq

from ...wire._curve import connect_client
from ...wire._store_protocol import BLOCKING, WireError, decode_reply, encode_request

# A blocking get/wait asks the server in slices this long, releasing the socket between them:
# the one socket is shared by every thread (gloo's, the heartbeat's), and a thread parked on a key
# must not keep another from setting the key some peer waits on.
SLICE_MS = 200


class CurveStore(dist.Store):
    """A torch store kept by the kernel, reached over an encrypted, authenticated socket."""

    def __init__(self, host: str, port: int, server_public: str, client_public: str,
                 client_secret: str, timeout: datetime.timedelta = datetime.timedelta(minutes=5),
                 ) -> None:
        super().__init__()  # the pybind trampoline needs its C++ half
        self.set_timeout(timeout)
        self._endpoint = (host, port, server_public, client_public, client_secret)
        self._lock = threading.Lock()  # ZeroMQ sockets are not thread-safe
        self._next_id = 0
        self._closing = False
        self._ctx: zmq.Context | None = zmq.Context(io_threads=1)
        self._socket: zmq.Socket | None = self._connect(self._ctx)

    def _connect(self, ctx: zmq.Context) -> zmq.Socket:
        host, port, server_public, client_public, client_secret = self._endpoint
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        host = f"[{host}]" if ":" in host else host
        connect_client(sock, f"tcp://{host}:{port}", (server_public, client_public, client_secret))
        return sock

    # -- the torch.distributed.Store interface ------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        self._call("set", [key], [_bytes(value)])

    def get(self, key: str) -> bytes:
        return self._call("get", [key])[1][0]

    def add(self, key: str, value: int) -> int:
        return int(self._call("add", [key], n=int(value))[0]["n"])

    def compare_set(self, key: str, expected_value: bytes | str,
                    desired_value: bytes | str) -> bytes:
        return self._call("compare_set", [key], [_bytes(expected_value), _bytes(desired_value)])[1][0]

    def append(self, key: str, value: bytes | str) -> None:
        self._call("append", [key], [_bytes(value)])

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys))[0]["n"])

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._call("wait", list(keys), timeout=timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._call("multi_get", list(keys))[1]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._call("multi_set", list(keys), [_bytes(v) for v in values])

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the name torch's trampoline looks up
        return bool(self._call("delete_key", [key])[0]["n"])

    def getNumKeys(self) -> int:  # noqa: N802 - the name torch's trampoline looks up
        return int(self._call("num_keys", [])[0]["n"])

    def has_extended_api(self) -> bool:
        return True  # append, multi_get and multi_set are native here

    def clone(self) -> CurveStore:
        """Another client of the same store, with its own socket (torch clones a store for
        threads that must not share one)."""
        return CurveStore(*self._endpoint, timeout=self.timeout)

    def close(self) -> None:
        """Close the socket (idempotent); later calls raise ``DistStoreError``.  Never waits
        long: a thread inside a request (the kernel unreachable) closes it when it returns."""
        self._closing = True
        if self._lock.acquire(timeout=1.0):
            try:
                self._close_now()
            finally:
                self._lock.release()

    def _close_now(self) -> None:
        if self._socket is not None and self._ctx is not None:
            self._socket.close(linger=0)
            self._ctx.term()
        self._socket = self._ctx = None

    # -- one request ------------------------------------------------------------------------

    def _call(self, op: str, keys: list[str], values: list[bytes] | None = None, n: int = 0,
              timeout: datetime.timedelta | None = None) -> tuple[dict, list[bytes]]:
        """Send ``op`` and return its answer; blocking ops ask again until the deadline."""
        timeout_s = (timeout or self.timeout).total_seconds()
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            block_ms = min(SLICE_MS, remaining_ms) if op in BLOCKING else 0
            header, out = self._round_trip(op, keys, values or [], n, block_ms, deadline)
            if not header.get("pending"):
                break
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(
                    f"timed out after {timeout_s:g} s waiting for key(s) {keys} in the kernel's "
                    f"rendezvous at {self._where()} (a rank that never arrived?)")
        if "error" in header:
            raise dist.DistStoreError(f"the kernel's rendezvous refused {op}: {header['error']}")
        return header, out

    def _round_trip(self, op: str, keys: list[str], values: list[bytes], n: int, block_ms: int,
                    deadline: float) -> tuple[dict, Any]:
        with self._lock:
            if self._closing or self._socket is None:
                self._close_now()
                raise dist.DistStoreError(f"the store client of {self._where()} is closed")
            self._next_id += 1
            req_id = self._next_id
            # the server may hold a blocking request for block_ms: give it that long past the
            # deadline to answer, so a timeout is reported as one and not as silence
            wait_ms = max(0.0, deadline - time.monotonic()) * 1000 + block_ms + 1000
            self._socket.setsockopt(zmq.SNDTIMEO, int(wait_ms))
            try:
                self._socket.send_multipart(encode_request(req_id, op, keys, values, n, block_ms))
                while self._socket.poll(int(wait_ms)):
                    header, out = decode_reply(self._socket.recv_multipart())
                    if header["id"] == req_id:
                        return header, out
                    # else: the late answer to a request given up on earlier
                    wait_ms = max(0.0, deadline - time.monotonic()) * 1000 + block_ms + 1000
            except (zmq.Again, WireError):
                pass
            finally:
                if self._closing:  # close() was called meanwhile and could not wait for us
                    self._close_now()
        raise dist.DistStoreError(
            f"no answer from the kernel's rendezvous at {self._where()} to {op} by its deadline: "
            "the kernel is unreachable or gone, or this engine's key is not the cluster's")

    def _where(self) -> str:
        return f"{self._endpoint[0]}:{self._endpoint[1]}"


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
