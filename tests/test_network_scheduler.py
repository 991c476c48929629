"""Smart retraining end to end, in the kernel: a blended network (scaler, PCA, then a ridge and
a tree averaged) with counting wrappers around real scikit-learn estimators, exact fit logs after
every change, failures and retries, and predictions equal to references fitted directly with
scikit-learn. How single machines react to their estimator changing is tested in
test_network_scheduler_estimators.py."""

import collections
import os

import numpy as np
import pytest
from phalanx.network import MachineFitError, NetworkError, machine, node, source
from sklearn.base import BaseEstimator, clone
from sklearn.datasets import load_diabetes
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor
from sklearn.utils.metaestimators import available_if


class Counting(BaseEstimator):
    """Wraps an estimator and appends ``tag method`` to a journal file on every call."""

    def __init__(self, estimator=None, tag="", journal="", fail=False):
        self.estimator, self.tag, self.journal, self.fail = estimator, tag, journal, fail

    def _note(self, what):
        with open(self.journal, "a") as f:
            f.write(f"{self.tag} {what} {os.getpid()}\n")

    def fit(self, X, y=None):
        self._note("fit")
        if self.fail:
            raise ValueError(f"{self.tag} refuses to fit")
        self.estimator_ = clone(self.estimator).fit(X, y)
        return self

    @available_if(lambda self: hasattr(self.estimator, "transform"))
    def transform(self, X):
        self._note("transform")
        return self.estimator_.transform(X)

    @available_if(lambda self: hasattr(self.estimator, "predict"))
    def predict(self, X):
        self._note("predict")
        return self.estimator_.predict(X)


def blend(ns):
    """The blended network, wrapped: ``ns`` gains its nodes and machines."""
    c = lambda est, tag: Counting(est, tag, ns.journal)  # noqa: E731
    ns.X, ns.y = source(ns.Xd.copy(), name="X"), source(ns.yd.copy(), name="y")
    ns.stand = machine(c(StandardScaler(), "stand"), ns.X, name="stand")
    W = ns.stand.transform(ns.X)
    ns.pca = machine(c(PCA(3), "pca"), W, name="pca")
    Z = ns.pca.transform(W)
    ns.ridge = machine(c(Ridge(), "ridge"), Z, ns.y, name="ridge")
    ns.tree = machine(c(DecisionTreeRegressor(random_state=0), "tree"), Z, ns.y, name="tree")
    ns.yhat = node(lambda a, b: 0.5 * a + 0.5 * b, ns.ridge.predict(Z), ns.tree.predict(Z),
                   name="yhat")
    return ns


class Net:
    """Holds the network under test and reads the journal of estimator calls."""

    def __init__(self, tmp_path):
        self.Xd, self.yd = load_diabetes(return_X_y=True)
        self.journal = str(tmp_path / "journal.txt")
        blend(self)

    def calls(self):
        """Calls since the last look, as a Counter of ``"tag method"``."""
        if not os.path.exists(self.journal):
            return collections.Counter()
        with open(self.journal) as f:
            lines = f.read().split("\n")
        os.remove(self.journal)
        return collections.Counter(" ".join(line.split()[:2]) for line in lines if line)


def reference(X, y, n_components=3, depth=None):
    """The blended model fitted directly with scikit-learn; returns its predict function."""
    stand = StandardScaler().fit(X)
    pca = PCA(n_components).fit(stand.transform(X))
    Z = pca.transform(stand.transform(X))
    ridge, tree = Ridge().fit(Z, y), DecisionTreeRegressor(max_depth=depth,
                                                           random_state=0).fit(Z, y)

    def predict(X_new):
        Zn = pca.transform(stand.transform(X_new))
        return 0.5 * ridge.predict(Zn) + 0.5 * tree.predict(Zn)

    return predict


ALL = ("stand", "pca", "ridge", "tree")


def only(*fitted, action="fit"):
    return {name: (action if name in fitted else "skip") for name in ALL}


@pytest.fixture
def net(tmp_path):
    n = Net(tmp_path)
    log = n.yhat.fit()
    assert log.actions == only(*ALL)
    n.calls()
    return n


