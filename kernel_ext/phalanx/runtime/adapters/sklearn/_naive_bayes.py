"""Exact merges of the naive Bayes estimators: additive counts (Multinomial, Bernoulli,
Complement, Categorical) and per-class moments combined by counts (Gaussian)."""

from __future__ import annotations

from typing import Any

from ._pooling import _pool
from ._merge_rules import _Rule


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
