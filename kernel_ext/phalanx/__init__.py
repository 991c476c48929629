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

from typing import TYPE_CHECKING, Any

from ._version import __version__  # noqa: F401 - the package's version, read by tools
from .runtime import bytes_sent, latest_metrics, log

if TYPE_CHECKING:  # loaded on first use (see __getattr__); named here for type checkers
    from .runtime import allreduce as allreduce
    from .runtime import barrier as barrier
    from .runtime import broadcast as broadcast
    from .runtime import no_sync as no_sync
    from .runtime import steps as steps
    from .runtime import wrap as wrap

    import distributed
    from IPython.core.interactiveshell import InteractiveShell

    from ._session import Session
    from .fit import RunRecord

__all__ = ["log", "allreduce", "broadcast", "barrier", "wrap", "no_sync", "bytes_sent", "steps",
           "latest_metrics", "SyncStrategy", "param_values", "param_grads", "Communicator",
           "last_run", "manifest", "dask_client", "breakpoint",
           "cluster_widget", "data_parallel", "get_session", "runs", "load_ipython_extension",
           "unload_ipython_extension"]


def __getattr__(name: str) -> Any:
    from . import runtime

    if name in runtime._CELL_API or name in runtime._STRATEGY_API:  # they import numpy
        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def breakpoint(rank: int | None = None) -> None:  # noqa: A001 - Python's, for one rank
    """Pause a ``%%distributed_fit`` run here on ``rank`` (every rank that gets here when
    None) and open Python's debugger in the cell; the other ranks wait at their next
    collective.  ``c`` continues, ``q`` ends the run.

    Example (in the cell)::

        if step == 5:
            phalanx.breakpoint(rank=1)
    """
    import sys

    from .runtime import breakpoint_on

    breakpoint_on(rank, sys._getframe(1))


def get_session() -> Session:
    """The phalanx session of the running IPython kernel (created on first use)."""
    from ._session import session_for_shell

    return session_for_shell()


def last_run() -> RunRecord:
    """The last ``%%distributed_fit`` run: status, wall time, per-rank steps, history, manifest."""
    return get_session().last_run()


def dask_client() -> distributed.Client:
    """The cluster's dask ``distributed.Client`` (workers inside the engines), dask's default
    client while the cluster runs: ``xgboost.dask``, ``dask.array`` ... use it as they are.
    It follows ``%cluster scale`` and ``restart`` and ends with the cluster.

    Example::

        client = phalanx.dask_client()
        out = xgboost.dask.train(None, params, xgboost.dask.DaskDMatrix(client, X, y))
    """
    return get_session().dask_client()


def runs() -> list:
    """Every run of this notebook, oldest first, also those of kernels before a restart: name,
    cell, start, duration, status, final metrics, and each one's curves again.  A background
    run of this kernel (``%%distributed_fit --background``) also answers ``wait()``,
    ``stop()`` and ``result(name)``.  ``$PHALANX_KEEP_RUNS`` runs are kept per notebook (100).

    Example::

        phalanx.runs()                  # a table
        phalanx.runs()[-1].history().to_pandas()
    """
    return get_session().runs()


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


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Called by ``%load_ext phalanx``."""
    from ._magics import register
    from ._session import session_for_shell

    register(ipython)
    session_for_shell(ipython)  # creates the session and opens the door for the lab panel


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """Called by ``%unload_ext phalanx``: stops the cluster this kernel started."""
    from ._session import close_session

    close_session(ipython)
