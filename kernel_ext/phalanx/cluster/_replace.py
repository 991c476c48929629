"""How :class:`~._manager.ClusterManager` replaces and removes engines: restart one rank or
all, scale down, and stop a group of engines so that none of their processes is left.

Mixed into the manager, whose state it shares.  A rank restarts alone where its launcher can
replace one engine: local engines are one engine set each; the SSH launcher asks the engine to
exit, waits on its host until its process is gone and starts a one-engine set on that host.
Launchers that start engines only as a group (MPI) restart them all, and their slots say so
(``EngineSlot.restarts_alone``), so that no message advises a restart that is then refused.
"""

from __future__ import annotations

import logging

from ._errors import ClusterError
from ._procs import is_adopted, kill_leftovers, local_pids, shutdown_engines, terminate_together
from ._ranks import EngineSlot
from ._state import ManagerState

log = logging.getLogger("phalanx")


class ReplaceMixin(ManagerState):
    """:meth:`restart`, shrinking, and the stop of a group of engines."""

    def restart(self, rank: int | None = None) -> list[EngineSlot]:
        """Restart one rank (its engine is replaced on its host, the rank is kept; the old
        engine's process has exited when this returns) or every engine."""
        self._require_running()
        if rank is None:
            targets = list(self._ranks)
        else:
            if not isinstance(rank, int) or isinstance(rank, bool):
                raise ClusterError(f"restart takes a rank number, got {rank!r}")
            try:
                targets = [self._ranks.slot_at(rank)]
            except IndexError as exc:
                raise ClusterError(str(exc)) from None
        adopted = [self._ranks.rank_of(s) for s in targets if is_adopted(self._slots[s])]
        if adopted:
            raise ClusterError(f"rank(s) {', '.join(map(str, adopted))} run on engines started "
                               "outside phalanx: restart them where they run and adopt them again")
        old = [self._slots[s] for s in targets]
        hosts = self._launcher.hosts_of(old)
        if not all(s.restarts_alone for s in old) and set(self._group_of(targets)) != set(targets):
            raise ClusterError(f"the {self.launcher} launcher starts engines in groups; "
                               "restart them all with %cluster restart")
        try:
            running = self._stop_slots(targets)
            if running:
                raise ClusterError(f"the engine(s) to replace did not exit: {'; '.join(running)}; "
                                   "nothing was started in their place")
            self._add_engines(len(targets), replacing=targets, hosts=hosts)
        except BaseException:
            with self._lock:  # the old engines are gone either way: never leave a stale slot
                for slot_id in targets:
                    if slot_id in self._slots:
                        self._slots[slot_id].state = "dead"
            self._on_change()
            raise
        return self.slots()

    def _group_of(self, slot_ids: list[str]) -> list[str]:
        """Every slot started in the same engine sets as ``slot_ids``."""
        sets = {self._slots[s].engine_set_id for s in slot_ids}
        return [s for s in self._slots if self._slots[s].engine_set_id in sets]

    def _remove_slots(self, slot_ids: list[str]) -> None:
        if set(self._group_of(slot_ids)) != set(slot_ids) and not self._launcher.restarts_one_engine:
            raise ClusterError(f"the {self.launcher} launcher starts engines in groups of "
                               "several; scale down by whole groups or restart the cluster")
        running = self._stop_slots(slot_ids)
        with self._lock:
            for slot_id in slot_ids:
                self._slots.pop(slot_id, None)
                self._ranks.remove(slot_id)
            self.generation += 1
        self._on_change()
        if running:
            raise ClusterError(f"engine(s) still running after the scale-down: {'; '.join(running)}")

    def _ask_to_exit(self, slot: EngineSlot) -> bool:
        """Engines asked to exit over ipyparallel before their launcher stops them: those
        phalanx did not start, and those whose launcher is slow to stop them (SSH)."""
        return is_adopted(slot) or self._launcher.ask_engines_to_exit

    def _stop_sets(self, sets: set[str]) -> None:
        """Stop every engine of the engine sets ``sets`` (a start that failed)."""
        self._stop_slots([s for s in self._slots if self._slots[s].engine_set_id in sets])

    def _stop_slots(self, slot_ids: list[str]) -> list[str]:
        """Stop the engines of ``slot_ids`` and return once their processes have exited; the
        ones still running, described (none unless a host could not be reached)."""
        assert self._runner is not None
        with self._lock:
            doomed = [self._slots[s] for s in slot_ids if s in self._slots]
            pids = local_pids(doomed)
            for slot in doomed:
                slot.state = "stopping"
        self._on_change()
        launched = {s.engine_set_id for s in doomed if not is_adopted(s)}
        whole = launched & {s.engine_set_id for s in doomed
                            if set(self._group_of([s.slot_id])) <= set(slot_ids)}
        engine_sets = [self._cluster.engines[s] for s in launched if s in self._cluster.engines]
        asked = [s.engine_id for s in doomed if self._ask_to_exit(s)]
        left, running = self._launcher.end_engines(engine_sets, doomed,
                                                   lambda: shutdown_engines(self.client, asked))
        stopping = [self._cluster.engines[s] for s in whole if s in self._cluster.engines]
        if self._launcher.ends_engines_by_pid:
            terminate_together(pids)
        for set_id in whole:
            if left and self._launcher.ask_engines_to_exit:
                self._launcher.forget(self._cluster.engines.pop(set_id, None))
                continue
            try:
                self._runner.run(self._cluster.stop_engines(set_id), timeout=30)
            except KeyError:
                pass  # the set already exited on its own
        kill_leftovers(pids)
        self._await_gone(stopping)
        return running
