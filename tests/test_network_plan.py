"""Fit plans: decisions for a whole network, upstream first, before anything runs."""

import numpy as np
import pytest
from phalanx.network import NetworkError, machine, source
from phalanx.network._plan import make_plan
from phalanx.network._topology import Network
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge


def small():
    rng = np.random.default_rng(1)
    X, y = source(rng.normal(size=(20, 4)), name="X"), source(rng.normal(size=20), name="y")
    pca = machine(PCA(2), X, name="pca")
    Z = pca.transform(X)
    ridge = machine(Ridge(), Z, y, name="ridge")
    return X, y, pca, ridge, ridge.predict(Z)


def actions(plan):
    return {s.name: (s.action, s.reason) for s in plan.steps}


def test_fresh_network_plans_full_fit_in_order():
    *_, out = small()
    plan = make_plan(Network([out]))
    assert actions(plan) == {"pca": ("fit", "never trained"), "ridge": ("fit", "never trained")}
    assert [s.name for s in plan.to_run] == ["pca", "ridge"]


def test_downstream_of_a_planned_fit_is_planned_too():
    X, y, pca, ridge, out = small()
    out.fit()
    pca.model.set_params(n_components=3)
    assert actions(make_plan(Network([out]))) == {
        "pca": ("fit", "hyperparameters changed: n_components"),
        "ridge": ("fit", "upstream 'pca' refits")}


def test_source_change_reaches_only_machines_depending_on_it():
    X, y, pca, ridge, out = small()
    out.fit()
    y.rebind(y.data[::-1].copy())
    assert actions(make_plan(Network([out]))) == {
        "pca": ("skip", "up to date"), "ridge": ("fit", "data of source 'y' changed")}


def test_sources_of_different_lengths_name_both_nodes_and_lengths():
    X, y, pca, ridge, out = small()
    y.rebind(np.zeros(15))
    with pytest.raises(NetworkError) as err:
        make_plan(Network([out]))
    assert str(err.value) == ("machine 'ridge': its training data comes from sources of "
                              "different lengths: 'X' has 20 rows, 'y' has 15 rows")


def test_preview_ignores_rows_and_lengths():
    X, y, pca, ridge, out = small()
    out.fit(rows=np.arange(10))
    y.rebind(np.zeros(15))  # would be an error for a real fit
    plan = make_plan(Network([out]), preview=True)
    assert actions(plan)["pca"] == ("skip", "up to date")
    assert actions(plan)["ridge"] == ("fit", "data of source 'y' changed")


def test_plan_records_what_the_fit_depends_on():
    X, y, pca, ridge, out = small()
    step = make_plan(Network([out]), rows=[0, 1, 2]).step(ridge)
    assert set(step.record.data) == {X.uid, y.uid}
    assert step.record.upstream == {pca.uid: 0}
    assert step.record.model_type == "sklearn.linear_model._ridge.Ridge"
    assert step.record.rows != "all"


def test_training_structure_ignores_node_identity_but_not_functions_or_constants():
    from phalanx.network import node
    from phalanx.network._plan import training_structure

    X, y = source(np.ones((4, 2)), name="X"), source(np.arange(4.0), name="y")
    weights = np.array([1.0, 2.0])

    def build(fn, w):
        return machine(Ridge(), node(fn, X, w), y, name="r")

    a, b = build(np.multiply, weights), build(np.multiply, weights)
    assert training_structure(a) == training_structure(b)
    assert training_structure(a) != training_structure(build(np.add, weights))
    before = training_structure(a)
    weights[0] = 5.0   # a constant argument mutated in place
    assert training_structure(a) != before


def test_mutated_constant_argument_retrains_its_consumer():
    from phalanx.network import node

    rng = np.random.default_rng(3)
    Xd, yd = rng.normal(size=(20, 2)), rng.normal(size=20)
    X, y = source(Xd, name="X"), source(yd, name="y")
    weights = np.array([1.0, 2.0])
    r = machine(Ridge(), node(np.multiply, X, weights, name="scaled"), y, name="r")
    r.fit()
    weights[1] = -1.0
    assert r.fit().reasons == {"r": "its training graph changed"}
    np.testing.assert_allclose(r.fitted.coef_, Ridge().fit(Xd * weights, yd).coef_)