def test_first_fit_trains_everything_once_and_matches_sklearn(tmp_path):
    n = Net(tmp_path)
    log = n.yhat.fit()
    assert log.actions == only(*ALL)
    assert set(log.reasons.values()) == {"never trained"}
    # Z feeds both ridge and tree but is computed once.
    assert n.calls() == {"stand fit": 1, "stand transform": 1, "pca fit": 1,
                         "pca transform": 1, "ridge fit": 1, "tree fit": 1}
    np.testing.assert_allclose(n.yhat(), reference(n.Xd, n.yd)(n.Xd))
    assert n.calls() == {"stand transform": 1, "pca transform": 1, "ridge predict": 1,
                         "tree predict": 1}
    assert all(log.times[m] > 0 for m in ALL) and log.backend == "serial"
    assert set(log.workers.values()) == {f"{os.uname().nodename}:{os.getpid()}"}


def test_refit_with_nothing_changed_computes_nothing(net):
    log = net.yhat.fit()
    assert log.actions == only()
    assert set(log.reasons.values()) == {"up to date"}
    assert net.calls() == {}


def test_tree_depth_change_retrains_only_tree(net):
    net.tree.model.set_params(estimator__max_depth=3)
    log = net.yhat.fit()
    assert log.actions == only("tree")
    assert log.reasons["tree"] == "hyperparameters changed: estimator"
    # The tree's training inputs are cached from the last fit: nothing upstream is recomputed.
    assert net.calls() == {"tree fit": 1}
    np.testing.assert_allclose(net.yhat(), reference(net.Xd, net.yd, depth=3)(net.Xd))


def test_without_cache_a_refit_recomputes_its_inputs_once(tmp_path):
    n = Net(tmp_path)
    n.ridge.cache = n.tree.cache = False
    n.yhat.fit()
    assert n.tree._inputs is None and n.pca._inputs is not None
    n.calls()
    n.ridge.model.set_params(estimator__alpha=3.0)
    n.tree.model.set_params(estimator__max_depth=3)
    assert n.yhat.fit().actions == only("ridge", "tree")
    assert n.calls() == {"stand transform": 1, "pca transform": 1, "ridge fit": 1,
                         "tree fit": 1}


def test_cached_inputs_are_not_used_once_the_data_changed(net):
    y2 = net.yd[::-1].copy()
    net.y.data[:] = y2                     # in place: same object, new content
    net.tree.model.set_params(estimator__max_depth=3)
    assert net.yhat.fit().actions == only("ridge", "tree")
    np.testing.assert_allclose(net.tree.fitted.estimator_.predict(np.zeros((1, 3))),
                               DecisionTreeRegressor(max_depth=3, random_state=0).fit(
                                   PCA(3).fit_transform(StandardScaler().fit_transform(
                                       net.Xd)), y2).predict(np.zeros((1, 3))))


def test_setting_a_value_and_setting_it_back_retrains_nothing(net):
    net.tree.model.set_params(estimator__max_depth=3)
    net.tree.model.set_params(estimator__max_depth=None)
    net.pca.model = Counting(PCA(3), "pca", net.journal)  # a new but equal estimator
    assert net.yhat.fit().actions == only()


def test_pca_components_change_retrains_pca_and_everything_downstream(net):
    net.pca.model.set_params(estimator__n_components=2)
    log = net.yhat.fit()
    assert log.actions == only("pca", "ridge", "tree")
    assert log.reasons["ridge"] == "upstream 'pca' refits"
    np.testing.assert_allclose(net.yhat(), reference(net.Xd, net.yd, n_components=2)(net.Xd))


@pytest.mark.parametrize("how", ["rebind", "in place"])
def test_replacing_y_retrains_only_its_consumers(net, how):
    y2 = net.yd * 2.0 + 1.0
    if how == "rebind":
        net.y.rebind(y2)
    else:
        net.y.data[:] = y2
    log = net.yhat.fit()
    assert log.actions == only("ridge", "tree")
    assert log.reasons["tree"] == "data of source 'y' changed"
    np.testing.assert_allclose(net.yhat(), reference(net.Xd, y2)(net.Xd))


def test_mutating_X_in_place_retrains_everything(net):
    net.X.data[0, 0] += 1.0
    log = net.yhat.fit()
    assert log.actions == only(*ALL)
    assert log.reasons["stand"] == "data of source 'X' changed"


