"""The kernel's rendezvous store across hosts (``fit/run/_store_server.py`` and the engines' client
``runtime/run/_store_client.py``): real sockets, real gloo process groups in real processes.

* two ranks form a gloo group through it (``init_process_group``, ``new_group``, allreduce);
* a missing key times out within the timeout, with an error that says what was missing;
* a peer without the cluster's client key - another CURVE key, no CURVE, a raw TCP socket, a
  torch ``TCPStore`` client - gets no answer: it can neither read, list nor write;
* a malformed request is answered with an error and the server keeps serving;
* ``close()`` leaves no thread and nothing listening.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist
import zmq

from phalanx.fit.run._store_server import StoreServer
from phalanx.runtime.run._store_client import CurveStore
from phalanx.wire._store_protocol import encode_request
from deadlines import hang_limit

SECRET = b"the-group-address-nobody-else-may-read"


@pytest.fixture
def server():
    srv = StoreServer("127.0.0.1")
    yield srv
    srv.close()


def _client(server: StoreServer, timeout_s: float = 5.0) -> CurveStore:
    return CurveStore(*server.spec()[1:], timeout=datetime.timedelta(seconds=timeout_s))


RANK = """
import datetime, json, sys, time
import torch, torch.distributed as dist
from phalanx.runtime.run._store_client import CurveStore
rank, spec = int(sys.argv[1]), json.loads(sys.argv[2])
store = CurveStore(*spec[1:], timeout=datetime.timedelta(seconds=30))
started = time.perf_counter()
dist.init_process_group("gloo", store=dist.PrefixStore("group-1", store), rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=30))
formed = time.perf_counter() - started
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
sub = dist.new_group([0, 1])
s = torch.tensor([10.0 * (rank + 1)])
dist.all_reduce(s, group=sub)
dist.barrier()
dist.destroy_process_group()
store.close()
print(json.dumps({"total": t.item(), "sub": s.item(), "formed_s": formed}))
"""


def _ranks(spec: tuple, script: str = RANK) -> list[dict]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), json.dumps(spec)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=hang_limit(120))
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_two_ranks_form_a_gloo_group_and_a_subgroup_through_the_store(server):
    results = _ranks(server.spec())
    assert [r["total"] for r in results] == [3.0, 3.0]
    assert [r["sub"] for r in results] == [30.0, 30.0]
    print("group formed in", [round(r["formed_s"], 3) for r in results], "s")


def test_the_store_behaves_as_torchs_stores_do(server):
    store = _client(server)
    try:
        assert store.add("n", 3) == 3 and store.add("n", 2) == 5 and store.get("n") == b"5"
        assert store.compare_set("c", b"", b"x") == b"x"      # missing and nothing expected
        assert store.compare_set("c", b"y", b"z") == b"x"     # not the expected value: unchanged
        assert store.compare_set("c", b"x", b"w") == b"w"
        store.append("a", b"1")
        store.append("a", b"2")
        store.multi_set(["m1", "m2"], [b"p", b"q"])
        assert store.get("a") == b"12" and store.multi_get(["m1", "m2"]) == [b"p", b"q"]
        assert store.check(["a", "m1"]) and not store.check(["a", "nothing"])
        before = store.num_keys()
        assert store.delete_key("a") and not store.delete_key("a")
        assert store.num_keys() == before - 1
        prefixed = dist.PrefixStore("g", store)
        prefixed.set("k", "v")
        assert prefixed.get("k") == b"v" and store.get("g/k") == b"v"
        clone = store.clone()
        assert clone.get("g/k") == b"v"
        clone.close()
    finally:
        store.close()


def test_a_blocking_get_is_answered_as_soon_as_the_key_is_set(server):
    store, other = _client(server), _client(server)
    try:
        threading.Timer(0.5, lambda: other.set("late", b"here")).start()
        started = time.monotonic()
        assert store.get("late") == b"here"
        assert time.monotonic() - started < 2.0
        store.wait(["late"], datetime.timedelta(seconds=1))
    finally:
        store.close()
        other.close()


def test_a_missing_key_times_out_within_the_timeout_with_a_clear_error(server):
    store = _client(server, timeout_s=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(dist.DistStoreError, match=r"timed out after 1 s .*'rank-1-address'"):
            store.get("rank-1-address")
        assert 1.0 <= time.monotonic() - started < 2.0
        started = time.monotonic()
        with pytest.raises(dist.DistStoreError, match="timed out after 0.5 s"):
            store.wait(["a", "b"], datetime.timedelta(seconds=0.5))
        assert time.monotonic() - started < 1.5
        store.set("still", b"works")  # the client is usable after a timeout
        assert store.get("still") == b"works"
    finally:
        store.close()


def test_a_missing_rank_fails_init_process_group_within_its_timeout(server):
    script = RANK.replace("timeout=datetime.timedelta(seconds=30))\nformed",
                          "timeout=datetime.timedelta(seconds=3))\nformed")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    started = time.monotonic()
    alone = subprocess.run([sys.executable, "-c", script, "0", json.dumps(server.spec())],
                           env=env, capture_output=True, text=True, timeout=hang_limit(120))
    assert alone.returncode != 0
    assert "DistStoreError" in alone.stderr or "timed out" in alone.stderr, alone.stderr[-2000:]
    assert time.monotonic() - started < hang_limit(60)  # interpreter and torch start-up dominate


def _seed(server: StoreServer) -> None:
    store = _client(server)
    store.set("group-1/rank-0-address", SECRET)
    store.close()


def test_a_client_with_another_key_gets_no_answer_and_changes_nothing(server):
    _seed(server)
    public, secret = zmq.curve_keypair()
    host, port, server_public = server.spec()[1:4]
    stranger = CurveStore(host, port, server_public, public.decode(), secret.decode(),
                          timeout=datetime.timedelta(seconds=1))
    try:
        for attempt in (lambda: stranger.get("group-1/rank-0-address"),
                        lambda: stranger.set("group-1/rank-0-address", b"evil"),
                        stranger.num_keys):
            with pytest.raises(dist.DistStoreError, match="no answer"):
                attempt()
    finally:
        stranger.close()
    owner = _client(server)
    assert owner.get("group-1/rank-0-address") == SECRET and owner.num_keys() == 1
    owner.close()


def test_a_client_without_curve_or_with_a_raw_socket_gets_nothing(server):
    _seed(server)
    host, port = server.spec()[1:3]
    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(f"tcp://{host}:{port}")
    plain.send_multipart(encode_request(1, "get", ["group-1/rank-0-address"]))
    plain.send_multipart(encode_request(2, "num_keys", []))
    assert not plain.poll(1500), "a client without CURVE was answered"
    ctx.destroy(linger=0)
    with socket.create_connection((host, port), timeout=3) as raw:
        raw.sendall(b'{"v": 1, "id": 1, "op": "num_keys", "keys": []}\n' + bytes(range(256)) * 4)
        heard = _read_until_closed(raw, 3.0)
    # at most the ZMTP greeting that names the CURVE mechanism: no key, no value, no count
    assert SECRET not in heard and b"rank-0" not in heard and len(heard) <= 64, heard


def test_a_torch_tcpstore_client_cannot_list_or_read(server):
    _seed(server)
    host, port = server.spec()[1:3]
    started = time.monotonic()
    with pytest.raises((RuntimeError, dist.DistError)):
        client = dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=2),
                               use_libuv=True)
        try:  # torch may connect lazily: then the first request must fail
            client.list_keys()
        finally:
            del client
    assert time.monotonic() - started < hang_limit(30)
    owner = _client(server)
    assert owner.get("group-1/rank-0-address") == SECRET  # the server is unharmed
    owner.close()


def _read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(0.2)
    heard, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            break
        if not chunk:
            break
        heard += chunk
    return heard


def test_malformed_requests_are_answered_with_an_error_and_the_server_keeps_serving(server):
    host, port, server_public, client_public, client_secret = server.spec()[1:]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey, sock.curve_publickey = server_public.encode(), client_public.encode()
    sock.curve_secretkey = client_secret.encode()
    sock.connect(f"tcp://{host}:{port}")
    bad = [[b"not json"], [b'{"v": 1, "id": 5, "op": "shutdown", "keys": []}'],
           [b'{"v": 1, "id": 6, "op": "set", "keys": ["k"]}'],             # no value frame
           [b'{"v": 1, "id": 7, "op": "get", "keys": ["k"], "block_ms": 99999}'],
           [b'{"v": 1, "id": 8, "op": "add", "keys": ["k"], "n": "x"}'], [b"[1, 2]"]]
    try:
        for frames in bad:
            sock.send_multipart(frames)
            assert sock.poll(3000), f"no answer to {frames}"
            header = json.loads(sock.recv_multipart()[0])
            assert header["ok"] is False and header["error"], header
        sock.send_multipart(encode_request(9, "set", ["word"], [b"not a number"]))
        sock.recv_multipart()
        sock.send_multipart(encode_request(10, "add", ["word"], n=1))
        assert "not an integer" in json.loads(sock.recv_multipart()[0])["error"]
    finally:
        ctx.destroy(linger=0)
    store = _client(server)
    store.set("after", b"ok")
    assert store.get("after") == b"ok"
    store.close()


def test_close_stops_the_thread_and_leaves_nothing_listening():
    server = StoreServer("127.0.0.1")
    port, thread = server.port, server._thread
    server.close()
    server.close()  # idempotent
    assert not thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
