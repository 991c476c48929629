"""``%cluster start --launcher ssh`` against real sshd, with a network namespace as a second host.

The test builds the network (root only): a bridge ``phx-sbr`` holding the kernel's host address
10.214.0.1 and a veth into the namespace ``phx-ssh`` (10.214.0.2).  An sshd runs on each address
(the namespace's is the "second host"), with a host key and a root key the test makes; the SSH
options come from an ipyparallel profile, as a person would configure them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from IPython.core.error import UsageError

from conftest import run_cell
from machine_lock import machine_wide
from test_reliability_helpers import (alive, figures, listening_sockets, wait_for,  # noqa: F401
                                      when_rank_logged)
from test_reliability_netns import BODY
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BRIDGE, HERE, NS, THERE = "phx-sbr", "10.214.0.1", "phx-ssh", "10.214.0.2"
NOBODY = "10.214.0.9"  # on the bridge's network, but no host answers there


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _teardown_network() -> None:
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    subprocess.run(["ip", "link", "del", "phx-sv0"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _build_network() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HERE}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    _ip("netns", "add", NS)
    _ip("link", "add", "phx-sv0", "type", "veth", "peer", "name", "phx-sp0")
    _ip("link", "set", "phx-sp0", "netns", NS)
    _ip("link", "set", "phx-sv0", "master", BRIDGE)
    _ip("link", "set", "phx-sv0", "up")
    for args in (("addr", "add", f"{THERE}/24", "dev", "phx-sp0"), ("link", "set", "phx-sp0", "up"),
                 ("link", "set", "lo", "up")):
        _ip("netns", "exec", NS, "ip", *args)


def _sshd_config(folder, address: str) -> str:
    return "\n".join([
        f"ListenAddress {address}", "Port 22", f"HostKey {folder}/host_key",
        f"AuthorizedKeysFile {folder}/authorized_keys", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "StrictModes no", f"PidFile {folder}/sshd-{address}.pid", ""])


def _start_sshd(folder, address: str, prefix: list[str]) -> subprocess.Popen:
    config = folder / f"sshd-{address}.conf"
    config.write_text(_sshd_config(folder, address))
    return subprocess.Popen([*prefix, shutil.which("sshd"), "-D", "-f", str(config),
                             "-E", str(folder / f"sshd-{address}.log")])


def _listening(address: str) -> bool:
    import socket

    try:
        with socket.create_connection((address, 22), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates a network namespace and runs sshd")
    if shutil.which("ip") is None or shutil.which("sshd") is None or shutil.which("ssh") is None:
        pytest.skip("needs iproute2 and openssh (client and server): make test installs them")
    folder = tmp_path_factory.mktemp("ssh")
    with machine_wide("ssh-hosts"):  # fixed names and addresses: one run at a time per machine
        yield from _hosts(folder)


def _hosts(folder):
    _teardown_network()
    try:
        _build_network()
    except subprocess.CalledProcessError as exc:
        _teardown_network()
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation folder
    for key in ("host_key", "root_key", "stranger_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)],
                       check=True)
    shutil.copy(folder / "root_key.pub", folder / "authorized_keys")
    daemons = [_start_sshd(folder, HERE, []), _start_sshd(folder, THERE, ["ip", "netns", "exec", NS])]
    try:
        wait_for(lambda: _listening(HERE) and _listening(THERE), 30, what="sshd listening")
        yield _profile(folder)
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(timeout=hang_limit(10))
        _teardown_network()


def _profile(folder, key: str = "root_key") -> str:
    """An ipyparallel profile with the SSH options of one key (as a person would set them)."""
    profile = folder / f"profile_{key}"
    profile.mkdir()
    options = ["-i", str(folder / key), "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    (profile / "ipcluster_config.py").write_text(
        f"c.SSHEngineSetLauncher.ssh_args = {options!r}\n"
        f"c.SSHEngineSetLauncher.scp_args = {options!r}\n"
        # phalanx as this checkout has it, on every host
        f"c.SSHEngineSetLauncher.environment = {{'PYTHONPATH': {os.environ['PYTHONPATH']!r}}}\n")
    return str(profile)


@pytest.fixture
def session(no_cluster, hosts):
    return no_cluster


def _remote_engine_pids() -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "ipyparallel.engine" in " ".join(proc.info["cmdline"] or []):
            try:
                if os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                    found.append(proc.pid)
            except OSError:
                continue
    return found


def test_engines_over_ssh_on_two_hosts_train_together(session, shell, hosts, figures):
    started = time.monotonic()
    shell.run_line_magic("cluster", f"start --launcher ssh --hosts {HERE}:1,{THERE}:1 "
                                    f"--gpus none --timeout 120 --profile {hosts}")
    figures["15_ssh_start_to_ready_s"] = round(time.monotonic() - started, 2)
    slots = session.cluster.slots()
    assert sorted(s.address for s in slots) == [HERE, THERE]
    assert len({s.host for s in slots}) == 2  # the panel shows two hosts
    assert session.cluster.controller_ip == HERE  # the interface that routes to the engines
    run_cell(shell, "%%distributed_fit --return total,transport --no-widget\n" + BODY)
    assert shell.user_ns["total"] == 3.0  # both ranks took part
    assert shell.user_ns["transport"] == "TorchCommunicator"  # no shared memory across hosts
    record = session.last_run()
    assert record.status == "done" and {r["rank"] for r in record.history.rows()} == {0, 1}
    assert session.fits.rendezvous.tcp_store is not None  # a rendezvous both hosts reach
    store_port = session.fits.rendezvous.tcp_store.port
    assert [s[1] for s in listening_sockets([os.getpid()]) if s[2] == store_port] == [HERE]
    _check_protected(session)
    shell.run_line_magic("cluster", "stop")
    assert session.fits.rendezvous.tcp_store is None and session.fits.rendezvous.receiver is None
    wait_for(lambda: not _remote_engine_pids(), 30, what="engines on the second host gone")
    # The same kernel then starts a local cluster: its metrics come back on loopback, not to
    # the receiver that listened on the other cluster's network.
    session.start_cluster(n=2, gpus="none", timeout=hang_limit(120))
    try:
        run_cell(shell, "%%distributed_fit --return total --no-widget\n" + BODY)
        record = session.last_run()
        assert {r["rank"] for r in record.history.rows()} == {0, 1}, "no metric row arrived"
        assert session.fits.rendezvous.receiver.address.startswith("tcp://127.0.0.1:")
        assert session.fits.rendezvous.tcp_store is None  # one host: a private file rendezvous
    finally:
        session.stop_cluster()


def _check_protected(session) -> None:
    """Beyond loopback: CurveZMQ on, keys owner-only, metrics only from this cluster's engines."""
    import json
    import stat

    import zmq

    path = session.cluster.engine_connection_file()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as handle:
        assert json.load(handle).get("curve_serverkey")  # engines must speak CurveZMQ
    receiver = session.fits.rendezvous.receiver
    assert receiver.address.startswith(f"tcp://{HERE}:")
    rows_before = len(session.last_run().history.rows())
    stranger = zmq.Context.instance().socket(zmq.PUSH)
    stranger.setsockopt(zmq.LINGER, 1000)
    stranger.connect(receiver.address)
    for token in ("", "guess"):
        stranger.send_json({"run": session.last_run().run_id, "token": token, "rank": 0,
                            "rows": [[99, 0.0, {"step_rank": 5.0}]], "step": 99,
                            "warnings": [], "final": False})
    stranger.close()
    # Across hosts the stream is CurveZMQ: a peer without the key is refused at its handshake
    # (once per connection attempt), before any batch of it is read
    wait_for(lambda: receiver.refused >= 1, 10, what="the stranger's connection refused")
    assert len(session.last_run().history.rows()) == rows_before


