"""What the cluster manager hears when engines or the controller exit on their own.

Three sources tell: a launcher's engine set stopped (its exit callback), the controller let an
engine go (its registration notice), the controller itself exited.  Each marks what it names in
the shared :class:`~phalanx.cluster._cluster_state.ClusterState` at once, so ``%cluster status``, the widget and the
panel show it and the next run refuses to start on a dead rank.  The callbacks come from
ipyparallel's loop thread and the client's thread, hence the state's lock.

Example (what :class:`~._engines.EngineStarter` and :class:`~._manager.ClusterManager` do)::

    exits = ExitWatch(state)
    engine_set.on_stop(lambda data: exits.engine_set_exited("set-0", data))
    client._registration_callbacks.append(exits.engine_unregistered)
    cluster.controller.on_stop(exits.controller_exited)
"""

from __future__ import annotations

import logging
from typing import Any

from ._locality import is_local
from ._cluster_state import ClusterState

log = logging.getLogger("phalanx")


class ExitWatch:
    """Marks ranks dead, and the controller gone, as the processes' exits are reported."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def engine_set_exited(self, set_id: str, data: dict | None) -> None:
        """A launcher's engine set stopped: its engines not being stopped on purpose are dead."""
        code = (data or {}).get("exit_code")
        changed = False
        with self.state.lock:
            for slot in self.state.slots.values():
                if slot.engine_set_id != set_id:
                    continue
                if slot.state not in ("stopping", "dead"):
                    slot.state, slot.exit_code, changed = "dead", code, True
                elif slot.state == "dead" and slot.exit_code is None and code is not None:
                    # marked dead when the controller let it go: the exit code comes now
                    slot.exit_code, changed = code, True
        if changed:
            log.warning("phalanx: engine set %s exited (code %s)", set_id, code)
            self.state.on_change()

    def engine_unregistered(self, event: dict) -> None:
        """The controller let an engine go (it exited, or missed its heartbeats): its rank is
        dead from now on.  A stopped process here is left to the run that waits on it (it ends
        it and says so); engines being stopped on purpose are already ``stopping``.  Where
        engines run over SSH this comes first: the launcher notices an exited engine only
        when its next poll over SSH returns."""
        if event.get("event") != "unregister":
            return
        changed = []
        with self.state.lock:
            for slot in self.state.slots.values():
                if slot.engine_id == event.get("id") and slot.state in ("starting", "idle", "busy") \
                        and not _still_here(slot):
                    slot.state = "dead"
                    changed.append(slot)
        for slot in changed:
            log.warning("phalanx: engine %s (pid %s on %s) left the cluster", slot.engine_id,
                        slot.pid, slot.host)
        if changed:
            self.state.on_change()

    def controller_exited(self, data: dict | None) -> None:
        """The controller exited: a run in progress can no longer hear from any engine."""
        cluster = self.state.cluster
        if cluster is None:  # stopped by us
            return
        self.state.controller_exit = dict(data or {}, pid=getattr(cluster.controller, "pid", None))
        log.warning("phalanx: the cluster's controller exited (%s)", data)
        self.state.on_change()


def _still_here(slot: Any) -> bool:
    """Whether a slot's engine process still runs on this host (a stopped one does)."""
    if not slot.pid or not is_local(slot):
        return False
    import psutil

    try:
        return psutil.Process(slot.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
