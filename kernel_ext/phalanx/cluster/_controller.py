"""Starting a cluster's controller: ipyparallel's ``Cluster``, its client, and the watchers.

The controller runs under phalanx's supervisor (:mod:`._supervise`: a private umask, a watchdog
that stops it when the kernel is gone), forked from the fork server where one is ready, and is
watched by the cluster's watchdog process (:mod:`._warden`).  Its own exit and its word that an
engine left reach the :class:`~._exit_watch.ExitWatch`.

Example (what :class:`~._manager.ClusterManager` does, on the cluster's event loop)::

    controller = ControllerStarter(state, fork_server, exits)
    state.runner.run(controller.start(profile=None), timeout=90)
    state.client   # connected
"""

from __future__ import annotations

import os
from typing import Any

from ._cluster_files import files_of
from ._engine_log import EngineLog, prune
from ._exit_watch import ExitWatch
from ._fork_server import ForkServer
from ._heartbeat import CONTROLLER_ARGS
from ._procs import quiet_logger
from ._cluster_state import ClusterState
from ._supervise import command as supervised, parent_env
from ._warden import launched_processes

# ipyparallel's hub keeps every request and result in memory by default (its DictDB, up to 1 GB),
# shipped data and returned models included: twelve runs shipping 20 MB each left the controller
# 250 MB larger (measured; 29 MB without).  phalanx never reads a task back from the hub.
NO_TASK_DATABASE = ["--nodb"]


class ControllerStarter:
    """Starts the controller of the state's launcher and connects the state's client to it."""

    def __init__(self, state: ClusterState, fork_server: ForkServer, exits: ExitWatch) -> None:
        self.state = state
        self._fork_server = fork_server
        self._exits = exits

    async def start(self, profile: str | None) -> None:
        """Start the controller (``profile``: an ipyparallel profile's name or folder) and
        connect; the state's ``warden`` must be started already."""
        state = self.state
        cluster = self._new_cluster(profile)
        # A fork server kept from the kernel's last cluster forks the controller too (a new one
        # is still importing: the controller does not wait for it).  The controller uses no GPU.
        zygote = self._fork_server.ready()
        environment = parent_env()
        if zygote is not None:
            environment.update(zygote.environment(), CUDA_VISIBLE_DEVICES="")
        state.forked_controller = None
        await cluster.start_controller(controller_cmd=supervised("ipyparallel.controller"),
                                       environment=environment)
        warden = state.warden
        assert warden is not None  # started just before the controller
        stand_in = launched_processes(cluster.controller)
        warden.watch(stand_in)
        cluster.controller.on_stop(self._exits.controller_exited)
        engine_log = state.engine_log
        if engine_log is not None:  # its own output, kept when it stops
            cluster.controller.on_stop(
                lambda data, c=cluster.controller: engine_log.keep("controller", c, data))
        state.client = await cluster.connect_client()
        # the controller's word that an engine is gone marks its rank dead at once
        state.client._registration_callbacks.append(self._exits.engine_unregistered)
        warden.remove_at_exit(files_of(cluster))
        if zygote is not None and stand_in:  # it runs by now: the client has connected to it
            state.forked_controller = zygote.controller(since=stand_in[0].create_time())
            if state.forked_controller is not None:  # the warden then knows its schedulers
                warden.watch([state.forked_controller])

    def _new_cluster(self, profile: str | None) -> Any:
        """ipyparallel's ``Cluster``, configured by the launcher (no process started yet: the
        launcher's checks run first)."""
        import ipyparallel as ipp

        state, launcher = self.state, self.state.launcher
        # no cluster file: ipyparallel's JupyterLab sidebar lists (and its server watches, logging
        # every engine's whole output at exit) the clusters whose files it finds in the profiles.
        # No stop by ipyparallel at exit: it raced phalanx's loop thread (see _exit_stop)
        kwargs: dict[str, Any] = dict(
            engines=launcher.ipyparallel_engines, delay=0, engine_timeout=int(state.timeout),
            controller_args=list(CONTROLLER_ARGS) + NO_TASK_DATABASE, shutdown_atexit=False,
            log=quiet_logger(), parent=None, cluster_file="")
        if profile and os.sep in profile:  # a profile's folder rather than its name
            kwargs["profile_dir"] = os.path.abspath(os.path.expanduser(profile))
        elif profile:
            kwargs["profile"] = profile
        state.cluster = cluster = ipp.Cluster(**kwargs)
        state.engine_log = EngineLog(cluster.profile_dir, cluster.cluster_id)
        prune(cluster.profile_dir)
        launcher.profile_config = cluster.config
        launcher.profile_dir = cluster.profile_dir
        launcher.check()  # before any process starts
        state.controller_exit = None
        state.controller_ip = cluster.controller_ip = launcher.listen_address(
            cluster.controller_ip or None)
        cluster.controller_args = list(cluster.controller_args) + launcher.controller_args(
            state.controller_ip)
        return cluster
