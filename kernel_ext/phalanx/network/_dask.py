"""Fits on a cluster: dask.distributed running on the ipyparallel engines.

:func:`dask_client` turns an ipyparallel ``Client`` into a dask cluster once (the engines
become dask workers through ``Client.become_dask``) and caches the result on that client, so
repeated fits start at once; :func:`stop_dask` tears it down.  :class:`DaskBackend` is the
scheduler backend: every node is a dask future, intermediate outputs stay on the workers and
only fit results come back to the kernel.

Example::

    >>> import ipyparallel as ipp                           # doctest: +SKIP
    >>> rc = ipp.Cluster(n=2).start_and_connect_sync()      # doctest: +SKIP
    >>> yhat.fit(cluster=rc)                                # doctest: +SKIP
    >>> stop_dask(rc)                                       # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ._tasks import raise_task

# The cached dask client lives on the ipyparallel client it belongs to, not in this module:
# its lifetime is that client's, and there is no process-wide registry to clean up.
_CACHE_ATTR = "_phalanx_dask_client"


def dask_client(cluster: Any, timeout: float = 60.0) -> Any:
    """The dask ``distributed.Client`` for ``cluster``, starting dask on the engines once.

    ``cluster`` is a dask ``Client`` (used as is), an ipyparallel ``Client``, or an object
    whose ``.client`` is one of those (the session's cluster manager).

    Example::

        >>> dc = dask_client(rc)          # doctest: +SKIP
        >>> dc is dask_client(rc)         # doctest: +SKIP
        True
    """
    from distributed import Client as DaskClient

    if isinstance(cluster, DaskClient):
        return cluster
    ipp = _ipp_client(cluster)
    if isinstance(ipp, DaskClient):
        return ipp
    cached = getattr(ipp, _CACHE_ATTR, None)
    if cached is not None and cached.status == "running":
        return cached
    if cached is not None:
        # A closed client with workers left behind: stop them, or become_dask would start a
        # second worker in each engine.
        _stop(ipp, cached)
    n_engines = len(ipp.ids)
    if n_engines == 0:
        raise RuntimeError("the cluster has no engines to run dask workers on")
    client = ipp.become_dask()
    try:
        client.wait_for_workers(n_engines, timeout=timeout)
    except Exception:
        _stop(ipp, client)
        raise
    setattr(ipp, _CACHE_ATTR, client)
    return client


def stop_dask(cluster: Any) -> bool:
    """Stop the dask scheduler and workers that :func:`dask_client` started for ``cluster``.

    Returns whether there was anything to stop.  A dask ``Client`` passed in directly
    belongs to the caller and is left alone.

    Example::

        >>> stop_dask(rc)                 # doctest: +SKIP
        True
    """
    from distributed import Client as DaskClient

    if isinstance(cluster, DaskClient):
        return False
    ipp = _ipp_client(cluster)
    cached = getattr(ipp, _CACHE_ATTR, None)
    if cached is None:
        return False
    _stop(ipp, cached)
    return True


def _stop(ipp: Any, client: Any) -> None:
    try:
        client.close()
    finally:
        if hasattr(ipp, _CACHE_ATTR):
            delattr(ipp, _CACHE_ATTR)
        ipp.stop_dask()


def _ipp_client(cluster: Any) -> Any:
    import ipyparallel
    from distributed import Client as DaskClient

    for candidate in (cluster, getattr(cluster, "client", None)):
        if isinstance(candidate, (ipyparallel.Client, DaskClient)):
            return candidate
    raise TypeError(f"cluster must be an ipyparallel Client, a dask distributed Client or "
                    f"have a .client that is one; got {type(cluster).__name__}")


class DaskBackend:
    """The :class:`~._scheduler.Backend` of a cluster: tasks are dask futures on the engines'
    workers, fits run concurrently wherever dask places them, values stay on the workers."""

    name = "dask"

    def __init__(self, cluster: Any) -> None:
        self.client = dask_client(cluster)
        # Cached inputs are futures of one scheduler: valid only while that client lives.
        self.token = f"dask:{id(self.client)}:{self.client.id}"

    def put(self, value: Any) -> Any:
        # A list around the value keeps scatter from splitting a list-valued source.
        return self.client.scatter([value], hash=False)[0]

    def submit(self, fn: Callable, *args: Any, key: str = "task") -> Any:
        # Unique keys: the same machine fitted in two fits must be two tasks.
        return self.client.submit(fn, *args, key=f"{key}-{uuid.uuid4().hex[:10]}", pure=False)

    def local(self, fn: Callable, *args: Any, key: str = "task") -> Any:
        """Run ``fn`` in the kernel (e.g. a ``fit_runner`` driving the engines itself)."""
        try:
            values = [self.client.gather(a) if _is_future(a) else a for a in args]
            return self.put(fn(*values))
        except Exception as exc:  # noqa: BLE001 - becomes an erred future, like a task
            return self.submit(raise_task, exc, key=key)

    def own(self, obj: Any) -> Any:
        return obj  # shipping to a worker already copies it

    def keep(self, future: Any) -> Any:
        return future  # holding the future keeps the data on its worker

    def valid(self, futures: list) -> bool:
        return self.client.status == "running" and all(
            not _is_future(f) or f.status == "finished" for f in futures)

    def result(self, future: Any) -> Any:
        return future.result()

    def as_completed(self, handles: list, deps: dict, on_start: Callable[[Any], None]
                     ) -> Iterator[tuple[Any, BaseException | None, Any]]:
        from distributed import as_completed

        waiting = list(handles)

        def start_ready() -> None:
            # A fit is (about to be) running once every fit it depends on is done.
            for h in list(waiting):
                if all(d.done() for d in deps.get(h, ())):
                    waiting.remove(h)
                    on_start(h)

        start_ready()
        for future in as_completed(handles):
            start_ready()
            try:
                value = future.result()
            except Exception as exc:  # noqa: BLE001 - erred, cancelled, lost: all per machine
                yield future, exc, None
            else:
                yield future, None, value
            start_ready()


def _is_future(obj: Any) -> bool:
    from distributed import Future

    return isinstance(obj, Future)
