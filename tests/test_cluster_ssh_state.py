"""What ``%cluster`` says about an SSH cluster is true on its hosts, and nothing is left there
(issue 47).

Two hosts as in :mod:`test_cluster_ssh` (real sshd, the second in a network namespace; they
share the file system and the process table, so a pid seen here is the pid on its host).  One
cluster serves the module: restarting one rank replaces only its engine, on its host, with the
old process and its nanny gone when the command returns; a killed engine is ``dead`` at once and
a re-run says so at once; ``%cluster stop`` returns with every engine on every host gone; the
hosts' profile holds no file more after start and stop than before.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from IPython.core.error import UsageError

from conftest import run_cell
from test_cluster_ssh import HERE, THERE, hosts  # noqa: F401  (the module's two hosts)
from test_reliability_helpers import alive, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

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
    assert _files(hosts) - before <= SKELETON, _files(hosts) - before
    assert not os.path.exists(private)
