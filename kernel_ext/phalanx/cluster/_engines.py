"""How :class:`~._manager.ClusterManager` adds engines: start engine sets through the launcher,
wait until each engine registers and answers, pin it, and give it a rank.

Mixed into the manager, whose state it shares; the manager decides when engines come and go
(start, scale, restart), this module how they arrive.
"""

from __future__ import annotations

import logging
import socket
import subprocess
from typing import Any

from ._gpus import assign_devices, pinning_env
from ._heartbeat import ENGINE_ARGS
from ._probe import warm_up
from ._locality import is_local
from ._ranks import EngineSlot, pair_by_host
from ._registration import await_registration, pin_group
from ._state import ManagerState
from ._warden import launched_processes

log = logging.getLogger("phalanx")


class EngineStartMixin(ManagerState):
    """New engines for :meth:`start`, :meth:`scale`, :meth:`restart` and :meth:`adopt`."""

    def _add_engines(self, count: int, replacing: list[str] | None = None,
                     hosts: dict[str, int] | None = None) -> None:
        """Start ``count`` engines (on ``hosts``, where the launcher places them), wait for
        them, identify and pin them, rank them."""
        new_slots: list[EngineSlot] = []
        try:
            self._launch(count, new_slots, hosts)
            self._await_registration(new_slots)
            for set_id in {s.engine_set_id for s in new_slots}:
                self._launcher.note_started(self._cluster.engines.get(set_id),
                                            [s for s in new_slots if s.engine_set_id == set_id])
        except BaseException:  # a set that failed to start too: none of this call's is left
            self._stop_sets({s.engine_set_id for s in new_slots})
            with self._lock:
                for s in new_slots:
                    self._slots.pop(s.slot_id, None)
            raise
        self._rank_new(new_slots, replacing)

    def _rank_new(self, new_slots: list[EngineSlot], replacing: list[str] | None = None) -> None:
        with self._lock:
            if replacing is not None:  # each replacement takes the rank of the one on its host
                new_slots = pair_by_host([self._slots[s] for s in replacing], new_slots)
            for slot in new_slots:
                sets = [s for s in self._slots.values() if s.engine_set_id == slot.engine_set_id]
                slot.restarts_alone = (self._launcher.one_set_per_engine or len(sets) == 1 or (
                    self._launcher.restarts_one_engine and self._launcher.hosts_of([slot]) is not None))
            for i, slot in enumerate(new_slots):
                if replacing is not None:
                    self._ranks.replace(replacing[i], slot.slot_id)
                    self._slots.pop(replacing[i], None)
                else:
                    self._ranks.append(slot.slot_id)
                slot.state = "idle"
            self.generation += 1
        self._on_change()

    def _launch(self, count: int, slots: list[EngineSlot],
                hosts: dict[str, int] | None = None) -> None:
        """Start ``count`` engines, adding their slots to ``slots`` as they are registered.

        A slot is registered *before* its set starts: an engine that exits at once (a broken
        environment) is marked dead by the set's stop callback, which may fire before the start
        call returns; finding no slot then, it would leave the wait for registration to run its
        whole timeout."""
        assert self._runner is not None and self._cluster is not None
        if self._launcher.one_set_per_engine:
            first_rank = self.size
            devices = assign_devices(self.gpu_spec, [socket.gethostname()] * (first_rank + count),
                                     {socket.gethostname(): self._gpus})[first_rank:]
            for device in devices:
                slot_id = f"slot-{next(self._ids)}"
                slots.append(self._register_slot(EngineSlot(slot_id, slot_id, device)))
                self._start_set(slot_id, 1, {"PHALANX_SLOT": slot_id, **pinning_env(device),
                                             **self._fork_env(device)})
        else:
            set_id = f"set-{next(self._ids)}"
            for i in range(count):
                slots.append(self._register_slot(EngineSlot(f"{set_id}.{i}", set_id)))
            self._start_set(set_id, count, {"PHALANX_SET": set_id}, hosts)

    def _fork_env(self, device: str | None) -> dict[str, str]:
        """What makes a CPU engine be forked from the cluster's zygote, where one runs."""
        return self._zygote.environment() if self._zygote is not None and device is None else {}

    def _register_slot(self, slot: EngineSlot) -> EngineSlot:
        with self._lock:
            self._slots[slot.slot_id] = slot
        return slot

    def _start_set(self, set_id: str, count: int, env: dict[str, str],
                   hosts: dict[str, int] | None = None) -> None:
        kwargs = {"engine_args": list(ENGINE_ARGS),
                  **self._launcher.engine_kwargs(set_id, count, env, hosts=hosts)}
        assert self._runner is not None and self._warden is not None  # set by start()
        try:
            self._runner.run(self._cluster.start_engines(count, engine_set_id=set_id, **kwargs),
                             timeout=self.timeout)
        except subprocess.CalledProcessError as exc:  # a batch system refused the job
            self._cluster.engines.pop(set_id, None)
            raise self._launcher.submit_error(exc) from None
        if self._launcher.engines_here:
            self._warden.watch(launched_processes(self._cluster.engines[set_id]))
        self._cluster.engines[set_id].on_stop(lambda data, s=set_id: self._set_stopped(s, data))

    def _set_stopped(self, set_id: str, data: dict | None) -> None:
        code = (data or {}).get("exit_code")
        changed = False
        with self._lock:
            for slot in self._slots.values():
                if slot.engine_set_id == set_id and slot.state not in ("stopping", "dead"):
                    slot.state, slot.exit_code, changed = "dead", code, True
        if changed:
            log.warning("phalanx: engine set %s exited (code %s)", set_id, code)
            self._on_change()

    def _engine_event(self, event: dict) -> None:
        """The controller let an engine go (it exited, or missed its heartbeats): its rank is
        dead from now on, in ``%cluster status``, the widget and the panel, and the next run
        refuses to start on it.  A stopped process here is left to the run that waits on it
        (it ends it and says so); engines being stopped on purpose are already ``stopping``."""
        if event.get("event") != "unregister":
            return
        changed = []
        with self._lock:
            for slot in self._slots.values():
                if slot.engine_id == event.get("id") and slot.state in ("starting", "idle", "busy") \
                        and not _still_here(slot):
                    slot.state = "dead"
                    changed.append(slot)
        for slot in changed:
            log.warning("phalanx: engine %s (pid %s on %s) left the cluster", slot.engine_id,
                        slot.pid, slot.host)
        if changed:
            self._on_change()

    def _await_registration(self, slots: list[EngineSlot]) -> None:
        """Wait until each new slot's engine has registered and answered the probe."""
        await_registration(self, slots, self.controller_ip)
        if not self._launcher.one_set_per_engine:
            pin_group(self, slots)
        self.client[[s.engine_id for s in slots]].apply_async(warm_up)  # not awaited


def _still_here(slot: Any) -> bool:
    """Whether a slot's engine process still runs on this host (a stopped one does)."""
    if not slot.pid or not is_local(slot):
        return False
    import psutil

    try:
        return psutil.Process(slot.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
