"""Engines on other "hosts": two network namespaces joined by a bridge (scenario 12 of issue 9).

The test builds the network itself (root only): a bridge ``phx-br`` with the kernel's address
10.213.0.1 and one veth pair per namespace (10.213.0.2, 10.213.0.3) - three machines on one LAN,
sharing only the file system and the process table.  The controller listens on the bridge
address; one engine runs here and one in each namespace, started by hand with
``ip netns exec`` and adopted by phalanx.  The run must use a rendezvous (TCPStore), a metric
stream and gloo sockets that every namespace can reach: nothing on loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from machine_lock import machine_wide
from test_reliability_helpers import alive, figures, listening_sockets  # noqa: F401
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BRIDGE, KERNEL_IP = "phx-br", "10.213.0.1"
NAMESPACES = {"phx-a": "10.213.0.2", "phx-b": "10.213.0.3"}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _teardown_network() -> None:
    for index, ns in enumerate(NAMESPACES):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"phx-v{index}"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _build_network() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{KERNEL_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for index, (ns, address) in enumerate(NAMESPACES.items()):
        outside, inside = f"phx-v{index}", f"phx-p{index}"
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("link", "set", outside, "master", BRIDGE)
        _ip("link", "set", outside, "up")
        for args in (("addr", "add", f"{address}/24", "dev", inside), ("link", "set", inside, "up"),
                     ("link", "set", "lo", "up")):
            _ip("netns", "exec", ns, "ip", *args)


@pytest.fixture
def namespaces():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates network namespaces and a bridge")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's `ip` command to create network namespaces")
    with machine_wide("netns"):  # fixed names and addresses: one run at a time per machine
        _teardown_network()  # leftovers of an interrupted earlier run
        try:
            _build_network()
        except subprocess.CalledProcessError as exc:
            _teardown_network()
            pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
        yield NAMESPACES
        _teardown_network()


def _start_engine(ns: str, address: str, connection_file: str, log) -> subprocess.Popen:
    env = {**os.environ, "PHALANX_SLOT": f"{ns}-0", "PHALANX_HOST": ns, "PHALANX_ADDRESS": address}
    from phalanx.cluster._heartbeat import ENGINE_ARGS
    from phalanx.cluster._supervise import command as supervised

    command = ["ip", "netns", "exec", ns, *supervised("ipyparallel.engine"),
               f"--file={connection_file}", *ENGINE_ARGS]
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


BODY = """
import socket
import torch
from phalanx import allreduce, log
from phalanx.runtime.run._engine_state import current_run
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    opt.zero_grad(); model(torch.full((2, 3), float(rank))).sum().backward(); opt.step()
    log(step_rank=float(rank))
