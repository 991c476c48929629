"""Fits on a real 2-engine ipyparallel cluster through dask: exact fit logs, predictions
equal to scikit-learn references, independent branches overlapping in time."""

import collections
import logging
import os
import sys
import time
from pathlib import Path

import cloudpickle
import numpy as np
import phalanx.network
import pytest
from phalanx.events import validate_event
from phalanx.network import (
    MachineFitError,
    NetworkEstimator,
    dask_client,
    machine,
    node,
    source,
    stop_dask,
)
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.datasets import load_diabetes
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor
from sklearn.utils.metaestimators import available_if
from deadlines import hang_limit

ipp = pytest.importorskip("ipyparallel")
distributed = pytest.importorskip("distributed")

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

# Engines cannot import this test module: ship its classes and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Counting(BaseEstimator):
    """Wraps an estimator; appends ``tag method pid`` to a journal file on every call."""

    def __init__(self, estimator=None, tag="", journal="", fail=False, sleep=0.0):
        self.estimator, self.tag, self.journal = estimator, tag, journal
        self.fail, self.sleep = fail, sleep

    def _note(self, what):
        with open(self.journal, "a") as f:
            f.write(f"{self.tag} {what} {os.getpid()}\n")

    def fit(self, X, y=None):
        self._note("fit")
        time.sleep(self.sleep)
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


def _add_path(path):
    import sys as engine_sys

    if path not in engine_sys.path:
        engine_sys.path.insert(0, path)


@pytest.fixture(scope="module")
def rc(request):
    held = {}

    def stop():
        client = held.get("client")
        try:
            if client is not None:
                stop_dask(client)
                client.close()
        finally:
            held["cluster"].stop_cluster_sync()

    held["cluster"] = ipp.Cluster(n=2, controller_ip="127.0.0.1", log_level=logging.WARNING)
    request.addfinalizer(stop)   # registered first: a half-started cluster is stopped too
    client = held["client"] = held["cluster"].start_and_connect_sync(activate=False)
    client.wait_for_engines(2, timeout=hang_limit(60))
    # Engines must import phalanx.network (the task functions) however pytest found it here.
    kernel_ext = str(Path(phalanx.network.__file__).parents[2])
    client[:].apply_sync(_add_path, kernel_ext)
    return client


class Net:
    """The issue's blended network with counting wrappers, plus its journal."""

    def __init__(self, tmp_path, sleep=0.0):
        self.Xd, self.yd = load_diabetes(return_X_y=True)
        self.journal = str(tmp_path / "journal.txt")
        c = lambda est, tag, s=0.0: Counting(est, tag, self.journal, sleep=s)  # noqa: E731
        self.X, self.y = source(self.Xd.copy(), name="X"), source(self.yd.copy(), name="y")
        self.stand = machine(c(StandardScaler(), "stand"), self.X, name="stand")
        W = self.stand.transform(self.X)
        self.pca = machine(c(PCA(3), "pca"), W, name="pca")
        Z = self.pca.transform(W)
        self.ridge = machine(c(Ridge(), "ridge", sleep), Z, self.y, name="ridge")
        self.tree = machine(c(DecisionTreeRegressor(random_state=0), "tree", sleep), Z, self.y,
                            name="tree")
        self.yhat = node(lambda a, b: 0.5 * a + 0.5 * b, self.ridge.predict(Z),
                         self.tree.predict(Z), name="yhat")

    def calls(self):
        """``(Counter of "tag method", set of pids)`` since the last look."""
        if not os.path.exists(self.journal):
            return collections.Counter(), set()
        with open(self.journal) as f:
            rows = [line.split() for line in f if line.strip()]
        os.remove(self.journal)
        return collections.Counter(f"{r[0]} {r[1]}" for r in rows), {int(r[2]) for r in rows}


def reference(X, y, n_components=3, depth=None):
    stand = StandardScaler().fit(X)
    pca = PCA(n_components).fit(stand.transform(X))
    Z = pca.transform(stand.transform(X))
    ridge = Ridge().fit(Z, y)
    tree = DecisionTreeRegressor(max_depth=depth, random_state=0).fit(Z, y)
    Zn = pca.transform(stand.transform(X))
    return 0.5 * ridge.predict(Zn) + 0.5 * tree.predict(Zn)


ALL = ("stand", "pca", "ridge", "tree")


def only(*fitted):
    return {name: ("fit" if name in fitted else "skip") for name in ALL}


