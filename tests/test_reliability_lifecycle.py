"""Nothing lost, nothing left running: repeated start/run/stop, and a kernel that is killed.

Scenarios 6 and 7 of issue 9.  The first drives 20 cycles through one session in this process
(the process plays the kernel) and compares what the process holds after cycle 2 and cycle 20;
every cycle's engines are forked from one fork server, which ends with the session.
The second starts a real IPython kernel (jupyter_client), starts a cluster in it, SIGKILLs the
kernel and checks that the controller, its schedulers, the engines and their nannies all go.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from phalanx.cluster._procs import wait_gone, wait_processes_gone

from conftest import assert_all_gone
from kernel_support import kernel_manager
from test_reliability_helpers import (  # noqa: F401
    alive, descendants, figures, listening_sockets, shm_segments_of)
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

CYCLES = 20
BODY = "from phalanx import allreduce\ntotal = allreduce(1.0, op='sum')\n"


def _footprint(engine_pids: set[int], fork_server: int, before: set[int]) -> dict:
    """What this process holds beyond the processes it had ``before`` (another session's kept
    fork server, in a shared test process); the fork server that serves every cycle is not
    counted (it is kept for the next cluster, and checked on its own).  Its engines are its
    children: one that exited a moment ago may wait a few milliseconds to be reaped, so
    processes get a few seconds to be gone before they count."""
    me = psutil.Process()
    children = lambda: [p for p in descendants()  # noqa: E731
                        if p.pid != fork_server and p.pid not in before]
    deadline = time.monotonic() + hang_limit(5)
    while children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"children": len(children()), "fds": me.num_fds(), "threads": me.num_threads(),
            "listening": len(listening_sockets([me.pid])), "rss_mb": me.memory_info().rss / 2**20,
            "shm_segments": len(shm_segments_of(engine_pids))}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 20 cold starts of a controller and 2 engines on a shared 2-core box
def test_twenty_start_run_stop_cycles_do_not_grow_the_kernel(figures):
    from phalanx._session import Session
    from phalanx.fit import FitOptions

    session = Session()
    marks: dict[int, dict] = {}
    engine_pids: set[int] = set()  # every cycle's: their segments must all be gone
    fork_servers: set[int] = set()
    before = {p.pid for p in descendants()}
    started = time.monotonic()
    try:
        for cycle in range(1, CYCLES + 1):
            session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
            ns: dict = {}
            session.distributed_fit(BODY, FitOptions.build(returns="total", widget=False), ns)
            assert ns["total"] == 2.0
            fork_server = session.cluster.process_ids()["zygote"][0]
            fork_servers.add(fork_server)
            pids = [p for pids in session.cluster.process_ids().values() for p in pids
                    if p != fork_server]
            engine_pids.update(pids)
            session.stop_cluster()
            assert_all_gone(pids)
            marks[cycle] = _footprint(engine_pids, fork_server, before)
            print(f"cycle {cycle}: {time.monotonic() - started:.1f} s {marks[cycle]}", flush=True)
    finally:
        session.close()
    assert len(fork_servers) == 1, "each cycle started a fork server of its own"
    assert_all_gone(fork_servers)  # ... which ends with the session
    first, last = marks[2], marks[CYCLES]  # cycle 1 pays for imports and first-use caches
    growth = {k: round(last[k] - first[k], 1) for k in first}
    figures["6_cycles"] = CYCLES
    figures["6_cycle_mean_s"] = round((time.monotonic() - started) / CYCLES, 2)
    figures["6_after_cycle_2"] = {k: round(v, 1) for k, v in first.items()}
    figures["6_growth_cycle_2_to_20"] = growth
    assert last["children"] == 0 and last["shm_segments"] == 0, last
    assert growth["fds"] <= 8 and growth["listening"] <= 1 and growth["threads"] <= 4, growth
    assert growth["rss_mb"] <= 40, growth


# --- a real kernel, killed ------------------------------------------------------------------------

def _start_kernel(extra_env: dict | None = None):
    env = {**os.environ, **(extra_env or {})}
    km = kernel_manager()
    km.start_kernel(env=env)
    client = km.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=hang_limit(60))
    return km, client


def execute(client, code: str, timeout: float = hang_limit(120)) -> str:
    """Run ``code`` in the kernel; returns its stdout; fails on an error reply."""
    out: list[str] = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = client.execute_interactive(code, timeout=timeout, output_hook=collect)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


def test_killed_kernel_leaves_no_controller_or_engine_running(figures):
    km, client = _start_kernel()
    procs: list = []
    try:
        execute(client, "%load_ext phalanx\n%cluster start -n 2 --gpus none\n")
        execute(client, "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n")
        kernel = psutil.Process(km.provisioner.pid)
        procs = kernel.children(recursive=True)
        roles = {p.pid: " ".join(p.cmdline()) for p in procs}
        assert sum("ipyparallel.controller" in r for r in roles.values()) >= 1, roles
        assert sum("ipyparallel.engine" in r for r in roles.values()) >= 2, roles
        client.stop_channels()
        killed = time.monotonic()
        kernel.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only the watchdogs can act
        left = wait_processes_gone(procs, 20)  # zombies count as gone
        gone_after = time.monotonic() - killed
        assert not alive(left), {p.pid: roles.get(p.pid) for p in left}
        figures["7_killed_kernel_processes"] = len(procs)
        figures["7_killed_kernel_all_gone_s"] = round(gone_after, 2)
    finally:
        for proc in procs:  # never leave anything behind, even when the test failed
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        km.cleanup_resources()


def test_runs_that_ship_new_data_leave_no_copy_in_the_controller(two_engines):
    import torch
    from phalanx.fit import FitOptions

    session = two_engines
    controller = [psutil.Process(pid) for pid in session.cluster.process_ids()["controller"]]
    assert controller, "no local controller process to measure"
    marks: list[float] = []
    ns: dict = {}
    for run in range(10):
        ns["X"] = torch.full((250_000, 20), float(run))  # 20 MB, new contents every run
        session.distributed_fit("total = float(X.sum())\n",
                                FitOptions.build(shard="X", returns="total", widget=False), ns)
        assert ns["total"] == run * 250_000 * 20 / 2  # rank 0's half
        marks.append(sum(p.memory_info().rss for p in controller) / 2**20)
    growth = marks[-1] - marks[1]  # the first run pays for first-use allocations
    # ipyparallel's default hub database kept every request: about 20 MB more per run
    assert growth < 60, f"the controller grew {growth:.0f} MB over 8 runs of 20 MB: {marks}"


_EXITS_RUNNING = """
import json, sys
from phalanx._session import Session
session = Session()
session.start_cluster(n=2, gpus="none")
print(json.dumps(session.cluster.process_ids()), flush=True)
"""  # and the script ends, its cluster still running


def test_a_process_that_exits_with_its_cluster_running_stops_it_quietly(tmp_path):
    """A script (or a kernel shut down) with a cluster still running: its exit stops the
    cluster through phalanx's own stop, with nothing said and nothing left.  ipyparallel's own
    exit handler raced phalanx's loop thread ("Error stopping cluster" with a traceback)."""
    script = tmp_path / "exits_running.py"
    script.write_text(_EXITS_RUNNING)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=hang_limit(180), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    roles = json.loads(done.stdout.strip().splitlines()[-1])
    pids = [pid for role in roles.values() for pid in role]
    assert len(roles.get("engines", [])) >= 2, roles  # engines and their nannies
    left = wait_gone(pids, hang_limit(10))
    assert not alive(left), alive(left)
    assert "Traceback" not in done.stderr, done.stderr
    # ipyparallel's own exit handler says this when it finds the cluster still running
    assert "Stopping cluster" not in done.stderr, done.stderr
