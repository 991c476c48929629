"""Waiting for new engines to register: match each to its slot, or say why it never will.

Used by :class:`~._engines.EngineStarter`; reads and fills the slots of the shared
:class:`~phalanx.cluster._cluster_state.ClusterState`.  Engines started as a group (MPI, SSH, batch jobs) are pinned to
their host's devices here too.  A start ends in one of three ways: every slot's engine answered
the probe; an engine set died or its launcher knows it will not come (a batch job that ended, or
stays pending past the timeout); or the timeout passed.  The error names the set and ends with
the tail of its log.
"""

from __future__ import annotations

import time
from typing import Any

from ._errors import ClusterError
from ._launchers import log_tail
from ._gpus import assign_devices, host_gpu_order
from ._locality import host_label, is_local
from ._probe import identify_engine, pin_engine
from ._cluster_state import ClusterState


def await_registration(state: ClusterState, slots: list, timeout: float) -> None:
    """Wait until each of ``slots`` has an engine that answered the probe within ``timeout``
    seconds (or raise)."""
    deadline = time.monotonic() + timeout
    pending = {s.slot_id: s for s in slots}
    known = {s.engine_id for s in state.slots.values() if s.engine_id is not None}
    probed: set[int] = set()
    while pending:
        check_sets(state, slots, pending, timeout, waited_out=time.monotonic() > deadline)
        for eid in [e for e in state.client.ids if e not in known and e not in probed]:
            info = probe(state, eid, timeout, deadline)
            probed.add(eid)
            slot = match(info, pending)
            if slot is not None:
                slot.engine_id, slot.address, slot.pid, slot.info = (
                    eid, info["address"], info["pid"], info)
                slot.host = host_label(info)
                pending.pop(slot.slot_id)
        time.sleep(0.05)


def probe(state: ClusterState, eid: int, timeout: float, deadline: float) -> dict:
    """What a newly registered engine says about itself, by the start's deadline: an engine
    that registered but never answers (wedged, or gone without the controller noticing yet),
    or died before it answered, fails the start with its name instead of leaving it waiting
    for ever or raising ipyparallel's own error."""
    from ipyparallel import error

    answer = state.client[eid].apply_async(identify_engine, state.controller_ip)
    try:
        return answer.get(timeout=max(1.0, deadline - time.monotonic()))
    except error.TimeoutError:
        raise ClusterError(f"engine {eid} registered with the controller but did not answer "
                           f"within {timeout:g} s, so it was stopped; start it again "
                           "(%cluster start, scale or restart; a longer --timeout on a busy "
                           "machine)") from None
    except error.EngineError as exc:  # it died between registering and answering
        raise ClusterError(f"engine {eid} exited right after registering with the controller "
                           f"({exc}); start it again (%cluster start, scale or restart)") from None


def pin_group(state: ClusterState, slots: list, replacing: list[str] | None = None) -> None:
    """Engines started together share one environment: pin each one after it registered,
    to a device of its own host (the host's devices as its engines reported them).  Each
    engine sees all of its host's GPUs, its own at its ``LOCAL_RANK``; a replacement takes the
    GPU of the engine it replaces (it keeps that one's rank)."""
    everyone = [s for s in state.in_rank_order() if s not in slots] + slots
    visible = {s.host: (state.gpus if is_local(s) else s.info.get("gpus", [])) for s in everyone}
    if replacing is not None:
        devices = _devices_of_replaced([state.slots[s] for s in replacing], slots)
    else:
        devices = assign_devices(state.gpu_spec, [s.host for s in everyone],
                                 visible)[len(everyone) - len(slots):]
    for slot, device in zip(slots, devices):
        slot.device = device
        order = ",".join(host_gpu_order(state.gpu_spec, visible.get(slot.host, [])))
        state.client[slot.engine_id].apply_sync(pin_engine, slot.slot_id, device, order)


def _devices_of_replaced(old: list, new: list) -> list[str | None]:
    """For each of ``new``, the device of the ``old`` slot it replaces: one on its host, in
    rank order (as the ranks are then handed over), else the next one left."""
    left = list(old)
    devices = []
    for slot in new:
        match = next((o for o in left if o.host == slot.host), left[0] if left else None)
        if match is not None:
            left.remove(match)
        devices.append(match.device if match is not None else None)
    return devices


def check_sets(state: ClusterState, slots: list, pending: dict, timeout: float,
               waited_out: bool) -> None:
    """Raise when a pending slot's engine set died or will not register."""
    dead = [s for s in slots if s.state == "dead"]
    if dead:
        raise ClusterError(failure(state, dead[0], "exited before registering"))
    launcher = state.launcher
    for set_id in {s.engine_set_id for s in pending.values()}:
        engine_set = state.cluster.engines.get(set_id) if state.cluster else None
        why = launcher.set_failure(engine_set, waited_out) if engine_set is not None else None
        if why:
            raise ClusterError(f"{why}.\n{output_tail(engine_set)}")
    if waited_out:
        raise ClusterError(failure(state, next(iter(pending.values())),
                                   f"did not register within {timeout:g} s"))


def match(info: dict, pending: dict) -> Any:
    """The pending slot an engine that answered the probe belongs to (``None``: not ours)."""
    if info["slot"] in pending:
        return pending[info["slot"]]
    by_mpi_rank = f"{info['set']}.{info['mpi_rank']}"  # keep MPI rank == phalanx rank
    if info["mpi_rank"] is not None and by_mpi_rank in pending:
        return pending[by_mpi_rank]
    for slot in pending.values():  # grouped launchers: any slot of the engine's set
        if slot.engine_set_id == info["set"]:
            return slot
    return None


def output_tail(engine_set: Any) -> str:
    try:
        output = engine_set.get_output() if engine_set is not None else ""
    except Exception:
        output = ""
    return f"Last lines of the engine log:\n{log_tail(output)}"


def failure(state: ClusterState, slot: Any, what: str) -> str:
    engine_set = state.cluster.engines.get(slot.engine_set_id) if state.cluster else None
    name = state.launcher.set_name(engine_set) if engine_set is not None else "engine(s)"
    return f"{name} started by the {state.launcher.name} launcher {what}.\n{output_tail(engine_set)}"
