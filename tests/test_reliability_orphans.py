"""A kernel that dies hard leaves nothing of its cluster (issue 12).

A real IPython kernel (jupyter_client) starts a local cluster and is then SIGKILLed: no atexit
handler, no signal handler, nothing of the kernel runs.  The cluster's watchdog process must end
the controller (with the schedulers it forked), the engines and their nannies within seconds, even
those that cannot stop themselves (an engine stopped by SIGSTOP, the schedulers of a controller
that crashed first), remove the kernel's scratch directories and shared-memory segments, and
exit.  A normal ``%cluster stop`` leaves no watchdog running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import psutil
import pytest

from test_reliability_helpers import alive, figures, wait_for  # noqa: F401
from test_reliability_lifecycle import _start_kernel, execute
from test_reliability_helpers import shm_segments_of
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

FIT = "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n"
GONE_S = 30.0  # generous for a loaded 2-core machine; the measured time is printed and recorded


ROLES = (("_warden.py", "warden"), ("engine.nanny", "nanny"), ("phalanx-nanny", "nanny"),
         ("ipyparallel.engine", "engine"), ("ipyparallel.controller", "controller"),  # the controller's schedulers share its line
         ("phalanx-control", "controller"), ("_zygote.py", "fork server"))


def _role(proc: psutil.Process) -> str:
    try:
        line = " ".join([proc.name(), *proc.cmdline()])  # a nanny forked by the zygote: its name
        role = next((role for mark, role in ROLES if mark in line), line[:80])
        if role == "fork server" and "_zygote.py" in " ".join(proc.parent().cmdline()):
            return "forked engine"  # the zygote's command line, the zygote its parent
        return role
    except (psutil.Error, AttributeError):  # gone (a parent gone too: None)
        return "gone"


def _roles(procs) -> dict[int, str]:
    return {p.pid: _role(p) for p in procs}


@contextlib.contextmanager
def _kernel(tmp, **env: str):
    """A real kernel whose temporary files land in ``tmp`` (``env``: more of its variables);
    whatever it started is killed at the end even when the test failed (the list it yields
    collects the processes to check)."""
    km, client = _start_kernel({"TMPDIR": str(tmp), **env})
    seen: list[psutil.Process] = []
    try:
        yield km, client, seen
    finally:
        client.stop_channels()
        for proc in seen:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        km.cleanup_resources()
        with contextlib.suppress(Exception):
            km.shutdown_kernel(now=True)


def _kill_and_wait(km, procs: list, figures: dict, name: str) -> float:
    """SIGKILL the kernel; wait until the cluster's processes, then the watchdog, have exited.
    Returns when the kernel was killed (``time.monotonic``)."""
    kernel = psutil.Process(km.provisioner.pid)
    roles = _roles(procs)
    cluster = [p for p in procs if roles[p.pid] != "warden"]
    killed = time.monotonic()
    kernel.send_signal(signal.SIGKILL)
    took = {}
    for what, group in (("cluster", cluster), ("all", procs)):
        try:
            wait_for(lambda group=group: not alive(group), GONE_S, interval=0.05,
                     what=f"{what} gone")
        except AssertionError:
            raise AssertionError({pid: roles[pid] for pid in alive(procs)}) from None
        took[what] = round(time.monotonic() - killed, 2)
    print(f"{name}: {len(cluster)} cluster processes gone {took['cluster']} s after the kernel's "
          f"SIGKILL, its watchdog {took['all']} s", flush=True)
    figures[f"{name}_cluster_gone_s"] = took["cluster"]
    figures[f"{name}_watchdog_gone_s"] = took["all"]
    return killed


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _scratch_dirs(tmp, kernel_pid: int) -> list[str]:
    return [n for n in os.listdir(tmp) if n.startswith(f"phalanx-{kernel_pid}-")]


@pytest.mark.timeout(300)
def test_killed_kernel_leaves_no_process_scratch_dir_or_segment(tmp_path, figures):
    with contextlib.ExitStack() as cleanup, _kernel(tmp_path) as (km, client, seen):
        execute(client, "%load_ext phalanx\n%cluster start -n 2 --gpus none\n")
        execute(client, FIT)  # the rendezvous directory now exists
        runner = execute(client, "from phalanx import get_session\nprint(get_session().fits._id)")
        segment = f"phx_{runner.strip()}left_0"
        cleanup.callback(_unlink, f"/dev/shm/{segment}")  # even when the test fails
        # what a rank killed inside its rendezvous leaves: a segment no one unlinks
        execute(client, "get_session().cluster.view([0]).execute("
                        "'from phalanx.runtime.transport._shm_segment import Segment\\n"
                        f"leftover = Segment.create(\"/{segment}\", slot_bytes=4096)', block=True)")
        kernel_pid = km.provisioner.pid
        seen += psutil.Process(kernel_pid).children(recursive=True)
        pids = {p.pid for p in seen}
        assert _scratch_dirs(tmp_path, kernel_pid) and shm_segments_of(pids) == [segment]
        roles = sorted(_roles(seen).values())
        assert roles.count("warden") == 1 and roles.count("engine") == 2, roles
        assert roles.count("nanny") == 2 and roles.count("controller") >= 2, roles
        # forked (the socket's path in pytest's TMPDIR is about as long as a Unix address holds)
        assert roles.count("fork server") == 1 and roles.count("forked engine") == 2, roles

        # the controller's connection files (its keys) and the cluster's other files
        files = json.loads(execute(client, "import json\n"
                                           "from phalanx.cluster._cluster_files import files_of\n"
                                           "print(json.dumps(files_of(get_session().cluster.state.cluster)))"))
        assert [f for f in files if os.path.exists(f)], files
        killed = _kill_and_wait(km, seen, figures, "orphans_killed_kernel")
        wait_for(lambda: not _scratch_dirs(tmp_path, kernel_pid) and not shm_segments_of(pids),
                 GONE_S, interval=0.05, what="the kernel's scratch directory and segment removed")
        assert not [f for f in files if os.path.exists(f)], files
        figures["orphans_killed_kernel_files_gone_s"] = round(time.monotonic() - killed, 2)


@pytest.mark.timeout(300)
def test_added_stopped_engine_and_a_crashed_controllers_schedulers_end_with_the_kernel(
        tmp_path, figures):
    # Engines started as separate processes, as every launcher but the local one starts them: a
    # stopped one cannot run its own watchdog, so the kernel's warden must end it.  (A forked
    # engine dies with its fork server, which ends with the kernel: the test above.)
    with _kernel(tmp_path, PHALANX_FORK_SERVER="0") as (km, client, seen):
        execute(client, "%load_ext phalanx\n%cluster start -n 2 --gpus none\n%cluster scale 3\n")
        pids = execute(client, "from phalanx import get_session\n"
                               "print(*[s.pid for s in get_session().cluster.slots()])").split()
        added = psutil.Process(int(pids[2]))
        kernel = psutil.Process(km.provisioner.pid)
        seen += kernel.children(recursive=True)
        controller = next(p for p in kernel.children() if _role(p) == "controller")
        schedulers = controller.children()
        assert schedulers and _roles(seen)[added.pid] == "engine"
        added.send_signal(signal.SIGSTOP)  # it cannot run its own watchdog any more
        controller.kill()  # as the OOM killer would: its forked schedulers are left to init
        wait_for(lambda: all(p.ppid() != controller.pid for p in schedulers), GONE_S,
                 what="the schedulers orphaned")

        _kill_and_wait(km, seen, figures, "orphans_stopped_engine_and_schedulers")
        assert not alive([added, *schedulers])


@pytest.mark.timeout(300)
def test_cluster_stop_leaves_no_watchdog_nor_a_crashed_controllers_schedulers(no_cluster):
    session = no_cluster

    def wardens() -> list[psutil.Process]:
        return [p for p in psutil.Process().children() if _role(p) == "warden"]

    session.start_cluster(n=1, gpus="none")
    assert len(wardens()) == 1
    session.stop_cluster()
    assert wardens() == []  # stop waits for it

    session.start_cluster(n=1, gpus="none")
    controller = psutil.Process(session.cluster.process_ids()["controller"][0])
    schedulers = controller.children()
    assert schedulers
    controller.kill()  # crashed: nothing stops what it forked
    wait_for(lambda: session.cluster.controller_exit, GONE_S, what="the controller's exit noticed")
    session.stop_cluster()
    assert wardens() == [] and not alive(schedulers), _roles(schedulers)


WATCHED = ("import time\nfrom phalanx.cluster._supervise import start_watchdog\n"
           "start_watchdog()\nprint('watching', flush=True)\ntime.sleep(60)\n")


def test_a_supervised_process_ends_with_its_parent_and_not_for_a_reused_pid():
    """Every controller, engine and stand-in watches the kernel that started it: it ends once
    the kernel has ended (exit code 70), and at once where the pid it was given now names
    another process (a different start time)."""
    import subprocess
    import sys

    from phalanx.cluster._supervise import PARENT_PID, PARENT_START, _start_ticks

    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    children: list[subprocess.Popen] = []
    try:
        ticks = _start_ticks(parent.pid)
        assert ticks is not None
        for started in (ticks, ticks + 1):
            children.append(subprocess.Popen(
                [sys.executable, "-c", WATCHED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**os.environ, PARENT_PID: str(parent.pid), PARENT_START: str(started)}))
        assert children[1].wait(timeout=hang_limit(30)) == 70  # not its parent: it stops at once
        assert children[0].stdout.readline() == b"watching\n"
        assert children[0].poll() is None          # its parent runs: it waits
        parent.kill()
        parent.wait()
        assert children[0].wait(timeout=hang_limit(30)) == 70
        assert b"the kernel (pid" in children[0].stderr.read()
    finally:
        parent.kill()
        for child in children:
            child.kill()
            child.wait()