def test_an_unreachable_host_fails_the_start_naming_it(session, shell, hosts):
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("cluster", f"start --launcher ssh --hosts {THERE}:1,{NOBODY}:1 "
                                        f"--gpus none --timeout 60 --profile {hosts}")
    assert f"host '{NOBODY}'" in str(caught.value)
    assert not session.cluster.running and not _remote_engine_pids()


def test_a_refused_key_fails_the_start_naming_the_host(session, shell, hosts):
    stranger = _profile(Path(hosts).parent, "stranger_key")  # a key the hosts do not know
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("cluster", f"start --launcher ssh --hosts {THERE}:1 --gpus none "
                                        f"--profile {stranger}")
    message = str(caught.value)
    assert f"host '{THERE}'" in message and "Permission denied" in message, message
    assert not session.cluster.running and not _remote_engine_pids()


def test_gpus_a_host_does_not_have_are_refused_naming_it(session, shell, hosts):
    # The second host has no GPU: asking for device 0 there is refused once its engine said
    # what it has, and the engine started there does not stay behind.
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("cluster", f"start --launcher ssh --hosts {THERE}:1 --gpus 0 "
                                        f"--timeout 120 --profile {hosts}")
    message = str(caught.value)
    assert "--gpus asks for device(s) 0 but host" in message and "has: none" in message, message
    assert not session.cluster.running
    wait_for(lambda: not _remote_engine_pids(), 60, what="the refused host's engine gone")


def test_hosts_that_cannot_be_read_are_refused(session, shell):
    with pytest.raises(UsageError, match="cannot read 'a:x' in --hosts"):
        shell.run_line_magic("cluster", "start --launcher ssh --hosts a:x --gpus none")
    assert not session.cluster.running


LONG_BODY = """
import time
from phalanx import allreduce, log
for step in range(100000):
    allreduce(float(rank))
    log(step_rank=float(rank))
    time.sleep(0.02)
"""


