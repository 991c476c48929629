"""Data-parallel ``partial_fit``: every rank ends a call with the same scikit-learn model.

While a ``%%distributed_fit`` cell runs, each ``partial_fit`` of an estimator (shipped from the
notebook or built inside the cell) learns from the rank's own batch, then merges with the other
ranks.  The merge rule depends on the estimator's class and is chosen at its first ``partial_fit``
(the same choice on every rank):

* **exact** (``MultinomialNB``, ``BernoulliNB``, ``ComplementNB``, ``CategoricalNB``,
  ``GaussianNB``, ``StandardScaler``, ``MinMaxScaler``, ``MaxAbsScaler``): what the ranks learned
  since the last merge is pooled (counts summed, means and variances combined by counts, minima
  and maxima reduced) and the derived attributes are recomputed with scikit-learn's own helpers,
  so every rank holds what one process learns from the union of the batches;
* **averaged** (``SGD*``, ``Perceptron``, ``PassiveAggressive*``, ``MLP*``, ``BernoulliRBM``):
  the float fitted arrays go through the run's sync strategy like torch parameters
  (``--sync``/``--every``/``--alpha`` keep their meaning); bookkeeping such as ``t_`` or
  ``n_iter_`` stays per rank;
* **composite** (``OneVsRestClassifier``, ``MultiOutput*``, ``SelectFromModel``): the outer
  call alone synchronises, and each fitted inner estimator is merged by its own rule;
* anything else (``MiniBatchKMeans``, ``IncrementalPCA``, unknown estimators): its float fitted
  arrays are averaged by name and an :class:`EstimatorAveragingWarning` says why that may not be
  the model one process would learn, and what to do instead; where nothing can be lined up
  across ranks (``Birch``, ``OneVsOneClassifier``) each rank keeps its own model, with the same
  warning.

``--sync none`` turns all of it off (ranks train independently).  scikit-learn's own ``fit``
stays per rank, even where it calls ``partial_fit`` inside (``StandardScaler.fit``).  Exact
merges count each rank's batch as its own samples, as sharding intends: ranks fed the same rows
count them once per rank.  An estimator already fitted at its first ``partial_fit`` here starts
from rank 0's state on every rank, as torch parameters do.

How: while a run is active, every class with ``partial_fit`` (scikit-learn's, loaded or defined
during the run, and the classes of estimators handed over) carries a :class:`_Patched` descriptor
for ``partial_fit``/``fit``.  Nothing goes into the instances, so estimators pickle, deep-copy
and ``--return`` as plain scikit-learn objects.  The classes are restored when the run ends.

Example (inside ``%%distributed_fit --shard X,y``)::

    nb = MultinomialNB()
    for i in range(0, len(X), 100):
        nb.partial_fit(X[i:i + 100], y[i:i + 100], classes=np.arange(10))
    # every rank's nb is the model one process learns from all of X
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.util
import sys
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ._state import RunContext

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

    import numpy as np

__all__ = ["EstimatorAveragingWarning", "EstimatorSyncError", "fitted_state", "merge_rule",
           "is_incremental_estimator", "patch_partial_fit", "patch_namespace_estimators",
           "install_estimator_sync"]


class EstimatorAveragingWarning(UserWarning):
    """An estimator's ``partial_fit`` has no exact merge across ranks: phalanx averages its float
    fitted attributes, which need not give the model one process would learn."""


class EstimatorSyncError(ValueError):
    """Ranks cannot be kept in agreement: different classes, shapes or fitted states."""


def is_incremental_estimator(obj: Any) -> bool:
    """Whether ``obj`` is an estimator instance with ``partial_fit``."""
    return hasattr(obj, "partial_fit") and hasattr(obj, "get_params") and not isinstance(obj, type)


# --- fitted state ---------------------------------------------------------------------------


def _fitted_items(estimator: Any) -> Iterator[tuple[str, Any]]:
    """Fitted attributes by scikit-learn's convention (public names ending in ``_``), sorted,
    lists and tuples expanded as ``name[i]``."""
    try:
        attrs = vars(estimator)
    except TypeError:  # __slots__: no instance dict, nothing fitted by the convention
        return
    for name in sorted(attrs):
        if not name.endswith("_") or name.startswith("_"):
            continue
        value = attrs[name]
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield f"{name}[{i}]", item
        else:
            yield name, value


def _numeric(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "iufc" else None
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, float, np.number)):
        return np.asarray(value)
    return None


def fitted_state(estimator: Any) -> list[tuple[str, np.ndarray]]:
    """The learned state of ``estimator``: numeric fitted attributes as ``(name, array)``.

    Names are sorted; lists such as ``coefs_`` appear as ``coefs_[0]``, ``coefs_[1]``...
    Arrays are the estimator's own (changing one changes the estimator); scalars come as 0-d
    copies.  Estimators in the same state give the same structure on every rank.

    Example::

        >>> from sklearn.naive_bayes import MultinomialNB
        >>> nb = MultinomialNB().partial_fit([[1, 0], [0, 2]], [0, 1], classes=[0, 1])
        >>> [name for name, _ in fitted_state(nb)][:3]
        ['class_count_', 'class_log_prior_', 'classes_']
    """
    out = []
    for label, value in _fitted_items(estimator):
        array = _numeric(value)
        if array is not None:
            out.append((label, array))
    return out


# Float fitted arrays that are per-rank bookkeeping, never averaged.
_BOOKKEEPING = frozenset({
    "t_", "n_iter_", "n_features_in_", "classes_", "loss_", "loss_curve_", "best_loss_",
    "validation_scores_", "best_validation_score_", "n_layers_", "n_outputs_", "n_samples_seen_",
    "h_samples_", "n_steps_", "n_batch_iter_"})
# SGD with ``average``: the iterate and the running average live in private arrays.
_SGD_AVERAGE = ("_average_coef", "_average_intercept", "_standard_coef", "_standard_intercept")


def _unique(arrays: Sequence[Any]) -> list[Any]:
    """Drop arrays viewing memory already listed (``coef_`` is often a view of another one):
    a strategy must see each parameter once."""
    seen, out = set(), []
    for array in arrays:
        key = (array.__array_interface__["data"][0], array.nbytes)
        if key not in seen:
            seen.add(key)
            out.append(array)
    return out


def _float_arrays(estimator: Any, exclude: frozenset = _BOOKKEEPING) -> list[Any]:
    import numpy as np

    return _unique([value for label, value in _fitted_items(estimator)
                    if label.split("[", 1)[0] not in exclude and isinstance(value, np.ndarray)
                    and value.dtype.kind == "f" and value.size])


def _is_fitted(estimator: Any) -> bool:
    probe = getattr(estimator, "__sklearn_is_fitted__", None)
    if probe is not None:
        return bool(probe())
    return any(True for _ in _fitted_items(estimator))


# --- merge rules ----------------------------------------------------------------------------


class _Rule:
    """How one estimator is merged across ranks (one object per estimator and run).

    ``before`` runs ahead of the rank's own ``partial_fit`` (exact rules set the accumulators
    aside so the call learns this batch only), ``restore`` undoes it when the call raises,
    ``merge`` pools with the other ranks (collectives), ``averaged`` lists the arrays the sync
    strategy averages.  ``rebase`` (first call of an estimator fitted before): every rank starts
    from rank 0's state, as torch parameters do.
    """

    kind = "averaged"
    check_every_call = False  # the arrays' shapes may change between calls: agree every time

    def __init__(self, estimator: Any) -> None:
        self.cls_name = type(estimator).__name__

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        """Called before the rank's own ``partial_fit``."""

    def restore(self, est: Any) -> None:
        """The rank's ``partial_fit`` raised: put back what ``before`` set aside."""

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        """Pool this call's learning with the other ranks (collective)."""

    def averaged(self, est: Any) -> list[Any]:
        return []

    def signature(self, est: Any) -> str:
        return ",".join(f"{a.dtype}{a.shape}" for a in self.averaged(est))

    def warnings(self) -> list[str]:
        return []


