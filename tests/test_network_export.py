"""A network packaged as a scikit-learn estimator: sklearn's own checks, and smart
retraining across ``fit`` calls (a blend weight refits nothing learned)."""

import pickle

import numpy as np
import pytest
from phalanx.network import NetworkEstimator, machine, node
from sklearn.base import ClassifierMixin, RegressorMixin, clone
from sklearn.datasets import load_diabetes, load_iris
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor
from sklearn.utils.estimator_checks import parametrize_with_checks


def blend(a, b, weight):
    return weight * a + (1.0 - weight) * b


class BlendedRegressor(RegressorMixin, NetworkEstimator):
    """Scaler -> (ridge, tree) -> weighted blend."""

    def __init__(self, scaler=None, ridge=None, tree=None, weight=0.5):
        self.scaler, self.ridge, self.tree, self.weight = scaler, ridge, tree, weight

    def network(self, X, y):
        scaler = machine(_or(self.scaler, StandardScaler()), X, name="scaler")
        W = scaler.transform(X)
        ridge = machine(_or(self.ridge, Ridge()), W, y, name="ridge")
        tree = machine(_or(self.tree, DecisionTreeRegressor(random_state=0)), W, y, name="tree")
        return node(blend, ridge.predict(W), tree.predict(W), self.weight, name="blend")


class BlendedClassifier(ClassifierMixin, NetworkEstimator):
    """Probabilities of two classifiers blended; predict is the most probable class."""

    outputs = ("predict", "predict_proba")

    def __init__(self, logistic=None, tree=None, weight=0.5):
        self.logistic, self.tree, self.weight = logistic, tree, weight

    def network(self, X, y):
        lr = machine(_or(self.logistic, LogisticRegression()), X, y, name="logistic")
        tree = machine(_or(self.tree, DecisionTreeClassifier(random_state=0)), X, y, name="tree")
        proba = node(blend, lr.predict_proba(X), tree.predict_proba(X), self.weight,
                     name="proba")
        return {"predict_proba": proba,
                "predict": node(_argmax_label, proba, self.classes_, name="label")}


class LogTarget(RegressorMixin, NetworkEstimator):
    """Optionally log-transformed features: the structure of the network depends on a setting."""

    def __init__(self, log_features=False):
        self.log_features = log_features

    def network(self, X, y):
        feats = node(_log_abs, X, name="feats") if self.log_features else X
        return machine(Ridge(), feats, y, name="ridge").predict(feats)


def _log_abs(X):
    return np.log1p(np.abs(X))


def _argmax_label(proba, classes):
    return classes[np.argmax(proba, axis=1)]


def _or(value, default):
    return default if value is None else value


def regressor():
    return BlendedRegressor(StandardScaler(), Ridge(), DecisionTreeRegressor(random_state=0))


@parametrize_with_checks([regressor(), BlendedClassifier(LogisticRegression(max_iter=500),
                                                DecisionTreeClassifier(random_state=0))])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.fixture(scope="module")
def diabetes():
    return load_diabetes(return_X_y=True)


def reference(X, y, weight=0.5, depth=None, alpha=1.0):
    s = StandardScaler().fit(X)
    W = s.transform(X)
    r = Ridge(alpha=alpha).fit(W, y)
    t = DecisionTreeRegressor(max_depth=depth, random_state=0).fit(W, y)
    return lambda Xn: blend(r.predict(s.transform(Xn)), t.predict(s.transform(Xn)), weight)


def test_blend_weight_refits_nothing_learned(diabetes):
    X, y = diabetes
    est = regressor().fit(X, y)
    assert est.fit_log_.actions == {"scaler": "fit", "ridge": "fit", "tree": "fit"}
    fitted_tree = est.network_["predict"].args[1].machine.fitted
    est.set_params(weight=0.2).fit(X, y)
    assert est.fit_log_.actions == {"scaler": "skip", "ridge": "skip", "tree": "skip"}
    assert est.network_["predict"].args[1].machine.fitted is fitted_tree
    np.testing.assert_allclose(est.predict(X[:50]), reference(X, y, weight=0.2)(X[:50]))


