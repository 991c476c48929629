"""The local CPU engines' fork server, as the cluster manager keeps it across clusters.

Local CPU engines are forked from a process that imported torch once (:mod:`._zygote`): it
imports while the first controller starts, and serves the kernel's later clusters too.  GPU
engines start fresh: CUDA state must not cross a fork.  The fork server is not the cluster
watchdog's to end: it outlives ``%cluster stop`` (for ``PHALANX_FORK_SERVER_IDLE_S``, default
600 s, without engines) and ends by itself when the kernel does.

Example (what :class:`~._manager.ClusterManager` does)::

    server = ForkServer()
    server.prepare(launcher, gpu_spec, gpus, idle_s=600)  # at each start
    env = server.engine_env(device=None)                   # an engine forked from it
    server.after_cluster()                                 # at each stop (kept when idle_s > 0)
    server.close()                                         # the session's end
"""

from __future__ import annotations

import os
from typing import Any

from ._gpus import GpuSpec
from ._launchers import Launcher
from ._supervise import parent_env
from ._zygote_handle import ZygoteHandle


class ForkServer:
    """The kernel's zygote for local CPU engines (:attr:`handle`; ``None`` where none runs)."""

    def __init__(self) -> None:
        self.handle: ZygoteHandle | None = None
        self.idle_s = 0.0  # how long it outlives a stopped cluster (0: it stops with it)

    def prepare(self, launcher: Launcher, gpu_spec: GpuSpec, gpus: list[str],
                idle_s: float) -> None:
        """Have a fork server ready for a cluster about to start, where its engines may be
        forked: keep the one kept from the last cluster when it still serves, else start one."""
        self.idle_s = idle_s
        wanted = launcher.forks_engines and not (gpu_spec.mode != "none" and gpus) \
            and os.environ.get("PHALANX_FORK_SERVER") != "0"
        kept = self.handle
        if kept is not None and not (wanted and kept.serves({**os.environ, **parent_env()})):
            self.close()  # ended, turned off, or imported under other variables
        if wanted and self.handle is None:
            self.handle = ZygoteHandle.start(idle_s=idle_s)

    def ready(self) -> ZygoteHandle | None:
        """The fork server once it has imported and listens (a controller does not wait for
        one still importing), else ``None``."""
        return self.handle if self.handle is not None and self.handle.ready() else None

    def engine_env(self, device: str | None) -> dict[str, str]:
        """What makes an engine on ``device`` be forked from the fork server (CPU engines only)."""
        return self.handle.environment() if self.handle is not None and device is None else {}

    def nannies(self) -> list[int]:
        """The nannies of engines forked there that still run."""
        return self.handle.nannies() if self.handle is not None else []

    def pid(self) -> int | None:
        return self.handle.pid if self.handle is not None else None

    def controller(self, since: float) -> Any:
        """The controller it forked for a stand-in started at ``since`` (see
        :meth:`ZygoteHandle.controller`)."""
        return self.handle.controller(since) if self.handle is not None else None

    def after_cluster(self) -> None:
        """A cluster was stopped: close the fork server unless it may outlive the cluster (after
        the engines: it would kill any still running)."""
        if not self.idle_s:
            self.close()

    def close(self) -> None:
        """Stop the fork server (the session's end; ``%cluster stop`` keeps it)."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.close()
