"""What a failed run started on this engine ends with it.

A cell may start processes: DataLoader workers, a ``multiprocessing.Process``, a ``subprocess``
it waits on.  When the run ends in an error, a ``--timeout``, Stop or an interrupt, nothing is
going to wait for them any more, and they would live on beside the engine (holding memory, a GPU,
a port) until the cluster stops.  So at that point every process the engine started since the
run began (children and their children) is asked to terminate, and killed after a short grace.
A run that ends well keeps its children: the cell may have started them on purpose.

Nothing is looked at while the run goes: the cost is on the failure path only.

Example::

    started = time.time()
    try:
        exec(code, namespace)
    except BaseException:
        end_children_since(started)   # -> the pids that were ended
        raise
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("phalanx")

# multiprocessing's own servers, started at first use and shared by every later run of this
# engine (the resource tracker would unlink what it tracks when it ends): not the cell's.
_SHARED_SERVERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")

# Process start times are counted in clock ticks (10 ms): a child started right at the run's
# start may read as a little earlier.
_START_SLACK_S = 0.05


def end_children_since(started: float, grace_s: float = 2.0) -> list[int]:
    """Terminate (then kill, after ``grace_s``) this process's descendants started at or after
    ``started`` (a ``time.time()``); returns their pids."""
    import psutil

    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    since = _on_process_clock(started, psutil.boot_time()) - _START_SLACK_S
    ended = []
    for child in descendants:
        try:
            if child.create_time() >= since and not _shared_server(child):
                child.terminate()
                ended.append(child)
        except psutil.Error:  # gone already
            continue
    _, alive = psutil.wait_procs(ended, timeout=grace_s)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    if ended:
        log.info("phalanx: ended %d process(es) the failed run had started: %s", len(ended),
                 [c.pid for c in ended])
    return [c.pid for c in ended]


def _shared_server(process: Any) -> bool:
    command = " ".join(process.cmdline())
    return any(server in command for server in _SHARED_SERVERS)


def _on_process_clock(wall: float, boot_time: float) -> float:
    """``wall`` (a ``time.time()``) on the clock of process start times.  Those are the boot
    time, which the system gives in whole seconds, plus time since boot: next to ``time.time()``
    they are off by up to a second, more than a short run lasts."""
    since_boot = time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))
    return boot_time + since_boot - (time.time() - wall)
