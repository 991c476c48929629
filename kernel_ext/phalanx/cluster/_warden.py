"""One watchdog process per cluster: when its kernel is gone, nothing of the cluster is left.

Each supervised controller and engine already stops itself when the kernel dies (see
:mod:`._supervise`), but only while it can still run its own watchdog thread.  Some processes
never can: the schedulers the controller forks (they inherit no thread) outlive a controller that
the OOM killer or a crash took down, and an engine that is stopped (SIGSTOP) or wedged runs no
Python code at all.  The warden is a small process started with the cluster, in a session of its
own so that a signal sent to the kernel's process group does not reach it::

    python .../phalanx/cluster/_warden.py KERNEL_PID KERNEL_START TMPDIR

The kernel tells it on its stdin which processes it launched (``watch PID START``, kept up to date
when engines are added by scaling or restarts), which files of the cluster hold its keys or state
(``file PATH``) and ``stop`` when the cluster was stopped normally.
Every few seconds it also remembers their children (an engine's nanny, the controller's
schedulers), so that it knows them even after their parent is gone.

* the kernel gone (pidfd, or a poll where there is none): it terminates, then kills, every process
  it knows and every process still in their process groups; then it removes the cluster's files
  (the controller's connection files with their keys, which a killed controller leaves), the
  kernel's scratch directories and the shared-memory segments of the processes that died, and
  exits;
* ``stop``: it ends whatever the normal stop left behind (the orphaned schedulers of a controller
  that died earlier) and exits.

A pid is signalled only while it still names the process that was recorded (its start time is
checked), so a pid reused by an unrelated process is never touched.

Example (the kernel's side)::

    warden = Warden.start()
    warden.watch(launched_processes(cluster.controller))
    warden.close()      # the cluster was stopped: the warden exits
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import psutil

log = logging.getLogger("phalanx")

POLL_S = 0.5        # how often the kernel is checked where no pidfd can tell at once
REMEMBER_S = 5.0    # how often the children of the watched processes are looked up
GRACE_S = 2.0       # between SIGTERM and SIGKILL
_SAME_START_S = 1e-3


# --- the kernel's side ------------------------------------------------------------------------

class Warden:
    """The kernel's handle on its cluster's watchdog process (a no-op when it could not start)."""

    def __init__(self, proc: subprocess.Popen | None) -> None:
        self._proc = proc
        self._stdin = proc.stdin if proc is not None else None  # how it gets its orders
        self._lock = threading.Lock()

    @classmethod
    def start(cls) -> "Warden":
        """Start the watchdog of this process's next cluster."""
        me = psutil.Process()
        command = [sys.executable, os.path.abspath(__file__), str(me.pid),
                   repr(me.create_time()), tempfile.gettempdir()]
        try:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            log.warning("phalanx: the cluster's watchdog did not start (%s); a killed kernel "
                        "may leave processes behind", exc)
            proc = None
        return cls(proc)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def watch(self, procs: Iterable[Any]) -> None:
        """Tell the watchdog about processes this kernel launched (psutil processes)."""
        lines = []
        for proc in procs:
            try:
                lines.append(f"watch {proc.pid} {proc.create_time()!r}\n")
            except psutil.NoSuchProcess:
                continue  # already gone: nothing to watch
        self._send("".join(lines))

    def remove_at_exit(self, paths: Iterable[str]) -> None:
        """Files the watchdog removes if the kernel dies (the stop removes them otherwise)."""
        self._send("".join(f"file {path}\n" for path in paths if "\n" not in path))

    def close(self, timeout: float = 15.0) -> None:
        """The cluster was stopped: the watchdog ends what is left of it and exits."""
        if self._proc is None:
            return
        self._send("stop\n")
        with self._lock:
            try:
                if self._stdin is not None:
                    self._stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("phalanx: the cluster's watchdog did not exit; killing it")
            self._proc.kill()
            self._proc.wait()

    def _send(self, text: str) -> None:
        if self._stdin is None or not text:
            return
        with self._lock:
            try:
                self._stdin.write(text.encode())
                self._stdin.flush()
            except (OSError, ValueError) as exc:  # it died, or was closed
                log.warning("phalanx: the cluster's watchdog is gone (%s)", exc)


def launched_processes(launcher: Any) -> list:
    """The processes an ipyparallel launcher started here: a set's engines, or its one process."""
    children = getattr(launcher, "launchers", None)
    if children:
        return [p for child in children.values() for p in launched_processes(child)]
    proc = getattr(launcher, "process", None)
    return [proc] if proc is not None else []


# --- the watchdog's side ----------------------------------------------------------------------

