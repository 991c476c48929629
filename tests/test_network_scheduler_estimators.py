"""Smart retraining when a machine's estimator changes: replaced by another type, its dict and
array hyperparameters mutated in place, warm-started updates that continue the previous fit,
and a fit runner that replaces the default fit; results equal scikit-learn's own."""

import numpy as np
import pytest
from phalanx.network import MachineFitError, machine, node, source
from sklearn.base import BaseEstimator
from sklearn.datasets import load_diabetes
from sklearn.ensemble import GradientBoostingRegressor
from sklearn.linear_model import Lasso, Ridge
from sklearn.preprocessing import FunctionTransformer, StandardScaler


def test_estimator_replaced_by_another_type():
    Xd, yd = load_diabetes(return_X_y=True)
    X, y = source(Xd), source(yd)
    m = machine(Ridge(), X, y, name="lin")
    out = m.predict(X)
    out.fit()
    m.model = Ridge()
    assert out.fit().actions == {"lin": "skip"}
    m.model = Lasso(alpha=0.1)
    log = out.fit()
    assert log.actions == {"lin": "fit"}
    assert log.reasons["lin"].startswith("estimator replaced: sklearn.linear_model._ridge.Ridge")
    np.testing.assert_allclose(out(), Lasso(alpha=0.1).fit(Xd, yd).predict(Xd))


def scale_columns(X, w):
    return X * w


def test_dict_and_array_hyperparameters_mutated_in_place():
    Xd, yd = load_diabetes(return_X_y=True)
    weights = np.ones(Xd.shape[1])
    X, y = source(Xd, name="X"), source(yd, name="y")
    scale = machine(FunctionTransformer(scale_columns, kw_args={"w": weights}), X, name="scale")
    ridge = machine(Ridge(), scale.transform(X), y, name="ridge")
    out = ridge.predict(scale.transform(X))
    out.fit()
    weights[0] = 3.0                                  # array inside a dict, in place
    assert out.fit().actions == {"scale": "fit", "ridge": "fit"}
    scale.model.kw_args["w"] = weights * 2           # the dict itself, in place
    assert out.fit().actions == {"scale": "fit", "ridge": "fit"}
    np.testing.assert_allclose(out(), Ridge().fit(Xd * weights * 2, yd).predict(Xd * weights * 2))
    scale.model.kw_args["w"] = (weights * 2).copy()  # equal value, new object
    assert out.fit().actions == {"scale": "skip", "ridge": "skip"}


class Rounds(BaseEstimator):
    """A warm-startable booster-like model that records how many rounds each fit trained."""

    def __init__(self, n_estimators=10, warm_start=True):
        self.n_estimators, self.warm_start = n_estimators, warm_start

    def fit(self, X, y):
        if not (self.warm_start and hasattr(self, "history_")):
            self.history_, self.total_ = [], 0
        self.history_ = [*self.history_, self.n_estimators - self.total_]
        self.total_ = self.n_estimators
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_ + self.total_)


def test_warm_update_continues_from_the_previous_fit():
    Xd, yd = load_diabetes(return_X_y=True)
    X, y = source(Xd, name="X"), source(yd, name="y")
    boost = machine(Rounds(10), X, y, name="boost")
    feature = node(np.reshape, boost.predict(X), (-1, 1), name="feature")
    stack = machine(Ridge(), feature, y, name="stack")
    out = stack.predict(feature)
    out.fit()
    first = boost.fitted
    boost.model.set_params(n_estimators=25)
    log = out.fit()
    assert log.actions == {"boost": "update", "stack": "fit"}
    assert log.reasons == {"boost": "warm start: n_estimators 10 -> 25",
                           "stack": "upstream 'boost' refits"}
    assert boost.fitted.history_ == [10, 15]    # 15 more rounds, not 25 from scratch
    assert first.history_ == [10]               # the previous fit was copied, not changed
    boost.model.set_params(n_estimators=15)     # shrinking cannot continue warm
    assert out.fit().actions == {"boost": "fit", "stack": "fit"}
    assert boost.fitted.history_ == [15]
    boost.model.set_params(n_estimators=30, warm_start=False)
    assert out.fit().actions == {"boost": "fit", "stack": "fit"}


def test_warm_update_of_sklearn_gradient_boosting_matches_sklearn():
    Xd, yd = load_diabetes(return_X_y=True)
    X, y = source(Xd, name="X"), source(yd, name="y")
    boost = machine(GradientBoostingRegressor(n_estimators=10, warm_start=True,
                                              random_state=0), X, y, name="boost")
    out = boost.predict(X)
    out.fit()
    boost.model.set_params(n_estimators=20)
    assert out.fit().actions == {"boost": "update"}
    warm = GradientBoostingRegressor(n_estimators=10, warm_start=True, random_state=0)
    warm.fit(Xd, yd).set_params(n_estimators=20).fit(Xd, yd)
    assert boost.fitted.n_estimators_ == 20
    np.testing.assert_allclose(out(), warm.predict(Xd))


def test_fit_runner_replaces_the_default_fit_and_keeps_smart_retraining():
    Xd, yd = load_diabetes(return_X_y=True)
    calls = []

    def runner(estimator, X, y, cluster=None):
        calls.append((type(estimator).__name__, X.shape, cluster))
        if getattr(estimator, "alpha", 0) < 0:
            raise RuntimeError("gang lost a rank")
        return estimator.fit(X, y)

    X, y = source(Xd, name="X"), source(yd, name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    dp = machine(Ridge(), W, y, name="dp", fit_runner=runner)
    out = dp.predict(W)
    assert out.fit().actions == {"stand": "fit", "dp": "fit"}
    assert calls == [("Ridge", Xd.shape, None)]
    assert out.fit().actions == {"stand": "skip", "dp": "skip"} and len(calls) == 1
    dp.model.set_params(alpha=-1.0)
    with pytest.raises(MachineFitError, match="machine 'dp' failed to fit: RuntimeError: gang"):
        out.fit()
    dp.model.set_params(alpha=2.0)
    assert out.fit().actions == {"stand": "skip", "dp": "fit"}
    ref = Ridge(alpha=2.0).fit(StandardScaler().fit_transform(Xd), yd)
    np.testing.assert_allclose(out(), ref.predict(StandardScaler().fit_transform(Xd)))
