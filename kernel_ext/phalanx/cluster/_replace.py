"""Restarting engines: one rank, keeping its rank and host, or all of them.

A rank restarts alone where its launcher can replace one engine: local engines are one engine
set each; the SSH launcher asks the engine to exit, waits on its host until its process is gone
and starts a one-engine set on that host.  Launchers that start engines only as a group (MPI)
restart them all, and their slots say so (``EngineSlot.restarts_alone``), so that no message
advises a restart that is then refused.

Example (what :class:`~._manager.ClusterManager` does)::

    restarter = Restarter(state, starter, stopper)
    restarter.restart(rank=1)     # rank 1's old engine has exited when this returns
    restarter.restart()           # every engine
"""

from __future__ import annotations

from ._engines import EngineStarter
from ._errors import ClusterError
from ._procs import is_adopted
from ._cluster_state import ClusterState
from ._stopping import EngineStopper


class Restarter:
    """Replaces engines of a running cluster: stops the old ones, then starts their successors."""

    def __init__(self, state: ClusterState, starter: EngineStarter, stopper: EngineStopper) -> None:
        self.state = state
        self._starter = starter
        self._stopper = stopper

    def restart(self, rank: int | None = None) -> None:
        """Restart one rank (its engine is replaced on its host, the rank is kept; the old
        engine's process has exited when this returns) or every engine."""
        state = self.state
        state.require_running()
        targets = list(state.ranks) if rank is None else [self._slot_of(rank)]
        self._check_restartable(targets)
        hosts = state.launcher.hosts_of([state.slots[s] for s in targets])
        try:
            running = self._stopper.stop(targets)
            if running:
                raise ClusterError(f"the engine(s) to replace did not exit: {'; '.join(running)}; "
                                   "nothing was started in their place")
            self._starter.add(len(targets), replacing=targets, hosts=hosts)
        except BaseException:
            with state.lock:  # the old engines are gone either way: never leave a stale slot
                for slot_id in targets:
                    if slot_id in state.slots:
                        state.slots[slot_id].state = "dead"
            state.on_change()
            raise

    def _slot_of(self, rank: int) -> str:
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise ClusterError(f"restart takes a rank number, got {rank!r}")
        try:
            return self.state.ranks.slot_at(rank)
        except IndexError as exc:
            raise ClusterError(str(exc)) from None

    def _check_restartable(self, targets: list[str]) -> None:
        """Refuse engines phalanx did not start, and part of a group its launcher can only
        start as a whole."""
        state = self.state
        adopted = [state.ranks.rank_of(s) for s in targets if is_adopted(state.slots[s])]
        if adopted:
            raise ClusterError(f"rank(s) {', '.join(map(str, adopted))} run on engines started "
                               "outside phalanx: restart them where they run and adopt them again")
        alone = all(state.slots[s].restarts_alone for s in targets)
        if not alone and set(state.group_of(targets)) != set(targets):
            raise ClusterError(f"the {state.launcher.name} launcher starts engines in groups; "
                               "restart them all with %cluster restart")