def test_component_params_retrain_only_that_component(diabetes):
    X, y = diabetes
    est = regressor().fit(X, y)
    assert est.get_params()["tree__max_depth"] is None
    est.set_params(tree__max_depth=3).fit(X, y)
    assert est.fit_log_.actions == {"scaler": "skip", "ridge": "skip", "tree": "fit"}
    est.set_params(ridge__alpha=10.0).fit(X, y)
    assert est.fit_log_.actions == {"scaler": "skip", "ridge": "fit", "tree": "skip"}
    np.testing.assert_allclose(est.predict(X), reference(X, y, depth=3, alpha=10.0)(X))
    assert est.fit(X[:300], y[:300]).fit_log_.actions == {
        "scaler": "fit", "ridge": "fit", "tree": "fit"}


def test_a_setting_that_changes_the_graph_retrains_what_it_feeds(diabetes):
    X, y = diabetes
    est = LogTarget().fit(X, y)
    est.set_params(log_features=True).fit(X, y)
    assert est.fit_log_.reasons == {"ridge": "its training graph changed"}
    np.testing.assert_allclose(est.predict(X), Ridge().fit(_log_abs(X), y).predict(_log_abs(X)))
    assert est.fit(X, y).fit_log_.actions == {"ridge": "skip"}


def test_clone_is_unfitted_and_components_stay_unfitted(diabetes):
    X, y = diabetes
    est = regressor().fit(X, y)
    assert not hasattr(est.ridge, "coef_")          # the component itself is never fitted
    copy = clone(est)
    assert not hasattr(copy, "network_") and copy.get_params()["ridge__alpha"] == 1.0
    assert copy.fit(X, y).fit_log_.actions == {"scaler": "fit", "ridge": "fit", "tree": "fit"}


def test_pickle_round_trip_predicts_the_same_and_keeps_smart_retraining(diabetes):
    X, y = diabetes
    est = regressor().fit(X, y)
    blob = pickle.dumps(est)
    assert X[:20].tobytes() not in blob   # training data is not saved with the model
    assert est._sources[0].data is not None  # ...nor removed from the live estimator
    back = pickle.loads(blob)
    np.testing.assert_allclose(back.predict(X), est.predict(X))
    assert back._sources[0] in back.network_["predict"].origins   # still one network
    assert back.fit(X, y).fit_log_.actions == {"scaler": "skip", "ridge": "skip", "tree": "skip"}


def test_works_inside_grid_search(diabetes):
    X, y = diabetes
    search = GridSearchCV(regressor(), {"weight": [0.0, 1.0]}, cv=2).fit(X, y)
    ridge_only = reference(X, y, weight=1.0)(X)
    tree_only = reference(X, y, weight=0.0)(X)
    expected = ridge_only if search.best_params_["weight"] == 1.0 else tree_only
    np.testing.assert_allclose(search.predict(X), expected)


def test_classifier_with_several_outputs():
    X, y = load_iris(return_X_y=True)
    est = BlendedClassifier(LogisticRegression(max_iter=500),
                            DecisionTreeClassifier(max_depth=2, random_state=0)).fit(X, y)
    lr = LogisticRegression(max_iter=500).fit(X, y)
    tree = DecisionTreeClassifier(max_depth=2, random_state=0).fit(X, y)
    proba = 0.5 * lr.predict_proba(X) + 0.5 * tree.predict_proba(X)
    np.testing.assert_allclose(est.predict_proba(X), proba)
    np.testing.assert_array_equal(est.predict(X), np.argmax(proba, axis=1))
    assert est.set_params(weight=0.9).fit(X, y).fit_log_.actions == {
        "logistic": "skip", "tree": "skip"}
    assert not hasattr(est, "transform") and not hasattr(regressor(), "predict_proba")


def test_a_failing_component_raises_its_own_error_naming_the_machine(diabetes):
    X, y = diabetes
    est = regressor().set_params(ridge__alpha=-1.0)
    with pytest.raises(ValueError) as err:
        est.fit(X, y)
    assert "machine 'ridge' failed to fit" in str(err.value.__cause__)
