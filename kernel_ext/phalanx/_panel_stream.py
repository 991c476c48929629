"""Metric rows on their way to the lab panel, bounded per flush.

A run that logs fast would send every row to every panel (8 ranks logging 1,000 steps a second
is 8,000 rows a second on IOPub), while the panel keeps only a min/max-preserving downsampling
(M4) of each line.  So each flush carries about :data:`LINE_POINTS` rows per rank at most,
chosen the same way: M4 over the flush's rows of that rank, the buckets shared out among its
metrics.  Consecutive chunks thinned by M4 and downsampled again by the panel still show every
chunk's extremes, so spikes and the last point survive.  The mean over ranks is not taken from
these rows (one step's rows of different ranks are thinned differently): the kernel's digest
takes it from every row and the event carries it as ``means``, thinned the same way here.

Example::

    >>> from phalanx import events
    >>> rows = [{"rank": r, "step": s, "t": 0.0, "metrics": {"loss": float(s)}}
    ...         for s in range(1000) for r in (0, 1)]
    >>> means = {"loss": [[s, float(s)] for s in range(1000)]}
    >>> thin = thin_metrics(events.metrics("r", rows, means), line_points=64)
    >>> len(thin["rows"]) <= 2 * 64, len(thin["means"]["loss"]) <= 64, thin["rows"][-1]["step"]
    (True, True, 999)
"""

from __future__ import annotations

import numpy as np

from .fit._downsample import m4_indices

# Rows per rank in one flush (a few flushes a second): a line gains a few hundred points a second
# at most, more than a chart a few thousand pixels wide redraws usefully.
LINE_POINTS = 64


def thin_metrics(event: dict, line_points: int = LINE_POINTS) -> dict:
    """``event`` (``metrics``) with about ``line_points`` rows per rank at most and as many mean
    points per metric; every row of a rank that has no more than that."""
    rows, buckets = event["rows"], max(1, line_points // 4)
    kept = _kept_rows(rows, line_points)
    thinned = rows if len(kept) == len(rows) else [rows[i] for i in kept.tolist()]
    means = {name: [points[i] for i in m4_indices(np.array([p[1] for p in points], float),
                                                  buckets).tolist()]
             for name, points in (event.get("means") or {}).items()}
    return {**event, "rows": thinned, "means": means}


def _kept_rows(rows: list[dict], line_points: int) -> np.ndarray:
    ranks = np.fromiter((r["rank"] for r in rows), np.int64, len(rows))
    keep = np.zeros(len(rows), bool)
    names = list(dict.fromkeys(name for r in rows for name in r["metrics"]))
    # M4 keeps up to four rows per bucket and metric: share the rank's rows out among them.
    buckets = max(1, line_points // (4 * max(1, len(names))))
    for rank in np.unique(ranks).tolist():
        where = np.flatnonzero(ranks == rank)
        if len(where) <= line_points:
            keep[where] = True
            continue
        for name in names:
            logged = np.array([i for i in where.tolist() if name in rows[i]["metrics"]], np.int64)
            values = np.array([rows[i]["metrics"][name] for i in logged.tolist()], float)
            keep[logged[m4_indices(values, buckets)]] = True
    return np.flatnonzero(keep)
