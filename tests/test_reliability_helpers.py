"""Shared pieces of the reliability tests (issue 9): measured figures, fault injection helpers.

Every reliability test records what it measured (detection and release times, resource counts)
with the ``figures`` fixture; they are merged into ``test-artifacts/reliability-figures.json`` so
the numbers quoted in the issue note come from the test run itself.  Bounds asserted here are
the issue's (e.g. "errors within 10 s"), generous for a loaded 2-core machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import threading
import time
from pathlib import Path

import psutil
import pytest

from phalanx.runtime.transport._shm_segment import PREFIX, W_PID
from deadlines import hang_limit

# The header words read to find a segment's creator.
HEADER_WORDS = W_PID + 1

FIGURES = Path(__file__).resolve().parents[1] / "test-artifacts" / "reliability-figures.json"


@pytest.fixture(scope="session")
def figures():
    """A dict a test adds its measurements to (``figures["name"] = value``); saved at the end."""
    measured: dict = {}
    yield measured
    if not measured:
        return
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test workers each save their own figures into the one file: merge under a lock.
    with open(FIGURES.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            saved = json.loads(FIGURES.read_text())
        except (FileNotFoundError, ValueError):
            saved = {}
        saved.update(measured)
        FIGURES.write_text(json.dumps(saved, indent=2, sort_keys=True))


def wait_for(predicate, timeout: float, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout:g} s")


def engine_state(cluster, slot, log_lines: int = 15) -> str:
    """What a test that waited in vain on an engine prints: the process's state and signal masks
    (a signal pending, blocked or ignored shows here) and the end of its launcher's log, where
    its nanny logs each signal it relays."""
    lines = [f"engine {slot.engine_id} pid {slot.pid} slot state {slot.state!r}"]
    try:
        status = Path(f"/proc/{slot.pid}/status").read_text().splitlines()
        lines += [line for line in status if line.startswith(("State", "Threads", "Sig", "Shd"))]
        lines.append("wchan " + Path(f"/proc/{slot.pid}/wchan").read_text())
    except OSError as exc:
        lines.append(f"no /proc entry: {exc}")
    sets = getattr(getattr(getattr(cluster, "state", None), "cluster", None), "engines", {}) or {}
    engine_set = sets.get(slot.engine_set_id)
    for launcher in getattr(engine_set, "launchers", {}).values():
        output = getattr(launcher, "output_file", "")
        try:
            tail = Path(output).read_text(errors="replace").splitlines()[-log_lines:]
        except OSError as exc:
            tail = [f"not readable: {exc}"]
        lines += [f"log {output}:"] + tail
    return "\n".join(lines)


def when_rank_logged(session, rank: int, rows: int, action, timeout: float = hang_limit(60.0)):
    """Run ``action()`` in a thread once ``rank`` has logged ``rows`` rows in the active run.

    Returns a dict that receives ``t`` (wall clock of the action) and ``error`` (if any).
    """
    done: dict = {}

    def watch():
        try:
            def progressed():
                tracker = session.fits.active
                return tracker is not None and sum(
                    1 for r in tracker.history.rows() if r["rank"] == rank) >= rows
            wait_for(progressed, timeout, what=f"rank {rank} logging {rows} rows")
            done["t"] = time.time()
            action()
        except Exception as exc:  # reported by the test through done["error"]
            done["error"] = exc

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    done["thread"] = thread
    return done


def all_idle(session) -> bool:
    return all(row["state"] == "idle" for row in session.status().rows)


def listening_sockets(pids) -> list:
    """(pid, address, port) of every listening TCP socket of ``pids``."""
    wanted = set(pids)
    return [(c.pid, c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
            if c.pid in wanted and c.status == psutil.CONN_LISTEN]


def descendants(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(procs) -> list[int]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def shm_segments_of(pids: set[int]) -> list[str]:
    """phalanx's shared-memory segments created by one of ``pids`` (the creator's pid is a word of
    a segment's header): another test run's segments on the machine are not ours."""
    found = []
    for name in os.listdir("/dev/shm"):
        if not name.startswith(PREFIX):
            continue
        try:
            with open(f"/dev/shm/{name}", "rb") as f:
                header = f.read(HEADER_WORDS * 8)
        except OSError:
            continue  # unlinked meanwhile, or another user's
        if len(header) == HEADER_WORDS * 8 and struct.unpack(f"{HEADER_WORDS}q", header)[W_PID] in pids:
            found.append(name)
    return found


def write_sitecustomize(folder: Path, monkeypatch, body: str) -> None:
    """Put a sitecustomize.py first on the engines' PYTHONPATH (engines inherit os.environ)."""
    (folder / "sitecustomize.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
