"""Private temporary directories of this kernel, gone when the kernel goes, however it goes.

A :class:`ScratchDir` is made on first use as ``$TMPDIR/phalanx-<pid>-<start>-<tag>-<random>``
(mode 0700).  It is removed by :meth:`ScratchDir.remove` (``%unload_ext``), at interpreter exit
(a kernel shutdown or restart request) and on SIGTERM (what a kernel manager sends a kernel that
is slow to stop).  A kernel killed outright (SIGKILL) can clean nothing: its cluster's watchdog
process (:mod:`phalanx.cluster._warden`) removes them, and otherwise the next phalanx session on
the machine removes every such directory whose process is gone - the pid no longer exists, is a
zombie, or belongs to a process started at another time.

Example::

    >>> scratch = ScratchDir("rdzv")
    >>> path = scratch.path               # made on first use (and again if used after remove)
    >>> os.path.isdir(path)
    True
    >>> scratch.remove(); os.path.exists(path)
    False
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import tempfile
import threading
import uuid

import psutil

_NAME = re.compile(r"^phalanx-(\d+)-(\d+)-")
# Directories to remove if SIGTERM ends the process.  A signal handler belongs to the process,
# so this set does too; it is filled only by directories that exist, never at import.
_LIVE: set[str] = set()
_PREVIOUS: list = []  # the SIGTERM handler phalanx's replaced, once installed


def _started(pid: int) -> int:
    """The process's start time in whole seconds: with the pid, it names one process for good."""
    return int(psutil.Process(pid).create_time())


class ScratchDir:
    """One private temporary directory of this process, created lazily."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._path: str | None = None
        self._lock = threading.Lock()
        _install_sigterm_cleanup()

    @property
    def path(self) -> str:
        """The directory (created, owner-only, on first access)."""
        with self._lock:
            if self._path is None or not os.path.isdir(self._path):
                pid = os.getpid()
                prefix = f"phalanx-{pid}-{_started(pid)}-{self.tag}-"
                self._path = tempfile.mkdtemp(prefix=prefix, suffix=uuid.uuid4().hex[:4])
                _LIVE.add(self._path)
                atexit.register(self.remove)
            return self._path

    def remove(self) -> None:
        """Remove the directory and everything in it (nothing happens if it was never made)."""
        with self._lock:
            if self._path is not None:
                _LIVE.discard(self._path)
                shutil.rmtree(self._path, ignore_errors=True)
                atexit.unregister(self.remove)


def reap_orphans(root: str | None = None) -> list[str]:
    """Remove the scratch directories of phalanx processes that no longer run; returns them."""
    root = root or tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    reaped = []
    for name in names:
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1)), int(match.group(2))):
            continue
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path) and os.stat(path).st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            reaped.append(path)
    return reaped


def _alive(pid: int, started: int) -> bool:
    try:
        proc = psutil.Process(pid)
        # a killed kernel stays a zombie until its parent reaps it: it is gone all the same
        return (abs(int(proc.create_time()) - started) <= 1  # rounding, not pid reuse
                and proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def _install_sigterm_cleanup() -> None:
    """On SIGTERM, remove the live scratch directories, then die as SIGTERM would have made
    us (or hand over to the handler that was there).  Only the main thread can install it."""
    if _PREVIOUS or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return
    _PREVIOUS.append(previous)
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: object) -> None:
    for path in list(_LIVE):
        shutil.rmtree(path, ignore_errors=True)
    _LIVE.clear()
    previous = _PREVIOUS[0] if _PREVIOUS else signal.SIG_DFL
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
