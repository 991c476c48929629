"""Statistics of the ranks' batches pooled over the ranks (collectives), for the exact rules."""

from __future__ import annotations

from typing import Any


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
