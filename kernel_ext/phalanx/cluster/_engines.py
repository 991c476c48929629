"""How new engines arrive: start engine sets through the launcher, wait until each engine
registers and answers, pin it, and give it a rank.

The manager decides when engines come (start, scale, restart, adopt); :class:`EngineStarter`
how.  A start that fails leaves none of its engines running (it stops them through the
:class:`~._stopping.EngineStopper`), and an engine set that exits before its engines registered
ends the wait at once (its exit reaches the :class:`~._exit_watch.ExitWatch`).

Example (what :class:`~._manager.ClusterManager` does)::

    starter = EngineStarter(state, stopper, exits, fork_server)
    starter.add(2)                                  # two more ranks
    starter.add(1, replacing=["slot-1"])            # a new engine takes slot-1's rank
"""

from __future__ import annotations

import socket
import subprocess

from ._exit_watch import ExitWatch
from ._fork_server import ForkServer
from ._gpus import assign_devices, host_gpu_order, pinning_env
from ._heartbeat import ENGINE_ARGS
from ._probe import warm_up
from ._ranks import EngineSlot, pair_by_host
from ._registration import await_registration, pin_group
from ._cluster_state import ClusterState
from ._stopping import EngineStopper
from ._warden import launched_processes


class EngineStarter:
    """New engines for a running cluster's start, scale, restart and adoption."""

    def __init__(self, state: ClusterState, stopper: EngineStopper, exits: ExitWatch,
                 fork_server: ForkServer) -> None:
        self.state = state
        self._stopper = stopper
        self._exits = exits
        self._fork_server = fork_server

    def add(self, count: int, replacing: list[str] | None = None,
            hosts: dict[str, int] | None = None) -> None:
        """Start ``count`` engines (on ``hosts``, where the launcher places them), wait for
        them, identify and pin them, rank them (``replacing``: in those slots' ranks)."""
        state = self.state
        new_slots: list[EngineSlot] = []
        try:
            self._launch(count, new_slots, hosts, replacing)
            self.await_registration(new_slots, state.timeout, replacing)
            for set_id in {s.engine_set_id for s in new_slots}:
                state.launcher.note_started(state.cluster.engines.get(set_id),
                                            [s for s in new_slots if s.engine_set_id == set_id])
        except BaseException:  # a set that failed to start too: none of this call's is left
            self._stopper.stop_sets({s.engine_set_id for s in new_slots})
            state.forget(s.slot_id for s in new_slots)
            raise
        self.rank(new_slots, replacing)

    def rank(self, new_slots: list[EngineSlot], replacing: list[str] | None = None) -> None:
        """Give registered slots ranks: the next ones, or those of ``replacing``."""
        state, launcher = self.state, self.state.launcher
        with state.lock:
            if replacing is not None:  # each replacement takes the rank of the one on its host
                new_slots = pair_by_host([state.slots[s] for s in replacing], new_slots)
            for slot in new_slots:
                sets = [s for s in state.slots.values() if s.engine_set_id == slot.engine_set_id]
                slot.restarts_alone = (launcher.one_set_per_engine or len(sets) == 1
                                       or launcher.replaces_alone(slot))
            for i, slot in enumerate(new_slots):
                if replacing is not None:
                    state.ranks.replace(replacing[i], slot.slot_id)
                    state.slots.pop(replacing[i], None)
                else:
                    state.ranks.append(slot.slot_id)
                slot.state = "idle"
            state.generation += 1
        state.on_change()

    def await_registration(self, slots: list[EngineSlot], timeout: float,
                           replacing: list[str] | None = None) -> None:
        """Wait until each new slot's engine has registered and answered the probe."""
        state = self.state
        await_registration(state, slots, timeout)
        if not state.launcher.one_set_per_engine:
            pin_group(state, slots, replacing)
        state.client[[s.engine_id for s in slots]].apply_async(warm_up)  # not awaited

    def _launch(self, count: int, slots: list[EngineSlot], hosts: dict[str, int] | None = None,
                replacing: list[str] | None = None) -> None:
        """Start ``count`` engines, adding their slots to ``slots`` as they are registered.

        A slot is registered *before* its set starts: an engine that exits at once (a broken
        environment) is marked dead by the set's stop callback, which may fire before the start
        call returns; finding no slot then, it would leave the wait for registration to run its
        whole timeout."""
        state = self.state
        assert state.runner is not None and state.cluster is not None
        if state.launcher.one_set_per_engine:
            first_rank, here = state.size, socket.gethostname()
            if replacing is not None:  # a replacement keeps the rank, so LOCAL_RANK and GPU too
                devices = [state.slots[s].device for s in replacing]
            else:
                devices = assign_devices(state.gpu_spec, [here] * (first_rank + count),
                                         {here: state.gpus})[first_rank:]
            order = host_gpu_order(state.gpu_spec, state.gpus)
            for device in devices:
                slot_id = f"slot-{next(state.ids)}"
                slots.append(state.register(EngineSlot(slot_id, slot_id, device)))
                self._start_set(slot_id, 1, {"PHALANX_SLOT": slot_id,
                                             **pinning_env(device, order),
                                             **self._fork_server.engine_env(device)})
        else:
            set_id = f"set-{next(state.ids)}"
            for i in range(count):
                slots.append(state.register(EngineSlot(f"{set_id}.{i}", set_id)))
            self._start_set(set_id, count, {"PHALANX_SET": set_id}, hosts)

    def _start_set(self, set_id: str, count: int, env: dict[str, str],
                   hosts: dict[str, int] | None = None) -> None:
        state = self.state
        cluster, launcher = state.cluster, state.launcher
        kwargs = {"engine_args": list(ENGINE_ARGS),
                  **launcher.engine_kwargs(set_id, count, env, hosts=hosts)}
        assert state.runner is not None and state.warden is not None  # set by start()
        try:
            state.runner.run(cluster.start_engines(count, engine_set_id=set_id, **kwargs),
                             timeout=state.timeout)
        except subprocess.CalledProcessError as exc:  # a batch system refused the job
            cluster.engines.pop(set_id, None)
            raise launcher.submit_error(exc) from None
        if launcher.engines_here:
            state.warden.watch(launched_processes(cluster.engines[set_id]))
        # the watch's method is looked up when the set stops, not now (tests delay the notice)
        cluster.engines[set_id].on_stop(
            lambda data, s=set_id: self._exits.engine_set_exited(s, data))
        engine_set, engine_log = cluster.engines[set_id], state.engine_log
        if engine_log is not None:  # its processes' own output, out of the cell and terminal
            engine_set.on_stop(lambda data, s=set_id: engine_log.keep(f"engine set {s}",
                                                                      engine_set, data))
