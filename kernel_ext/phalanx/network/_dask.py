"""Fits on a cluster: dask.distributed running on the ipyparallel engines.

:func:`dask_client` turns an ipyparallel ``Client`` into a dask cluster once (each engine runs a
dask worker) and caches the result on that client, so repeated fits start at once;
:func:`stop_dask` tears it down.  :class:`DaskBackend` is the scheduler backend: every node is a
dask future, intermediate outputs stay on the workers and only fit results come back to the
kernel.

Nothing dask starts listens beyond this machine when every engine is on it: the scheduler (in
the kernel) and the workers (in the engines) bind to 127.0.0.1 and the dashboard is off unless
asked for.  When engines are on other hosts, scheduler, workers and client speak TLS with
certificates made for this cluster only (``Security.temporary``): a peer without them is refused.
The scheduler runs in the kernel rather than in ipyparallel's controller so that phalanx chooses
its address and security, and stops it for real (ipyparallel's ``stop_dask`` leaves the
controller's scheduler and the engines' workers listening).

Example (on a running ipyparallel cluster)::

    import ipyparallel as ipp
    rc = ipp.Cluster(n=2).start_and_connect_sync()
    yhat.fit(cluster=rc)
    stop_dask(rc)
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeGuard, TypeVar

if TYPE_CHECKING:
    import ipyparallel
    import distributed
    from distributed import Client as DaskClient, Future
    from distributed import Worker

from ._tasks import raise_task

# The cached dask client lives on the ipyparallel client it belongs to, not in this module:
# its lifetime is that client's, and there is no process-wide registry to clean up.
_CACHE_ATTR = "_phalanx_dask_client"
# Likewise the scratch directory of a dask client we started lives on that client.
_SCRATCH_ATTR = "_phalanx_scratch"
LOOPBACK = "127.0.0.1"

M = TypeVar("M")


class HasClient(Protocol):
    """The session's cluster manager: it has the ipyparallel (or dask) client."""

    @property
    def client(self) -> ipyparallel.Client | distributed.Client: ...


class _EngineKernel(Protocol):
    """An engine's kernel: where ipyparallel keeps the engine's dask worker."""

    distributed_worker: Worker | None


# What a fit's ``cluster=`` takes.
ClusterArg: TypeAlias = "distributed.Client | ipyparallel.Client | HasClient"