def test_blend_on_the_cluster_matches_sklearn_with_exact_logs(rc, tmp_path):
    n = Net(tmp_path)
    log = n.yhat.fit(cluster=rc)
    assert log.actions == only(*ALL) and log.backend == "dask"
    calls, pids = n.calls()
    # The shared output Z is one task, computed once for both consumers.
    assert calls == {"stand fit": 1, "stand transform": 1, "pca fit": 1, "pca transform": 1,
                     "ridge fit": 1, "tree fit": 1}
    engine_pids = set(rc[:].apply_sync(os.getpid))
    assert pids <= engine_pids and os.getpid() not in pids
    assert {int(w.rsplit(":", 1)[1]) for w in log.workers.values()} <= engine_pids
    np.testing.assert_allclose(n.yhat(), reference(n.Xd, n.yd))
    assert n.calls()[1] == {os.getpid()}   # calling a node computes in the kernel

    n.tree.model.set_params(estimator__max_depth=3)
    assert n.yhat.fit(cluster=rc).actions == only("tree")
    # Its training inputs stayed on the workers since the last fit: nothing is recomputed.
    assert n.calls()[0] == {"tree fit": 1}
    np.testing.assert_allclose(n.yhat(), reference(n.Xd, n.yd, depth=3))

    n.pca.model.set_params(estimator__n_components=2)
    assert n.yhat.fit(cluster=rc).actions == only("pca", "ridge", "tree")
    n.y.rebind(n.yd * 3.0)
    assert n.yhat.fit(cluster=rc).actions == only("ridge", "tree")
    assert n.yhat.fit(cluster=rc).actions == only()
    np.testing.assert_allclose(n.yhat(), reference(n.Xd, n.yd * 3.0, n_components=2, depth=3))


def test_rows_freeze_and_failures_on_the_cluster(rc, tmp_path):
    n = Net(tmp_path)
    train = np.arange(300)
    assert n.yhat.fit(rows=train, cluster=rc).actions == only(*ALL)
    assert n.yhat.fit(rows=train, cluster=rc).actions == only()
    n.pca.freeze()
    assert n.yhat.fit(cluster=rc).actions == only("stand", "ridge", "tree")
    n.pca.thaw()
    assert n.yhat.fit(cluster=rc).actions == only("pca", "ridge", "tree")
    np.testing.assert_allclose(n.yhat(), reference(n.Xd, n.yd))

    old_tree = n.tree.fitted
    n.tree.model.set_params(fail=True)
    n.X.data[0] += 1.0
    with pytest.raises(MachineFitError) as err:
        n.yhat.fit(cluster=rc)
    assert err.value.machines == ["tree"]
    assert "machine 'tree' failed to fit: ValueError: tree refuses to fit" in str(err.value)
    assert err.value.log.ran == ["stand", "pca", "ridge"]
    assert n.tree.fitted is old_tree and n.tree.status == "failed"
    n.tree.model.set_params(fail=False)
    assert n.yhat.fit(cluster=rc).actions == only("tree")
    n.X.data[0] -= 1.0
    n.yhat.fit(cluster=rc)
    np.testing.assert_allclose(n.yhat(), reference(n.Xd, n.yd))


def test_independent_branches_fit_at_the_same_time(rc, tmp_path):
    n = Net(tmp_path, sleep=1.0)
    events = []
    log = n.yhat.fit(cluster=rc, on_event=events.append)
    (r0, r1), (t0, t1) = log.spans["ridge"], log.spans["tree"]
    assert r0 < t1 and t0 < r1, f"branches did not overlap: ridge {log.spans['ridge']}, " \
                                f"tree {log.spans['tree']}"
    assert log.workers["ridge"] != log.workers["tree"]
    for ev in events:
        validate_event(ev)
    both = [ev for ev in events
            if {n["id"]: n["state"] for n in ev["nodes"]}.get("ridge") == "fitting"
            and {n["id"]: n["state"] for n in ev["nodes"]}.get("tree") == "fitting"]
    assert both, "no event showed both branches fitting"
    assert {n["id"]: n["state"] for n in events[-1]["nodes"]}["yhat"] == "fitted"


def test_fit_runner_runs_in_the_kernel_with_the_cluster(rc):
    Xd, yd = load_diabetes(return_X_y=True)
    seen = []

    def runner(estimator, W, y, cluster=None):
        seen.append((os.getpid(), cluster, W.shape))
        return estimator.fit(W, y)

    X, y = source(Xd, name="X"), source(yd, name="y")
    stand = machine(StandardScaler(), X, name="stand")
    W = stand.transform(X)
    gang = machine(Ridge(), W, y, name="gang", fit_runner=runner)
    after = machine(DecisionTreeRegressor(random_state=0), node(np.reshape, gang.predict(W),
                                                                (-1, 1)), y, name="after")
    log = after.fit(cluster=rc)
    assert log.actions == {"stand": "fit", "gang": "fit", "after": "fit"}
    assert seen == [(os.getpid(), rc, Xd.shape)] and log.workers["gang"] == "kernel"
    assert log.workers["after"] != "kernel"
    W_ref = StandardScaler().fit_transform(Xd)
    np.testing.assert_allclose(gang.fitted.coef_, Ridge().fit(W_ref, yd).coef_)


