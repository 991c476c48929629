"""The kernel's side of the zygote (:mod:`._zygote`): start it with a local CPU cluster, tell
engines where it is, stop it with the cluster.

Example (what :class:`~._manager.ClusterManager` does)::

    zygote = ZygoteHandle.start()            # None where it cannot run: engines start fresh
    env = zygote.environment() if zygote else {}
    ...                                       # engines launched with env are forked from it
    zygote.close()
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import psutil

from .._scratch import ScratchDir
from ._supervise import parent_env
from ._zygote import ENV_PID, ENV_SOCKET

log = logging.getLogger("phalanx")

_MAX_SOCKET_PATH = 100  # a Unix socket's path has room for 107 bytes on Linux
STOP_GRACE_S = 5.0


class ZygoteHandle:
    """One running zygote process and its private socket directory."""

    def __init__(self, proc: subprocess.Popen, path: str, scratch: ScratchDir) -> None:
        self.proc, self.path, self._scratch = proc, path, scratch

    @classmethod
    def start(cls) -> "ZygoteHandle | None":
        """Start a zygote; ``None`` (engines then start as separate processes) where the
        platform has no ``fork``/pidfd or the socket's path would be too long."""
        if not hasattr(os, "fork") or not hasattr(os, "pidfd_open"):
            return None
        scratch = ScratchDir("zygote")
        path = os.path.join(scratch.path, "zygote.sock")
        if len(path.encode()) > _MAX_SOCKET_PATH:
            scratch.remove()
            return None
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
        try:
            with open(os.path.join(scratch.path, "zygote.log"), "ab") as errors:
                proc = subprocess.Popen([sys.executable, script, path],
                                        env={**os.environ, **parent_env()},
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=errors, start_new_session=True)
        except OSError as exc:
            log.warning("phalanx: the engines' fork server did not start (%s); engines start "
                        "as separate processes", exc)
            scratch.remove()
            return None
        return cls(proc, path, scratch)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def process(self) -> psutil.Process | None:
        """The zygote as a psutil process (for the cluster's watchdog), if it still runs."""
        try:
            return psutil.Process(self.proc.pid)
        except psutil.NoSuchProcess:
            return None

    def environment(self) -> dict[str, str]:
        """What an engine's environment needs to be forked from this zygote."""
        return {ENV_SOCKET: self.path, ENV_PID: str(self.proc.pid)}

    def close(self) -> None:
        """Stop the zygote (it kills engines it forked that still run) and remove its folder."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._scratch.remove()
