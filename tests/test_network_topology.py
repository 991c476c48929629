"""Network shape: training order, upstream sets, names, drawing edges."""

import numpy as np
import pytest
from phalanx.network import NetworkError, machine, node, source
from phalanx.network._topology import Network, operation_closure
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor


@pytest.fixture
def blend():
    X, y = source(np.ones((6, 3)), name="X"), source(np.arange(6.0), name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    pca = machine(PCA(2), W, name="pca")
    Z = pca.transform(W)
    ridge = machine(Ridge(), Z, y, name="ridge")
    tree = machine(DecisionTreeRegressor(), Z, y, name="tree")
    yhat = node(lambda a, b: (a + b) / 2, ridge.predict(Z), tree.predict(Z), name="yhat")
    return dict(X=X, y=y, stand=stand, pca=pca, ridge=ridge, tree=tree, yhat=yhat)


def test_training_order_and_upstream(blend):
    net = Network([blend["yhat"]])
    assert [m.name for m in net.machines] == ["stand", "pca", "ridge", "tree"]
    assert net.upstream[blend["tree"]] == [blend["pca"], blend["stand"]]
    assert net.upstream[blend["stand"]] == []
    assert [s.name for s in net.data_sources[blend["ridge"]]] == ["X", "y"]
    assert [s.name for s in net.data_sources[blend["pca"]]] == ["X"]
    assert net.downstream(blend["pca"]) == [blend["ridge"], blend["tree"]]


def test_a_machine_target_covers_only_its_own_upstream(blend):
    net = Network([blend["ridge"]])
    assert [m.name for m in net.machines] == ["stand", "pca", "ridge"]


def test_origins_exclude_training_edges(blend):
    assert [s.name for s in blend["yhat"].origins] == ["X"]
    closure = operation_closure([blend["yhat"]])
    assert sorted(m.name for m in closure.machines) == ["pca", "ridge", "stand", "tree"]


def test_default_names_are_estimator_classes_made_unique_and_stay_pinned():
    X, y = source(np.ones((4, 2))), source(np.arange(4.0))
    a, b = machine(Ridge(), X, y), machine(Ridge(), X, y)
    c = machine(Ridge(), X, y, name="Ridge3")
    net = Network([a.predict(X) + b.predict(X) + c.predict(X)])
    assert [m.name for m in net.machines] == ["Ridge", "Ridge2", "Ridge3"]
    assert [s.name for s in net.sources] == ["source", "source2"]
    assert [s.name for s in net.statics] == ["add", "add2"]
    # Pinned: a network holding only the second machine still calls it Ridge2.
    assert [m.name for m in Network([b]).machines] == ["Ridge2"]


def test_two_parts_with_the_same_given_name_are_an_error():
    X, y = source(np.ones((4, 2)), name="data"), source(np.arange(4.0))
    r = machine(Ridge(), X, y, name="data")
    with pytest.raises(NetworkError, match="two parts of this network are named 'data'"):
        Network([r.predict(X)])


def test_drawing_edges_fold_operations_into_machines(blend):
    edges = Network([blend["yhat"]]).edges()
    assert set(edges) == {("X", "stand"), ("stand", "pca"), ("pca", "ridge"), ("y", "ridge"),
                          ("pca", "tree"), ("y", "tree"), ("ridge", "yhat"), ("tree", "yhat")}


def test_operation_on_other_data_adds_its_producer_edge(blend):
    X_test = source(np.ones((2, 3)), name="X_test")
    out = blend["ridge"].predict(blend["pca"].transform(blend["stand"].transform(X_test)))
    edges = Network([out]).edges()
    assert ("X_test", "stand") in edges and ("X", "stand") in edges
