"""Engines on SSH hosts that have really exited: wait on each host until their processes are gone.

Asking an engine to exit through the controller (what ``%cluster stop`` and restarts do) is
done once the controller has let it go, while the process and its nanny are still shutting down
on their host (measured: about 5 s more); ipyparallel's own SSH stop signals one pid and then
polls every minute.  So before the engines are asked, one SSH session per host runs
:data:`SCRIPT` there: it finds each engine's process and its children (the nanny), says it is
ready, waits for them to exit, ends (SIGTERM, then SIGKILL) what has not after a grace period,
and prints the pids still running (none, unless even SIGKILL failed).

Example::

    left = end_on_hosts({"gpu2": (["ssh", "gpu2", "python3", "-"], [4711])},
                        ask=lambda: client.shutdown(targets=[1]), grace=5.0)
    # {} once pid 4711 (and its nanny) exited on gpu2
"""

from __future__ import annotations

import logging
import re
import select
import subprocess
import time
from typing import Callable

log = logging.getLogger("phalanx")

# Only processes that are ipyparallel's are touched: a pid the engine reported may, in theory,
# have been reused by the time the script looks.
SCRIPT = r'''
import signal, time
import psutil
pids, grace = {pids!r}, {grace!r}
procs = []
for pid in pids:
    try:
        proc = psutil.Process(pid)
        if "ipyparallel" in " ".join(proc.cmdline()):
            procs += [proc] + proc.children(recursive=True)
    except psutil.Error:
        pass
print("__ready__", flush=True)
def running(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
def wait(procs, limit):
    deadline = time.monotonic() + limit
    while True:
        left = [p for p in procs if running(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
left = wait(procs, grace)
for sig in (signal.SIGTERM, signal.SIGKILL):
    for proc in left:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass
    left = wait(left, 2.0)
print("__left=" + ",".join(str(p.pid) for p in left) + "__", flush=True)
'''
_LEFT = re.compile(r"__left=([0-9,]*)__")
READY_S = 30.0  # an SSH login and a Python start on a loaded host


def end_on_hosts(plan: dict[str, tuple[list[str], list[int]]], ask: Callable[[], object],
                 grace: float = 5.0) -> dict[str, str]:
    """``plan``: host -> (the command that runs Python reading stdin there, engine pids).

    Starts the watch on every host, calls ``ask`` (which asks the engines to exit) once each
    has found its processes, and returns when every host has reported: host -> what is still
    running there (empty when everything exited)."""
    watches = {host: _start(command, pids, grace) for host, (command, pids) in plan.items()}
    deadline = time.monotonic() + READY_S
    for host, proc in watches.items():
        if proc is not None and not _ready(proc, deadline):
            log.warning("phalanx: the exit watch on host %s did not start", host)
    try:
        ask()
    finally:
        left = {host: _finish(proc, plan[host][1], grace) for host, proc in watches.items()}
    return {host: what for host, what in left.items() if what}


def _start(command: list[str], pids: list[int], grace: float) -> subprocess.Popen | None:
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        log.warning("phalanx: cannot run %s: %s", command[0], exc)
        return None
    assert proc.stdin is not None
    try:
        proc.stdin.write(SCRIPT.format(pids=list(pids), grace=grace))
        proc.stdin.close()
    except OSError:
        pass  # ssh already failed: _finish reports it
    return proc


def _ready(proc: subprocess.Popen, deadline: float) -> bool:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            return False  # ssh ended before the script said anything
        if "__ready__" in line:
            return True
    return False


def _finish(proc: subprocess.Popen | None, pids: list[int], grace: float) -> str:
    listed = ", ".join(map(str, pids))
    if proc is None:
        return f"pid(s) {listed} (not checked: ssh did not run)"
    assert proc.stdout is not None and proc.stderr is not None
    try:  # the script prints two short lines: no pipe fills while it runs
        proc.wait(timeout=grace + 15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return f"pid(s) {listed} (the host did not answer)"
    finally:
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    found = _LEFT.search(out or "")
    if found is None:
        said = (err or out or "").strip().splitlines()[-1:] or ["no output"]
        return f"pid(s) {listed} (not checked: {said[0]})"
    return f"pid(s) {found.group(1).replace(',', ', ')}" if found.group(1) else ""