class Blended(RegressorMixin, NetworkEstimator):
    def __init__(self, weight=0.5):
        self.weight = weight

    def network(self, X, y):
        ridge = machine(Ridge(), X, y, name="ridge")
        tree = machine(DecisionTreeRegressor(random_state=0), X, y, name="tree")
        return self.weight * ridge.predict(X) + (1 - self.weight) * tree.predict(X)


def test_exported_estimator_fits_on_the_cluster(rc):
    Xd, yd = load_diabetes(return_X_y=True)
    est = Blended().fit(Xd, yd, cluster=rc)
    assert est.fit_log_.backend == "dask"
    ref = 0.5 * Ridge().fit(Xd, yd).predict(Xd) + \
        0.5 * DecisionTreeRegressor(random_state=0).fit(Xd, yd).predict(Xd)
    np.testing.assert_allclose(est.predict(Xd), ref)
    assert est.set_params(weight=0.1).fit(Xd, yd, cluster=rc).fit_log_.actions == {
        "ridge": "skip", "tree": "skip"}


def _keys(dc):
    """Keys whose results are held in worker memory (released lineage does not count)."""
    return set(dc.run_on_scheduler(lambda dask_scheduler: [
        k for k, ts in dask_scheduler.tasks.items() if ts.state == "memory"]))


def _settles(dc, before, expected, timeout=hang_limit(10.0)):
    deadline = time.monotonic() + timeout
    while _keys(dc) - before != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return _keys(dc) - before


def test_cluster_argument_forms_and_only_cached_inputs_stay_on_workers(rc):
    dc = dask_client(rc)
    assert dask_client(rc) is dc

    class Manager:   # what the session's cluster manager looks like
        client = rc

    assert dask_client(Manager()) is dc and dask_client(dc) is dc
    before = _keys(dc)
    Xd, yd = load_diabetes(return_X_y=True)
    X, y = source(Xd, name="X"), source(yd, name="y")
    stand = machine(StandardScaler(), X, name="stand")
    r = machine(Ridge(), stand.transform(X), y, name="r")
    assert r.fit(cluster=dc).actions == {"stand": "fit", "r": "fit"}
    r.model.set_params(alpha=2.0)
    assert r.fit(cluster=Manager()).actions == {"stand": "skip", "r": "fit"}
    W = StandardScaler().fit_transform(Xd)
    np.testing.assert_allclose(r.fitted.coef_, Ridge(alpha=2.0).fit(W, yd).coef_)
    # Intermediate results and fit tasks are gone; what stays is each machine's training
    # inputs (X for stand; W and y for r), kept for the next refit.
    cached = {f.key for m in (stand, r) for f in m._inputs[1]}
    assert len(cached) == 3
    assert _settles(dc, before, cached) == cached
    stand._inputs = r._inputs = None
    assert _settles(dc, before, set()) == set()
    with pytest.raises(TypeError, match="cluster must be an ipyparallel Client"):
        r.fit(cluster=object(), force=True)


def test_stop_dask_tears_down_and_a_later_fit_starts_it_again(rc):
    first = dask_client(rc)
    assert stop_dask(rc) is True and stop_dask(rc) is False
    assert first.status == "closed"
    assert rc[:].apply_sync(lambda: 1) == [1, 1]   # the engines themselves are still usable
    X, y = source(np.arange(20.0).reshape(10, 2)), source(np.arange(10.0))
    assert machine(Ridge(), X, y, name="r").fit(cluster=rc).actions == {"r": "fit"}
    second = dask_client(rc)
    assert second is not first and len(second.scheduler_info()["workers"]) == 2


def test_tls_dask_fits_and_refuses_peers_without_the_clusters_certificates(rc):
    """What engines on other hosts get: every dask connection is TLS with certificates made
    for this cluster; a plain or foreign client is turned away, a fit works as before."""
    from distributed import Client, Security

    stop_dask(rc)
    dc = dask_client(rc, tls=True)
    try:
        address = dc.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        workers = dc.scheduler_info()["workers"]
        assert len(workers) == 2 and all(w.startswith("tls://127.0.0.1:") for w in workers)
        X, y = source(np.arange(20.0).reshape(10, 2)), source(np.arange(10.0))
        r = machine(Ridge(), X, y, name="r")
        assert r.fit(cluster=rc).actions == {"r": "fit"}
        np.testing.assert_allclose(r.fitted.coef_, Ridge().fit(X(), y()).coef_)
        for intruder in ({"address": address.replace("tls://", "tcp://")},
                         {"address": address, "security": Security.temporary()}):
            with pytest.raises((OSError, TimeoutError)):
                Client(**intruder, timeout=5, set_as_default=False)
    finally:
        stop_dask(rc)
