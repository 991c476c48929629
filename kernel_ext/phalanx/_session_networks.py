"""The session's learning networks and dask: ``%distributed_fit NODE``, ``phalanx.dask_client()``
and the dask workers that live inside the engines (stopped before the engines change or go).

A mixin of :class:`~phalanx._session.Session`.

Example: ``session.dask_client().submit(sum, [1, 2]).result()`` on a running cluster.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ._bus import EventBus
from ._dask_client import UserDask
from .cluster import ClusterError, ClusterManager

log = logging.getLogger("phalanx")


class NetworkVerbs:
    """Learning networks fitted on the cluster, and the cluster's dask."""

    cluster: ClusterManager
    events: EventBus
    user_dask: UserDask
    _verbs: threading.RLock

    def fit_network(self, node: Any, **kwargs: Any) -> Any:
        """Fit a learning network on the cluster (``%distributed_fit NODE``); DAG states go to
        the views as ``network`` events."""
        if not self.cluster.running:
            raise ClusterError("no cluster is running: start one with %cluster start -n 2")
        return node.fit(cluster=self.cluster, on_event=self.events.emit, **kwargs)

    def dask_tasks(self) -> int | None:
        """Dask tasks running on the engines now (a network's fits, ``dask_client()`` work);
        None when dask is not started on the cluster."""
        from .network._dask import dask_tasks_running

        with self._verbs:  # one verb at a time (see _session._serialised)
            return dask_tasks_running(self.cluster) if self.cluster.running else None

    def dask_client(self) -> Any:
        """The cluster's dask client, dask's default (``phalanx.dask_client()``)."""
        if not self.cluster.running:
            raise ClusterError("no cluster is running: start one with %cluster start -n 2")
        return self.user_dask.client(self.cluster)

    def _stop_dask(self, resume: bool = False) -> None:
        """Dask workers live inside the engines: stop them before the engines change or go
        (``resume``: the person's client comes back after the change)."""
        if resume:
            self.user_dask.suspend()
        else:
            self.user_dask.close()
        if self.cluster.running:
            from .network import stop_dask

            try:
                stop_dask(self.cluster)
            except Exception as exc:  # the engines are going anyway
                log.warning("phalanx: stopping dask on the engines failed: %s", exc)
