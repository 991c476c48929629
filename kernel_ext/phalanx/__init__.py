"""phalanx: interactive cluster training from Jupyter.

``%load_ext phalanx`` adds the ``%cluster`` and ``%%distributed_fit`` magics.  Inside a
``%%distributed_fit`` cell, ``from phalanx import log, allreduce, broadcast, barrier, wrap,
no_sync, steps``.

Your own sync rule: subclass ``SyncStrategy`` in a notebook cell and pass its name to the magic
(``%%distributed_fit --sync EveryThird``); ``param_values``, ``param_grads``, ``latest_metrics``
and the ``Communicator`` it receives as ``self.comm`` are what it works with (see
:mod:`phalanx.runtime` for the rules and an example)::

    from phalanx import SyncStrategy, param_values

    class EveryThird(SyncStrategy):
        def after_step(self, params, step):       # after opt.step(), on every rank
            if step % 3 == 2:
                self.comm.allreduce(param_values(params), op="mean")

Importing phalanx is cheap and side-effect free (engines import it too): the kernel-side parts
are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__  # noqa: F401 - the package's version, read by tools
from .runtime import allreduce, barrier, broadcast, bytes_sent, latest_metrics, log, no_sync, steps, wrap

__all__ = ["log", "allreduce", "broadcast", "barrier", "wrap", "no_sync", "bytes_sent", "steps",
           "latest_metrics", "SyncStrategy", "param_values", "param_grads", "Communicator",
           "last_run", "manifest", "dask_client",
           "cluster_widget", "data_parallel", "get_session", "runs", "load_ipython_extension",
           "unload_ipython_extension"]


def __getattr__(name: str) -> Any:
    from . import runtime

    if name in runtime._STRATEGY_API:  # loaded on first use: they import numpy
        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_session() -> Any:
    """The phalanx session of the running IPython kernel (created on first use)."""
    from ._session import session_for_shell

    return session_for_shell()


def last_run() -> Any:
    """The last ``%%distributed_fit`` run: status, wall time, per-rank steps, history, manifest."""
    return get_session().last_run()


def dask_client() -> Any:
    """The cluster's dask ``distributed.Client`` (workers inside the engines), dask's default
    client while the cluster runs: ``xgboost.dask``, ``dask.array`` ... use it as they are.
    It follows ``%cluster scale`` and ``restart`` and ends with the cluster.

    Example::

        client = phalanx.dask_client()
        out = xgboost.dask.train(None, params, xgboost.dask.DaskDMatrix(client, X, y))
    """
    return get_session().dask_client()


def runs() -> list:
    """The background runs of this kernel (``%%distributed_fit --background``), oldest first."""
    from ._background import runs_of

    return list(runs_of(get_session()))


def manifest() -> Any:
    """What is needed to reproduce the last run (versions, world size, seed, data hashes...)."""
    return get_session().last_run().manifest


def cluster_widget() -> Any:
    """A widget showing the cluster with buttons to scale, stop and restart it (the engine table
    where no widget can be drawn)."""
    from .widgets import cluster_view

    return cluster_view(get_session())


def data_parallel(**options: Any) -> Any:
    """A learning-network ``fit_runner`` training the machine's model on every engine.

    Example::

        mlp = machine(TorchRegressor(), Z, y, fit_runner=phalanx.data_parallel(sync="localsgd", every=4))
    """
    from ._data_parallel import data_parallel as make_runner

    return make_runner(**options)


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext phalanx``."""
    from ._magics import register
    from ._session import session_for_shell

    register(ipython)
    session_for_shell(ipython)  # creates the session and opens the door for the lab panel


def unload_ipython_extension(ipython: Any) -> None:
    """Called by ``%unload_ext phalanx``: stops the cluster this kernel started."""
    from ._session import close_session

    close_session(ipython)