class _Averaged(_Rule):
    """Gradient-trained estimators: float fitted arrays through the sync strategy."""

    def averaged(self, est: Any) -> list[Any]:
        return _float_arrays(est)


class _SGDAveraged(_Averaged):
    """SGD estimators; with ``average`` the iterate and running average too, or each rank would
    keep training its own iterate under an averaged ``coef_``."""

    def averaged(self, est: Any) -> list[Any]:
        import numpy as np

        extra = []
        if getattr(est, "average", False):
            extra = [getattr(est, name) for name in _SGD_AVERAGE
                     if isinstance(getattr(est, name, None), np.ndarray)]
        return _unique(extra + _float_arrays(est))


class _RBMAveraged(_Averaged):
    def averaged(self, est: Any) -> list[Any]:
        return _float_arrays(est, _BOOKKEEPING | {"h_samples_"})  # the rank's own Gibbs chain


class _Warned(_Averaged):
    """No exact merge known: average float fitted arrays by name, and say so."""

    kind = "warned"
    check_every_call = True

    def __init__(self, estimator: Any, reason: str = "", attrs: str = "") -> None:
        super().__init__(estimator)
        self.reason = reason or ("phalanx knows no exact way to merge its state across ranks, "
                                 "so the average need not be the model one process would learn")
        self.attrs = attrs or "every float fitted array attribute (public, name ending in '_')"

    def warnings(self) -> list[str]:
        return [f"{self.cls_name}.partial_fit on several ranks: phalanx averages "
                f"{self.attrs} across ranks by name after every partial_fit; {self.reason}.  "
                f"For a correct model fit it on one rank (`if rank == 0: ...`, and --return it "
                f"from there) or run with --sync none and combine the per-rank models yourself."]


class _Local(_Rule):
    """State that cannot be lined up across ranks: each rank keeps its own, and says so."""

    kind = "local"

    def __init__(self, estimator: Any, why: str = "") -> None:
        super().__init__(estimator)
        self.why = why

    def warnings(self) -> list[str]:
        return [f"{self.cls_name}.partial_fit on several ranks: {self.why}, so phalanx cannot "
                f"merge it: each rank keeps its own model and rank 0's is the one --return "
                f"brings back.  Fit it on one rank (`if rank == 0: ...`) or combine the "
                f"per-rank models yourself."]


class _Stateless(_Rule):
    kind = "stateless"


