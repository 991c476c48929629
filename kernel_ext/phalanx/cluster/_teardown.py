"""Stopping a whole cluster: every engine on every host, the controller, and what they leave.

The stop keeps going past any error (what matters is that no process survives): it ends the
engines through their launcher, the controller through ipyparallel, then kills what is left on
this host, removes the engines' shared-memory segments and the cluster's files, and lets the
watchdog (:mod:`._warden`) end the rest.

Example (what :class:`~._manager.ClusterManager` does)::

    teardown = ClusterTeardown(state, stopper, fork_server)
    still_running = teardown.run()   # [] unless a host could not be reached
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ._cluster_files import files_of, remove_files
from ._fork_server import ForkServer
from ._mpi_segments import mpich_segments, remove_segments
from ._procs import children_of, kill_leftovers, local_pids, shutdown_engines, terminate_together
from ._ranks import RankTable
from ._cluster_state import ClusterState
from ._stopping import EngineStopper

log = logging.getLogger("phalanx")


@dataclass
class _Leaving:
    """What the stop ends, taken from the state as it begins."""

    slots: list
    pids: list[int]       # the engines' processes on this host
    nannies: list[int]    # ... and their nannies
    segments: set[str]    # the shared-memory segments the engines map
    asked: list           # engine ids asked to exit through the controller
    cluster: Any
    client: Any
    runner: Any
    warden: Any
    sets: list            # the cluster's engine sets
    files: list[str]      # files the controller's own exit leaves


class ClusterTeardown:
    """Ends the running cluster and leaves the state empty (no slots, no handles)."""

    def __init__(self, state: ClusterState, stopper: EngineStopper, fork_server: ForkServer) -> None:
        self.state = state
        self._stopper = stopper
        self._fork_server = fork_server

    def run(self) -> list[str]:
        """Stop everything; returns the engine processes still running, described (none
        unless a host could not be reached)."""
        leaving = self._take()
        running: list[str] = []
        try:
            running = self._end_processes(leaving)
        except Exception as exc:  # keep going: what matters is that no process survives
            log.warning("phalanx: stopping the cluster raised %s; killing leftovers", exc)
        finally:
            self._clean_up(leaving)
        return running

    def _take(self) -> _Leaving:
        """Mark every slot stopping and take the cluster's handles out of the state (an exit
        reported from now on is one the stop caused)."""
        state = self.state
        with state.lock:
            slots = list(state.slots.values())
            pids = local_pids(slots)
            nannies = children_of(pids) + self._fork_server.nannies()
            segments = mpich_segments(pids)  # read while the engines still map them
            asked = [s.engine_id for s in slots if state.asks_to_exit(s)]
            for slot in slots:
                slot.state = "stopping"
        cluster = state.cluster
        leaving = _Leaving(slots, pids, nannies, segments, asked, cluster, state.client,
                           state.runner, state.warden,
                           sets=list(cluster.engines.values()) if cluster is not None else [],
                           files=files_of(cluster) if cluster is not None else [])
        state.cluster = state.client = state.runner = state.warden = None
        state.forked_controller = None
        return leaving

    def _end_processes(self, leaving: _Leaving) -> list[str]:
        """Have the engines and the controller exit the way their launcher wants."""
        launcher, cluster, client = self.state.launcher, leaving.cluster, leaving.client
        left: bool = True
        running: list[str] = []
        if client is not None:
            left, running = launcher.end_engines(
                leaving.sets, leaving.slots, lambda: shutdown_engines(client, leaving.asked))
            client.close(linger=0)
        if launcher.ends_engines_by_pid:
            terminate_together(leaving.pids)
        if cluster is not None and leaving.runner is not None:
            if left and launcher.ask_engines_to_exit:  # the engines are gone
                for set_id in list(cluster.engines):
                    launcher.forget(cluster.engines.pop(set_id))
                leaving.runner.run(cluster.stop_controller(), timeout=30)
            else:
                leaving.runner.run(cluster.stop_cluster(), timeout=30)
        return running

    def _clean_up(self, leaving: _Leaving) -> None:
        """Whatever the stop above managed: nothing of the cluster is left after this."""
        state = self.state
        kill_leftovers(leaving.pids)
        # Each engine's nanny, once its engine is gone, tells the controller so and lingers
        # 3 s trying when the controller has stopped too (ipyparallel's LINGER): with the
        # whole cluster gone there is no one left to tell.
        terminate_together(leaving.nannies, grace=1.0)
        self._stopper.await_gone(leaving.sets)
        remove_segments(leaving.segments)  # the engines that mapped them are gone (killed above)
        self._fork_server.after_cluster()  # after the engines: it would kill any still running
        if leaving.warden is not None:  # it ends what the stop left (a dead controller's schedulers)
            leaving.warden.close()
        if leaving.runner is not None:
            leaving.runner.close()
        state.launcher.cleanup()
        remove_files(leaving.files)  # what the controller's own exit leaves
        with state.lock:
            state.slots.clear()
            state.ranks = RankTable()
            state.generation += 1
        state.on_change()
