"""Processes the tests started and left running, found after the run and named by test module.

Each pytest process (the one process of a serial run, each xdist worker) marks the environment
it hands down with its own pid (``PHALANX_TEST_OWNER``), so every process a test starts - an
engine, a controller, a kernel, a launcher's child, whatever they fork - carries the mark unless
it was given a clean environment.  After each test module (its fixtures finalised), the marked
processes still running are noted with the module; at the end of the session those still
running a grace period later are reported, with the module after which each was first seen,
and ended (SIGTERM, then SIGKILL) so that nothing outlives the test run.

The report is written to a folder shared by the workers (``PHALANX_LEFTOVERS``, named by the
first pytest process) and printed in the terminal summary by the pytest process that started
them.  A left-over process fails the session: "nothing is left running" is a promise every
feature makes, and a leak found at the end of the suite without a module's name is a leak
nobody can fix.

Example (in ``conftest.py``)::

    pytest_plugins = ["leftover_processes"]
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
from deadlines import hang_limit

MARK = "PHALANX_TEST_OWNER"
FOLDER = "PHALANX_LEFTOVERS"
GRACE_S = 15.0  # a process told to stop at a fixture's end may take a few seconds to exit

# The first pytest process names the folder (xdist's workers inherit the name); it is made only
# when there is something to report, and removed at the end by the process that named it.
_NAMED_FOLDER = FOLDER not in os.environ
if _NAMED_FOLDER:
    os.environ[FOLDER] = os.path.join(tempfile.gettempdir(),
                                      f"phalanx-test-leftovers-{os.getpid()}-{uuid.uuid4().hex[:8]}")
os.environ[MARK] = str(os.getpid())
_OWNER = os.environ[MARK]
_first_seen: dict[tuple[int, float], tuple[str, str]] = {}  # (pid, start) -> (module, command)


def _marked() -> dict[tuple[int, float], psutil.Process]:
    """The running processes that carry this pytest process's mark (itself excluded)."""
    found = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == _OWNER:
                found[(proc.pid, proc.create_time())] = proc
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or not ours to read
    return found


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:600] or proc.name()
    except (psutil.Error, OSError):
        return "?"


@pytest.fixture(scope="module", autouse=True)
def _note_leftovers_of_module(request):
    """After the module's own fixtures are finalised: note who is still running."""
    yield
    for key, proc in _marked().items():
        if key not in _first_seen:
            _first_seen[key] = (request.module.__name__, _command(proc))


@pytest.fixture(scope="session", autouse=True)
def _end_leftovers_of_session():
    """Last of all: report and end what is still running after a grace period."""
    yield
    deadline = time.monotonic() + GRACE_S
    still = _marked()
    while still and time.monotonic() < deadline:
        time.sleep(0.5)
        still = _marked()
    if not still:
        return
    lines = []
    for key, proc in still.items():
        module, command = _first_seen.get(key, ("the session's own fixtures", _command(proc)))
        lines.append(f"after {module}: pid {proc.pid}: {command}")
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(list(still.values()), timeout=hang_limit(5))
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    folder = Path(os.environ[FOLDER])
    folder.mkdir(mode=0o700, exist_ok=True)
    (folder / f"leftovers-{os.getpid()}.txt").write_text("\n".join(lines) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The pytest process that made the folder reports every worker's leftovers."""
    folder = Path(os.environ[FOLDER])
    reports = sorted(folder.glob("leftovers-*.txt")) if folder.is_dir() else []
    lines = [line for report in reports for line in report.read_text().splitlines() if line]
    if hasattr(config, "workerinput") or not lines:
        return
    terminalreporter.section("processes left running by the tests (ended now)", red=True)
    for line in lines:
        terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    """Left-over processes fail the run."""
    if hasattr(session.config, "workerinput"):
        return
    folder = Path(os.environ[FOLDER])
    if folder.is_dir() and any(folder.glob("leftovers-*.txt")) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    if _NAMED_FOLDER:
        shutil.rmtree(os.environ[FOLDER], ignore_errors=True)
