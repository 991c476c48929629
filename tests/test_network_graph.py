"""Building networks and calling nodes; bad input fails early and names the node."""

import threading

import numpy as np
import pytest
from phalanx.network import Machine, NetworkError, Node, Source, machine, node, source
from sklearn.decomposition import PCA
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import StandardScaler


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(30, 4)), rng.normal(size=30)


def test_estimator_lacking_the_method_fails_when_the_node_is_built(data):
    X = source(data[0], name="X")
    pca = machine(PCA(2), X, name="pca")
    with pytest.raises(NetworkError, match="machine 'pca': PCA has no method 'predict'"):
        pca.predict(X)


def test_replacing_the_model_by_one_lacking_a_used_method_is_refused(data):
    X = source(data[0])
    m = machine(StandardScaler(), X, name="stand")
    m.transform(X)
    with pytest.raises(NetworkError, match="machine 'stand': Ridge has no method 'transform'"):
        m.model = Ridge()
    assert isinstance(m.model, StandardScaler)


def test_model_without_fit_is_refused():
    with pytest.raises(NetworkError, match="object has no fit method"):
        machine(object(), source([1]))


def test_unshippable_lambda_static_node_names_the_node(data):
    lock = threading.Lock()
    X = source(data[0])
    with pytest.raises(NetworkError) as err:
        node(lambda a: (lock, a)[1], X, name="locked")
    msg = str(err.value)
    assert msg.startswith("static node 'locked' (defined at ")
    assert "test_network_graph.py" in msg and "cannot be shipped to engines" in msg
    assert "lock" in msg


def test_arithmetic_builds_static_nodes(data):
    X, y = source(data[0], name="X"), source(data[1], name="y")
    a = machine(LinearRegression(), X, y, name="a").predict(X)
    b = machine(Ridge(alpha=10.0), X, y, name="b").predict(X)
    combo = (2 * a - b / 4 + 1) ** 2 - (-a)
    assert isinstance(combo, Node) and combo.kind == "static"
    combo.fit()
    pa = LinearRegression().fit(*data).predict(data[0])
    pb = Ridge(alpha=10.0).fit(*data).predict(data[0])
    np.testing.assert_allclose(combo(), (2 * pa - pb / 4 + 1) ** 2 + pa)


def test_calling_on_training_data_rows_and_new_data(data):
    X, y = source(data[0], name="X"), source(data[1], name="y")
    r = machine(Ridge(), X, y, name="r")
    yhat = r.predict(X)
    yhat.fit()
    ref = Ridge().fit(*data)
    np.testing.assert_allclose(yhat(), ref.predict(data[0]))
    np.testing.assert_allclose(yhat(rows=[3, 1]), ref.predict(data[0][[3, 1]]))
    X_new = np.ones((2, 4))
    np.testing.assert_allclose(yhat(X_new), ref.predict(X_new))


def test_new_data_on_a_network_with_several_origins_lists_them(data):
    X, X2, y = source(data[0], name="X"), source(data[0] + 1, name="X2"), source(data[1])
    r = machine(Ridge(), X, y, name="r")
    both = node(np.add, r.predict(X), r.predict(X2), name="both")
    both.fit()
    with pytest.raises(NetworkError, match=r"'both'\(X_new\) needs a network with exactly one "
                                           r"origin; it has 2: 'X', 'X2'"):
        both(np.ones((2, 4)))
    np.testing.assert_allclose(both(rows=[0]), r.fitted.predict(data[0][:1]) * 2 +
                               r.fitted.coef_.sum())


def test_calling_before_fitting_names_the_untrained_machine(data):
    X, y = source(data[0], name="X"), source(data[1])
    yhat = machine(Ridge(), X, y, name="r").predict(X)
    with pytest.raises(NetworkError, match="machine 'r' is not trained yet"):
        yhat()


def test_sources_rebind_and_select_rows():
    s = source(np.arange(5), name="s")
    assert isinstance(s, Source) and s.name == "s"
    np.testing.assert_array_equal(s(rows=[4, 0]), [4, 0])
    s.rebind(np.arange(3))
    np.testing.assert_array_equal(s(), [0, 1, 2])
    assert s("new") == "new"


def test_plain_data_as_training_argument_becomes_a_source(data):
    m = machine(Ridge(), data[0], data[1], name="r")
    assert isinstance(m, Machine) and all(isinstance(a, Source) for a in m.args)
    m.fit()
    # An operation on plain data (no node involved) returns the value directly.
    np.testing.assert_allclose(m.predict(data[0][:2]), Ridge().fit(*data).predict(data[0][:2]))


def test_model_is_never_fitted_in_place(data):
    X, y = source(data[0]), source(data[1])
    model = Ridge()
    m = machine(model, X, y)
    m.fit()
    assert not hasattr(model, "coef_") and hasattr(m.fitted, "coef_") and m.fitted is not model


def test_repr_mentions_name_and_state(data):
    m = machine(Ridge(), source(data[0]), source(data[1]), name="r")
    assert repr(m) == "<Machine 'r' Ridge fresh>"
    assert repr(m.predict(m.args[0])) == "<Node 'r.predict(...)'>"