def _refresh_discrete_nb(est: Any) -> None:
    """Derived naive Bayes attributes from the merged counts, as ``partial_fit`` computes them."""
    if hasattr(est, "feature_all_"):  # ComplementNB keeps the per-feature totals
        est.feature_all_ = est.feature_count_.sum(axis=0)
    est._update_feature_log_prob(est._check_alpha())
    est._update_class_log_prior(class_prior=est.class_prior)


class _CountNB(_Rule):
    """Multinomial/Bernoulli/Complement NB: the model is a function of additive counts."""

    kind = "exact"
    counts = ("class_count_", "feature_count_")

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        fitted = hasattr(est, "class_count_")
        self.pre = [getattr(est, n).copy() for n in self.counts] if fitted else None

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        import numpy as np

        cur = [getattr(est, name) for name in self.counts]
        pre = getattr(self, "pre", None) or [np.zeros_like(c) for c in cur]
        deltas = [c - p for c, p in zip(cur, pre)]  # what this rank learned since the last merge
        if rebase:
            comm.broadcast(pre, src=0)
        comm.allreduce(deltas, op="sum")
        for name, p, d in zip(self.counts, pre, deltas):
            setattr(est, name, p + d)
        self.pre = None
        _refresh_discrete_nb(est)


def _pad_columns(array: Any, width: int) -> Any:
    import numpy as np

    return np.pad(array, [(0, 0), (0, width - array.shape[1])]) if array.shape[1] < width else array


class _CategoricalNB(_Rule):
    """CategoricalNB: per-feature count tables that grow with the categories seen."""

    kind = "exact"

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        self.pre = None
        if hasattr(est, "class_count_"):
            self.pre = [est.class_count_.copy()] + [c.copy() for c in est.category_count_]

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        import numpy as np

        tables = est.category_count_
        nf = len(tables)
        # widths and n_categories_ (this batch's, as sklearn keeps it) of the union: maxima
        sizes = np.array([t.shape[1] for t in tables] + list(est.n_categories_), dtype=np.float64)
        comm.allreduce([sizes], op="max")
        widths = sizes[:nf].astype(int)
        cur = [est.class_count_] + [_pad_columns(t, w) for t, w in zip(tables, widths)]
        pre = getattr(self, "pre", None) or (
            [np.zeros_like(est.class_count_)] + [np.zeros((t.shape[0], 0)) for t in tables])
        pre = [pre[0]] + [_pad_columns(p, w) for p, w in zip(pre[1:], widths)]
        deltas = [c - p for c, p in zip(cur, pre)]
        if rebase:
            comm.broadcast(pre, src=0)
        comm.allreduce(deltas, op="sum")
        merged = [p + d for p, d in zip(pre, deltas)]
        est.class_count_, est.category_count_ = merged[0], merged[1:]
        est.n_categories_ = sizes[nf:].astype(np.asarray(est.n_categories_).dtype)
        self.pre = None
        _refresh_discrete_nb(est)


def _pool(comm: Any, groups: list[tuple[Any, Any, Any]]) -> list[tuple[Any, Any, Any]]:
    """Counts, sums and sums of squared deviations of sample groups, pooled over the ranks.

    Each group is this rank's ``(n, mean, var)`` (``n`` broadcastable to ``mean``; ``mean`` or
    ``var`` may be None).  The squares are taken around the pooled mean in a second allreduce
    (Chan, Golub and LeVeque's pairwise combination), which keeps two-pass precision.
    """
    import numpy as np

    counts = [np.array(n, dtype=np.float64, ndmin=1) for n, _, _ in groups]
    totals = [c.copy() for c in counts]
    with np.errstate(invalid="ignore", divide="ignore"):  # empty groups: 0/0 is dropped below
        sums: list[Any] = [None if m is None else np.where(c > 0, c * m, 0.0)
                           for c, (_, m, _) in zip(counts, groups)]
        comm.allreduce(totals + [s for s in sums if s is not None], op="sum")
        squares: list[Any] = [None if v is None else
                              np.where(c > 0, c * (v + (m - np.where(t > 0, s / t, 0.0)) ** 2),
                                       0.0)
                              for c, t, s, (_, m, v) in zip(counts, totals, sums, groups)]
    present = [q for q in squares if q is not None]
    if present:
        comm.allreduce(present, op="sum")
    return list(zip(totals, sums, squares))


def _column_moments(X: Any) -> tuple[Any, Any, Any] | None:
    """``(n, mean, var)`` per column of a dense batch, or None when it is not one."""
    import numpy as np

    try:
        data = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if data.ndim != 2 or not data.shape[0]:
        return None
    return np.array([data.shape[0]], dtype=np.float64), data.mean(axis=0), data.var(axis=0)


