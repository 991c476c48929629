"""scikit-learn ``partial_fit`` across ranks (threads as ranks): exact merges of count-based
estimators, averaging of gradient-trained ones, loud warnings for the rest, and the hooks that
reach estimators built inside the cell."""

from __future__ import annotations

import copy
import inspect
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from sklearn.base import BaseEstimator
from sklearn.cluster import MiniBatchKMeans
from sklearn.datasets import load_digits
from sklearn.linear_model import SGDClassifier, SGDRegressor
from sklearn.multiclass import OneVsOneClassifier, OneVsRestClassifier
from sklearn.multioutput import MultiOutputRegressor
from sklearn.naive_bayes import BernoulliNB, CategoricalNB, ComplementNB, GaussianNB, MultinomialNB
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import MaxAbsScaler, MinMaxScaler, StandardScaler

from conftest import run_cell
from phalanx.runtime.adapters.sklearn import (EstimatorAveragingWarning, EstimatorSyncError, _Patched,
                                         fitted_state, install_estimator_sync, merge_rule,
                                         patch_namespace_estimators, patch_partial_fit)
from phalanx.runtime.adapters._import_watch import ImportWatch
from phalanx.wire._options import TrainOptions
from phalanx.runtime.run._engine_state import RunContext
from phalanx.runtime.transport._comm import make_thread_communicators
from deadlines import hang_limit

CLASSES = np.arange(10)


def _digits():
    X, y = load_digits(return_X_y=True)
    order = np.random.RandomState(0).permutation(len(X))
    return X[order], y[order]


X_ALL, Y_ALL = _digits()
X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = X_ALL[:1400], Y_ALL[:1400], X_ALL[1400:], Y_ALL[1400:]


def batches(X, y=None, extra=None, size=200, stop=1000):
    """Whole batches, as one process sees them: ``(X, y, extra)`` rows of each."""
    for i in range(0, min(stop, len(X)), size):
        yield (X[i:i + size], None if y is None else y[i:i + size],
               None if extra is None else extra[i:i + size])


def half(part, rank, n=2):
    """Rank ``rank``'s rows of a batch (uneven halves on purpose: 200 rows -> 100/100, odd
    sizes differ by one)."""
    if part is None:
        return None
    cut = np.linspace(0, len(part), n + 1).astype(int)
    return part[cut[rank]:cut[rank + 1]]


