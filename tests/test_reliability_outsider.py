"""An outside peer on the cluster's network gets nothing from the kernel (issue 47).

The hosts are network namespaces on one bridge (``test_reliability_netns.py`` builds them): the
kernel at 10.213.0.1, an engine here and one in ``phx-a`` - a real 2-host run - while ``phx-b``
holds no engine and plays a stranger on the same LAN.  During the run the stranger tries the
rendezvous (torch's ``TCPStore`` client, a CURVE client with its own key, raw TCP, ZeroMQ
without keys) and every other port the kernel and its controller listen on, and pushes metric
batches for the running run with plain ZeroMQ and with a CURVE key of its own - even with the
real token, handed over by the test as if it had leaked.  It must get nothing: no answer, no key,
no value, nothing written, no row in the run's history (the metric port admits only its own
client key); the run is unharmed and its own rows arrive.  (The engines' gloo ports are not probed: gloo, like every torch.distributed
deployment, trusts its network - see the README.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from test_reliability_helpers import alive, figures, listening_sockets  # noqa: F401
from test_reliability_netns import BODY, KERNEL_IP, _start_engine, namespaces  # noqa: F401

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ENGINE_NS, OUTSIDER_NS = "phx-a", "phx-b"
PROBE = os.path.join(os.path.dirname(__file__), "rendezvous_probe.py")

UNTIL_FLAG = """
import os, time
from phalanx import allreduce, log
step = 0
while step < 1200:  # until the stranger is done (a minute at most)
    if allreduce(float(os.path.exists({flag!r})), op="max"):
        break
    log(step_rank=float(rank))
    time.sleep(0.05)
    step += 1
total = allreduce(float(rank + 1), op="sum")
"""


def _kernel_listeners(session) -> list[int]:
    """Ports the kernel and its controller listen on where the stranger can reach them."""
    pids = [os.getpid(), *session.cluster.process_ids()["controller"]]
    found = listening_sockets(pids)
    return sorted({port for _, ip, port in found if ip in (KERNEL_IP, "0.0.0.0", "::")})


def _two_host_session(namespaces, log):
    from phalanx._session import Session

    session = Session()
    session.cluster.start(n=1, gpus="none", controller_ip=KERNEL_IP)
    engine = _start_engine(ENGINE_NS, namespaces[ENGINE_NS], session.cluster.engine_connection_file(),
                           log)
    session.cluster.adopt([f"{ENGINE_NS}-0"], timeout=90)
    return session, engine


def test_a_stranger_on_the_network_gets_nothing_from_the_kernel(namespaces, tmp_path, figures):
    from phalanx.fit import FitOptions

    log = open(tmp_path / "engines.log", "wb")
    session, engine, spawned = None, None, []
    try:
        session, engine = _two_host_session(namespaces, log)
        spawned = [psutil.Process(engine.pid), *psutil.Process(engine.pid).children(recursive=True)]
        ns: dict = {}
        started = time.monotonic()
        session.distributed_fit(BODY, FitOptions.build(returns="total", widget=False), ns)
        figures["47_first_run_two_hosts_s"] = round(time.monotonic() - started, 2)
        assert ns["total"] == 3.0
        rendezvous = session.fits.rendezvous
        server, receiver = rendezvous.tcp_store, rendezvous.receiver
        assert server is not None and server.bind_ip == KERNEL_IP
        ports = _kernel_listeners(session)
        assert server.port in ports and int(receiver.address.rsplit(":", 1)[1]) in ports
        flag, refused, keys = str(tmp_path / "stranger-done"), receiver.refused, set(server.keys())
        assert receiver.curve and len(receiver.keys) == 3  # across hosts: the stream is CURVE
        probe = _start_probe(ports, server, receiver, flag)
        threading.Thread(target=_leak_run_and_token, args=(session, probe, receiver.token),
                         daemon=True).start()
        session.distributed_fit(UNTIL_FLAG.format(flag=flag),
                                FitOptions.build(returns="total", widget=False), ns)
        stdout, stderr = probe.communicate(timeout=120)
        assert probe.returncode == 0, stderr[-3000:]
        report = json.loads(stdout.strip().splitlines()[-1])
        figures["47_stranger_ports_probed"] = len(report["raw"])
        figures["47_stranger_most_bytes_heard"] = max(len(h) // 2 for h in report["raw"].values())
        assert ns["total"] == 3.0 and session.last_run().status == "done"  # the run is unharmed
        _check_got_nothing(report, server, receiver, ports)
        assert not {k for k in server.keys() if "outsider" in k}, "the stranger wrote a key"
        assert set(server.keys()) >= keys
        _wait(lambda: receiver.refused >= refused + report["forged"], "forging peers refused")
        rows = session.last_run().history.rows()
        assert not [r for r in rows if r["rank"] == 99], "a forged batch reached the run"
        assert {r["rank"] for r in rows} == {0, 1}  # the real rows arrived, from both hosts
        session.distributed_fit(BODY, FitOptions.build(returns="total", widget=False), ns)
        assert ns["total"] == 3.0  # the warm group still works after the probing
        store_port = server.port
        session.stop_cluster()
        assert rendezvous.tcp_store is None and not server._thread.is_alive()
        assert not [s for s in listening_sockets([os.getpid()]) if s[2] == store_port]
    finally:
        if session is not None:
            session.close()
        _, left = psutil.wait_procs(spawned, timeout=15)
        for proc in left:
            proc.kill()
        if engine is not None:
            engine.wait(timeout=5)
        log.close()
    assert not alive(left), "the engine or its nanny outlived the cluster"


def _start_probe(ports: list[int], server, receiver, flag: str) -> subprocess.Popen:
    args = {"ip": KERNEL_IP, "ports": ports, "store_port": server.port, "flag": flag,
            "metric_port": int(receiver.address.rsplit(":", 1)[1]),
            # public keys: assume the stranger has them
            "server_public": server.server_public, "metric_public": receiver.keys[0]}
    return subprocess.Popen(["ip", "netns", "exec", OUTSIDER_NS, sys.executable, PROBE,
                             json.dumps(args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _leak_run_and_token(session, probe: subprocess.Popen, token: str) -> None:
    """Hand the stranger the running run's id and the token, once the run is on."""
    deadline = time.monotonic() + 60
    while session.fits.active is None and time.monotonic() < deadline:
        time.sleep(0.05)
    run = session.fits.active.run_id if session.fits.active is not None else "none"
    try:
        probe.stdin.write(json.dumps({"run": run, "token": token}) + "\n")
        probe.stdin.flush()
    except OSError:
        pass  # the probe already ended: its report says why


def _check_got_nothing(report: dict, server, receiver, ports: list[int]) -> None:
    secrets = [server.spec()[5].encode(), server.client_public.encode(), b"rank", b"phx-",
               receiver.token.encode(), receiver.keys[2].encode()]
    for port in ports:
        heard = bytes.fromhex(report["raw"][str(port)])
        # at most a ZeroMQ greeting (64 bytes: signature, version, mechanism), never data
        assert len(heard) <= 64, (port, heard)
        assert not any(s in heard for s in secrets), (port, heard)
        assert report["zmq"][str(port)] == 0, f"port {port} answered a client without keys"
    tcpstore = report["tcpstore"]
    assert all(v.startswith("error") for k, v in tcpstore.items() if k != "connect"), tcpstore
    curve = report["curve"]
    assert all("no answer" in v for v in curve.values()), curve


def _wait(check, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.1)
