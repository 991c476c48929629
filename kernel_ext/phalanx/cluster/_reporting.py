"""What ``%cluster status``, the widget and the leak checks read about a cluster: one row per
rank, and the local processes behind the cluster.

Example (what :class:`~._manager.ClusterManager` does)::

    report = StatusReport(state, fork_server)
    report.status()        # [{"rank": 0, "engine_id": 0, "state": "idle", ...}, ...]
    report.process_ids()   # {"controller": [...], "engines": [...], "warden": [...], "zygote": [...]}
"""

from __future__ import annotations

from ._fork_server import ForkServer
from ._procs import memory_mb
from ._cluster_state import ClusterState
from ._warden import launched_processes


class StatusReport:
    """Reads the shared state (and asks the controller which engines are busy); changes nothing."""

    def __init__(self, state: ClusterState, fork_server: ForkServer) -> None:
        self.state = state
        self._fork_server = fork_server

    def status(self, steps: dict[int, int] | None = None) -> list[dict]:
        """One row per rank: rank, engine id, host, pid, device, state, memory (MB), step."""
        busy = self._busy_engines()
        rows = []
        for rank, slot in enumerate(self.state.in_rank_order()):
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
        client = self.state.client
        if client is None:
            return set()
        try:
            queue = client.queue_status(block=True)
        except Exception:
            return set()
        return {eid for eid, q in queue.items()
                if isinstance(q, dict) and (q.get("tasks", 0) or q.get("queue", 0))}

    def process_ids(self) -> dict[str, list[int]]:
        """Local processes of the cluster: the controller's and the engines', with children
        (the controller's schedulers, each engine's nanny), its watchdog and the engines' fork
        server (its children are the engines).  For audits and leak checks."""
        import psutil

        found: dict[str, list[int]] = {}
        for role, pids in self._root_pids().items():
            found[role] = []
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    found[role] += [pid] + [c.pid for c in proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
        # the nannies of engines forked by the fork server (:mod:`._zygote_nanny`)
        found["engines"] += self._fork_server.nannies()
        found["zygote"] = self._fork_server_pids(found["engines"])
        return found

    def _root_pids(self) -> dict[str, list[int]]:
        """Each role's processes whose children count with them."""
        state = self.state
        warden = state.warden
        roots: dict[str, list[int]] = {"controller": [],
                                       "engines": [s.pid for s in state.in_rank_order() if s.pid],
                                       "warden": [warden.pid] if warden and warden.pid else []}
        controller = getattr(state.cluster, "controller", None) if state.cluster else None
        forked = state.forked_controller
        if forked is not None and forked.is_running():  # its stand-in counts with the zygote
            roots["controller"] = [forked.pid]
        elif controller is not None and getattr(controller, "pid", None):
            roots["controller"] = [controller.pid]
        return roots

    def _fork_server_pids(self, engine_pids: list[int]) -> list[int]:
        """The fork server and, for engines forked from it, the processes ipyparallel launched
        that stand for them (their proxies)."""
        import psutil

        state, pid = self.state, self._fork_server.pid()
        if pid is None or state.cluster is None:
            return []
        launched = [p.pid for s in list(state.cluster.engines.values())
                    for p in launched_processes(s)]
        if state.forked_controller is not None:
            launched += [p.pid for p in launched_processes(state.cluster.controller)]
        return [p for p in [pid, *launched] if p not in engine_pids and psutil.pid_exists(p)]