def dask_client(cluster: ClusterArg, timeout: float = 60.0, tls: bool | None = None,
                dashboard_address: str | None = None) -> distributed.Client:
    """The dask ``distributed.Client`` for ``cluster``, starting dask on the engines once.

    ``cluster`` is a dask ``Client`` (used as is), an ipyparallel ``Client``, or an object
    whose ``.client`` is one of those (the session's cluster manager).  ``tls`` defaults to
    "engines on other hosts"; ``dashboard_address`` (e.g. ``"127.0.0.1:8787"``, default: the
    ``PHALANX_DASK_DASHBOARD`` environment variable) turns dask's dashboard on there.

    Example (``rc``: an ipyparallel ``Client`` of a running cluster)::

        dc = dask_client(rc)
        dc is dask_client(rc)             # True: dask is started once per cluster
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
        # A closed client with workers left behind: stop them, or a second worker would start
        # in each engine.
        _stop(ipp, cached)
    targets = _engine_ids(cluster, ipp)
    if not targets:
        raise RuntimeError("the cluster has no engines to run dask workers on")
    remote = _engines_elsewhere(cluster, ipp, targets)
    client = _start(ipp, targets, remote, remote is not None if tls is None else tls,
                    dashboard_address or os.environ.get("PHALANX_DASK_DASHBOARD") or None)
    try:
        client.wait_for_workers(len(targets), timeout=timeout)
    except Exception:
        _stop(ipp, client)
        raise
    setattr(ipp, _CACHE_ATTR, client)
    return client


def dask_tasks_running(cluster: ClusterArg) -> int | None:
    """How many dask tasks the engines' workers are running now; None where dask has not been
    started on ``cluster`` (nothing is started to find out)."""
    try:
        ipp = _ipp_client(cluster)
    except TypeError:
        return None
    cached = getattr(ipp, _CACHE_ATTR, None)
    if cached is None or cached.status != "running":
        return None
    try:
        return sum(len(keys) for keys in cached.processing().values())
    except Exception:  # noqa: BLE001 - a scheduler going away: nothing runs there
        return None


def stop_dask(cluster: ClusterArg) -> bool:
    """Stop the dask scheduler and workers that :func:`dask_client` started for ``cluster``.

    Returns whether there was anything to stop.  A dask ``Client`` passed in directly
    belongs to the caller and is left alone.

    Example (``rc`` as for :func:`dask_client`)::

        stop_dask(rc)                     # True: there was a scheduler to stop
    """
    import sys

    if "distributed" not in sys.modules:  # no dask was ever started: importing it costs ~0.6 s
        return False
    from distributed import Client as DaskClient

    if isinstance(cluster, DaskClient):
        return False
    ipp = _ipp_client(cluster)
    cached = getattr(ipp, _CACHE_ATTR, None)
    if cached is None:
        return False
    _stop(ipp, cached)
    return True


def _start(ipp: ipyparallel.Client, targets: list[int], remote: str | None, tls: bool,
           dashboard_address: str | None) -> DaskClient:
    """A scheduler in the kernel, one worker per engine, and a client of that scheduler."""
    from distributed import Client as DaskClient, LocalCluster, Security

    from .._scratch import ScratchDir

    security = Security.temporary() if tls else Security()
    # dask's scratch space (its own and, on this host, the workers') in a directory of the
    # kernel's that goes with it, rather than a dask-scratch-space left in /tmp for good.
    scratch = ScratchDir("dask")
    # Locally everything binds to loopback; across hosts the scheduler listens on the kernel's
    # address towards the engines ("" when unknown: every interface) and each worker on its
    # engine's address towards the scheduler, all guarded by TLS.
    host = LOOPBACK if remote is None else remote
    scheduler = LocalCluster(
        n_workers=0, processes=False, host=host, protocol="tls://" if tls else "tcp://",
        security=security, dashboard_address=None,
        scheduler_kwargs={"dashboard": dashboard_address is not None,
                          # the scheduler's HTTP routes (health, metrics) stay on loopback too
                          "dashboard_address": dashboard_address or f"{LOOPBACK}:0",
                          "local_directory": scratch.path})
    try:
        ipp[targets].apply_sync(
            _start_engine_worker, scheduler.scheduler_address, nthreads=1, security=security,
            host=LOOPBACK if remote is None else None, dashboard_address=f"{LOOPBACK}:0",
            local_directory=scratch.path if remote is None else None)
        client = DaskClient(scheduler, set_as_default=False)
        setattr(client, _SCRATCH_ATTR, scratch)
        return client
    except BaseException:
        _close_workers(ipp, targets)
        scheduler.close()
        scratch.remove()
        raise


def _engine_ids(cluster: ClusterArg, ipp: ipyparallel.Client) -> list[int]:
    """The engines to run workers in: the session's live engines where it knows them
    (ipyparallel's own list still holds an engine a scale just removed), else every one."""
    slots = getattr(cluster, "slots", None)
    if callable(slots):
        return [s.engine_id for s in slots()
                if s.engine_id is not None and s.state not in ("dead", "stopping")]
    return list(ipp.ids)


def _engines_elsewhere(cluster: ClusterArg, ipp: ipyparallel.Client, targets: list[int]) -> str | None:
    """None when every engine runs on this host, else this host's address towards them."""
    from distributed.utils import get_ip

    slots = getattr(cluster, "slots", None)
    if callable(slots):  # the session's cluster manager knows where each engine runs
        from ..cluster import is_local

        away = [s for s in slots() if not is_local(s)]
        return get_ip(away[0].address) if away else None
    hosts = ipp[targets].apply_sync(socket.gethostname)
    return None if set(hosts) == {socket.gethostname()} else ""


def _stop(ipp: ipyparallel.Client | DaskClient, client: DaskClient) -> None:
    scheduler = getattr(client, "cluster", None)
    try:
        client.close()
    finally:
        if hasattr(ipp, _CACHE_ATTR):
            delattr(ipp, _CACHE_ATTR)
        try:
            _close_workers(ipp, list(ipp.ids))
        finally:
            if scheduler is not None:
                scheduler.close()
            scratch = getattr(client, _SCRATCH_ATTR, None)
            if scratch is not None:
                scratch.remove()


def _close_workers(ipp: ipyparallel.Client | DaskClient, targets: list[int], wait_s: float = 10.0) -> None:
    """Close the dask worker in each engine that still answers (a dead one took its worker
    with it).  One request per engine: an engine that vanished must not spare the others."""
    pending = []
    for engine_id in targets:
        try:
            pending.append(ipp[engine_id].apply_async(_close_engine_worker))
        except Exception:  # unregistered meanwhile
            continue
    for request in pending:
        try:
            request.get(timeout=wait_s)
        except Exception:  # died or too busy to answer: nothing more to do for it
            continue


# --- run in the engines (shipped by reference: engines import phalanx) --------------------------

def _start_engine_worker(address: str, **worker_args: object) -> None:
    """Start a dask worker inside this engine's event loop (replacing a closed or stale one).

    With no ``host`` the worker listens on this engine's address towards the scheduler: the
    one interface the others can reach it on (not every interface, nor a default route that a
    host on a private network may not have)."""
    import asyncio

    from distributed import Worker
    from distributed.comm import get_address_host
    from distributed.utils import get_ip

    if worker_args.get("host") is None:
        worker_args["host"] = get_ip(get_address_host(address))
    _close_engine_worker()
    kernel = _engine_kernel()
    kernel.distributed_worker = worker = Worker(address, **worker_args)
    asyncio.ensure_future(worker.start())


def _close_engine_worker() -> None:
    """Close this engine's dask worker (its listeners go with it) and forget it."""
    import asyncio

    kernel = _engine_kernel()
    worker = getattr(kernel, "distributed_worker", None)
    kernel.distributed_worker = None
    if worker is not None:
        asyncio.ensure_future(worker.close(reason="phalanx stop_dask"))


def _engine_kernel() -> _EngineKernel:
    from IPython import get_ipython

    return get_ipython().kernel


def _ipp_client(cluster: ClusterArg) -> ipyparallel.Client | DaskClient:
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

    def __init__(self, cluster: ClusterArg) -> None:
        self.client = dask_client(cluster)
        # Cached inputs are futures of one scheduler: valid only while that client lives.
        self.token = f"dask:{id(self.client)}:{self.client.id}"

    def put(self, value: object) -> Future:
        # A list around the value keeps scatter from splitting a list-valued source.
        return self.client.scatter([value], hash=False)[0]

    def submit(self, fn: Callable[..., object], *args: object, key: str = "task") -> Future:
        # Unique keys: the same machine fitted in two fits must be two tasks.
        return self.client.submit(fn, *args, key=f"{key}-{uuid.uuid4().hex[:10]}", pure=False)

    def local(self, fn: Callable[..., object], *args: object, key: str = "task") -> Future:
        """Run ``fn`` in the kernel (e.g. a ``fit_runner`` driving the engines itself)."""
        try:
            values = [self.client.gather(a) if _is_future(a) else a for a in args]
            return self.put(fn(*values))
        except Exception as exc:  # noqa: BLE001 - becomes an erred future, like a task
            return self.submit(raise_task, exc, key=key)

    def own(self, obj: M) -> M:
        return obj  # shipping to a worker already copies it

    def keep(self, future: Future) -> Future:
        return future  # holding the future keeps the data on its worker

    def valid(self, futures: list[Future]) -> bool:
        return self.client.status == "running" and all(
            not _is_future(f) or f.status == "finished" for f in futures)

    def result(self, future: Future) -> object:
        return future.result()

    def as_completed(self, handles: list[Future], deps: dict[Future, list[Future]],
                     on_start: Callable[[Future], None]
                     ) -> Iterator[tuple[Future, BaseException | None, object]]:
        from distributed import as_completed

        waiting = list(handles)

        def start_ready() -> None:
            # A fit is (about to be) running once every fit it depends on is done.
            for h in list(waiting):
                if all(d.done() for d in deps.get(h, ())):
                    waiting.remove(h)
                    on_start(h)

        start_ready()
        for future in as_completed(handles, loop=self.client.loop):
            start_ready()
            try:
                value = future.result()
            except Exception as exc:  # noqa: BLE001 - erred, cancelled, lost: all per machine
                yield future, exc, None
            else:
                yield future, None, value
            start_ready()


def _is_future(obj: object) -> TypeGuard[Future]:
    from distributed import Future

    return isinstance(obj, Future)
