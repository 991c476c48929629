"""Engines on other "hosts": two network namespaces joined by a bridge (scenario 12 of issue 9).

The test builds the network itself (root only): a bridge ``phx-br`` with the kernel's address
10.213.0.1 and one veth pair per namespace (10.213.0.2, 10.213.0.3) - three machines on one LAN,
sharing only the file system and the process table.  The controller listens on the bridge
address; one engine runs here and one in each namespace, started by hand with
``ip netns exec`` and adopted by phalanx.  The run must use a rendezvous (TCPStore), a metric
stream and gloo sockets that every namespace can reach: nothing on loopback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import psutil
import pytest
import torch

from machine_lock import machine_wide
from test_reliability_helpers import alive, figures, listening_sockets  # noqa: F401

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
from phalanx.runtime._state import current_run
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
        session.cluster.adopt([f"{ns}-0" for ns in namespaces], timeout=90)
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
        _, left = psutil.wait_procs(spawned, timeout=15)
        for proc in left:  # never leave a process behind, even when the test failed
            proc.kill()
        for proc in engines:
            proc.wait(timeout=5)
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