def test_rows(net):
    train, test = np.arange(0, 300), np.arange(300, 442)
    log = net.yhat.fit(rows=train)
    assert log.actions == only(*ALL) and log.reasons["stand"] == "rows changed"
    ref = reference(net.Xd[train], net.yd[train])
    np.testing.assert_allclose(net.yhat(rows=test), ref(net.Xd[test]))
    np.testing.assert_allclose(net.yhat(), ref(net.Xd))
    assert net.yhat.fit(rows=list(train)).actions == only()   # same rows, another container
    assert net.yhat.fit().actions == only(*ALL)


def test_freeze_and_thaw(net):
    net.pca.freeze()
    net.pca.model.set_params(estimator__n_components=2)
    log = net.yhat.fit()
    assert log.actions == only() and log.reasons["pca"] == "frozen"
    net.X.data[5] += 1.0
    log = net.yhat.fit()   # pca keeps its fit, but its input moved: its consumers retrain
    assert log.actions == only("stand", "ridge", "tree")
    assert log.reasons["ridge"] == "upstream 'stand' refits"
    assert net.yhat.fit(force=True).actions == only("stand", "ridge", "tree")
    net.pca.thaw()
    assert net.yhat.fit().actions == only("pca", "ridge", "tree")
    net.X.data[5] -= 1.0
    net.yhat.fit()
    np.testing.assert_allclose(net.yhat(), reference(net.Xd, net.yd, n_components=2)(net.Xd))


def test_force_retrains_everything(net):
    log = net.yhat.fit(force=True)
    assert log.actions == only(*ALL) and set(log.reasons.values()) == {"forced"}


def test_failing_machine_keeps_its_state_and_siblings_keep_theirs(net):
    old_tree, old_ridge = net.tree.fitted, net.ridge.fitted
    y2 = net.yd + 5.0
    net.y.rebind(y2)
    net.tree.model.set_params(fail=True)
    with pytest.raises(MachineFitError) as err:
        net.yhat.fit()
    assert err.value.machines == ["tree"]
    assert str(err.value) == "machine 'tree' failed to fit: ValueError: tree refuses to fit"
    assert isinstance(err.value.__cause__, ValueError)
    assert err.value.log.actions == only("ridge", "tree") and err.value.log.ran == ["ridge"]
    assert net.tree.fitted is old_tree and net.tree.status == "failed"
    assert net.ridge.fitted is not old_ridge and net.ridge.status == "fitted"
    with pytest.raises(MachineFitError):   # retries only what failed
        net.yhat.fit()
    assert net.calls()["ridge fit"] == 1
    net.tree.model.set_params(fail=False)
    assert net.yhat.fit().actions == only("tree")
    assert net.tree.status == "fitted"
    np.testing.assert_allclose(net.yhat(), reference(net.Xd, y2)(net.Xd))


def test_failing_upstream_cancels_downstream_and_the_retry_resumes_there(net):
    net.X.data[:, 0] *= 2.0
    net.pca.model.set_params(fail=True)
    with pytest.raises(MachineFitError) as err:
        net.yhat.fit()
    assert err.value.machines == ["pca"] and err.value.cancelled == ["ridge", "tree"]
    assert "not fitted because something upstream failed: 'ridge', 'tree'" in str(err.value)
    assert net.calls() == {"stand fit": 1, "stand transform": 1, "pca fit": 1}
    net.pca.model.set_params(fail=False)
    log = net.yhat.fit()
    assert log.actions == only("pca", "ridge", "tree")
    np.testing.assert_allclose(net.yhat(), reference(net.Xd, net.yd)(net.Xd))


def test_failing_setback_is_forgiven(net):
    net.tree.model.set_params(fail=True)
    with pytest.raises(MachineFitError):
        net.yhat.fit()
    net.tree.model.set_params(fail=False)   # back to the settings of its last good fit
    assert net.yhat.fit().actions == only()
    assert net.tree.status == "fitted"


def test_machine_fit_trains_only_its_own_upstream(tmp_path):
    n = Net(tmp_path)
    log = n.ridge.fit()
    assert log.actions == {"stand": "fit", "pca": "fit", "ridge": "fit"}
    assert n.tree.fitted is None
    assert n.yhat.fit().actions == only("tree")




def test_sources_of_different_lengths_fail_before_anything_trains(tmp_path):
    n = Net(tmp_path)
    n.y.rebind(n.yd[:400])
    with pytest.raises(NetworkError, match="machine 'ridge': its training data comes from "
                                           "sources of different lengths: 'X' has 442 rows, "
                                           "'y' has 400 rows"):
        n.yhat.fit()
    assert n.calls() == {} and n.stand.fitted is None
