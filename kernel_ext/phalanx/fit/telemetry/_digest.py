"""A run's curves at bounded size, kept up to date as rows arrive (pure numpy).

:class:`CurveDigest` holds, per metric, one :class:`~._downsample.M4Stream` per rank and one for
the mean over ranks (:class:`RankMeans`): a few thousand points per line whatever the run's
length.  It is what a reloaded panel receives instead of every row, and what the static summary
draws.

Example::

    >>> import numpy as np
    >>> d = CurveDigest(world_size=2, max_points=400)
    >>> d.add({"rank": np.array([0, 1]), "step": np.array([1, 1]), "t": np.zeros(2),
    ...        "loss": np.array([1.0, 3.0])})
    {'loss': [[1, 2.0]]}
    >>> d.points()["loss"]["mean"]
    ([1.0], [2.0])
"""

from __future__ import annotations

import threading
from typing import Any, Hashable

import numpy as np

from ._downsample import MAX_POINTS, M4Stream, m4_indices

MEAN = "mean"
MAX_OPEN_STEPS = 256
_BASE = ("rank", "step", "t")


def wire_means(rows: np.ndarray) -> list[list[float]]:
    """``[[step, mean], ...]`` of ``(mean, step)`` rows: the wire form of a mean line."""
    return [[int(step), mean] for mean, step in rows.tolist()]


class StepMeans:
    """Means over ranks of one metric, handed out once a step is settled."""

    def __init__(self) -> None:
        self._open: dict[int, list[float]] = {}   # step -> [sum, count]

    def add(self, steps: np.ndarray, values: np.ndarray) -> None:
        unique, inverse = np.unique(steps, return_inverse=True)
        sums = np.bincount(inverse, weights=values)
        counts = np.bincount(inverse)
        for step, s, c in zip(unique.tolist(), sums.tolist(), counts.tolist()):
            at = self._open.setdefault(step, [0.0, 0])
            at[0] += s
            at[1] += c

    def settle(self, world_size: int, passed: int | None, final: bool = False) -> np.ndarray:
        """Rows ``(mean, step)`` of the steps now settled, in step order; ``passed``: the
        lowest step any rank last logged (every rank moved past the steps below it)."""
        ready = [s for s, (_, c) in self._open.items()
                 if final or c >= world_size or (passed is not None and s < passed)]
        overflow = len(self._open) - len(ready) - MAX_OPEN_STEPS
        if overflow > 0:
            waiting = sorted(set(self._open) - set(ready))
            ready.extend(waiting[:overflow])
        out = np.empty((len(ready), 2))
        for i, step in enumerate(sorted(ready)):
            total, count = self._open.pop(step)
            out[i] = (total / count, step)
        return out


