"""``phalanx.dask_client()``: the cluster's dask, for dask-based libraries as they are.

The learning networks already run dask on the engines (a worker inside each engine, the
scheduler in the kernel, loopback or TLS: :mod:`phalanx.network._dask`), through a client of
their own that is nobody's default.  Libraries such as ``xgboost.dask`` and ``dask.array`` look
for dask's *default* client (``distributed.get_client()``: "No global client found" without
one).  :class:`UserDask` gives the person a client of that same scheduler which is the
default while it lives, and keeps it following the cluster:

- ``%cluster scale`` and ``%cluster restart`` stop dask on the engines before they change (the
  workers live inside them); when the person had a client, a new one to the new workers is the
  default as soon as the cluster is back (:meth:`UserDask.suspend` / :meth:`UserDask.resume`);
- ``%cluster stop`` and the kernel's end close it for good (:meth:`UserDask.close`), and dask
  computations go back to whatever default there was before.

Example::

    client = phalanx.dask_client()
    booster = xgboost.dask.train(None, params, xgboost.dask.DaskDMatrix(client, X, y))["booster"]
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("phalanx")


class UserDask:
    """The person's default dask client of the session's cluster, made on first ask."""

    def __init__(self) -> None:
        self._client: Any = None   # distributed.Client, the default while it is open
        self._of: Any = None       # the network's client it shares a scheduler with
        self._wanted = False       # asked for, and the cluster has not stopped since

    def client(self, cluster: Any, timeout: float = 60.0) -> Any:
        """The default ``distributed.Client`` of ``cluster``'s engines (started on first use;
        the same one until the cluster changes)."""
        from distributed import Client

        from .network import dask_client

        shared = dask_client(cluster, timeout=timeout)  # starts dask on the engines once
        if self._client is not None and self._of is shared and self._client.status == "running":
            return self._client
        self._close_client()
        self._client = Client(shared.scheduler.address, security=shared.security,
                              set_as_default=True, timeout=timeout)
        self._of, self._wanted = shared, True
        return self._client

    def suspend(self) -> None:
        """Close the client while the engines change; :meth:`resume` brings one back."""
        self._close_client()

    def resume(self, cluster: Any) -> None:
        """After a change of the engines: a client to the new workers, if one was in use."""
        if not self._wanted or not getattr(cluster, "running", False):
            return
        try:
            self.client(cluster)
        except Exception as exc:  # the cluster changed as asked; dask can be asked again
            log.warning("phalanx: dask did not come back on the engines: %s (call "
                        "phalanx.dask_client() again)", exc)

    def close(self) -> None:
        """Close the client for good (the cluster stops)."""
        self._wanted = False
        self._close_client()

    def _close_client(self) -> None:
        client, self._client, self._of = self._client, None, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # its scheduler may be gone already
                log.debug("phalanx: closing the dask client: %s", exc)
