"""Stopping a group of engines so that none of their processes is left, on any host.

What a restart, a scale-down and a failed start share (the whole cluster's stop is
:mod:`._teardown`).  Engines phalanx did not start, and those whose launcher is slow to stop
them (SSH), are first asked to exit through the controller; the launcher then ends its engine
sets, and on this host whatever is left of their processes is killed.

Example (what :class:`~._replace.Restarter` does)::

    stopper = EngineStopper(state)
    still_running = stopper.stop(["slot-1"])   # [] unless a host could not be reached
"""

from __future__ import annotations

import logging

from ._errors import ClusterError
from ._procs import is_adopted, kill_leftovers, local_pids, shutdown_engines, terminate_together
from ._cluster_state import ClusterState

log = logging.getLogger("phalanx")


class EngineStopper:
    """Stops engines of a running cluster: :meth:`stop`, :meth:`stop_sets`, :meth:`remove`."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def remove(self, slot_ids: list[str]) -> None:
        """Stop ``slot_ids``' engines and drop their ranks (a scale-down)."""
        state = self.state
        if set(state.group_of(slot_ids)) != set(slot_ids) and not state.launcher.restarts_one_engine:
            raise ClusterError(f"the {state.launcher.name} launcher starts engines in groups of "
                               "several; scale down by whole groups or restart the cluster")
        running = self.stop(slot_ids)
        with state.lock:
            for slot_id in slot_ids:
                state.slots.pop(slot_id, None)
                state.ranks.remove(slot_id)
            state.generation += 1
        state.on_change()
        if running:
            raise ClusterError(f"engine(s) still running after the scale-down: {'; '.join(running)}")

    def stop_sets(self, sets: set[str]) -> None:
        """Stop every engine of the engine sets ``sets`` (a start that failed)."""
        slots = self.state.slots
        self.stop([s for s in slots if slots[s].engine_set_id in sets])

    def stop(self, slot_ids: list[str]) -> list[str]:
        """Stop the engines of ``slot_ids`` and return once their processes have exited; the
        ones still running, described (none unless a host could not be reached)."""
        state = self.state
        assert state.runner is not None
        with state.lock:
            doomed = [state.slots[s] for s in slot_ids if s in state.slots]
            pids = local_pids(doomed)
            for slot in doomed:
                slot.state = "stopping"
        state.on_change()
        cluster, launcher = state.cluster, state.launcher
        launched = {s.engine_set_id for s in doomed if not is_adopted(s)}
        # sets all of whose engines go: ipyparallel stops those; a set only some of whose
        # engines go stays (its launcher ended those engines alone)
        whole = launched & {s.engine_set_id for s in doomed
                            if set(state.group_of([s.slot_id])) <= set(slot_ids)}
        engine_sets = [cluster.engines[s] for s in launched if s in cluster.engines]
        # an engine whose set stays (one rank of a batch job) can only be asked to exit
        alone = [s for s in doomed if s.engine_set_id in launched - whole
                 and not launcher.ends_engines_by_pid and not launcher.ask_engines_to_exit]
        asked = [s.engine_id for s in doomed if state.asks_to_exit(s) or s in alone]
        left, running = launcher.end_engines(engine_sets, doomed,
                                             lambda: shutdown_engines(state.client, asked))
        if alone:
            running += launcher.await_exited(alone)
        stopping = [cluster.engines[s] for s in whole if s in cluster.engines]
        if launcher.ends_engines_by_pid:
            terminate_together(pids)
        for set_id in whole:
            if left and launcher.ask_engines_to_exit:
                launcher.forget(cluster.engines.pop(set_id, None))
                continue
            try:
                state.runner.run(cluster.stop_engines(set_id), timeout=30)
            except KeyError:
                pass  # the set already exited on its own
        kill_leftovers(pids)
        self.await_gone(stopping)
        return running

    def await_gone(self, sets: list) -> None:
        """Return once the launcher no longer lists the stopped sets (a cancelled batch job
        leaves the queue only after its processes ended)."""
        launcher = self.state.launcher
        for engine_set in sets:
            try:
                launcher.after_stop(engine_set)
            except Exception as exc:
                log.warning("phalanx: checking that %s is gone raised %s",
                            launcher.set_name(engine_set), exc)
