"""Node-state events during fits, in the schema the notebook view and the panel share."""

import contextlib

import pytest
from phalanx.events import NODE_STATES, validate_event
from phalanx.network import MachineFitError, machine, network_event, node, source
from sklearn.base import BaseEstimator
from sklearn.datasets import load_diabetes
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor


class Refusing(BaseEstimator):
    def __init__(self, fail=False):
        self.fail = fail

    def fit(self, X, y=None):
        if self.fail:
            raise ValueError("no")
        return self

    def transform(self, X):
        return X


@pytest.fixture
def net():
    Xd, yd = load_diabetes(return_X_y=True)
    X, y = source(Xd, name="X"), source(yd, name="y")
    stand = machine(StandardScaler(), X, name="stand")
    gate = machine(Refusing(), stand.transform(X), name="gate")
    W = gate.transform(stand.transform(X))
    pca = machine(PCA(3), W, name="pca")
    Z = pca.transform(W)
    ridge = machine(Ridge(), Z, y, name="ridge")
    tree = machine(DecisionTreeRegressor(random_state=0), Z, y, name="tree")
    yhat = node(lambda a, b: 0.5 * a + 0.5 * b, ridge.predict(Z), tree.predict(Z), name="yhat")
    return dict(stand=stand, gate=gate, pca=pca, ridge=ridge, tree=tree, yhat=yhat, y=y)


def fit_events(target, **kw):
    events = []
    with contextlib.suppress(MachineFitError):
        target.fit(on_event=events.append, **kw)
    for ev in events:
        validate_event(ev)
    return events


def trajectory(events, node_id):
    """States a node went through, repeats collapsed."""
    out = []
    for ev in events:
        state = next(n["state"] for n in ev["nodes"] if n["id"] == node_id)
        if not out or out[-1] != state:
            out.append(state)
    return out


def test_first_fit_walks_every_machine_through_queued_fitting_fitted(net):
    events = fit_events(net["yhat"])
    assert {ev["network"] for ev in events} == {"yhat"}
    for name in ("stand", "gate", "pca", "ridge", "tree"):
        assert trajectory(events, name) == ["queued", "fitting", "fitted"]
    assert trajectory(events, "X") == ["fitted"]
    assert trajectory(events, "yhat")[-1] == "fitted"
    # Serial fits run one at a time, upstream first.
    fitting = [[n["id"] for n in ev["nodes"] if n["kind"] == "machine" and
                n["state"] == "fitting"] for ev in events]
    assert [f for f in fitting if f] == [["stand"], ["gate"], ["pca"], ["ridge"], ["tree"]]
    final = {n["id"]: n for n in events[-1]["nodes"]}
    assert final["tree"]["last_action"] == "fit" and final["tree"]["fit_time_s"] > 0
    assert final["tree"]["estimator"] == "DecisionTreeRegressor"
    assert final["tree"]["params"]["random_state"] == "0"
    assert sorted(events[-1]["edges"]) == sorted([
        ["X", "stand"], ["stand", "gate"], ["gate", "pca"], ["pca", "ridge"], ["y", "ridge"],
        ["pca", "tree"], ["y", "tree"], ["ridge", "yhat"], ["tree", "yhat"]])


def test_skipped_machines_stay_fitted_while_the_changed_one_refits(net):
    net["yhat"].fit()
    net["tree"].model.set_params(max_depth=2)
    events = fit_events(net["yhat"])
    for name in ("stand", "gate", "pca", "ridge"):
        assert trajectory(events, name) == ["fitted"]
    assert trajectory(events, "tree") == ["queued", "fitting", "fitted"]


def test_failure_marks_the_machine_failed_and_downstream_stale(net):
    net["yhat"].fit()
    net["gate"].model.set_params(fail=True)
    net["stand"].model.set_params(with_mean=False)
    events = fit_events(net["yhat"])
    final = {n["id"]: n["state"] for n in events[-1]["nodes"]}
    assert final == {"X": "fitted", "y": "fitted", "stand": "fitted", "gate": "failed",
                     "pca": "stale", "ridge": "stale", "tree": "stale", "yhat": "failed"}
    assert trajectory(events, "pca") == ["queued", "stale"]
    assert set(final.values()) <= set(NODE_STATES)


def test_cancelled_machines_never_trained_stay_fresh(net):
    net["gate"].model.set_params(fail=True)
    events = fit_events(net["yhat"])
    final = {n["id"]: n["state"] for n in events[-1]["nodes"]}
    assert final == {"X": "fitted", "y": "fitted", "stand": "fitted", "gate": "failed",
                     "pca": "fresh", "ridge": "fresh", "tree": "fresh", "yhat": "failed"}


def test_network_event_at_rest_marks_stale_and_fresh(net):
    states = lambda: {n["id"]: n["state"] for n in network_event(net["yhat"])["nodes"]}  # noqa
    assert set(states().values()) == {"fitted", "fresh"}
    assert states()["tree"] == "fresh"
    net["yhat"].fit()
    assert set(states().values()) == {"fitted"}
    net["y"].rebind(net["y"].data + 1)
    assert states() == {"X": "fitted", "y": "fitted", "stand": "fitted", "gate": "fitted",
                        "pca": "fitted", "ridge": "stale", "tree": "stale", "yhat": "stale"}
    ev = network_event(net["yhat"], network_id="blend")
    assert validate_event(ev)["network"] == "blend"


def test_no_emitter_no_events_and_the_emitter_sees_dicts_it_can_keep(net):
    net["yhat"].fit()   # no on_event: nothing to call, nothing breaks
    events = fit_events(net["yhat"], force=True)
    events[0]["nodes"][0]["state"] = "failed"   # events are independent snapshots
    assert events[1]["nodes"][0]["state"] == "fitted"


def test_a_raising_callback_is_logged_and_the_fit_goes_on(net, caplog):
    def broken(event):
        raise RuntimeError("view crashed")

    with caplog.at_level("ERROR", logger="phalanx"):
        log = net["yhat"].fit(on_event=broken)
    assert log.actions == {"stand": "fit", "gate": "fit", "pca": "fit", "ridge": "fit",
                           "tree": "fit"}
    assert "network event callback failed" in caplog.text and "view crashed" in caplog.text
