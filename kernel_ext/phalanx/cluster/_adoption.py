"""Engines phalanx did not start, given ranks of the cluster (in a container, a network
namespace, on a host no launcher reaches).

Example (what ``%cluster adopt`` does through :class:`~._manager.ClusterManager`)::

    adoption = Adoption(state, starter)
    path = adoption.connection_file()
    # there: PHALANX_SLOT=far-0 python -m ipyparallel.engine --file=PATH
    adoption.adopt(["far-0"])
"""

from __future__ import annotations

import os

from ._engines import EngineStarter
from ._errors import ClusterError
from ._procs import ADOPTED
from ._ranks import EngineSlot
from ._cluster_state import ClusterState


class Adoption:
    """Hands out what an engine started by hand needs, and ranks such engines once they answer."""

    def __init__(self, state: ClusterState, starter: EngineStarter) -> None:
        self.state = state
        self._starter = starter

    def connection_file(self) -> str:
        """What an engine started by hand needs (``ipengine --file=PATH``): the controller's
        address and keys.  Owner-only; copy it only to hosts you trust."""
        self.state.require_running()
        cluster = self.state.cluster
        return os.path.join(cluster.profile_dir, "security",
                            f"ipcontroller-{cluster.cluster_id}-engine.json")

    def adopt(self, slot_ids: list[str], timeout: float | None = None) -> None:
        """Give the next ranks to the engines that run with ``PHALANX_SLOT=<id>`` for each of
        ``slot_ids`` (and, when the hostname does not tell them apart,
        ``PHALANX_HOST``/``PHALANX_ADDRESS``), once each has registered and answered."""
        state = self.state
        state.require_running()
        taken = [s for s in slot_ids if s in state.slots]
        if taken or len(set(slot_ids)) != len(slot_ids):
            raise ClusterError(f"slot ids must be new and distinct, got {slot_ids!r}")
        state.check_limit(state.size + len(slot_ids))
        new = [state.register(EngineSlot(s, ADOPTED + s)) for s in slot_ids]
        try:
            self._starter.await_registration(new, timeout or state.timeout)
        except BaseException:
            state.forget(s.slot_id for s in new)
            raise
        self._starter.rank(new)
