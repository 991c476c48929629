"""Local CPU engines forked from the cluster's zygote (cluster/_zygote.py): the engines behave as
separately started ones would, every way an engine or its stand-in can end is seen as the
engine's end, and the zygote serves the kernel's next cluster, then ends with the session or
after a while without engines."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from conftest import assert_all_gone, engine_pids
from phalanx.cluster._zygote import environment_mismatch, read_at_import
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

def test_only_variables_read_at_import_must_match_the_zygotes():
    assert read_at_import("PYTHONPATH") and read_at_import("OMP_NUM_THREADS")
    assert read_at_import("TORCH_LOGS") and read_at_import("LD_PRELOAD")
    assert not read_at_import("PHALANX_SLOT") and not read_at_import("IPP_CONNECTION_INFO")
    assert not read_at_import("CUDA_VISIBLE_DEVICES") and not read_at_import("WANDB_API_KEY")
    assert environment_mismatch({"PATH": "/bin", "IPP_CLUSTER_ID": "a"},
                                {"PATH": "/usr/bin", "IPP_CLUSTER_ID": "b"}) is None
    assert environment_mismatch({"OMP_NUM_THREADS": "1"}, {}) == \
        "its environment differs in OMP_NUM_THREADS"


def test_a_nanny_no_zygote_answers_for_is_left_to_ipyparallel(tmp_path):
    """Asked of a zygote that is not there, the forked engine's nanny request says so (and
    leaves no pipe open), so that ipyparallel starts the nanny itself."""
    from phalanx.cluster._zygote_nanny import fork_nanny

    before = sorted(os.listdir("/proc/self/fd"))
    assert fork_nanny(str(tmp_path / "gone.sock"), {"engine_id": 0}) is None
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_socket_deeper_than_an_address_holds_is_still_served(tmp_path):
    """A deep TMPDIR puts the zygote's socket beyond the 107 bytes of a Unix address: it is
    bound and reached through its folder, and no descriptor is left open."""
    import socket

    from phalanx.cluster._zygote_proxy import MAX_ADDRESS, unix_address

    folder = tmp_path / ("deep" * 30)
    folder.mkdir()
    path = str(folder / "zygote.sock")
    assert len(path) > MAX_ADDRESS
    before = sorted(os.listdir("/proc/self/fd"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server, \
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as client:
        with unix_address(path) as address:
            server.bind(address)
        server.listen(1)
        assert os.path.exists(path)  # the socket is where the path says, not in /proc
        with unix_address(path) as address:
            client.connect(address)
        conn, _ = server.accept()
        with conn:
            client.send(b"fork")
            assert conn.recv(16) == b"fork"
    assert sorted(os.listdir("/proc/self/fd")) == before


def _probe(session) -> list[dict]:
    return session.cluster.view().apply_sync(_engine_info)


def _engine_info() -> dict:
    import os
    import sys

    import numpy as np

    return {"pid": os.getpid(), "ppid": os.getppid(), "slot": os.environ.get("PHALANX_SLOT"),
            "zygote_env": os.environ.get("PHALANX_ZYGOTE"), "draw": float(np.random.rand()),
            "sid": os.getsid(0), "torch": "torch" in sys.modules}


def _zygote_pid(session) -> int:
    pids = session.cluster.process_ids()["zygote"]
    assert pids, "no zygote runs beside a local CPU cluster"
    return pids[0]


def _nannies(zygote: int) -> list[psutil.Process]:
    """The engines' nannies the zygote forked (cluster/_zygote_nanny.py)."""
    return [c for c in psutil.Process(zygote).children() if c.name() == "phalanx-nanny"]


