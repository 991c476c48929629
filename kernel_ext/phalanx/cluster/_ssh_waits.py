"""ipyparallel's SSH wait sessions, ended with the engines they wait for.

For each SSH engine, ipyparallel keeps a thread that runs ``ssh HOST python`` over and over,
each session waiting on the host for the engine's pid for up to ``poll_seconds`` (60 s).  When
phalanx has ended the engines itself (:mod:`._ssh_exit`) it lets those threads go, but a session
already under way stays: an ``ssh`` child of the kernel for up to a minute after
``%cluster stop`` returned (seen by the test suite's leftover check: the pid it waits on may
linger, and a zombie counts as running there).

Once :func:`install` has run, every SSH command of ipyparallel's runs through a ``Popen`` that its
sender (one per launcher) remembers; :func:`end` terminates a launcher's commands still running,
and a wait ended so reads as "still running" to ipyparallel's thread, which then sees it was let
go and returns quietly.

Example (phalanx's SSH launcher)::

    install()              # before the first SSH engine starts
    ...
    end(launcher)          # its engine has exited: no ssh session of it is left
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

_RUNNING = "_phalanx_running"  # on a ShellCommandSend: the Popen objects of its commands now
_LOCK = threading.Lock()


def install() -> None:
    """Make ipyparallel's SSH commands killable (once per process)."""
    from ipyparallel.cluster import launcher, shellcmd

    sender_class, launcher_class = shellcmd.ShellCommandSend, launcher.SSHLauncher
    if getattr(sender_class._check_output, "_phalanx", False):
        return

    def _check_output(self: Any, cmd: list[str], input: str | None = None,
                      timeout: float | None = None, **kwargs: Any) -> Any:
        kwargs.setdefault("text", True)
        with subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else None,
                              stdout=subprocess.PIPE, **kwargs) as proc:
            with _LOCK:
                self.__dict__.setdefault(_RUNNING, set()).add(proc)
            try:
                out, _ = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
            finally:
                with _LOCK:
                    self.__dict__[_RUNNING].discard(proc)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd, out)
        return out

    original_wait = launcher_class.wait_one

    def wait_one(self: Any, timeout: float) -> int:
        try:
            return original_wait(self, timeout)
        except (subprocess.CalledProcessError, RuntimeError):
            stop = getattr(self, "_stop_waiting", None)
            if stop is not None and stop.is_set():
                raise TimeoutError("let go") from None  # ipyparallel's loop then returns
            raise

    _check_output._phalanx = True  # type: ignore[attr-defined]
    sender_class._check_output = _check_output
    launcher_class.wait_one = wait_one


def end(launcher: Any) -> None:
    """Terminate the launcher's SSH commands still running (its engine has exited)."""
    sender = getattr(launcher, "_ssh_sender", None)
    with _LOCK:
        procs = list(getattr(sender, "__dict__", {}).get(_RUNNING, ()))
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
