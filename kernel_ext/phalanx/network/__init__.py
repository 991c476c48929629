"""Learning networks: DAGs of models that retrain only what changed, on the cluster in parallel.

Wire scikit-learn-style models into a graph with :func:`source`, :func:`machine` and
:func:`node`; ``fit`` a node and every machine it depends on trains, or is skipped when
nothing relevant changed; ``fit(cluster=...)`` runs independent branches at the same time on
the ipyparallel engines through dask.

Example::

    >>> import numpy as np
    >>> from sklearn.decomposition import PCA
    >>> from sklearn.linear_model import Ridge
    >>> from sklearn.tree import DecisionTreeRegressor
    >>> rng = np.random.default_rng(0)
    >>> X, y = source(rng.normal(size=(40, 5)), name="X"), source(rng.normal(size=40), name="y")
    >>> pca = machine(PCA(3), X, name="pca");                Z = pca.transform(X)
    >>> ridge = machine(Ridge(), Z, y, name="ridge")
    >>> tree = machine(DecisionTreeRegressor(), Z, y, name="tree")
    >>> yhat = 0.5 * ridge.predict(Z) + 0.5 * tree.predict(Z)
    >>> yhat.fit().actions
    {'pca': 'fit', 'ridge': 'fit', 'tree': 'fit'}
    >>> tree.model.set_params(max_depth=3); yhat.fit().actions
    DecisionTreeRegressor(max_depth=3)
    {'pca': 'skip', 'ridge': 'skip', 'tree': 'fit'}
"""

from typing import Any

from . import _drawing as _display, _upper_layers as _hooks, _scheduler
from ._dask import dask_client, stop_dask
from ._errors import MachineFitError, NetworkError
from ._events import network_event
from ._fitlog import FitLog
from ._build import machine, node, source
from ._graph import Machine, Node, Source

# Nodes and machines fit, compute and draw themselves through the layers built on them; they
# find those layers here rather than importing them (see ._hooks).
_hooks.install(_hooks.Hooks(fit=_scheduler.fit_network, evaluate=_scheduler.evaluate,
                            draw=_display.network_html))

__all__ = [
    "FitLog",
    "Machine",
    "MachineFitError",
    "NetworkError",
    "NetworkEstimator",
    "Node",
    "Source",
    "dask_client",
    "machine",
    "network_event",
    "node",
    "source",
    "stop_dask",
]


def __getattr__(name: str) -> Any:
    # NetworkEstimator needs scikit-learn at import; load it only when asked for, so that
    # importing phalanx.network (e.g. at %load_ext) stays cheap.
    if name == "NetworkEstimator":
        from ._export import NetworkEstimator

        return NetworkEstimator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
