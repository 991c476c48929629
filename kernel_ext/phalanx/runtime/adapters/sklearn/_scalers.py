"""Exact merges of the scalers: ``StandardScaler`` (moments combined by counts),
``MinMaxScaler`` and ``MaxAbsScaler`` (extremes reduced)."""

from __future__ import annotations

from typing import Any

from ._pooling import _pool, _reduce_extremes
from ._merge_rules import _Rule


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