total = allreduce(float(rank + 1), op="sum")
transport = type(current_run().collectives._pick([torch.ones(1)])).__name__
weights = model.weight.detach().clone()
handed_over = current_run().grad_sync._comm._thread is not None  # the gradient thread ran
"""


def test_engines_in_two_network_namespaces_join_one_run(namespaces, tmp_path, figures):
    from phalanx._session import Session
    from phalanx.fit import FitOptions

    session = Session()
    engines: list[subprocess.Popen] = []
    spawned: list[psutil.Process] = []
    log = open(tmp_path / "engines.log", "wb")
    try:
        session.cluster.start(n=1, gpus="none", controller_ip=KERNEL_IP)
        path = session.cluster.engine_connection_file()
        engines = [_start_engine(ns, address, path, log) for ns, address in namespaces.items()]
        started = time.monotonic()
        session.cluster.adopt([f"{ns}-0" for ns in namespaces], timeout=hang_limit(90))
        figures["12_adopt_two_namespace_engines_s"] = round(time.monotonic() - started, 2)
        spawned = [psutil.Process(p.pid) for p in engines]
        spawned += [c for p in spawned for c in p.children(recursive=True)]  # their nannies
        slots = session.cluster.slots()
        assert [s.host for s in slots][1:] == list(namespaces)
        ns: dict = {}
        started = time.monotonic()
        session.distributed_fit(BODY, FitOptions.build(returns="total,transport,weights",
                                                       widget=False, seed=1), ns)
        figures["12_first_run_three_hosts_s"] = round(time.monotonic() - started, 2)
        assert ns["total"] == 6.0  # 1 + 2 + 3: every rank took part
        assert ns["transport"] == "TorchCommunicator"  # no shared memory across hosts
        record = session.last_run()
        assert record.status == "done" and record.steps == {0: 5, 1: 5, 2: 5}
        assert {r["rank"] for r in record.history.rows()} == {0, 1, 2}  # metrics from every ns
        assert session.fits.rendezvous.tcp_store is not None  # a TCP rendezvous, not a local file
        assert session.fits.rendezvous.receiver.address.startswith(f"tcp://{KERNEL_IP}:")
        one_bucket = ns["weights"]
        # warm re-run across the namespaces, a bucket per parameter: across hosts --overlap auto
        # averages them on the gradient thread (through torch.distributed) as backward runs
        session.distributed_fit(BODY, FitOptions.build(returns="total,weights,handed_over",
                                                       widget=False, seed=1, bucket_mb=1e-5), ns)
        assert ns["total"] == 6.0 and ns["handed_over"]
        assert torch.allclose(ns["weights"], one_bucket, atol=1e-6)
        _fit_a_network_over_tls(session)
        # Here (the kernel, the controller, the local engine): loopback or the bridge address
        # only, torch's TCPStore included (it is handed a socket bound to the bridge address).
        here = [os.getpid()] + [p for pids in session.cluster.process_ids().values() for p in pids]
        sockets = listening_sockets(here)
        wide = [s for s in sockets if s[1] not in ("127.0.0.1", "::1", KERNEL_IP)]
        assert not wide, f"listening beyond loopback and the cluster's network: {wide}"
        store_port = session.fits.rendezvous.tcp_store.port
        assert (os.getpid(), KERNEL_IP, store_port) in sockets, sockets
        session.stop_cluster()  # a stopped cluster leaves nothing listening for its engines
        assert session.fits.rendezvous.tcp_store is None and session.fits.rendezvous.receiver is None
        assert not [s for s in listening_sockets([os.getpid()]) if s[2] == store_port]
    finally:
        session.close()
        _, left = psutil.wait_procs(spawned, timeout=hang_limit(15))
        for proc in left:  # never leave a process behind, even when the test failed
            proc.kill()
        for proc in engines:
            proc.wait(timeout=hang_limit(5))
        log.close()
    assert not alive(left), "engines or nannies outlived the cluster"


def _fit_a_network_over_tls(session) -> None:
    """A learning network across the namespaces: dask over TLS, each worker on its own
    address towards the scheduler, the scheduler on the kernel's."""
    import numpy as np
    from phalanx.network import machine, source
    from sklearn.linear_model import Ridge

    Xd, yd = np.arange(40.0).reshape(20, 2), np.arange(20.0) % 7
    X, y = source(Xd, name="X"), source(yd, name="y")
    ridge = machine(Ridge(), X, y, name="ridge")
    assert session.fit_network(ridge.predict(X)).actions == {"ridge": "fit"}
    np.testing.assert_allclose(ridge.fitted.coef_, Ridge().fit(Xd, yd).coef_)
    dask = session.cluster.client._phalanx_dask_client
    assert dask.scheduler.address.startswith(f"tls://{KERNEL_IP}:")
    workers = sorted(dask.scheduler_info()["workers"])
    assert [w.rsplit(":", 1)[0] for w in workers] == sorted(
        f"tls://{ip}" for ip in (KERNEL_IP, *NAMESPACES.values()))


# --- an outside peer on the hosts' network gets nothing from the kernel (issue 47) --------------
# (In this module so that it holds the machine's network lock right after the tests above, on
# the same test worker, instead of another worker idling until it is free.)  The kernel at
# 10.213.0.1, an engine here and one in ``phx-a`` - a real 2-host run - while ``phx-b`` holds no
# engine and plays a stranger on the same LAN.  During the run the stranger tries the rendezvous
# (torch's ``TCPStore`` client, a CURVE client with its own key, raw TCP, ZeroMQ without keys)
# and every other port the kernel and its controller listen on, and pushes metric batches for
# the running run with plain ZeroMQ and with a CURVE key of its own - even with the real token,
# handed over by the test as if it had leaked.  It must get nothing: no answer, no key, no value,
# nothing written, no row in the run's history; the run is unharmed and its own rows arrive.
# (The engines' gloo ports are not probed: gloo, like every torch.distributed deployment, trusts
# its network - see the README.)

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
    session.cluster.adopt([f"{ENGINE_NS}-0"], timeout=hang_limit(90))
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
        stdout, stderr = probe.communicate(timeout=hang_limit(60))
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
        _, left = psutil.wait_procs(spawned, timeout=hang_limit(15))
        for proc in left:
            proc.kill()
        if engine is not None:
            engine.wait(timeout=hang_limit(5))
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
    deadline = time.monotonic() + hang_limit(60)
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


def _wait(check, what: str, timeout: float = hang_limit(10.0)) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.1)