class _GaussianNB(_Rule):
    """GaussianNB: per-class counts, means and variances, combined exactly by counts.

    ``epsilon_`` (``var_smoothing`` times the largest column variance of the *batch*) comes from
    the union of the ranks' batches, as one process would compute it.
    """

    kind = "exact"
    state = ("class_count_", "theta_", "var_")

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        import numpy as np

        self.saved = None
        if hasattr(est, "theta_"):  # the call then learns this batch alone, from zero
            self.saved = {name: getattr(est, name).copy() for name in self.state}
            for name in self.state:
                setattr(est, name, np.zeros_like(getattr(est, name)))
        X = args[0] if args else kwargs.get("X")
        self.columns = _column_moments(X) if X is not None else None

    def restore(self, est: Any) -> None:
        for name, value in (getattr(self, "saved", None) or {}).items():
            setattr(est, name, value)

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        import numpy as np

        n = est.class_count_.astype(np.float64)[:, None]
        mu = est.theta_.astype(np.float64)
        var = est.var_.astype(np.float64) - float(est.epsilon_)
        columns = getattr(self, "columns", None) or _moments_over_classes(n, mu, var)
        saved = getattr(self, "saved", None)
        if rebase and saved is not None:
            comm.broadcast(list(saved.values()), src=0)
        (nc, sc, m2c), (nx, _, m2x) = _pool(comm, [(n, mu, var), columns])
        if not nx[0]:  # called on no rank (a pair of OneVsOneClassifier absent from the batch)
            self.restore(est)
            self.saved = self.columns = None
            return
        with np.errstate(invalid="ignore", divide="ignore"):
            mu_b = np.where(nc > 0, sc / nc, 0.0)
            var_b = np.where(nc > 0, m2c / nc, 0.0)
        eps = est.var_smoothing * float(np.max(m2x / nx))
        _update_gaussian(est, saved, nc[:, 0], mu_b, var_b, eps)
        self.saved = self.columns = None