class RankMeans:
    """The mean over ranks of each metric, step by step, as rows arrive in any grouping.

    A step's mean is handed out once every rank logged the metric there or moved past it (each
    rank's steps only grow), or once more than :data:`MAX_OPEN_STEPS` steps wait (a rank that
    never logs it).  ``world_size=None``: as many ranks as have logged.

    Example::

        >>> import numpy as np
        >>> m = RankMeans(world_size=2)
        >>> m.add(np.array([0]), np.array([1]), {"loss": np.array([1.0])})
        {}
        >>> m.add(np.array([1]), np.array([1]), {"loss": np.array([3.0])})["loss"].tolist()
        [[2.0, 1.0]]
    """

    def __init__(self, world_size: int | None) -> None:
        self.world_size = world_size
        self._means: dict[str, StepMeans] = {}
        self._position: dict[int, int] = {}       # rank -> last step it logged

    def add(self, ranks: np.ndarray, steps: np.ndarray,
            metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take rows by column (NaN = not logged); returns the newly settled ``(mean, step)``
        rows per metric, in step order (metrics with none settled are left out)."""
        for rank in np.unique(ranks).tolist():
            last = int(steps[ranks == rank].max())
            self._position[rank] = max(self._position.get(rank, -1), last)
        for name, values in metrics.items():
            logged = ~np.isnan(values)
            self._means.setdefault(name, StepMeans()).add(steps[logged], values[logged])
        return self._settle(list(metrics), final=False)

    def finish(self) -> dict[str, np.ndarray]:
        """The run is over: the means of the steps still open."""
        return self._settle(list(self._means), final=True)

    def _settle(self, names: list[str], final: bool) -> dict[str, np.ndarray]:
        world = self.world_size or len(self._position)
        passed = min(self._position.values()) if len(self._position) >= world else None
        out = {}
        for name in names:
            settled = self._means[name].settle(world, passed, final)
            if len(settled):
                out[name] = settled
        return out


class CurveDigest:
    """Downsampled lines ``{metric: {rank or "mean": M4Stream}}`` of one run; thread-safe."""

    def __init__(self, world_size: int, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self._lines: dict[str, dict[Hashable, M4Stream]] = {}
        self._means = RankMeans(world_size)
        self._lock = threading.Lock()

    @property
    def world_size(self) -> int:
        return self._means.world_size or 0

    @world_size.setter
    def world_size(self, value: int) -> None:  # a resized run: steps settle with the new ranks
        with self._lock:
            self._means.world_size = value

    def add(self, columns: dict[str, np.ndarray]) -> dict[str, list[list[float]]]:
        """New rows by column (``rank``, ``step``, ``t``, one array per metric, NaN = not
        logged); returns the means over ranks settled by them, ``{metric: [[step, mean], ...]}``
        (what a ``metrics`` event carries as ``means``)."""
        ranks, steps, times = columns["rank"], columns["step"], columns["t"]
        if not len(ranks):
            return {}
        metrics = {k: v for k, v in columns.items() if k not in _BASE}
        with self._lock:
            by_rank = {int(r): ranks == r for r in np.unique(ranks)}
            for name, values in metrics.items():
                logged = ~np.isnan(values)
                lines = self._lines.setdefault(name, {})
                for rank, mask in by_rank.items():
                    keep = mask & logged
                    if keep.any():
                        line = lines.setdefault(rank, M4Stream(self.max_points, 3))
                        line.add(np.stack([values[keep], steps[keep], times[keep]], axis=1))
            return self._add_means(self._means.add(ranks, steps, metrics))

    def finish(self) -> dict[str, list[list[float]]]:
        """The run is over: take the means of the steps still open (and return them)."""
        with self._lock:
            return self._add_means(self._means.finish())

    def _add_means(self, settled: dict[str, np.ndarray]) -> dict[str, list[list[float]]]:
        for name, rows in settled.items():
            self._lines[name].setdefault(MEAN, M4Stream(self.max_points, 2)).add(rows)
        return {name: wire_means(rows) for name, rows in settled.items()}

    def mean_points(self) -> dict[str, list[list[float]]]:
        """The drawn mean line of each metric, ``{metric: [[step, mean], ...]}``, at most
        ~``max_points`` each: what a reloaded panel draws as the mean."""
        with self._lock:
            return {name: wire_means(lines[MEAN].points())
                    for name, lines in self._lines.items() if MEAN in lines}

    def points(self) -> dict[str, dict[Hashable, tuple[list, list]]]:
        """``{metric: {rank or "mean": (steps, values)}}``, at most ~``max_points`` each."""
        with self._lock:
            out: dict[str, dict[Hashable, tuple[list, list]]] = {}
            for name, lines in self._lines.items():
                for key, line in lines.items():
                    drawn = line.points()
                    out.setdefault(name, {})[key] = (drawn[:, 1].tolist(), drawn[:, 0].tolist())
            return out

    def stats(self) -> dict[str, dict[str, dict[str, float | None]]]:
        """Per rank and metric: how many values were logged, their min, max and last (exact:
        the downsampling keeps every line's extremes and last point).

        Example: ``digest.stats()["0"]["loss"] == {"count": 500, "min": 0.1, "max": 2.3, "last": 0.1}``
        """
        with self._lock:
            out: dict[str, dict[str, dict[str, float | None]]] = {}
            for name, lines in self._lines.items():
                for rank, line in lines.items():
                    values = line.points()[:, 0]
                    finite = values[~np.isnan(values)]
                    out.setdefault(str(rank), {})[name] = {
                        "count": line.count, "last": float(values[-1]),
                        "min": float(finite.min()) if len(finite) else None,
                        "max": float(finite.max()) if len(finite) else None}
            return out

    def wire_rows(self) -> list[dict]:
        """The ranks' downsampled points as metric rows ``{rank, step, t, metrics}`` (the form of
        ``metrics`` events), by step then rank (so a panel can take each step's mean over
        ranks as the rows come); points of one rank and step share a row."""
        with self._lock:
            merged: dict[tuple[int, int], dict] = {}
            for name, lines in self._lines.items():
                for rank, line in lines.items():
                    if not isinstance(rank, int):  # the mean line: not a rank's row
                        continue
                    for value, step, t in line.points().tolist():
                        row = merged.setdefault((rank, int(step)), {
                            "rank": rank, "step": int(step), "t": t, "metrics": {}})
                        row["metrics"][name] = value
        return [merged[k] for k in sorted(merged, key=lambda k: (k[1], k[0]))]


def window_rows(history: Any, steps: tuple | None = None, times: tuple | None = None,
                rank: int | None = None, max_points: int | None = None) -> list[dict]:
    """The rows of ``history`` inside a step or time window (inclusive bounds, ``None`` leaves a
    side open), of one rank or all, as wire rows ``{rank, step, t, metrics}``: every row while a
    line has at most ``max_points`` in the window, else its M4 downsampling.

    Example::

        >>> from ._history import MetricHistory
        >>> h = MetricHistory()
        >>> h.extend(0, [[s, 0.0, {"loss": 1.0 / s}] for s in range(1, 101)])
        100
        >>> [r["step"] for r in window_rows(h, steps=(10, 12))]
        [10, 11, 12]
    """
    limit = max_points or MAX_POINTS
    cols = history.columns(0, rank, steps, times)
    names = [k for k in cols if k not in _BASE]
    keep = np.zeros(len(cols["rank"]), bool)
    for r in np.unique(cols["rank"]).tolist():
        where = np.flatnonzero(cols["rank"] == r)
        for name in names:
            logged = where[~np.isnan(cols[name][where])]
            keep[logged[m4_indices(cols[name][logged], max(1, limit // 4))]] = True
    rows = []
    picked = {k: v[keep].tolist() for k, v in cols.items()}
    for i, (r, s, t) in enumerate(zip(picked["rank"], picked["step"], picked["t"])):
        rows.append({"rank": r, "step": s, "t": t, "metrics": {
            n: picked[n][i] for n in names if picked[n][i] == picked[n][i]}})
    return rows


def window_points(history: Any, metric: str, key: Hashable, start: float, end: float,
                  max_points: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One line of a zoomed chart: ``(steps, values)`` of ``metric`` for rank ``key`` (or the
    mean over ranks, ``key == "mean"``) with ``start <= step <= end``, at full resolution up to
    ``max_points``, downsampled (M4) beyond."""
    cols = history.columns(0, _rank_of(key), (start, end))
    steps, values = cols["step"], cols.get(metric, np.zeros(len(cols["step"])) * np.nan)
    logged = ~np.isnan(values)
    steps, values = steps[logged], values[logged]
    if key == MEAN and len(steps):
        steps, inverse = np.unique(steps, return_inverse=True)
        values = np.bincount(inverse, weights=values) / np.bincount(inverse)
    else:
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    keep = m4_indices(values, max(1, (max_points or MAX_POINTS) // 4))
    return steps[keep].astype(float), values[keep]


def _rank_of(key: Hashable) -> int | None:
    """The rank whose line ``key`` names (``None``: the mean over ranks)."""
    if key == MEAN:
        return None
    if isinstance(key, (int, str, np.integer)):
        return int(key)
    raise TypeError(f"a line is named by its rank or {MEAN!r}, not {key!r}")