def _wait(condition, timeout: float = hang_limit(30.0), what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _total(session) -> float:
    from phalanx import allreduce
    from phalanx.fit import FitOptions

    ns = {"allreduce": allreduce}
    session.distributed_fit("total = allreduce(1.0, op='sum')",
                            FitOptions.build(returns="total", widget=False), ns)
    return ns["total"]


@pytest.mark.slow
def test_forked_engines_are_separate_engines_and_train_together(cluster_session):
    """Each engine is the zygote's child, in a session of its own, with its own slot, its own
    numpy draw and torch already imported; a run across them works as before."""
    session = cluster_session
    zygote = _zygote_pid(session)
    infos = _probe(session)
    assert [i["ppid"] for i in infos] == [zygote, zygote]
    assert [i["pid"] for i in infos] == engine_pids(session)
    assert sorted(i["slot"] for i in infos) == sorted(s.slot_id for s in session.cluster.slots())
    assert all(i["sid"] == i["pid"] for i in infos)           # own session: no shared signals
    assert all(i["zygote_env"] is None for i in infos)        # an engine asks no zygote itself
    assert all(i["torch"] for i in infos)                     # imported once, in the zygote
    assert infos[0]["draw"] != infos[1]["draw"]               # numpy reseeded after the fork
    assert _total(session) == 2.0
    # Each engine's nanny is forked too (no fresh interpreter under the engine), and relays a
    # signal sent through the controller, as phalanx's interrupts are.
    assert len(_nannies(zygote)) == 2
    assert not [c for pid in engine_pids(session) for c in psutil.Process(pid).children()]
    view = session.cluster.view()
    view.execute("import signal\n_caught = []\n"
                 "signal.signal(signal.SIGUSR2, lambda sig, frame: _caught.append(sig))", block=True)
    session.cluster.client.send_signal(signal.SIGUSR2, targets=view.targets, block=True)
    _wait(lambda: view.pull("_caught", block=True) == [[signal.SIGUSR2]] * 2,
          what="the signal relayed by each nanny")


@pytest.mark.slow
def test_a_killed_forked_engine_is_seen_dead_and_its_restart_is_forked(cluster_session):
    """SIGKILL of a forked engine ends its stand-in the same way, so the cluster marks the rank
    dead, and a restart of that rank brings back an engine forked again."""
    session = cluster_session
    victim = session.cluster.slots()[1]
    os.kill(victim.pid, signal.SIGKILL)
    _wait(lambda: session.cluster.slots()[1].state == "dead", what="the rank marked dead")
    # dead as soon as the controller lets it go; its exit code comes with the launcher's notice
    _wait(lambda: session.cluster.slots()[1].exit_code is not None, what="its exit code")
    exit_code = session.cluster.slots()[1].exit_code
    assert exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL), exit_code
    zygote = _zygote_pid(session)
    _wait(lambda: len(_nannies(zygote)) == 1, what="the killed engine's nanny gone")
    session.restart(1)
    assert [i["ppid"] for i in _probe(session)] == [zygote, zygote]
    assert len(_nannies(zygote)) == 2
    assert _total(session) == 2.0


@pytest.mark.slow
def test_a_killed_stand_in_or_zygote_takes_its_engines_and_restarts_start_fresh(no_cluster):
    """The process ipyparallel launched and the engine are one: killing either ends the other.
    A killed zygote takes its engines along (each reported dead, nothing left unaccounted);
    with the zygote gone, restarted engines start as separate processes."""
    session = no_cluster
    session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
    zygote = _zygote_pid(session)
    engines = engine_pids(session)
    stand_ins = [p for p in session.cluster.process_ids()["zygote"]
                 if p != zygote and "ipyparallel.engine" in psutil.Process(p).cmdline()]
    assert len(stand_ins) == 2 and not set(stand_ins) & set(engines)
    os.kill(stand_ins[0], signal.SIGKILL)
    _wait(lambda: sum(s.state == "dead" for s in session.cluster.slots()) == 1,
          what="the engine of the killed stand-in marked dead")
    gone = [s.pid for s in session.cluster.slots() if s.state == "dead"]
    assert_all_gone(gone, timeout=hang_limit(15))
    os.kill(zygote, signal.SIGKILL)
    # (the stand-ins are this process's children: waiting on them here would reap them before
    # ipyparallel's own wait reads their exit; their slots turning dead says they exited)
    assert_all_gone([zygote, *engines], timeout=hang_limit(15))
    _wait(lambda: all(s.state == "dead" for s in session.cluster.slots()),
          what="every engine marked dead")
    assert {s.exit_code for s in session.cluster.slots()} == {-signal.SIGKILL}
    session.restart()
    assert all(i["ppid"] not in (zygote, 1) for i in _probe(session))
    assert _total(session) == 2.0
    pids = engine_pids(session)
    session.stop_cluster()
    assert_all_gone(pids)