def _moments_over_classes(n: Any, mu: Any, var: Any) -> tuple[Any, Any, Any]:
    """Column moments of the whole batch from its per-class moments (no sample weights)."""
    import numpy as np

    total = float(n.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (n * mu).sum(axis=0) / total
        spread = (n * (var + (mu - mean) ** 2)).sum(axis=0) / total
    return np.array([total]), mean, spread


def _update_gaussian(est: Any, saved: dict | None, n_b: Any, mu_b: Any, var_b: Any,
                     eps: float) -> None:
    """GaussianNB's ``_partial_fit`` update, fed with the pooled batch moments."""
    import numpy as np

    dtype = est.theta_.dtype
    if saved is None:
        n0, mu0, past = np.zeros_like(n_b), np.zeros_like(mu_b), np.zeros_like(var_b)
    else:  # sklearn takes the new epsilon off the stored variances before combining
        n0 = saved["class_count_"].astype(np.float64)
        mu0 = saved["theta_"].astype(np.float64)
        past = saved["var_"].astype(np.float64) - eps
    a, b = n0[:, None], n_b[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        total = a + b
        mu = np.where(a == 0, mu_b, (b * mu_b + a * mu0) / total)
        ssd = a * past + b * var_b + (b * a / total) * (mu0 - mu_b) ** 2
        var = np.where(a == 0, var_b, ssd / total)
    seen = b > 0  # classes present in some rank's batch
    est.theta_ = np.where(seen, mu, mu0).astype(dtype)
    est.var_ = (np.where(seen, var, past) + eps).astype(dtype)
    est.class_count_ = (n0 + n_b).astype(dtype)
    est.epsilon_ = np.float64(eps)
    if est.priors is None:
        est.class_prior_ = est.class_count_ / est.class_count_.sum()


class _Scaler(_Rule):
    """Base of the scalers: ``before`` hides ``n_samples_seen_`` so the call fits this batch
    alone (sklearn's first-call path); the merge combines it with the state set aside."""

    kind = "exact"
    state: tuple[str, ...] = ()
    hide: tuple[str, ...] = ("n_samples_seen_",)

    def before(self, est: Any, args: tuple, kwargs: dict) -> None:
        self.saved = None
        if hasattr(est, "n_samples_seen_"):
            self.saved = {name: getattr(est, name, None) for name in self.state}
            for name in self.hide:
                if hasattr(est, name):
                    delattr(est, name)

    def restore(self, est: Any) -> None:
        for name, value in (getattr(self, "saved", None) or {}).items():
            setattr(est, name, value)

    def _saved(self, nf: int) -> list[Any] | None:
        """What was set aside as float64 arrays (counts per feature), None if nothing."""
        import numpy as np

        saved = getattr(self, "saved", None)
        if saved is None:
            return None
        return [None if v is None else np.broadcast_to(np.asarray(v, np.float64), (nf,)).copy()
                for v in saved.values()]


class _StandardScaler(_Scaler):
    state = ("n_samples_seen_", "mean_", "var_", "scale_")
    hide = ("n_samples_seen_", "scale_")

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        import numpy as np

        nf = est.n_features_in_
        seen = np.asarray(est.n_samples_seen_)
        n = np.broadcast_to(seen.astype(np.float64), (nf,))
        mean = None if est.mean_ is None else np.asarray(est.mean_, np.float64)
        var = None if est.var_ is None else np.asarray(est.var_, np.float64)
        saved = self._saved(nf)
        if rebase and saved is not None:
            comm.broadcast([a for a in saved[:3] if a is not None], src=0)
        ((n_b, sum_b, m2_b),) = _pool(comm, [(n, mean, var)])
        total, mean_t, var_t = _incremental(saved, n_b, sum_b, m2_b)
        _set_standard(est, total.astype(seen.dtype), mean_t, var_t)
        self.saved = None


def _incremental(saved: list[Any] | None, n_b: Any, sum_b: Any, m2_b: Any) -> tuple[Any, Any, Any]:
    """``sklearn.utils.extmath._incremental_mean_and_var``'s update, fed with pooled moments."""
    import numpy as np

    n0, mean0, var0 = (saved[:3] if saved is not None
                       else (np.zeros_like(n_b), np.zeros_like(n_b), np.zeros_like(n_b)))
    total = n0 + n_b
    if sum_b is None:
        return total, None, None
    with np.errstate(invalid="ignore", divide="ignore"):
        last_sum = mean0 * n0
        mean = (last_sum + sum_b) / total
        if m2_b is None:
            return total, mean, None
        last_over_new = n0 / n_b
        unnormalized = (var0 * n0 + m2_b
                        + last_over_new / total * (last_sum / last_over_new - sum_b) ** 2)
        unnormalized = np.where(n0 == 0, m2_b, unnormalized)
        return total, mean, unnormalized / total


def _set_standard(est: Any, n: Any, mean: Any, var: Any) -> None:
    import numpy as np
    from sklearn.preprocessing._data import _handle_zeros_in_scale, _is_constant_feature

    # as sklearn: one integer when every feature saw the same number of samples
    est.n_samples_seen_ = n[0] if n.max() == n.min() else n
    est.mean_, est.var_ = mean, var
    if est.with_std:
        constant = _is_constant_feature(var, mean, est.n_samples_seen_)
        est.scale_ = _handle_zeros_in_scale(np.sqrt(var), copy=False, constant_mask=constant)
    else:
        est.scale_ = None


def _reduce_extremes(comm: Any, low: Any, high: Any, count: int) -> tuple[Any, Any, float]:
    """Column minima/maxima (NaN where a batch had no value) and counts over the ranks' batches.

    NaN is sent as an infinity, so a rank whose batch is all NaN in a column does not hide the
    others' values (sklearn's nanmin over the union does the same).
    """
    import numpy as np

    nf = high.shape[0]
    lo = np.zeros(nf) if low is None else np.where(np.isnan(low), np.inf, low)
    extremes = np.concatenate([-lo, np.where(np.isnan(high), -np.inf, high)]).astype(np.float64)
    counts = np.array([count], dtype=np.float64)
    comm.allreduce([extremes], op="max")
    comm.allreduce([counts], op="sum")
    lo, hi = -extremes[:nf], extremes[nf:]
    lo[np.isposinf(lo)] = np.nan
    hi[np.isneginf(hi)] = np.nan
    return lo, hi, float(counts[0])


class _MinMaxScaler(_Scaler):
    state = ("n_samples_seen_", "data_min_", "data_max_")

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        import numpy as np

        dtype, nf = est.data_min_.dtype, est.data_min_.shape[0]
        saved = self._saved(nf)
        if rebase and saved is not None:
            comm.broadcast(saved, src=0)
        lo, hi, count = _reduce_extremes(comm, est.data_min_, est.data_max_, est.n_samples_seen_)
        if saved is not None:
            lo, hi, count = (np.minimum(saved[1], lo), np.maximum(saved[2], hi),
                             count + saved[0][0])
        _set_min_max(est, lo.astype(dtype), hi.astype(dtype), int(count))
        self.saved = None


def _set_min_max(est: Any, data_min: Any, data_max: Any, count: int) -> None:
    import numpy as np
    from sklearn.preprocessing._data import _handle_zeros_in_scale

    low = np.asarray(est.feature_range[0], dtype=data_min.dtype)
    high = np.asarray(est.feature_range[1], dtype=data_min.dtype)
    data_range = data_max - data_min
    est.scale_ = (high - low) / _handle_zeros_in_scale(data_range, copy=True)
    est.min_ = low - data_min * est.scale_
    est.data_min_, est.data_max_, est.data_range_ = data_min, data_max, data_range
    est.n_samples_seen_ = count


class _MaxAbsScaler(_Scaler):
    state = ("n_samples_seen_", "max_abs_")

    def merge(self, est: Any, comm: Any, rebase: bool) -> None:
        import numpy as np
        from sklearn.preprocessing._data import _handle_zeros_in_scale

        dtype, nf = est.max_abs_.dtype, est.max_abs_.shape[0]
        saved = self._saved(nf)
        if rebase and saved is not None:
            comm.broadcast(saved, src=0)
        _, top, count = _reduce_extremes(comm, None, est.max_abs_, est.n_samples_seen_)
        if saved is not None:
            top, count = np.maximum(saved[1], top), count + saved[0][0]
        est.max_abs_ = top.astype(dtype)
        est.scale_ = _handle_zeros_in_scale(est.max_abs_, copy=True)
        est.n_samples_seen_ = int(count)
        self.saved = None


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


# --- one estimator in one run ---------------------------------------------------------------


def _digest(text: str) -> float:
    # 48 bits: exact in a float64, which every transport reduces
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "big"))


_DISAGREE = {
    "estimator": "ranks reached partial_fit of different estimators (the cell must call "
                 "partial_fit in the same order on every rank)",
    "fitted": "the estimator was fitted on some ranks only before its first partial_fit here: "
              "fit it the same way on every rank (or on none)",
    "classes_": "classes_ differ across ranks: pass the same classes= at the first partial_fit "
                "on every rank (e.g. np.unique of the full labels, computed in the notebook)",
    "n_features_in_": "ranks passed different numbers of features",
    "structure": "its fitted arrays differ in shape across ranks, so they cannot be merged: fit "
                 "it on one rank, or run with --sync none and combine the models yourself",
}


