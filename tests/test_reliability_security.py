"""Security of a local cluster (scenario 11 of issue 9).

* every listening socket of the controller, its schedulers, the engines and their nannies - and
  the kernel's metric receiver and rendezvous - is on loopback;
* ipyparallel's connection files (they hold the cluster's keys) are owner-only from the moment
  they exist: the controller runs with umask 077, so not even the moment between ipyparallel's
  ``open()`` and its ``chmod()`` leaves them readable;
* a comm message from the frontend that does not fit the schema is rejected and logged, and the
  kernel keeps working (a real kernel, driven through jupyter_client);
* scale requests above the configured maximum are refused with nothing changed;
* after every feature has run in a real kernel (a foreground run, a learning network fitted on
  the cluster through dask, a data-parallel node, a panel session, a scale up and down) no
  process of the kernel or of its cluster listens beyond loopback.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
import uuid

import psutil
import pytest

from conftest import run_cell
from test_reliability_helpers import figures, listening_sockets, wait_for  # noqa: F401
from test_reliability_lifecycle import _start_kernel, execute
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOOPBACK = ("127.0.0.1", "::1")


def test_every_cluster_socket_listens_on_loopback_only(two_engines, shell):
    session = two_engines
    # A run forms the process group (gloo, shared memory) and opens the metric stream.
    run_cell(shell, "%%distributed_fit\nfrom phalanx import allreduce\nallreduce(1.0)\n")
    roles = session.cluster.process_ids()
    pids = [p for pids in roles.values() for p in pids]
    assert roles["controller"] and len(roles["engines"]) >= 4  # engines + nannies
    sockets = listening_sockets(pids)
    assert sockets, "found no listening socket at all: the check would prove nothing"
    exposed = [s for s in sockets if s[1] not in LOOPBACK]
    assert not exposed, f"listening beyond loopback: {exposed}"
    receiver = session.fits.rendezvous.receiver
    assert receiver is not None and receiver.address.startswith("tcp://127.0.0.1:")
    assert session.fits.rendezvous.tcp_store is None  # one host: the rendezvous is a private file store
    assert stat.S_IMODE(os.stat(session.fits.rendezvous.directory).st_mode) == 0o700


def test_connection_files_are_owner_only_from_the_moment_they_exist():
    from phalanx._session import Session

    security = os.path.expanduser("~/.ipython/profile_default/security")
    os.makedirs(security, exist_ok=True)
    before = set(os.listdir(security))
    seen: dict[str, set[int]] = {}
    stop = threading.Event()

    def watch():  # as fast as Python can: any moment a file is group/world readable is a leak
        while not stop.is_set():
            for name in set(os.listdir(security)) - before:
                if name.startswith("ipcontroller-"):
                    try:
                        seen.setdefault(name, set()).add(stat.S_IMODE(os.stat(os.path.join(security, name)).st_mode))
                    except FileNotFoundError:
                        pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    session = Session()
    try:
        session.start_cluster(n=1, gpus="none")
        controller = session.cluster.process_ids()["controller"][0]
        with open(f"/proc/{controller}/status") as f:
            umask = next(line.split()[1] for line in f if line.startswith("Umask:"))
    finally:
        stop.set()
        watcher.join(timeout=hang_limit(5))
        session.close()
    assert umask == "0077"
    assert len(seen) >= 2, seen  # the client and the engine connection files
    assert all(modes == {0o600} for modes in seen.values()), seen


def test_scale_above_the_maximum_is_refused_and_changes_nothing(two_engines, monkeypatch):
    from phalanx.cluster import ClusterError, ClusterManager

    session = two_engines
    ids = session.cluster.engine_ids()
    monkeypatch.setattr(session.cluster, "max_engines", 2)
    with pytest.raises(ClusterError, match="3 engines is above this cluster's limit of 2"):
        session.scale(3)
    assert session.cluster.engine_ids() == ids
    monkeypatch.setenv("PHALANX_MAX_ENGINES", "3")
    with pytest.raises(ClusterError, match="PHALANX_MAX_ENGINES"):
        ClusterManager().start(n=4, gpus="none")  # refused before any process starts


def _comm_messages(client, comm_id: str, timeout: float = hang_limit(10.0)) -> list[dict]:
    """The kernel's comm messages on ``comm_id`` that arrive within ``timeout``."""
    found = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=0.2)
        except Exception:
            if found:
                break
            continue
        if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == comm_id:
            found.append(msg["content"]["data"])
    return found


def _send_comm(client, msg_type: str, content: dict) -> None:
    client.shell_channel.send(client.session.msg(msg_type, content))