def _same(pid: int, started: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one started at ``started`` (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - started) <= _SAME_START_S else None
    except psutil.Error:
        return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Watched:
    """The processes of one cluster: those the kernel named, their children, their groups."""

    def __init__(self) -> None:
        self.known: dict[tuple[int, float], psutil.Process] = {}
        self.groups: dict[int, float] = {}  # process group id -> its leader's start time
        self.files: list[str] = []  # removed once the processes are gone

    def add(self, proc: psutil.Process) -> None:
        try:
            key = (proc.pid, proc.create_time())
            if key not in self.known:
                self.known[key] = proc
                if os.getpgid(proc.pid) == proc.pid:  # a leader: its group is the cluster's too
                    self.groups[proc.pid] = key[1]
        except (psutil.Error, OSError):
            pass

    def remember_children(self) -> None:
        """Add the children of every watched process that runs; forget those that are gone."""
        for key, proc in list(self.known.items()):
            if not _running(proc):
                del self.known[key]
                continue
            try:
                for child in proc.children(recursive=True):
                    self.add(child)
            except psutil.Error:
                pass

    def group_members(self) -> list[psutil.Process]:
        """Processes still in a watched group; a group whose number now belongs to another
        process (its leader's pid reused) is left alone."""
        live = {pgid: started for pgid, started in self.groups.items()
                if not psutil.pid_exists(pgid) or _same(pgid, started) is not None}
        members = []
        for proc in psutil.process_iter():
            try:
                started = live.get(os.getpgid(proc.pid))
                if started is not None and proc.create_time() >= started - _SAME_START_S:
                    members.append(proc)
            except (psutil.Error, OSError):
                continue
        return members

    def end_all(self) -> int:
        """SIGTERM (with SIGCONT, so that a stopped process receives it), then SIGKILL what is
        still running after a grace period; returns how many processes there were."""
        self.remember_children()
        targets = {p.pid: p for p in [*self.known.values(), *self.group_members()]
                   if p.pid != os.getpid() and _running(p)}
        procs = list(targets.values())
        _signal(procs, signal.SIGTERM, signal.SIGCONT)
        left = wait_processes_gone(procs, GRACE_S)
        _signal(left, signal.SIGKILL)
        wait_processes_gone(left, GRACE_S)
        return len(procs)


def _signal(procs: list, *signals: int) -> None:
    for proc in procs:
        for sig in signals:
            try:
                proc.send_signal(sig)  # psutil refuses a pid that now names another process
            except psutil.Error:
                pass


def wait_processes_gone(procs: list, timeout: float) -> list:
    """Wait up to ``timeout`` s until every process has exited; the ones still running.

    A zombie counts as gone: it has exited and only waits for its parent to reap it.  That
    parent may be init, for a process whose own parent died first (an engine's nanny), and init
    may take a second or more, so this polls rather than waiting for the process to leave the
    process table.  The caller's own children among them are reaped on the way."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in procs if _running(p)]
        if not left or time.monotonic() > deadline:
            return left
        psutil.wait_procs(left, timeout=0.05)  # the pause, reaping our own children


def _remove_kernel_temp(tmp: str) -> None:
    """The dead kernel's scratch directories, and segments whose creator died (the cluster's
    engines now among them): the rules that say what is stale live with the code that made it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from phalanx._scratch import reap_orphans
    from phalanx.runtime.transport._shm_segment import cleanup_stale

    reap_orphans(tmp)
    cleanup_stale()


def _remove_files(paths: list[str]) -> None:
    for path in paths:
        try:
            os.remove(path)
        except OSError:  # gone already, or not a file: nothing to do
            pass


def _report(text: str) -> None:
    try:
        sys.stderr.write(f"phalanx: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the kernel's log may have gone with it: clean up anyway
        pass


class _Orders:
    """Lines read from the kernel, without blocking; ``closed`` once the kernel closed them."""

    def __init__(self, fd: int) -> None:
        self.fd, self.closed, self._buffer = fd, False, b""

    def read(self) -> list[str]:
        data = os.read(self.fd, 65536)
        if not data:
            self.closed = True
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [line.decode() for line in lines if line]


def _kernel_exit_fd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _obey(lines: list[str], watched: Watched) -> bool:
    """Carry out the kernel's lines; False once it said ``stop``."""
    for line in lines:
        words = line.split()
        if words == ["stop"]:
            return False
        if len(words) > 1 and words[0] == "file":
            watched.files.append(line.split(" ", 1)[1])
        elif len(words) == 3 and words[0] == "watch":
            proc = _same(int(words[1]), float(words[2]))
            if proc is not None:
                watched.add(proc)
    return True


def watch(kernel: psutil.Process | None, orders: _Orders, watched: Watched) -> bool:
    """Serve until the kernel is gone (True) or asks the watchdog to stop (False)."""
    exit_fd = _kernel_exit_fd(kernel.pid) if kernel is not None else None
    next_look = time.monotonic() + REMEMBER_S
    while kernel is not None and _running(kernel):
        fds = [fd for fd in (exit_fd, None if orders.closed else orders.fd) if fd is not None]
        ready, _, _ = select.select(fds, [], [], POLL_S)
        if orders.fd in ready and not _obey(orders.read(), watched):
            return False
        if time.monotonic() > next_look:
            watched.remember_children()
            next_look = time.monotonic() + REMEMBER_S
    # what a kernel killed in the middle of starting engines wrote last is still in the pipe
    while not orders.closed and select.select([orders.fd], [], [], 0)[0]:
        _obey(orders.read(), watched)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: python _warden.py KERNEL_PID KERNEL_START TMPDIR")
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run as a script: its folder must not shadow anything
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kernel_pid, tmp = int(argv[0]), argv[2]
    watched = Watched()
    kernel_gone = watch(_same(kernel_pid, float(argv[1])), _Orders(sys.stdin.fileno()), watched)
    ended = watched.end_all()
    if not kernel_gone:
        return 0
    _report(f"the kernel (pid {kernel_pid}) is gone; ended {ended} process(es) of its cluster")
    try:
        _remove_files(watched.files)
        _remove_kernel_temp(tmp)
    except Exception as exc:  # the processes are gone; say what could not be cleaned
        _report(f"removing the kernel's temporary files failed: {exc!r}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
