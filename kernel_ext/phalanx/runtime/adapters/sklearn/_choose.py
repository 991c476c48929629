"""Which rule merges an estimator: the registry by class, :func:`merge_rule`, and the
meta-estimators' rule, which chooses one for each inner estimator in turn."""

from __future__ import annotations

import functools
from typing import Any, Callable

from ._fitted import _fitted_items, _is_fitted, _unique, is_incremental_estimator
from ._naive_bayes import _CategoricalNB, _CountNB, _GaussianNB
from ._merge_rules import _Averaged, _Local, _RBMAveraged, _Rule, _SGDAveraged, _Stateless, _Warned
from ._scalers import _MaxAbsScaler, _MinMaxScaler, _StandardScaler


def _children(est: Any) -> list[tuple[str, Any]]:
    """Fitted inner estimators with ``partial_fit`` (``estimators_[3]``, ``estimator_``)."""
    return [(label, value) for label, value in _fitted_items(est)
            if is_incremental_estimator(value)]


class _Composite(_Rule):
    """Meta-estimators: the inner estimators' ``partial_fit`` calls run inside the outer one,
    which alone synchronises; then each fitted inner estimator is merged by its own rule.  The
    averaged inner arrays share the outer estimator's strategy."""

    kind = "composite"
    check_every_call = True  # inner estimators fitted on some ranks only would block a merge

    def __init__(self, estimator: Any) -> None:
        super().__init__(estimator)
        self.rules: dict[str, tuple[type, _Rule]] = {}
        self.prepared: set[str] = set()

    def _rule(self, path: str, child: Any) -> _Rule:
        known = self.rules.get(path)
        if known is None or known[0] is not type(child):
            known = self.rules[path] = (type(child), _choose_rule(child))
        return known[1]

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        self.prepared = set()
        for path, child in _children(est):
            self._rule(path, child).before(child, (), {})  # its arguments are the outer call's
            self.prepared.add(path)

    def restore(self, est: Any) -> None:
        for path, child in _children(est):
            if path in self.prepared:
                self._rule(path, child).restore(child)

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        for path, child in _children(est):
            self._rule(path, child).merge(child, comm, rebase and path in self.prepared)
        self.prepared = set()

    def averaged(self, est: Any) -> list[Any]:
        return _unique([a for path, child in _children(est)
                        for a in self._rule(path, child).averaged(child)])

    def signature(self, est: Any) -> str:
        return ";".join(f"{path}={type(child).__qualname__}:{_is_fitted(child)}:"
                        f"{self._rule(path, child).signature(child)}"
                        for path, child in _children(est))

    def warnings(self) -> list[str]:
        return [f"inside {self.cls_name}: {message}"
                for _, rule in self.rules.values() for message in rule.warnings()]


_CLUSTERS = ("clusters found on one rank need not line up with those of another (centre k on "
             "rank 0 can match centre j on rank 1), so averaged centres can fall between clusters")
_SUBSPACE = ("components are defined up to sign and order and each rank's come from its own "
             "data, so averaging them need not give the components of the whole data")
_WARNED: dict[str, tuple[str, str]] = {
    "sklearn.cluster._kmeans.MiniBatchKMeans": (_CLUSTERS, "cluster_centers_"),
    "sklearn.decomposition._incremental_pca.IncrementalPCA": (
        _SUBSPACE, "components_, mean_, var_, singular_values_ and explained_variance*_"),
    "sklearn.decomposition._dict_learning.MiniBatchDictionaryLearning": (_SUBSPACE, "components_"),
    "sklearn.decomposition._nmf.MiniBatchNMF": (_SUBSPACE, "components_"),
    "sklearn.decomposition._lda.LatentDirichletAllocation": (
        "topics found on one rank need not line up with another rank's", "components_"),
}
_RULES: dict[str, Callable[[Any], _Rule]] = {
    "sklearn.naive_bayes.MultinomialNB": _CountNB,
    "sklearn.naive_bayes.BernoulliNB": _CountNB,
    "sklearn.naive_bayes.ComplementNB": _CountNB,
    "sklearn.naive_bayes.CategoricalNB": _CategoricalNB,
    "sklearn.naive_bayes.GaussianNB": _GaussianNB,
    "sklearn.preprocessing._data.StandardScaler": _StandardScaler,
    "sklearn.preprocessing._data.MinMaxScaler": _MinMaxScaler,
    "sklearn.preprocessing._data.MaxAbsScaler": _MaxAbsScaler,
    "sklearn.linear_model._stochastic_gradient.BaseSGD": _SGDAveraged,
    "sklearn.neural_network._multilayer_perceptron.BaseMultilayerPerceptron": _Averaged,
    "sklearn.neural_network._rbm.BernoulliRBM": _RBMAveraged,
    "sklearn.multiclass.OneVsRestClassifier": _Composite,
    "sklearn.multiclass.OneVsOneClassifier": functools.partial(
        _Local, why="a pair of classes absent from one rank's batch leaves that pair's "
                    "estimator unfitted there while other ranks fit theirs (use "
                    "OneVsRestClassifier, whose inner estimators are merged)"),
    "sklearn.multioutput._MultiOutputEstimator": _Composite,
    "sklearn.feature_selection._from_model.SelectFromModel": _Composite,
    "sklearn.feature_extraction.text.HashingVectorizer": _Stateless,
    "sklearn.cluster._birch.Birch": functools.partial(
        _Local, why="its state (a tree of subclusters) differs in shape from rank to rank"),
    **{name: functools.partial(_Warned, reason=reason, attrs=attrs)
       for name, (reason, attrs) in _WARNED.items()},
}


def _choose_rule(estimator: Any) -> _Rule:
    """The rule of the most specific class in the estimator's MRO that has one (same on every
    rank: it depends on the class only); unknown estimators are averaged with a warning."""
    for klass in type(estimator).__mro__:
        factory = _RULES.get(f"{klass.__module__}.{klass.__qualname__}")
        if factory is not None:
            return factory(estimator)
    return _Warned(estimator)


def merge_rule(estimator: Any) -> str:
    """How ``partial_fit`` of ``estimator`` is merged across ranks: ``"exact"``,
    ``"averaged"``, ``"composite"``, ``"warned"``, ``"local"`` or ``"stateless"``.

    Example::

        >>> from sklearn.linear_model import SGDClassifier
        >>> merge_rule(SGDClassifier())
        'averaged'
    """
    return _choose_rule(estimator).kind
