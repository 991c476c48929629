"""Data-parallel nodes: a learning-network machine whose model trains on every engine at once.

``machine(model, Z, y, fit_runner=data_parallel())`` makes the machine's fit a
``%%distributed_fit`` run: its inputs are sharded by rows across the cluster's ranks, the model's
own ``fit`` runs on every rank (a torch training loop inside it is synchronised by the chosen
strategy through the zero-change optimizer hooks; a ``partial_fit`` learner gets parameter
averaging), and rank 0's trained copy comes back as the fitted estimator.  Smart retraining
works around it as for any machine: it refits only when its inputs or hyperparameters change.

Example::

    mlp = machine(TorchRegressor(hidden=32), Z, y, fit_runner=data_parallel(sync="allreduce"))
    yhat = mlp.predict(Z); yhat.fit()
"""

from __future__ import annotations

from typing import Any, Callable

from .wire._options import DEFAULT_ALPHA, DEFAULT_EVERY, DEFAULT_SYNC

_FIT_BODY = """
if y is None:
    estimator.fit(X)
else:
    estimator.fit(X, y)
"""


def data_parallel(sync: str | type = DEFAULT_SYNC, every: int = DEFAULT_EVERY,
                  alpha: float = DEFAULT_ALPHA,
                  seed: int | None = 0, n: int | None = None,
                  session: Any = None) -> Callable[..., Any]:
    """A ``fit_runner`` that trains a machine's model data-parallel on the cluster.

    ``sync``/``every``/``alpha``/``seed``/``n`` mean what they mean for ``%%distributed_fit``;
    ``sync`` may also be a ``SyncStrategy`` subclass itself, one defined in the notebook included.
    The machine's first input is sharded by rows (and its target, when it has one).
    """
    sync_name, strategy = _strategy_flag(sync)

    def run(estimator: Any, *inputs: Any, cluster: Any = None) -> Any:
        from ._session import session_for_shell
        from .fit import FitOptions

        owner = session if session is not None else session_for_shell()
        if len(inputs) not in (1, 2):
            raise ValueError(f"a data-parallel machine takes X or X, y; got {len(inputs)} inputs")
        X, y = inputs[0], inputs[1] if len(inputs) == 2 else None
        namespace = {"estimator": estimator, "X": X, "y": y}
        if strategy is not None:
            namespace[sync_name] = strategy  # shipped with the estimator, like a notebook class
        shard = "X,y" if y is not None else "X"
        opts = FitOptions.build(n=n, sync=sync_name, every=every, alpha=alpha, seed=seed, shard=shard,
                                returns="estimator", name=f"fit {type(estimator).__name__}",
                                widget=False)
        owner.distributed_fit(_FIT_BODY, opts, namespace)
        return namespace["estimator"]

    run.__name__ = f"data_parallel_{sync_name}"
    return run


def _strategy_flag(sync: Any) -> tuple[str, type | None]:
    """The ``--sync`` value for ``sync``, and the class to ship when it is one (checked now)."""
    if isinstance(sync, str):
        return sync, None
    if not isinstance(sync, type):
        raise TypeError(f"data_parallel(sync=...) takes a strategy name or a SyncStrategy "
                        f"subclass, got {type(sync).__name__} {sync!r}")
    from .fit.run._fit_options import STRATEGIES
    from .fit.run._strategy import notebook_strategy

    taken = ("estimator", "X", "y", *STRATEGIES)  # the cell's own names and the built-in ones
    name = sync.__name__ if sync.__name__ not in taken else "sync_strategy"
    notebook_strategy(name, {name: sync})  # a class that is no SyncStrategy is refused here
    return name, sync