def test_invalid_panel_messages_are_rejected_and_logged_and_the_kernel_keeps_working():
    km, client = _start_kernel({"PHALANX_MAX_ENGINES": "2"})
    try:
        execute(client, """
import logging
from phalanx import get_session
from phalanx._labcomm import LabComm
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("phalanx").addHandler(Keep())
lab = LabComm(get_session())
lab.register()
""")
        comm_id = uuid.uuid4().hex
        _send_comm(client, "comm_open", {"comm_id": comm_id, "target_name": "phalanx",
                                         "data": {"v": 1, "type": "request_snapshot"}})
        snapshot = _comm_messages(client, comm_id)
        assert any(m.get("type") == "snapshot" for m in snapshot), snapshot  # the comm works
        for bad in ({"v": 1, "type": "exec", "code": "import os"}, {"v": 99, "type": "stop"},
                    {"v": 1, "type": "scale", "n": "lots"}, ["not", "an", "object"]):
            _send_comm(client, "comm_msg", {"comm_id": comm_id, "data": bad})
        _send_comm(client, "comm_msg", {"comm_id": comm_id, "data": {"v": 1, "type": "scale", "n": 3}})
        refused = _comm_messages(client, comm_id)
        assert any("at most 2" in (m.get("error") or "") for m in refused), refused
        logged = execute(client, "import json; print(json.dumps(records))")
        messages = json.loads(logged.strip().splitlines()[-1])
        assert sum("ignoring an invalid request" in m for m in messages) == 4, messages
        assert execute(client, "print(6 * 7)").strip() == "42"  # the kernel keeps working
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)



# --- every feature, then every listener of a real kernel and its cluster ---------------------------

_NETWORK = """
import numpy as np, torch, phalanx
from phalanx.network import machine, source
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

class TorchRegressor(RegressorMixin, BaseEstimator):
    def fit(self, X, y):
        X, y = torch.as_tensor(X), torch.as_tensor(y)
        self.net_ = torch.nn.Linear(X.shape[1], 1).double()
        opt = torch.optim.SGD(self.net_.parameters(), lr=0.05)
        for _ in range(5):
            opt.zero_grad(); ((self.net_(X).squeeze(1) - y) ** 2).mean().backward(); opt.step()
        return self
    def predict(self, X):
        with torch.no_grad():
            return self.net_(torch.as_tensor(X)).squeeze(1).numpy()

rng = np.random.default_rng(0)
Xd = rng.normal(size=(40, 4)); yd = Xd @ rng.normal(size=4)
X, y = source(Xd, name="X"), source(yd, name="y")
W = machine(StandardScaler(), X, name="stand").transform(X)
ridge = machine(Ridge(), W, y, name="ridge")
yhat = ridge.predict(W)
dp = machine(TorchRegressor(), W, y, name="dp", fit_runner=phalanx.data_parallel())
yhat_dp = dp.predict(W)
"""


def _listeners(pids) -> list[tuple]:
    """(pid, process name, proto, address, port) of every TCP listener and every bound,
    unconnected UDP socket of ``pids``: all the ways a process can be reached from outside."""
    wanted, found = set(pids), []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in wanted or not conn.laddr:
            continue
        tcp = conn.type == socket.SOCK_STREAM
        if (tcp and conn.status == psutil.CONN_LISTEN) or (not tcp and not conn.raddr):
            try:
                name = " ".join(psutil.Process(conn.pid).cmdline()[1:3])[:60]
            except psutil.NoSuchProcess:
                name = "?"
            found.append((conn.pid, name, "tcp" if tcp else "udp", conn.laddr.ip, conn.laddr.port))
    return found


def _kernel_tree(kernel_pid: int, client) -> list[int]:
    """The kernel, its descendants and the processes its session says make up the cluster."""
    pids = {kernel_pid} | {p.pid for p in psutil.Process(kernel_pid).children(recursive=True)}
    roles = json.loads(execute(client, "import json; from phalanx import get_session\n"
                                       "print(json.dumps(get_session().cluster.process_ids()))"
                               ).strip().splitlines()[-1])
    return sorted(pids | {p for group in roles.values() for p in group})


@pytest.mark.timeout(900)  # a kernel, a cluster, dask, a scale up and down on a loaded 2-core box
def test_nothing_listens_beyond_loopback_after_every_feature(figures):
    km, client = _start_kernel()
    seen: dict[str, list] = {}

    def audit(after: str) -> None:
        seen[after] = _listeners(_kernel_tree(km.provisioner.pid, client))

    try:
        execute(client, "%load_ext phalanx\n%cluster start -n 2 --gpus none\n")
        execute(client, "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n")
        audit("foreground run")
        execute(client, _NETWORK)
        execute(client, "%distributed_fit yhat\n")
        audit("learning network on the cluster")
        execute(client, "%distributed_fit yhat_dp\nassert phalanx.last_run().world_size == 2\n")
        audit("data-parallel node")
        comm_id = uuid.uuid4().hex
        _send_comm(client, "comm_open", {"comm_id": comm_id, "target_name": "phalanx",
                                         "data": {"v": 1, "type": "request_snapshot"}})
        assert any(m.get("type") == "snapshot" for m in _comm_messages(client, comm_id))
        _send_comm(client, "comm_msg", {"comm_id": comm_id, "data": {"v": 1, "type": "scale", "n": 3}})
        wait_for(lambda: "3" in execute(client, "print(get_session().cluster.size)"), 120,
                 interval=0.5, what="the panel's scale to 3 engines")
        audit("panel session, scale up")
        execute(client, "ridge.model.set_params(alpha=2.0)\n%distributed_fit yhat\n")
        audit("learning network on 3 engines")
        execute(client, "%cluster scale 2\n")
        audit("scale down")
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=False)
    figures["12_listeners"] = {k: [list(s) for s in v] for k, v in seen.items()}
    assert all(seen.values()), f"found no listener at all: the check would prove nothing: {seen}"
    exposed = {k: [s for s in v if s[3] not in LOOPBACK] for k, v in seen.items()}
    assert not any(exposed.values()), f"listening beyond loopback: {exposed}"
