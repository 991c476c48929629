"""The kernel's side of the zygote (:mod:`._zygote`): start it with a local CPU cluster, tell
engines where it is, keep it for the kernel's next cluster, stop it with the session.

Example (what :class:`~._manager.ClusterManager` does)::

    zygote = ZygoteHandle.start(idle_s=600)  # None where it cannot run: engines start fresh
    env = zygote.environment() if zygote else {}
    ...                                       # engines launched with env are forked from it
    zygote.serves(dict(os.environ))           # next cluster: still running, same imports?
    zygote.close()
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

from .._scratch import ScratchDir
from ._supervise import parent_env
from ._zygote import CONTROLLER_NAME, ENV_PID, ENV_SOCKET, NANNY_NAME, environment_mismatch

log = logging.getLogger("phalanx")

STOP_GRACE_S = 5.0
IDLE_VARIABLE = "PHALANX_FORK_SERVER_IDLE_S"
# A stopped cluster's fork server waits this long for the kernel's next cluster: a stop and start
# (to change the engine count or launcher, or after a fault) then skips the imports, and a kernel
# that is done with clusters gets the memory (about 300 MB once no engine shares it) back in
# minutes.
DEFAULT_IDLE_S = 600.0


def fork_server_idle_s() -> float:
    """How long a stopped cluster's fork server waits for the next cluster (0: it stops with
    its cluster), from ``PHALANX_FORK_SERVER_IDLE_S``; a value that is not a number of seconds
    is refused with what to write instead."""
    raw = os.environ.get(IDLE_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_IDLE_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{IDLE_VARIABLE}={raw!r} is not a number of seconds: set it to how long "
                         "a stopped cluster's fork server waits for the next cluster (0 stops it "
                         f"with the cluster; unset means {DEFAULT_IDLE_S:.0f})")
    return seconds


class ZygoteHandle:
    """One running zygote process and its private socket directory."""

    def __init__(self, proc: subprocess.Popen, path: str, scratch: ScratchDir,
                 env: dict[str, str]) -> None:
        self.proc, self.path, self._scratch, self.env = proc, path, scratch, env

    @classmethod
    def start(cls, idle_s: float | None = None) -> "ZygoteHandle | None":
        """Start a zygote that ends after ``idle_s`` seconds without engines (``None``: only
        with the kernel or :meth:`close`); ``None`` (engines then start as separate processes)
        where the platform has no ``fork``/pidfd."""
        if not hasattr(os, "fork") or not hasattr(os, "pidfd_open"):
            return None
        scratch = ScratchDir("zygote")
        path = os.path.join(scratch.path, "zygote.sock")  # any length (unix_address)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
        env = {**os.environ, **parent_env()}
        command = [sys.executable, script, path, *([repr(float(idle_s))] if idle_s else [])]
        try:
            with open(os.path.join(scratch.path, "zygote.log"), "ab") as errors:
                proc = subprocess.Popen(command, env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=errors, start_new_session=True)
        except OSError as exc:
            log.warning("phalanx: the engines' fork server did not start (%s); engines start "
                        "as separate processes", exc)
            scratch.remove()
            return None
        return cls(proc, path, scratch, env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def serves(self, env: dict[str, str]) -> bool:
        """Whether it still runs and can fork engines whose environment is ``env`` (what it
        imported read the same variables); one that ended on its own is reaped here."""
        return self.proc.poll() is None and environment_mismatch(self.env, env) is None

    def environment(self) -> dict[str, str]:
        """What an engine's environment needs to be forked from this zygote."""
        return {ENV_SOCKET: self.path, ENV_PID: str(self.proc.pid)}

    def ready(self) -> bool:
        """Whether it has imported and listens: a controller only waits for one that does."""
        return self.proc.poll() is None and os.path.exists(self.path)

    def nannies(self) -> list[int]:
        """The engines' nannies it forked that still run (:mod:`._zygote_nanny`)."""
        return [p.pid for p in self._children_named(NANNY_NAME)]

    def controller(self, since: float) -> Any:
        """The controller it forked for a stand-in started at ``since`` (a psutil process), or
        ``None``: the newest child by that name started after the stand-in."""
        found = [p for p in self._children_named(CONTROLLER_NAME)
                 if _started(p) >= since - 1e-3]
        return max(found, key=_started) if found else None

    def _children_named(self, name: str) -> list:
        import psutil

        found = []
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return []
        for child in children:
            try:
                if child.name() == name:
                    found.append(child)
            except psutil.NoSuchProcess:
                continue
        return found

    def close(self) -> None:
        """Stop the zygote (it kills the engines and nannies it forked that still run) and
        remove its folder."""
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


def _started(proc: Any) -> float:
    import psutil

    try:
        return float(proc.create_time())
    except psutil.NoSuchProcess:
        return 0.0