@pytest.mark.slow
def test_a_later_clusters_controller_is_forked_and_outlives_a_killed_zygote(no_cluster):
    """A kernel's second cluster gets its controller from the zygote kept from the first (the
    first's starts fresh, while the zygote imports).  It is the real controller, with its
    schedulers and a private umask; a killed zygote takes the engines, not the controller, so
    the restarted (fresh) engines join it; the stop ends it and its schedulers."""
    from phalanx.cluster._zygote import CONTROLLER_NAME

    session = no_cluster
    session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
    session.stop_cluster()  # the fork server is kept for the next cluster
    session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
    zygote = _zygote_pid(session)
    controller = psutil.Process(session.cluster.process_ids()["controller"][0])
    assert controller.ppid() == zygote and controller.name() == CONTROLLER_NAME
    schedulers = controller.children()
    assert schedulers
    with open(f"/proc/{controller.pid}/status") as f:
        assert next(line.split()[1] for line in f if line.startswith("Umask:")) == "0077"
    assert _total(session) == 2.0
    os.kill(zygote, signal.SIGKILL)
    _wait(lambda: all(s.state == "dead" for s in session.cluster.slots()),
          what="every forked engine marked dead")
    assert controller.is_running() and session.cluster.controller_exit is None
    session.restart()
    assert all(i["ppid"] != zygote for i in _probe(session))
    assert _total(session) == 2.0
    pids = engine_pids(session)
    session.stop_cluster()
    assert_all_gone([*pids, controller.pid, *(p.pid for p in schedulers)])


@pytest.mark.slow
def test_an_engine_the_zygote_cannot_serve_starts_fresh(no_cluster, monkeypatch):
    """A variable set in the kernel after the zygote started (imports there may have read it)
    means a new engine starts as a separate process instead."""
    session = no_cluster
    session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
    zygote = _zygote_pid(session)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # libgomp reads it when torch is imported
    session.scale(2)
    infos = _probe(session)
    assert infos[0]["ppid"] == zygote and infos[1]["ppid"] != zygote
    assert _total(session) == 2.0
    pids = engine_pids(session)
    session.stop_cluster()
    assert_all_gone(pids)