def _agree(comm: Any, facts: dict[str, str], estimator: Any) -> None:
    """Raise the same EstimatorSyncError on every rank when ranks disagree on ``facts``."""
    import numpy as np

    keys = sorted(facts)
    mine = [_digest(facts[k]) for k in keys]
    both = np.array(mine + [-d for d in mine], dtype=np.float64)
    comm.allreduce([both], op="max")  # max and -min in one call
    bad = [k for i, k in enumerate(keys) if both[i] != -both[len(keys) + i]]
    if bad:
        raise EstimatorSyncError(f"{type(estimator).__name__}.partial_fit: "
                                 + "; ".join(_DISAGREE[k] for k in bad))


def _count_step(run: RunContext) -> None:
    run.steps += 1
    if run.metrics is not None:
        run.metrics.set_step(run.steps)


class _EstimatorSync:
    """One estimator in one run: its rule, its strategy, its first-call checks."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.rule: _Rule | None = None
        self.strategy: Any = None
        self.active = False          # merging at all: not --sync none, not a no-op on one rank
        self.fitted_before = False   # fitted when its first partial_fit here began
        self.merged = False
        self.started = False         # strategy.start() ran on its averaged arrays
        self.warned: set[str] = set()

    def call(self, est: Any, method: Callable, args: tuple, kwargs: dict) -> Any:
        rule = self.rule or self._open(est)
        rebase = self.active and not self.merged and self.fitted_before
        if self.active:
            rule.before(est, args, kwargs)
        try:
            result = method(*args, **kwargs)
        except BaseException:
            if self.active:
                rule.restore(est)
            raise
        if self.active:
            self._merge(est, rule, rebase)
        _count_step(self.run)
        return result

    def _open(self, est: Any) -> _Rule:
        from ._sync import NoSync, make_strategy

        run = self.run
        rule = self.rule = _choose_rule(est)
        strategy = self.strategy = make_strategy(run.strategy_spec, run.collectives, run.every,
                                                 run.alpha)
        self.active = not isinstance(strategy, NoSync) and not (
            run.world_size == 1 and strategy.identity_on_one_rank)
        self.fitted_before = _is_fitted(est)
        if not self.active:
            return rule
        kind = f"{type(est).__module__}.{type(est).__qualname__}"
        _agree(run.collectives, {"estimator": kind, "fitted": str(self.fitted_before)}, est)
        self._warn(rule.warnings())
        arrays = rule.averaged(est) if self.fitted_before else []
        if arrays:  # shipped fitted: every rank starts from rank 0's model, as torch's do
            self._start(est, rule, arrays, average_first=False)
        return rule

    def _merge(self, est: Any, rule: _Rule, rebase: bool) -> None:
        comm = self.run.collectives
        if not self.merged or rule.check_every_call:
            facts = {"structure": rule.signature(est)}
            if not self.merged:
                facts["classes_"] = repr(_listed(getattr(est, "classes_", None)))
                facts["n_features_in_"] = repr(getattr(est, "n_features_in_", None))
            _agree(comm, facts, est)
        rule.merge(est, comm, rebase)
        self.merged = True
        self._warn(rule.warnings())  # a composite knows its inner estimators only now
        arrays = rule.averaged(est)
        if not arrays:
            return
        if not self.started:
            self._start(est, rule, arrays, average_first=True)
        self.strategy.after_step(arrays, self.run.steps)  # 0-based, like torch's

    def _start(self, est: Any, rule: _Rule, arrays: list, average_first: bool) -> None:
        """First arrays of the estimator: ranks agree, then the strategy starts from them.

        Built during the first call (random initialisations may differ), the ranks' first
        models are averaged - no rank's first batch is dropped - before ``start`` (rank 0's
        broadcast, EASGD's centre)."""
        if average_first:
            self.run.collectives.allreduce(arrays, op="mean")
        self.strategy.start(arrays)
        self.started = True
        self.run.tracked.append((self.strategy, lambda: rule.averaged(est)))

    def _warn(self, messages: list[str]) -> None:
        if self.run.world_size == 1 or self.run.rank != 0:  # once per run, not once per rank
            return
        for message in messages:
            if message not in self.warned:
                self.warned.add(message)
                warnings.warn(message, EstimatorAveragingWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this module: the warning then shows the
    cell's own ``partial_fit`` line, not phalanx's."""
    frame: types.FrameType | None = sys._getframe(1)  # level 1: the frame calling warn()
    level = 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _listed(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


# --- runs, classes, hooks -------------------------------------------------------------------

_LOCK = threading.RLock()
_STATES: dict[int, _RunSync] = {}      # id(run) -> its state (one run per engine; tests: more)
_BY_THREAD: dict[int, _RunSync] = {}   # the thread that installed it -> state
_PATCHED: dict[type, dict[str, Any]] = {}  # class -> the entries it had before patching
_MISSING = object()
_PATCHED_ATTRS = ("partial_fit", "fit")


class _RunSync:
    """One run's estimators.  ``depth`` counts synchronising calls in progress: a nested call
    (a meta-estimator's inner ``partial_fit``, ``partial_fit`` inside ``fit``) runs plain.  It
    is per run, not per thread: meta-estimators with ``n_jobs`` call the inner estimators from
    joblib's threads."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.depth = 0
        self.closed = False
        self.creation_hook = False
        self.syncs: dict[int, tuple[Any, _EstimatorSync]] = {}

    def call(self, attr: str, est: Any, method: Callable, args: tuple, kwargs: dict) -> Any:
        if self.closed or self.depth:
            return method(*args, **kwargs)
        self.depth += 1
        try:
            if attr != "partial_fit":
                return method(*args, **kwargs)
            return self._sync_for(est).call(est, method, args, kwargs)
        finally:
            self.depth -= 1

    def _sync_for(self, est: Any) -> _EstimatorSync:
        entry = self.syncs.get(id(est))
        if entry is None or entry[0] is not est:  # the estimator is held: its id is not reused
            entry = self.syncs[id(est)] = (est, _EstimatorSync(self.run))
        return entry[1]

    def close(self) -> None:
        """End of the run: forget its estimators; the last run restores the classes."""
        with _LOCK:
            if self.closed:
                return
            self.closed = True
            self.syncs.clear()
            if _STATES.get(id(self.run)) is self:
                del _STATES[id(self.run)]
            for ident in [t for t, s in _BY_THREAD.items() if s is self]:
                del _BY_THREAD[ident]
            if self.creation_hook:
                _HOOK.users -= 1
                if not _HOOK.users:
                    _HOOK.stop()
            if not _STATES:
                _unpatch_all()


def _state_for(run: RunContext) -> _RunSync:
    with _LOCK:
        state = _STATES.get(id(run))
        if state is None or state.run is not run:
            state = _STATES[id(run)] = _RunSync(run)
            run.extra_cleanup.append(state.close)
        _BY_THREAD[threading.get_ident()] = state
        return state


def _current_state() -> _RunSync | None:
    state = _BY_THREAD.get(threading.get_ident())
    if state is None and len(_STATES) == 1:  # a worker thread of the run (joblib)
        state = next(iter(_STATES.values()), None)
    return state


class _Patched:
    """Class attribute standing in for ``partial_fit``/``fit`` while runs are active.

    Looked up on an instance during a run it gives a bound method that goes through the run
    (:meth:`_RunSync.call`); on the class, or outside a run, the original method itself.
    ``available_if`` descriptors keep deciding whether the method exists.
    """

    def __init__(self, attr: str, inner: Any) -> None:
        self.attr, self.inner = attr, inner

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        get = getattr(self.inner, "__get__", None)
        method = get(obj, owner) if get is not None else self.inner
        if obj is None:
            return method
        state = _current_state()
        if state is None or state.closed:
            return method
        return _routed(state, self.attr, obj, method)


def _routed(state: _RunSync, attr: str, obj: Any, method: Any) -> Any:
    @functools.wraps(getattr(method, "__func__", method))  # signature() shows the original
    def routed(self: Any, *args: Any, **kwargs: Any) -> Any:
        return state.call(attr, self, method, args, kwargs)

    return types.MethodType(routed, obj)


def _lookup(cls: type, attr: str) -> Any:
    for klass in cls.__mro__:
        if attr in vars(klass):
            return vars(klass)[attr]
    return _MISSING


def _from_sklearn(raw: Any) -> bool:
    """Whether a ``fit`` is scikit-learn's own.  Those stay per rank (``StandardScaler.fit``
    calls ``partial_fit``: syncing it would make a fit on rank 0 alone, or one inside a
    cross-validation, wait for the other ranks); a ``fit`` written for the cell that loops over
    ``partial_fit`` keeps synchronising each call, as the user wrote it for every rank."""
    module = str(getattr(raw, "__module__", None) or type(raw).__module__)
    return module == "sklearn" or module.startswith("sklearn.")


def _patch_class(cls: type) -> bool:
    """Route ``partial_fit``/``fit`` of ``cls`` through the runs; False if the class refuses."""
    with _LOCK:
        if cls in _PATCHED:
            return True
        saved: dict[str, Any] = {}
        for attr in _PATCHED_ATTRS:
            raw = _lookup(cls, attr)
            if raw is _MISSING or isinstance(raw, _Patched):  # a patched base routes it already
                continue
            if attr == "fit" and not _from_sklearn(raw):  # a fit of one's own: see _from_sklearn
                continue
            saved[attr] = vars(cls).get(attr, _MISSING)
            try:
                setattr(cls, attr, _Patched(attr, raw))
            except (TypeError, AttributeError):  # extension types
                _restore_class(cls, saved)
                return False
        _PATCHED[cls] = saved
        return True


def _restore_class(cls: type, saved: dict[str, Any]) -> None:
    for attr, own in saved.items():
        if own is not _MISSING:
            setattr(cls, attr, own)
        elif isinstance(vars(cls).get(attr), _Patched):
            delattr(cls, attr)


def _unpatch_all() -> None:
    with _LOCK:
        for cls, saved in _PATCHED.items():
            _restore_class(cls, saved)
        _PATCHED.clear()


def _patch_instance(estimator: Any, state: _RunSync) -> None:
    """Fallback for a class that cannot be patched: an instance attribute, removed at the end."""
    if "partial_fit" in getattr(estimator, "__dict__", {}):
        return
    method = estimator.partial_fit
    try:
        estimator.partial_fit = functools.wraps(method)(
            lambda *args, **kwargs: state.call("partial_fit", estimator, method, args, kwargs))
    except (TypeError, AttributeError) as exc:
        raise TypeError(f"phalanx cannot synchronise partial_fit of {type(estimator).__name__}: "
                        f"neither its class nor the instance accepts a new attribute") from exc
    state.run.extra_cleanup.append(lambda: vars(estimator).pop("partial_fit", None))


def patch_partial_fit(estimator: Any, run: RunContext) -> Any:
    """Make ``estimator.partial_fit`` merge across ranks for the rest of ``run``; returns it.

    Example (what ``wrap(estimator)`` does)::

        clf = patch_partial_fit(SGDClassifier(), current_run())
    """
    state = _state_for(run)
    if not _patch_class(type(estimator)):
        _patch_instance(estimator, state)
    return estimator


def patch_namespace_estimators(run: RunContext, namespace: dict) -> int:
    """Synchronise the estimators with ``partial_fit`` the cell received (values of the
    namespace, and items of lists, tuples and dicts there); returns how many."""
    found = 0
    for value in list(namespace.values()):
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        for item in items:
            if is_incremental_estimator(item):
                patch_partial_fit(item, run)
                found += 1
    return found


# --- estimators created inside the cell ------------------------------------------------------


class _CreationHook:
    """Patches every scikit-learn class with ``partial_fit``: those loaded now, and those
    defined later (``BaseEstimator.__init_subclass__``), while some run wants it.

    Not ``BaseEstimator.__new__``: CPython 3.11 cannot take a ``__new__`` back (after ``del``,
    every subclass keeps calling ``object.__new__`` with the constructor's arguments, which
    raises), and instance attributes would not survive pickling or ``copy.deepcopy``.
    When scikit-learn is installed but not imported yet (importing it costs seconds), a
    one-shot import watcher does it once ``sklearn.base`` has loaded.
    """

    def __init__(self) -> None:
        self.users = 0
        self.base: Any = None
        self.own: Any = _MISSING
        self.installed: Any = None
        self.watch: _ImportWatch | None = None

    def start(self) -> None:
        if "sklearn.base" in sys.modules:
            self.on_sklearn()
        elif importlib.util.find_spec("sklearn") is not None:
            self.watch = _ImportWatch("sklearn.base", self.on_sklearn)
            sys.meta_path.insert(0, self.watch)

    def on_sklearn(self) -> None:
        with _LOCK:
            if not self.users or self.base is not None:
                return
            base = self.base = sys.modules["sklearn.base"].BaseEstimator
            own = self.own = vars(base).get("__init_subclass__", _MISSING)

            def init_subclass(cls: Any, **kwargs: Any) -> None:
                if own is not _MISSING:
                    own.__get__(None, cls)(**kwargs)
                else:
                    super(base, cls).__init_subclass__(**kwargs)
                if hasattr(cls, "partial_fit"):
                    _patch_class(cls)

            base.__init_subclass__ = self.installed = classmethod(init_subclass)
            for cls in _subclasses(base):
                if hasattr(cls, "partial_fit"):
                    _patch_class(cls)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.remove()
            self.watch = None
        if self.base is not None:
            if vars(self.base).get("__init_subclass__") is self.installed:  # not someone else's
                if self.own is _MISSING:
                    del self.base.__init_subclass__
                else:
                    self.base.__init_subclass__ = self.own
            self.base, self.own, self.installed = None, _MISSING, None


def _subclasses(base: type) -> list[type]:
    out: dict[type, None] = {}  # ordered, and diamonds counted once
    todo: list[type] = [base]
    while todo:
        found: list[type] = todo.pop().__subclasses__()
        for cls in found:
            if cls not in out:
                out[cls] = None
                todo.append(cls)
    return list(out)


class _ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``callback`` once module ``name`` has executed; consulted only for modules not
    imported yet, and leaves ``sys.meta_path`` at its first use."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        self.remove()
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenLoader(spec.loader, self.callback)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    """A loader that runs ``callback`` after the module executed (and then looks like the real
    loader: ``__loader__`` and ``__spec__.loader`` are put back first)."""

    def __init__(self, loader: Any, callback: Callable[[], None]) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.callback()


_HOOK = _CreationHook()


def install_estimator_sync(run: RunContext) -> Callable[[], None]:
    """Synchronise ``partial_fit`` of every scikit-learn estimator the cell builds while ``run``
    is active; returns the undo (also queued in ``run.extra_cleanup``; calling both is fine).

    Costs nothing when scikit-learn is not installed; when it is installed but not imported,
    nothing is imported until the cell does.

    Example::

        undo = install_estimator_sync(run)
        try:
            exec(cell, namespace)
        finally:
            undo()
    """
    state = _state_for(run)
    with _LOCK:
        if not state.creation_hook:
            state.creation_hook = True
            _HOOK.users += 1
            if _HOOK.users == 1:
                _HOOK.start()
    return state.close