def run_ranks(body, n=2, sync="allreduce", every=1, alpha=0.5, install=True):
    """``body(run)`` on ``n`` thread ranks, each with its own run, ended as the runtime ends a
    cell (strategies' finish, then the cleanups); returns the bodies' results."""
    comms = make_thread_communicators(n, timeout_s=20)
    results, errors = [None] * n, []

    def target(comm):
        run = RunContext("test", comm.rank, n, None, strategy_spec=sync, collectives=comm,
                         train=TrainOptions(sync_params={"every": every, "alpha": alpha}))
        try:
            if install:
                install_estimator_sync(run)
            results[comm.rank] = body(run)
            for strategy, params_fn in run.tracked:
                strategy.finish(params_fn())
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            for other in comms:
                other.abort(f"rank {comm.rank} failed")
        finally:
            errors.extend(AssertionError(line) for line in run.patches.undo_all())

    threads = [threading.Thread(target=target, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


def assert_same_state(got, want, rtol=1e-10, atol=1e-12):
    got, want = dict(fitted_state(got)), dict(fitted_state(want))
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def distributed(make, fit, data, **kwargs):
    """Each rank builds ``make()`` inside the run and feeds it its half of every batch."""
    def body(run):
        est = make()
        for xb, yb, wb in batches(*data):
            fit(est, half(xb, run.rank), half(yb, run.rank), half(wb, run.rank))
        return est

    return run_ranks(body, **kwargs)


def single(make, fit, data):
    est = make()
    for xb, yb, wb in batches(*data):
        fit(est, xb, yb, wb)
    return est


def nb_fit(est, X, y, w):
    est.partial_fit(X, y, classes=CLASSES, sample_weight=w)


def scaler_fit(est, X, y, w):
    est.partial_fit(X) if w is None else est.partial_fit(X, sample_weight=w)


def _with_holes(X):
    """Digits as floats with NaN holes, and a column that is all NaN in some half-batches."""
    X = X.astype(np.float64).copy()
    X[np.random.RandomState(1).rand(*X.shape) < 0.05] = np.nan
    X[:50, 3] = np.nan
    return X


WEIGHTS = np.random.RandomState(2).uniform(0.5, 2.0, len(X_ALL))
EXACT = {
    "multinomial": (MultinomialNB, nb_fit, (X_ALL, Y_ALL)),
    "bernoulli": (lambda: BernoulliNB(binarize=4.0), nb_fit, (X_ALL, Y_ALL)),
    "complement": (ComplementNB, nb_fit, (X_ALL, Y_ALL)),
    "complement-weighted": (ComplementNB, nb_fit, (X_ALL, Y_ALL, WEIGHTS)),
    "categorical": (CategoricalNB, nb_fit, (X_ALL.astype(int), Y_ALL)),
    "gaussian": (GaussianNB, nb_fit, (X_ALL, Y_ALL)),
    "gaussian-weighted": (GaussianNB, nb_fit, (X_ALL, Y_ALL, WEIGHTS)),
    "gaussian-priors": (lambda: GaussianNB(priors=np.full(10, 0.1), var_smoothing=1e-3), nb_fit,
                        (X_ALL, Y_ALL)),
    "standard": (StandardScaler, scaler_fit, (X_ALL,)),
    "standard-nan": (StandardScaler, scaler_fit, (_with_holes(X_ALL),)),
    "standard-weighted": (StandardScaler, scaler_fit, (X_ALL, None, WEIGHTS)),
    "standard-mean-only": (lambda: StandardScaler(with_std=False), scaler_fit, (X_ALL,)),
    "standard-counts-only": (lambda: StandardScaler(with_mean=False, with_std=False), scaler_fit,
                             (_with_holes(X_ALL),)),
    "minmax-nan": (lambda: MinMaxScaler(feature_range=(-1, 1)), scaler_fit, (_with_holes(X_ALL),)),
    "maxabs-nan": (MaxAbsScaler, scaler_fit, (_with_holes(X_ALL) - 8,)),
}


@pytest.mark.parametrize("case", EXACT)
def test_exact_merge_equals_one_process_on_the_whole_batches(case):
    make, fit, data = EXACT[case]
    assert merge_rule(make()) == "exact"
    reference = single(make, fit, data)
    for est in distributed(make, fit, data):
        assert_same_state(est, reference)


def test_categorical_nb_categories_seen_on_one_rank_only():
    """Rank 1 sees categories rank 0 never does: the count tables are widened on every rank."""
    rng = np.random.RandomState(3)
    X = rng.randint(0, 3, size=(1000, 4))
    X[100:200] += 4  # the second half of the first batch, rank 1's: categories 4..6
    y = rng.randint(0, 3, size=1000)

    def fit(est, X, y, w):
        est.partial_fit(X, y, classes=[0, 1, 2])

    reference = single(CategoricalNB, fit, (X, y))
    ranks = distributed(CategoricalNB, fit, (X, y))
    assert [t.shape[1] for t in ranks[0].category_count_] == [7, 7, 7, 7]
    for est in ranks:
        assert_same_state(est, reference)


@pytest.mark.parametrize("case", ["multinomial", "categorical", "gaussian", "standard-nan",
                                  "minmax-nan", "maxabs-nan"])
def test_an_estimator_fitted_in_the_notebook_continues_exactly(case):
    """Shipped already fitted: every rank starts from rank 0's state (here identical) and the
    merge counts the notebook's batches once, not once per rank."""
    make, fit, data = EXACT[case]
    first = [d[:300] for d in data]
    rest = [d[300:] for d in data]
    shipped = single(make, fit, first)
    reference = copy.deepcopy(shipped)
    for xb, yb, wb in batches(*rest):
        fit(reference, xb, yb, wb)

    def body(run):
        est = copy.deepcopy(shipped)  # what the engine unpickles
        assert patch_namespace_estimators(run, {"est": est, "n": 3}) == 1
        for xb, yb, wb in batches(*rest):
            fit(est, half(xb, run.rank), half(yb, run.rank), half(wb, run.rank))
        return est

    for est in run_ranks(body, install=False):
        assert_same_state(est, reference)


def test_each_partial_fit_counts_a_step():
    make, fit, data = EXACT["multinomial"]

    def body(run):
        est = make()
        for xb, yb, _ in batches(*data):
            fit(est, half(xb, run.rank), half(yb, run.rank), None)
        return run.steps

    assert run_ranks(body) == [5, 5]


# --- averaged: gradient-trained estimators ----------------------------------------------------


def train_recording(make, epochs=3, size=100, **kwargs):
    """Each rank trains ``make(rank)`` on its half of every batch; returns, per rank, the model
    and a copy of its averaged arrays after every call."""
    def body(run):
        est, after = make(run.rank), []
        for _ in range(epochs):
            for xb, yb, _ in batches(X_TRAIN, Y_TRAIN, size=size, stop=len(X_TRAIN)):
                est.partial_fit(half(xb, run.rank) / 16, half(yb, run.rank), classes=CLASSES)
                after.append([a.copy() for _, a in fitted_state(est)
                              if a.dtype.kind == "f" and a.ndim])
        return est, after

    return run_ranks(body, **kwargs)


def assert_ranks_agree_after_every_call(ranks):
    (_, a), (_, b) = ranks
    assert len(a) == len(b) and a
    for step_a, step_b in zip(a, b):
        for x, y in zip(step_a, step_b):
            np.testing.assert_array_equal(x, y)


def test_sgd_classifier_ranks_agree_after_every_call_and_learn():
    ranks = train_recording(lambda rank: SGDClassifier(loss="log_loss", alpha=1e-4,
                                                       random_state=rank))
    assert_ranks_agree_after_every_call(ranks)
    model = ranks[0][0]
    assert merge_rule(model) == "averaged"
    assert model.score(X_TEST / 16, Y_TEST) > 0.85
    assert "partial_fit" not in vars(model)


def test_sgd_with_averaging_agrees_on_its_iterate_too():
    ranks = train_recording(lambda rank: SGDClassifier(average=5, random_state=rank), epochs=1)
    (a, _), (b, _) = ranks
    np.testing.assert_array_equal(a._standard_coef, b._standard_coef)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_mlp_ranks_agree_after_every_call_and_learn():
    """Different random initialisations on the two ranks: the first call averages them."""
    ranks = train_recording(lambda rank: MLPClassifier(hidden_layer_sizes=(32,),
                                                       learning_rate_init=3e-3,
                                                       random_state=rank), epochs=4)
    assert_ranks_agree_after_every_call(ranks)
    model = ranks[0][0]
    names = [name for name, _ in fitted_state(model)]
    assert {"coefs_[0]", "coefs_[1]", "intercepts_[0]", "intercepts_[1]"} <= set(names)
    assert model.score(X_TEST / 16, Y_TEST) > 0.8


@pytest.mark.parametrize("sync,every", [("localsgd", 3), ("easgd", 2)])
def test_parameter_averaging_strategies_agree_at_the_end(sync, every):
    ranks = train_recording(lambda rank: SGDClassifier(random_state=rank), epochs=1, sync=sync,
                            every=every, alpha=0.4)
    (a, history_a), (b, history_b) = ranks
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12, atol=1e-12)  # finish() ran
    assert not np.array_equal(history_a[1][0], history_b[1][0])  # the second step: no full sync


def test_sync_none_keeps_ranks_independent_and_quiet():
    make, fit, data = EXACT["multinomial"]
    ranks = distributed(make, fit, data, sync="none")
    assert ranks[0].class_count_.sum() == ranks[1].class_count_.sum() == 500  # its half only

    def body(run):
        km = MiniBatchKMeans(n_clusters=4, random_state=run.rank, n_init=1)
        for xb, _, _ in batches(X_ALL):
            km.partial_fit(half(xb, run.rank))
        return km.cluster_centers_

    a, b = run_ranks(body, sync="none")  # no warning: the pytest config would turn it into an error
    assert not np.array_equal(a, b)


# --- warned and composite ---------------------------------------------------------------------


def test_minibatch_kmeans_warns_loudly_once_and_ranks_agree():
    def body(run):
        km = MiniBatchKMeans(n_clusters=5, random_state=run.rank, n_init=1)
        for xb, _, _ in batches(X_ALL):
            km.partial_fit(half(xb, run.rank))
        return km

    with pytest.warns(EstimatorAveragingWarning) as record:
        a, b = run_ranks(body)
    messages = [str(w.message) for w in record if w.category is EstimatorAveragingWarning]
    assert len(messages) == 1, messages
    assert "MiniBatchKMeans" in messages[0] and "cluster_centers_" in messages[0]
    assert "--sync none" in messages[0] and "rank 0" in messages[0]
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


class Centroid(BaseEstimator):
    """An estimator phalanx knows nothing about: a running mean."""

    def partial_fit(self, X, y=None):
        X = np.asarray(X, dtype=np.float64)
        n = getattr(self, "n_seen_", 0)
        self.mean_ = (getattr(self, "mean_", 0.0) * n + X.sum(axis=0)) / (n + len(X))
        self.n_seen_ = n + len(X)
        return self


def test_unknown_estimators_are_averaged_by_name_with_a_warning():
    def body(run):
        est = Centroid()
        for xb, _, _ in batches(X_ALL):
            est.partial_fit(half(xb, run.rank) + run.rank)
        return est

    with pytest.warns(EstimatorAveragingWarning, match="Centroid.partial_fit"):
        a, b = run_ranks(body)
    np.testing.assert_array_equal(a.mean_, b.mean_)
    assert a.n_seen_ == 500  # bookkeeping stays per rank


def test_one_vs_rest_of_naive_bayes_is_exact():
    make = lambda: OneVsRestClassifier(MultinomialNB())  # noqa: E731
    assert merge_rule(make()) == "composite"
    reference = single(make, lambda e, X, y, w: e.partial_fit(X, y, classes=CLASSES),
                       (X_ALL, Y_ALL))
    ranks = distributed(make, lambda e, X, y, w: e.partial_fit(X, y, classes=CLASSES),
                        (X_ALL, Y_ALL))
    for est in ranks:
        assert len(est.estimators_) == 10
        for got, want in zip(est.estimators_, reference.estimators_):
            assert_same_state(got, want)
        np.testing.assert_array_equal(est.predict(X_TEST), reference.predict(X_TEST))


def test_one_vs_one_stays_per_rank_with_a_warning():
    """A pair of classes missing from one rank's batch leaves that pair unfitted there only."""
    y = np.repeat([0, 1, 2, 3], 100)
    X = np.random.RandomState(4).normal(size=(400, 5)) + y[:, None]

    def body(run):
        ovo = OneVsOneClassifier(GaussianNB())
        for i in range(0, 400, 200):  # rank 0 sees classes 0 and 2, rank 1 classes 1 and 3
            ovo.partial_fit(half(X[i:i + 200], run.rank), half(y[i:i + 200], run.rank),
                            classes=[0, 1, 2, 3])
        return ovo

    with pytest.warns(EstimatorAveragingWarning, match="OneVsOneClassifier.*OneVsRestClassifier"):
        a, b = run_ranks(body)
    assert merge_rule(a) == "local"
    assert a.estimators_[1].class_count_.sum() == 200  # pair (0, 2): rank 0's rows only
    assert not hasattr(b.estimators_[1], "class_count_")  # never fitted on rank 1


def test_meta_estimators_of_sgd_agree_and_sync_once_per_outer_call():
    def body(run):
        ovr = OneVsRestClassifier(SGDClassifier(random_state=run.rank))
        reg = MultiOutputRegressor(SGDRegressor(random_state=run.rank))
        Y2 = np.c_[Y_ALL, -Y_ALL] / 10
        for xb, yb, y2 in batches(X_ALL / 16, Y_ALL, extra=Y2):
            ovr.partial_fit(half(xb, run.rank), half(yb, run.rank), classes=CLASSES)
            reg.partial_fit(half(xb, run.rank), half(y2, run.rank))
        return ovr, reg, run.steps

    (ovr_a, reg_a, steps), (ovr_b, reg_b, _) = run_ranks(body)
    assert steps == 10  # the inner estimators' calls are not steps of their own
    for a, b in zip(ovr_a.estimators_ + reg_a.estimators_, ovr_b.estimators_ + reg_b.estimators_):
        np.testing.assert_array_equal(a.coef_, b.coef_)
        np.testing.assert_array_equal(a.intercept_, b.intercept_)
    assert ovr_a.score(X_TEST / 16, Y_TEST) > 0.8


def test_ranks_with_different_classes_get_a_clear_error_on_every_rank():
    errors = []

    def body(run):
        est = SGDClassifier()
        try:
            est.partial_fit(X_ALL[:20], Y_ALL[:20], classes=np.arange(10 + run.rank))
        except EstimatorSyncError as exc:
            errors.append(str(exc))
        return est

    run_ranks(body)
    assert len(errors) == 2 and "classes_ differ across ranks" in errors[0]


# --- hooks: estimators built in the cell, and restoring everything -----------------------------


def test_estimators_built_during_the_run_are_synced_and_plain_afterwards():
    def body(run):
        class Late(MultinomialNB):  # a class defined during the run, as a cell may
            pass

        nb, late = MultinomialNB(), Late()
        for xb, yb, _ in batches(X_ALL, Y_ALL):
            nb.partial_fit(half(xb, run.rank), half(yb, run.rank), classes=CLASSES)
            late.partial_fit(half(xb, run.rank), half(yb, run.rank), classes=CLASSES)
        assert isinstance(inspect.getattr_static(MultinomialNB, "partial_fit"), _Patched)
        copied = copy.deepcopy(nb)  # plain objects: no closure in the instance
        restored = pickle.loads(pickle.dumps(nb))
        assert "partial_fit" not in vars(copied) and "partial_fit" not in vars(restored)
        return nb, late

    (nb, late), _ = run_ranks(body)
    assert nb.class_count_.sum() == late.class_count_.sum() == 1000  # both ranks' halves
    assert "partial_fit" not in vars(MultinomialNB) and "fit" not in vars(MultinomialNB)
    assert not isinstance(inspect.getattr_static(MultinomialNB, "partial_fit"), _Patched)
    assert "__init_subclass__" not in vars(BaseEstimator)
    assert "__new__" not in vars(BaseEstimator)
    assert "partial_fit" not in vars(nb)
    before = nb.class_count_.sum()
    nb.partial_fit(X_ALL[:10], Y_ALL[:10])  # plain scikit-learn again: no rank to wait for
    assert nb.class_count_.sum() == before + 10


def test_undo_restores_classes_that_define_partial_fit_themselves():
    original = vars(GaussianNB)["partial_fit"]
    comm = make_thread_communicators(1)[0]
    run = RunContext("t", 0, 1, None, collectives=comm)
    undo = install_estimator_sync(run)
    assert isinstance(vars(GaussianNB)["partial_fit"], _Patched)
    assert GaussianNB.partial_fit is original  # on the class: the method itself
    undo()
    undo()  # idempotent (the runtime may also run it from run.patches)
    assert vars(GaussianNB)["partial_fit"] is original
    assert "__init_subclass__" not in vars(BaseEstimator)


def test_sklearn_fit_stays_per_rank():
    def body(run):
        scaler = StandardScaler().fit(half(X_ALL, run.rank))  # fit calls partial_fit inside
        return scaler.n_samples_seen_, run.steps

    assert run_ranks(body) == [(898, 0), (899, 0)]


def test_wrap_style_patch_keeps_working_and_is_idempotent():
    def body(run):
        clf = SGDClassifier(random_state=run.rank)
        assert patch_partial_fit(clf, run) is clf
        assert patch_partial_fit(clf, run) is clf
        clf.partial_fit(half(X_ALL, run.rank), half(Y_ALL, run.rank), classes=CLASSES)
        return clf.coef_

    a, b = run_ranks(body, install=False)
    np.testing.assert_array_equal(a, b)


class _Frozen(type):
    def __setattr__(cls, name, value):
        raise TypeError("frozen class")


class FrozenCentroid(Centroid, metaclass=_Frozen):
    """A class that refuses new attributes, as extension types do."""


def test_a_class_that_cannot_be_patched_gets_an_instance_attribute_for_the_run():
    def body(run):
        est = FrozenCentroid()
        patch_namespace_estimators(run, {"models": [est]})
        assert "partial_fit" in vars(est)
        for xb, _, _ in batches(X_ALL):
            est.partial_fit(half(xb, run.rank) + run.rank)
        return est

    with pytest.warns(EstimatorAveragingWarning, match="FrozenCentroid"):
        a, b = run_ranks(body, install=False)
    np.testing.assert_array_equal(a.mean_, b.mean_)
    assert "partial_fit" not in vars(a)  # removed with the run


def test_fitted_state_follows_sklearn_conventions():
    mlp = MLPClassifier(hidden_layer_sizes=(4, 3), max_iter=5, random_state=0)
    mlp.partial_fit(X_ALL[:50], Y_ALL[:50], classes=CLASSES)
    mlp._private_ = np.zeros(3)
    state = fitted_state(mlp)
    names = [name for name, _ in state]
    assert names[:5] == ["best_loss_", "classes_", "coefs_[0]", "coefs_[1]", "coefs_[2]"]
    assert "_private_" not in names and "out_activation_" not in names  # private; a string
    values = dict(state)
    assert values["coefs_[0]"] is mlp.coefs_[0]  # the estimator's own arrays
    assert values["n_features_in_"].shape == ()  # scalars as 0-d copies
    assert all(v.dtype.kind in "iufc" for _, v in state)


@pytest.mark.parametrize("est,kind", [
    (MultinomialNB(), "exact"), (StandardScaler(), "exact"), (MaxAbsScaler(), "exact"),
    (SGDRegressor(), "averaged"), (MLPClassifier(), "averaged"),
    (OneVsRestClassifier(SGDClassifier()), "composite"), (MiniBatchKMeans(), "warned"),
    (Centroid(), "warned")])
def test_merge_rule_depends_on_the_class(est, kind):
    assert merge_rule(est) == kind


def test_import_watch_runs_its_callback_after_the_module(tmp_path, monkeypatch):
    (tmp_path / "phalanx_watched_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    watch = ImportWatch("phalanx_watched_mod",
                         lambda: seen.append(sys.modules["phalanx_watched_mod"].VALUE))
    sys.meta_path.insert(0, watch)
    try:
        import phalanx_watched_mod
    finally:
        watch.remove()
        sys.modules.pop("phalanx_watched_mod", None)
    assert seen == [41]
    assert watch not in sys.meta_path
    assert type(phalanx_watched_mod.__loader__).__name__ == "SourceFileLoader"


@pytest.mark.slow
def test_sklearn_imported_by_the_cell_after_install_is_hooked():
    """A fresh process: installing does not import scikit-learn (seconds), importing it later
    in the cell still gets its classes patched."""
    code = textwrap.dedent("""
        import inspect, sys
        from phalanx.runtime.run._engine_state import RunContext
        from phalanx.runtime.adapters.sklearn import install_estimator_sync, _Patched
        from phalanx.runtime.transport._comm import make_thread_communicators
        run = RunContext("t", 0, 1, None, collectives=make_thread_communicators(1)[0])
        undo = install_estimator_sync(run)
        assert "sklearn" not in sys.modules
        from sklearn.naive_bayes import MultinomialNB
        assert isinstance(inspect.getattr_static(MultinomialNB, "partial_fit"), _Patched)
        undo()
        assert not isinstance(inspect.getattr_static(MultinomialNB, "partial_fit"), _Patched)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=hang_limit(120))
    assert out.stdout.strip() == "ok", out.stderr


# --- on a real cluster --------------------------------------------------------------------------


@pytest.mark.cluster
def test_naive_bayes_built_in_the_cell_equals_single_process(two_engines, shell):
    run_cell(shell, """
import numpy as np
from sklearn.datasets import load_digits
from sklearn.naive_bayes import MultinomialNB
X, y = load_digits(return_X_y=True)
full = MultinomialNB().fit(X, y)
""")
    run_cell(shell, """%%distributed_fit --no-widget --shard X,y --return nb
import numpy as np
from sklearn.naive_bayes import MultinomialNB
nb = MultinomialNB()
for i in range(0, len(X), 100):
    nb.partial_fit(X[i:i + 100], y[i:i + 100], classes=np.arange(10))
""")
    ns = shell.user_ns
    nb, full = ns["nb"], ns["full"]
    assert "partial_fit" not in vars(nb)
    np.testing.assert_array_equal(nb.class_count_, full.class_count_)
    np.testing.assert_array_equal(nb.feature_count_, full.feature_count_)
    np.testing.assert_allclose(nb.feature_log_prob_, full.feature_log_prob_, rtol=1e-12)
    np.testing.assert_allclose(nb.class_log_prior_, full.class_log_prior_, rtol=1e-12)
