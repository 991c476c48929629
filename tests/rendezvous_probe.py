"""An outside peer on the cluster's network: tries every port it is given and reports what it got.

Run in a network namespace that holds no engine (``test_reliability_netns.py``) as
``python rendezvous_probe.py '<json>'`` with ``{"ip", "ports", "store_port", "metric_port",
"server_public", "metric_public", "flag"}``.  It knows what anyone on the network could learn
(addresses, ports, a CURVE server's public key) and none of the cluster's secrets - except that
for the metric stream it is even handed the run id and the token (one JSON line on stdin, once the
run is on), as if the token had leaked: without the client key its batches still get nowhere.  Per port it reports the bytes a
raw TCP client heard and the messages ZeroMQ clients without the cluster's keys received; for the
rendezvous what torch's ``TCPStore`` client and a CURVE client with its own key managed.  Last it
creates ``flag`` (the run it probed during then ends) and prints one JSON line.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import zmq

JUNK = b'{"v": 1, "id": 1, "op": "num_keys", "keys": []}\n' + bytes(range(256)) * 4


def raw_tcp(ip: str, port: int, seconds: float = 2.0) -> str:
    """Hex of what a plain TCP client heard after sending junk (until closed or ``seconds``)."""
    heard = b""
    try:
        with socket.create_connection((ip, port), timeout=seconds) as sock:
            sock.sendall(JUNK)
            sock.settimeout(0.2)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(4096)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                heard += chunk
    except OSError:
        pass
    return heard.hex()


def zmq_messages(ip: str, port: int, seconds: float = 1.5) -> int:
    """Messages that ZeroMQ clients without any key (a DEALER asking, a SUB listening) got."""
    ctx = zmq.Context()
    got = 0
    try:
        dealer, sub = ctx.socket(zmq.DEALER), ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        for sock in (dealer, sub):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{ip}:{port}")
        for frames in ([b'{"v": 1, "id": 1, "op": "num_keys", "keys": []}'], [b"", b"ping"]):
            dealer.send_multipart(frames, flags=zmq.NOBLOCK)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for sock in (dealer, sub):
                if sock.poll(50):
                    sock.recv_multipart()
                    got += 1
    except zmq.ZMQError:
        pass
    finally:
        ctx.destroy(linger=0)
    return got


def tcpstore_attempts(ip: str, port: int) -> dict:
    """What torch's own store client managed: list, read, write (an error string each)."""
    import torch.distributed as dist

    out: dict = {}
    try:
        store = dist.TCPStore(ip, port, None, False, timeout=datetime.timedelta(seconds=3))
    except Exception as exc:
        return {"connect": f"error: {type(exc).__name__}"}
    out["connect"] = "connected"
    for name, call in (("list", store.list_keys), ("get", lambda: store.get("x")),
                       ("set", lambda: store.set("outsider-was-here", "1"))):
        try:
            out[name] = repr(call())
        except Exception as exc:
            out[name] = f"error: {type(exc).__name__}"
    return out


def curve_attempts(ip: str, port: int, server_public: str) -> dict:
    """A CURVE client that knows the server's public key but has its own client key."""
    from phalanx.runtime.run._store_client import CurveStore

    public, secret = zmq.curve_keypair()
    store = CurveStore(ip, port, server_public, public.decode(), secret.decode(),
                       timeout=datetime.timedelta(seconds=2))
    out = {}
    for name, call in (("num_keys", store.num_keys), ("get", lambda: store.get("x")),
                       ("set", lambda: store.set("outsider-was-here", b"1"))):
        try:
            out[name] = repr(call())
        except Exception as exc:
            out[name] = f"error: {exc}"
    store.close()
    return out


def forge_metrics(ip: str, port: int, metric_public: str, run: str, token: str) -> int:
    """Push well-formed metric batches for ``run`` - no token, a guess, the real token - from a
    plain ZeroMQ client and from a CURVE client with its own key; the peers that tried (each
    must be refused at the handshake, its batches never read)."""
    own_public, own_secret = zmq.curve_keypair()
    peers = {"plain": None, "curve": (metric_public.encode(), own_public, own_secret)}
    ctx = zmq.Context()
    for keys in peers.values():
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        if keys is not None:
            push.curve_serverkey, push.curve_publickey, push.curve_secretkey = keys
        push.connect(f"tcp://{ip}:{port}")
        for guess in ("", "guess", token):
            push.send_json({"run": run, "token": guess, "rank": 99, "step": 99, "final": False,
                            "rows": [[99, 0.0, {"forged": 1.0}]], "warnings": []})
        push.close()
    ctx.term()
    return len(peers)


def main(args: dict) -> dict:
    ip, ports = args["ip"], args["ports"]
    with ThreadPoolExecutor(max_workers=len(ports) * 2 + 2) as pool:
        raw = {p: pool.submit(raw_tcp, ip, p) for p in ports}
        zmq_got = {p: pool.submit(zmq_messages, ip, p) for p in ports}
        store = pool.submit(tcpstore_attempts, ip, args["store_port"])
        curve = pool.submit(curve_attempts, ip, args["store_port"], args["server_public"])
        leaked = json.loads(sys.stdin.readline())  # the running run's id and the token
        forged = forge_metrics(ip, args["metric_port"], args["metric_public"], leaked["run"],
                               leaked["token"])
        report = {"raw": {p: f.result() for p, f in raw.items()},
                  "zmq": {p: f.result() for p, f in zmq_got.items()},
                  "tcpstore": store.result(), "curve": curve.result(), "forged": forged}
    return report


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    code = 0
    try:
        print(json.dumps(main(arguments)))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        open(arguments["flag"], "w").close()
        sys.stdout.flush()
        sys.stderr.flush()
        # Without the exit handlers: a client the probe left half-open (a torch store client, a
        # ZeroMQ socket of a refused handshake) would make the interpreter's exit wait on it,
        # and the report is already out.
        os._exit(code)
