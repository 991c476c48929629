"""Process-level helpers of the cluster manager: counting, finding, stopping processes.

Kept apart from :mod:`._manager` (which decides *what* to start and stop) because they only
touch processes and ipyparallel's client, never the manager's state.
"""

from __future__ import annotations

import logging
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from ._errors import ClusterError
from ._locality import is_local
from ._warden import wait_processes_gone

log = logging.getLogger("phalanx")


def quiet_logger() -> logging.Logger:
    """ipyparallel logs every engine exit with its whole output; phalanx reports what matters."""
    quiet = logging.getLogger("phalanx.ipyparallel")
    quiet.setLevel(logging.ERROR)
    quiet.propagate = False
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    return quiet


def check_count(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise ClusterError(f"{what} needs a whole number of engines, got {n!r}")
    if n < 1:
        raise ClusterError(f"{what} needs at least 1 engine, got {n}; use %cluster stop to stop all")
    return n


ADOPTED = "adopted:"  # engine set id of an engine phalanx did not start


def is_adopted(slot: Any) -> bool:
    return slot.engine_set_id.startswith(ADOPTED)


def local_pids(slots: Any) -> list[int]:
    """Pids phalanx may kill: only of engines on this host (a remote pid is someone else's)."""
    return [s.pid for s in slots if s.pid and is_local(s)]


def children_of(pids: list[int]) -> list[int]:
    """Every live descendant of ``pids`` (an engine's nanny, a data loader's workers)."""
    import psutil

    out = []
    for pid in pids:
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return out


def shutdown_engines(client: Any, engine_ids: list, wait_s: float = 5.0) -> bool:
    """Ask engines to exit through the controller (phalanx cannot signal adopted or remote
    ones), and give them a moment to unregister: an engine's nanny that finds the controller
    already gone hangs.  True when every one of them has left."""
    import time

    targets = [e for e in engine_ids if e is not None and e in client.ids]
    if not targets:
        return True
    try:
        client.shutdown(targets=targets, block=False)
    except Exception as exc:
        log.warning("phalanx: asking engines %s to exit failed: %s", targets, exc)
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and set(targets) & set(client.ids):
        time.sleep(0.05)
    return not set(targets) & set(client.ids)


def find_mpiexec() -> str:
    found = shutil.which("mpiexec") or shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    if not found:
        raise ClusterError("the mpi launcher needs mpiexec, which was not found: "
                           "`pip install mpich mpi4py` provides one")
    return found


def memory_mb(pid: int | None, host: str) -> float | None:
    """Resident memory of a process on this host, in MB (``None`` for remote or gone ones)."""
    if not pid or host != socket.gethostname():
        return None
    try:
        import psutil

        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except Exception:
        return None


def wait_gone(pids: list[int], timeout: float) -> list:
    """Wait up to ``timeout`` s for ``pids`` to exit; the processes still running (zombies count
    as gone: see :func:`._warden.wait_processes_gone`)."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return wait_processes_gone(procs, timeout)


def terminate_together(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM every process of ``pids`` at once; SIGKILL those still running after ``grace``.

    ipyparallel stops engines one at a time and gives each 5 s to exit after SIGTERM, while an
    engine acts on SIGTERM only once its current task ends (right after a start, that is the
    warm-up's import of torch): stopping two engines took 3 to 8 s.  Engines on this host hold
    nothing a stop would lose (each rank's shared-memory name is unlinked at its rendezvous), so
    they are ended together and ipyparallel's own stop then finds them gone.
    """
    import signal

    import psutil

    for pid in pids:
        try:
            psutil.Process(pid).send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    kill_leftovers(pids, grace)


def kill_leftovers(pids: list[int], grace: float = 5.0) -> None:
    """Make sure engine processes are gone: ipyparallel stops them; this catches stragglers."""
    import psutil

    alive = wait_gone(pids, grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)