def test_a_host_lost_mid_run_is_named_and_the_survivor_released(session, shell, hosts, figures):
    """The second host drops off the network mid-run (its link goes down: no reset, no goodbye,
    as when a node crashes or its switch port dies).  The run ends with one error naming the
    lost rank and its host, the rank on this host is released, and the kernel keeps working."""
    from phalanx.fit import DistributedFitError

    shell.run_line_magic("cluster", f"start --launcher ssh --hosts {HERE}:1,{THERE}:1 "
                                    f"--gpus none --timeout 120 --profile {hosts}")
    lost = [s.address for s in session.cluster.slots()].index(THERE)  # slots are in rank order
    cut = when_rank_logged(session, lost, 20, lambda: _ip("link", "set", "phx-sv0", "down"),
                           timeout=hang_limit(120))
    try:
        with pytest.raises(DistributedFitError) as caught:
            run_cell(shell, "%%distributed_fit --no-widget --collective-timeout 8\n" + LONG_BODY)
        cut["thread"].join(timeout=hang_limit(5))
        assert "t" in cut, f"the link was not cut: {cut.get('error')}"
        figures["15_host_lost_to_error_s"] = round(time.time() - cut["t"], 2)
        message = str(caught.value)
        print(f"lost host reported {figures['15_host_lost_to_error_s']} s after the cut:\n{message}")
        assert f"rank {lost}" in message and THERE in message, message
        assert session.last_run().status == "failed"
        # The survivor was released: the engine on this host runs the next cell.
        survivor = next(s for s in session.cluster.slots() if s.address == HERE)
        assert survivor.state != "dead"
    finally:
        _ip("link", "set", "phx-sv0", "up")
        shell.run_line_magic("cluster", "stop")
        wait_for(lambda: not _remote_engine_pids(), 60, what="engines on the lost host gone")


# --- what %cluster says about an SSH cluster is true on its hosts (issue 47) ---------------------
# One cluster on this module's two hosts: restarting one rank replaces only its engine, on its
# host, with the old process and its nanny gone when the command returns; a killed engine is
# ``dead`` at once and a re-run says so at once; ``%cluster stop`` returns with every engine on
# every host gone; the hosts' profile holds no file more after start and stop than before.

# IPython's own skeleton of a profile it uses (the kernel's controller uses this folder too,
# since both "hosts" share the file system): folders and their README, no config, no log.
SKELETON = {os.path.join("startup", "README")}
ENGINE_FILES = ("ipython_config.py", "ipython_kernel_config.py", "ipengine")


def _files(folder: str) -> set[str]:
    return {os.path.relpath(os.path.join(root, name), folder)
            for root, _, names in os.walk(folder) for name in names}


def _with_children(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]  # the engine and its nanny


@pytest.fixture(scope="module")
def ssh_cluster(shell, hosts):  # noqa: F811
    from phalanx._session import session_for_shell

    session = session_for_shell(shell)
    session.stop_cluster()
    before = _files(hosts)
    yield session, before
    session.stop_cluster()


def test_restart_one_rank_kill_and_stop_on_two_hosts(ssh_cluster, shell, hosts, capfd):  # noqa: F811
    session, before = ssh_cluster
    shell.run_line_magic("cluster", f"start --launcher ssh --hosts {HERE}:1,{THERE}:1 "
                                    f"--gpus none --timeout 120 --profile {hosts}")
    said = "".join(capfd.readouterr())
    assert "[ProfileCreate]" not in said, said  # no profile was generated on a host
    written = _files(hosts) - before - SKELETON
    assert not [f for f in written if os.path.basename(f).startswith(ENGINE_FILES)], written
    private = session.cluster.state.launcher.remote_profile_dir()  # where the engines' files went
    assert os.path.isdir(private)
    stays, old = session.cluster.slots()

    # one rank restarts alone, on its own host; its old engine and nanny are gone on return
    old_procs = _with_children(old.pid)
    started = time.monotonic()
    shell.run_line_magic("cluster", "restart 1")
    print(f"restart 1 took {time.monotonic() - started:.1f} s")
    assert not alive(old_procs), f"still running: {alive(old_procs)}"
    kept, new = session.cluster.slots()
    assert (kept.pid, kept.engine_id) == (stays.pid, stays.engine_id)  # rank 0 untouched
    assert new.address == THERE and new.pid != old.pid and new.state == "idle"

    # a killed engine is dead at once, and a re-run says so at once, naming it
    os.kill(new.pid, signal.SIGKILL)
    wait_for(lambda: session.cluster.status()[1]["state"] == "dead", 5, interval=0.02,
             what="rank 1 shown dead")
    assert [r["state"] for r in session.status().rows] == ["idle", "dead"]  # the widget's rows
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        run_cell(shell, "%%distributed_fit --no-widget\nx = 1\n")
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "rank(s) 1 are dead" in message and "%cluster restart 1" in message, message
    assert "died during the run" not in message

    # stop returns with every engine, on both hosts, gone (and nothing left in the profile)
    remaining = [p for s in session.cluster.slots() if s.state != "dead"
                 for p in _with_children(s.pid)]
    started = time.monotonic()
    shell.run_line_magic("cluster", "stop")
    print(f"stop took {time.monotonic() - started:.1f} s")
    assert not alive(remaining), f"still running when stop returned: {alive(remaining)}"
    # but the skeleton and the cluster's own log (cluster/_engine_log.py: what its engines said,
    # kept for the person to read)
    left = _files(hosts) - before - SKELETON
    assert all(re.fullmatch(r"log/phalanx-[\w-]+\.log", f) for f in left) and len(left) <= 1, left
    assert not os.path.exists(private)
