"""What a chaos run leaves behind: processes, /dev/shm segments, temp files, listening sockets
and threads (in the kernel and on the engines) beyond those there before the first fault."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

SETTLE_S = 20.0        # how long leftovers get to go away before they count as leaks


class Leftovers:
    """Counts, against a baseline taken once the cluster is warm, what the runs leave behind.

    ``session`` is the phalanx session whose cluster the runs use; ``engine_tmp`` the engines'
    private temp dir."""

    def __init__(self, session: Any, engine_tmp: str) -> None:
        self.session, self.engine_tmp = session, engine_tmp
        self.baseline: dict = {}

    def take_baseline(self) -> None:
        cluster = self.session.cluster
        procs = cluster.process_ids()
        engines = {s.pid: s.engine_id for s in cluster.slots()}
        self.baseline = {"threads": _kernel_threads(),
                         "kernel_listeners": len(_listeners([os.getpid()])),
                         "engine_threads": _engine_threads(cluster, engines),
                         "known": {p for ps in procs.values() for p in ps},
                         # what ran here before the first fault (a test session's shared
                         # JupyterLab, say) is not a run's leftover
                         "before": {p.pid for p in psutil.Process().children(recursive=True)},
                         "temp": set(_listing(self.engine_tmp))}  # e.g. torch's compile cache

    def temp_files(self) -> list[str]:
        """The engines' temp files that were not there at the baseline."""
        return [p for p in _listing(self.engine_tmp) if p not in self.baseline.get("temp", ())]

    def after_settling(self) -> list[str]:
        """What the last run left behind, after giving it ``SETTLE_S`` to go away."""
        leaks: list[str] = []
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            leaks = self.found()
            if not leaks:
                break
            time.sleep(0.5)
        return leaks

    def found(self) -> list[str]:
        """What is there now beyond the baseline."""
        base, cluster = self.baseline, self.session.cluster
        known = {p for ps in cluster.process_ids().values() for p in ps} | base.get("before", set())
        strays = [p.pid for p in psutil.Process().children(recursive=True)
                  if p.pid not in known and _running(p)]
        leaks = [f"process {p}" for p in strays]
        leaks += [f"shm {n}" for n in _shm_segments(self.session.fits._id)]
        leaks += [f"temp {p}" for p in self.temp_files()]
        threads = _kernel_threads()
        if threads > base["threads"]:
            leaks.append(f"kernel threads {threads} > {base['threads']}")
        listeners = len(_listeners([os.getpid()]))
        if listeners > base["kernel_listeners"]:
            leaks.append(f"kernel listeners {listeners} > {base['kernel_listeners']}")
        leaks += [f"listener of stray process {p}" for p in _listeners(strays)]
        engines = {s.pid: s.engine_id for s in cluster.slots() if s.state == "idle"}
        for pid, count in _engine_threads(cluster, engines).items():
            before = base["engine_threads"].setdefault(pid, count)
            if count > before:
                leaks.append(f"engine {pid} threads {count} > {before}")
        return leaks


def _kernel_threads() -> int:
    """The kernel's threads, less pyzmq's garbage collector: one per process, started the first
    time a large message is sent without a copy, and meant to live as long as the process."""
    return sum(1 for t in threading.enumerate()
               if type(t).__name__ != "GarbageCollectorThread")


def _engine_threads(cluster: Any, engines: dict) -> dict:
    counts = {}
    for pid, engine_id in engines.items():
        try:
            counts[pid] = cluster.client[engine_id].apply_sync(threading.active_count)
        except Exception:  # an engine gone meanwhile has no threads to leak
            continue
    return counts


def _listeners(pids: list[int]) -> list:
    wanted = set(pids)
    return [(c.pid, c.laddr) for c in psutil.net_connections(kind="inet")
            if c.pid in wanted and c.status == psutil.CONN_LISTEN]


def _shm_segments(runner_id: str) -> list[str]:
    try:
        return [n for n in os.listdir("/dev/shm") if runner_id in n]
    except FileNotFoundError:
        return []


def _listing(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
