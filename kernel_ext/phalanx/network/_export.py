"""A learning network packaged as a scikit-learn estimator.

Subclass :class:`NetworkEstimator` (after sklearn's ``RegressorMixin`` or
``ClassifierMixin``), take components and plain settings as ``__init__`` parameters, and
build the network from sources in :meth:`NetworkEstimator.network`.  Refitting rebuilds the
network and hands each new machine the fit state of the machine of the same name, so smart
retraining carries across ``fit`` calls: changing a blend weight refits nothing learned.

Example::

    >>> from sklearn.base import RegressorMixin
    >>> from sklearn.linear_model import Ridge
    >>> class Scaled(RegressorMixin, NetworkEstimator):
    ...     def __init__(self, ridge=None, scale=1.0):
    ...         self.ridge, self.scale = ridge, scale
    ...     def network(self, X, y):
    ...         r = machine(self.ridge or Ridge(), X, y, name="ridge")
    ...         return self.scale * r.predict(X)
    >>> import numpy as np
    >>> X, y = np.arange(10.0).reshape(5, 2), np.arange(5.0)
    >>> est = Scaled(Ridge()).fit(X, y)
    >>> est.set_params(scale=2.0).fit(X, y).fit_log_.actions
    {'ridge': 'skip'}
"""

from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np
from sklearn.base import BaseEstimator, is_classifier, is_regressor
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._build import machine, source  # noqa: F401 - machine: for the example
from ._errors import MachineFitError
from ._graph import Node, Source
from ._scheduler import fit_network
from ._topology import Network


class NetworkEstimator(BaseEstimator):
    """Base class for estimators whose ``fit`` trains a learning network.

    Subclasses define ``network(self, X, y)``: given the sources ``X`` and ``y`` it returns
    the node computing predictions, or a dict mapping method names (``"predict"``,
    ``"predict_proba"``, ``"transform"``...) to nodes.  ``fit(X, y, cluster=...)`` fits on a
    cluster.  After fitting, ``fit_log_`` holds the :class:`FitLog` and ``network_`` the nodes.

    ``outputs`` lists the methods the estimator offers (``predict`` by default); declare it on
    the class so scikit-learn sees the right kind of estimator before anything is fitted.
    """

    outputs: tuple[str, ...] = ("predict",)

    def network(self, X: Source, y: Source) -> Node | dict[str, Node]:
        """Build the network on sources ``X`` and ``y``; return its output node(s)."""
        raise NotImplementedError("subclasses define network(X, y)")

    def fit(self, X: Any, y: Any = None, cluster: Any = None) -> NetworkEstimator:
        """Validate the data, (re)build the network and fit it with smart retraining."""
        X, y = self._validate_fit(X, y)
        sources = getattr(self, "_sources", None)
        if sources is None:
            sources = (source(X, name="X"), source(y, name="y"))
        else:
            sources[0].rebind(X)
            sources[1].rebind(y)
        outputs = self.network(*sources)
        outputs = outputs if isinstance(outputs, dict) else {"predict": outputs}
        _adopt_state(list(outputs.values()), getattr(self, "network_", None))
        try:
            log = None
            for out in outputs.values():
                step = fit_network([out], cluster=cluster)
                log = step if log is None else log.merge(step)
        except MachineFitError as err:
            # Behave like the failing component: sklearn callers expect its exception type.
            cause = err.__cause__
            assert cause is not None   # a fit raises MachineFitError from the first failure
            raise cause from err
        self._sources, self.network_, self.fit_log_ = sources, outputs, log
        return self

    def _validate_fit(self, X: Any, y: Any) -> tuple[Any, Any]:
        X, y = validate_data(self, X, y, y_numeric=is_regressor(self), ensure_min_samples=2)
        if is_classifier(self):
            check_classification_targets(y)
            self.classes_ = np.unique(y)
        return X, y

    def _output(self, method: str, X: Any) -> Any:
        check_is_fitted(self, "network_")
        if method not in self.network_:
            raise AttributeError(f"{type(self).__name__}.network() defines no {method!r} output")
        X = validate_data(self, X, reset=False)
        return self.network_[method](X)

    @available_if(lambda self: "predict" in self.outputs)
    def predict(self, X: Any) -> Any:
        """The network's ``"predict"`` output for new data ``X``."""
        return self._output("predict", X)

    @available_if(lambda self: "predict_proba" in self.outputs)
    def predict_proba(self, X: Any) -> Any:
        """The network's ``"predict_proba"`` output for new data ``X``."""
        return self._output("predict_proba", X)

    @available_if(lambda self: "transform" in self.outputs)
    def transform(self, X: Any) -> Any:
        """The network's ``"transform"`` output for new data ``X``."""
        return self._output("transform", X)

    # The network holds closures (static nodes); cloudpickle it so the standard pickle, and
    # thus joblib and sklearn's own checks, can save a fitted estimator.  Network and sources
    # go in one blob so they stay the same objects.  Training data is dropped: new data
    # reaches the network through its origin.
    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        if "network_" in state:
            state["network_"] = _Packed((state.pop("network_"), state.pop("_sources", ())))
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state.get("network_"), _Packed):
            state["network_"], state["_sources"] = state["network_"].unpack()
        super().__setstate__(state)


class _Packed:
    """Network objects as cloudpickle bytes, sources emptied."""

    def __init__(self, obj: Any) -> None:
        saved = _empty_sources(obj)
        try:
            self.blob = cloudpickle.dumps(obj)
        finally:
            for s, data in saved:
                s.data = data

    def unpack(self) -> Any:
        """The network objects back."""
        return cloudpickle.loads(self.blob)


def _empty_sources(obj: tuple[dict, tuple]) -> list[tuple[Source, Any]]:
    outputs, sources = obj
    found = [*sources, *Network(list(outputs.values())).sources]
    saved = [(s, s.data) for s in dict.fromkeys(found)]
    for s, _ in saved:
        s.data = None
    return saved


def _adopt_state(outputs: list[Node], previous: dict | None) -> None:
    """Give each machine of the new network the state of the old machine of the same name."""
    if not previous:
        return
    old = {m.name: m for m in Network(list(previous.values())).machines}
    for m in Network(outputs).machines:
        if m.name in old:
            m._adopt(old[m.name])
