"""The parts of :class:`~._manager.ClusterManager` that report on engines or take in engines
started elsewhere; mixed into the manager so that its module keeps to starting and stopping.
"""

from __future__ import annotations

import os

from ._errors import ClusterError
from ._procs import ADOPTED, memory_mb
from ._ranks import EngineSlot
from ._state import ManagerState


class StatusMixin(ManagerState):
    """Rows for ``%cluster status`` and the processes behind them."""

    def process_ids(self) -> dict[str, list[int]]:
        """Local processes of the cluster: the controller's and the engines', with children
        (the controller's schedulers, each engine's nanny), its watchdog and the engines' fork
        server (its children are the engines).  For audits and leak checks."""
        import psutil

        warden = getattr(self, "_warden", None)
        roots: dict[str, list[int]] = {"controller": [],
                                       "engines": [s.pid for s in self.slots() if s.pid],
                                       "warden": [warden.pid] if warden and warden.pid else []}
        controller = getattr(self._cluster, "controller", None) if self._cluster else None
        forked = self._forked_controller
        if forked is not None and forked.is_running():  # its stand-in counts with the zygote
            roots["controller"] = [forked.pid]
        elif controller is not None and getattr(controller, "pid", None):
            roots["controller"] = [controller.pid]
        found: dict[str, list[int]] = {}
        for role, pids in roots.items():
            found[role] = []
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    found[role] += [pid] + [c.pid for c in proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
        zygote = getattr(self, "_zygote", None)
        if zygote is not None:  # the nannies of engines forked there (:mod:`._zygote_nanny`)
            found["engines"] += zygote.nannies()
        found["zygote"] = self._fork_server_pids(found["engines"])
        return found

    def _fork_server_pids(self, engine_pids: list[int]) -> list[int]:
        """The zygote and, for engines forked from it, the processes ipyparallel launched that
        stand for them (their proxies)."""
        import psutil

        from ._warden import launched_processes

        zygote = getattr(self, "_zygote", None)
        if zygote is None or self._cluster is None:
            return []
        launched = [p.pid for s in list(self._cluster.engines.values())
                    for p in launched_processes(s)]
        if self._forked_controller is not None:
            launched += [p.pid for p in launched_processes(self._cluster.controller)]
        return [pid for pid in [zygote.pid, *launched]
                if pid not in engine_pids and psutil.pid_exists(pid)]

    def status(self, steps: dict[int, int] | None = None) -> list[dict]:
        """One row per rank: rank, engine id, host, pid, device, state, memory (MB), step."""
        busy = self._busy_engines()
        rows = []
        for rank, slot in enumerate(self.slots()):
            state = slot.state
            if state == "idle" and slot.engine_id in busy:
                state = "busy"
            rows.append({
                "rank": rank, "engine_id": slot.engine_id if slot.engine_id is not None else -1,
                "host": slot.host, "pid": slot.pid, "device": slot.device or "cpu",
                "state": state, "memory_mb": memory_mb(slot.pid, slot.host),
                "step": (steps or {}).get(rank),
            })
        return rows

    def _busy_engines(self) -> set[int]:
        if self.client is None:
            return set()
        try:
            queue = self.client.queue_status(block=True)
        except Exception:
            return set()
        return {eid for eid, q in queue.items()
                if isinstance(q, dict) and (q.get("tasks", 0) or q.get("queue", 0))}


class AdoptionMixin(ManagerState):
    """Engines phalanx did not start, given ranks of the cluster."""

    def engine_connection_file(self) -> str:
        """What an engine started by hand needs (``ipengine --file=PATH``): the controller's
        address and keys.  Owner-only; copy it only to hosts you trust."""
        self._require_running()
        cluster = self._cluster
        return os.path.join(cluster.profile_dir, "security",
                            f"ipcontroller-{cluster.cluster_id}-engine.json")

    def adopt(self, slot_ids: list[str], timeout: float | None = None) -> list[EngineSlot]:
        """Give the next ranks to engines phalanx did not start (in a container, a network
        namespace, on a host no launcher reaches).  Each must run with ``PHALANX_SLOT=<id>``
        (and, when the hostname does not tell it apart, ``PHALANX_HOST``/``PHALANX_ADDRESS``).

        Example::

            path = manager.engine_connection_file()
            # there: PHALANX_SLOT=far-0 python -m ipyparallel.engine --file=PATH
            manager.adopt(["far-0"])
        """
        self._require_running()
        taken = [s for s in slot_ids if s in self._slots]
        if taken or len(set(slot_ids)) != len(slot_ids):
            raise ClusterError(f"slot ids must be new and distinct, got {slot_ids!r}")
        self.check_limit(self.size + len(slot_ids))
        new = [self._register_slot(EngineSlot(s, ADOPTED + s)) for s in slot_ids]
        saved, self.timeout = self.timeout, timeout or self.timeout
        try:
            self._await_registration(new)
        except BaseException:
            with self._lock:
                for slot in new:
                    self._slots.pop(slot.slot_id, None)
            raise
        finally:
            self.timeout = saved
        self._rank_new(new)
        return self.slots()