def _fork_servers() -> set[int]:
    """This process's fork servers (the shell's session here keeps one of its own)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "_zygote.py" in " ".join(child.cmdline()) and child.status() != "zombie":
                found.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.slow
def test_the_fork_server_serves_the_next_cluster_and_ends_with_the_session():
    """%cluster stop keeps the fork server (private socket, no engine) and the next start forks
    its engines from it; closing the session ends it and removes its socket."""
    from phalanx._session import Session

    before = _fork_servers()
    session = Session()
    try:
        session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
        zygote = _zygote_pid(session)
        socket_dir = os.path.dirname(session.cluster.fork_server.handle.path)
        assert oct(os.stat(socket_dir).st_mode & 0o777) == "0o700"
        others = [p for pids in session.cluster.process_ids().values() for p in pids
                  if p != zygote]
        session.stop_cluster()
        assert_all_gone(others)
        assert _fork_servers() - before == {zygote} and os.path.isdir(socket_dir)
        _wait(lambda: psutil.Process(zygote).children() == [], what="its engines reaped")

        restarted = time.monotonic()
        session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
        print(f"measured: second %cluster start {time.monotonic() - restarted:.2f} s")
        assert [i["ppid"] for i in _probe(session)] == [zygote, zygote]
        assert _total(session) == 2.0
    finally:
        session.close()
    assert_all_gone([zygote])
    assert not os.path.exists(socket_dir) and _fork_servers() == before


@pytest.mark.slow
def test_an_ended_fork_server_or_changed_variables_get_a_new_one(monkeypatch):
    """A kept fork server that ended (as after its idle time) is replaced at the next start, and
    so is one whose imports read a variable that changed since.  A value of
    PHALANX_FORK_SERVER_IDLE_S that is not a number of seconds is refused before anything
    starts."""
    from phalanx._session import Session
    from phalanx.cluster import ClusterError

    monkeypatch.setenv("PHALANX_FORK_SERVER_IDLE_S", "an hour")
    before = _fork_servers()
    session = Session()
    try:
        with pytest.raises(ClusterError, match="PHALANX_FORK_SERVER_IDLE_S='an hour' is not a"):
            session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
        assert not session.cluster.running and _fork_servers() == before
        monkeypatch.delenv("PHALANX_FORK_SERVER_IDLE_S")

        session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
        ended = _zygote_pid(session)
        session.stop_cluster()
        os.kill(ended, signal.SIGTERM)  # what its idle time does
        assert_all_gone([ended], timeout=hang_limit(15))
        session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
        first = _zygote_pid(session)
        assert first != ended and _probe(session)[0]["ppid"] == first
        session.stop_cluster()

        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # libgomp reads it when torch is imported
        session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
        second = _zygote_pid(session)
        assert second != first and _probe(session)[0]["ppid"] == second
        assert_all_gone([first])  # replaced, not left beside the new one
    finally:
        session.close()
    assert _fork_servers() == before


def test_a_fork_server_without_engines_ends_after_its_idle_time():
    """Started with an idle time and never asked for an engine, the fork server ends by itself
    once it has imported and waited that long, and removes its socket's directory."""
    from phalanx.cluster._zygote_handle import ZygoteHandle

    zygote = ZygoteHandle.start(idle_s=1.0)
    assert zygote is not None
    try:
        # (it listens for only a second: on a busy machine this test may first look after that)
        _wait(lambda: os.path.exists(zygote.path) or zygote.proc.poll() is not None,
              timeout=hang_limit(120), what="the server listening")
        _wait(lambda: zygote.proc.poll() is not None, timeout=hang_limit(30), what="the idle server ended")
        assert zygote.proc.returncode == 0 and not zygote.serves(dict(os.environ))
        assert not os.path.exists(os.path.dirname(zygote.path))
    finally:
        zygote.close()


@pytest.mark.slow
def test_the_fork_server_can_be_turned_off(no_cluster, monkeypatch):
    """PHALANX_FORK_SERVER=0: no zygote, and every engine is the process ipyparallel launched."""
    monkeypatch.setenv("PHALANX_FORK_SERVER", "0")
    session = no_cluster
    session.start_cluster(n=1, gpus="none", timeout=hang_limit(60))
    assert session.cluster.process_ids()["zygote"] == []
    assert _probe(session)[0]["ppid"] == os.getpid()
    assert _total(session) == 1.0


def test_the_zygote_refuses_a_gpu_engine_and_a_garbled_request(capsys):
    """Defence in depth behind the kernel's own routing: an engine given a GPU, or a request
    that cannot be read, gets a refusal (its proxy then starts the engine itself); the zygote
    keeps serving and, stopped, leaves nothing."""
    import json
    import socket

    from phalanx.cluster._zygote_handle import ZygoteHandle
    from phalanx.cluster._zygote_proxy import run_forked

    zygote = ZygoteHandle.start()
    assert zygote is not None
    try:
        env = {**os.environ, **zygote.environment(), "CUDA_VISIBLE_DEVICES": "0"}
        assert run_forked(["ipyparallel.engine"], environ=env) is None
        assert "it may use a GPU" in capsys.readouterr().err
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(zygote.path)
        conn.send(b"not json")
        assert "could not be read" in json.loads(conn.recv(4096))["refused"]
        conn.close()
        env["CUDA_VISIBLE_DEVICES"] = "1"
        assert run_forked(["ipyparallel.engine"], environ=env) is None
        assert zygote.proc.poll() is None
    finally:
        zygote.close()
    assert zygote.proc.poll() is not None and not os.path.exists(os.path.dirname(zygote.path))
