"""Min/max-preserving downsampling of metric curves (M4), whole or incremental (pure numpy).

A curve of any length is drawn with a bounded number of points: consecutive points are grouped
into buckets and each bucket keeps its first, lowest, highest and last point (M4).  A spike
therefore always shows, and so do the curve's global minimum and maximum and its last point.

:class:`M4Stream` does it as points arrive, without recomputing: buckets hold only those four
points, and when there are too many, neighbouring buckets are merged pairwise (the four points
of a merged bucket follow from those of its halves), so the width doubles and the drawn count
halves.  Until a curve outgrows its budget every point is kept as it is.

Example::

    >>> import numpy as np
    >>> y = np.zeros(1000); y[500] = 9.0; y[-1] = -1.0
    >>> keep = m4_indices(y, buckets=10)
    >>> len(keep) <= 40, 500 in keep, 999 in keep
    (True, True, True)
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 4000   # per line: a chart a few thousand pixels wide cannot show more


def m4_indices(y: np.ndarray, buckets: int) -> np.ndarray:
    """Sorted indices of the points M4 keeps: first, min, max and last of each of ``buckets``
    equal runs of ``y`` (NaNs are never a bucket's min or max)."""
    n = len(y)
    if n <= 4 * buckets:
        return np.arange(n)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts, stops = edges[:-1], edges[1:]
    bucket = np.repeat(np.arange(buckets), stops - starts)
    # Sorted by bucket, then by value (stable: ties keep their order, as argmin's first hit),
    # each bucket's points stay at its own positions, its lowest first: one sort in C instead
    # of an argmin and an argmax per bucket in Python (~10x faster at a few hundred buckets).
    nan = np.isnan(y)  # sorted last either way: never a bucket's min or max while it has a number
    mins = np.lexsort((np.where(nan, np.inf, y), bucket))[starts]
    maxs = np.lexsort((np.where(nan, np.inf, -y), bucket))[starts]
    return np.unique(np.concatenate([starts, mins, maxs, stops - 1]))


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` of ``(x, y)``, extremes and the last point kept.

    Example::

        >>> import numpy as np
        >>> xs, ys = downsample(np.arange(10_000), np.sin(np.arange(10_000)), max_points=400)
        >>> len(xs) <= 400, bool(ys.max() == np.sin(np.arange(10_000)).max())
        (True, True)
    """
    keep = m4_indices(np.asarray(y, dtype=float), max(1, max_points // 4))
    return np.asarray(x)[keep], np.asarray(y)[keep]


# A bucket is an array (4, C): its first, lowest, highest and last point; column 0 is the value
# compared (y), the others ride along (x, time).
FIRST, LOW, HIGH, LAST = range(4)


def _summaries(points: np.ndarray, width: int) -> np.ndarray:
    """Buckets (n, 4, C) of ``points`` (n * width, C), ``width`` consecutive points each."""
    grouped = points.reshape(-1, width, points.shape[1])
    y = grouped[:, :, 0]
    low = np.argmin(np.where(np.isnan(y), np.inf, y), axis=1)
    high = np.argmax(np.where(np.isnan(y), -np.inf, y), axis=1)
    rows = np.arange(len(grouped))
    return np.stack([grouped[:, 0], grouped[rows, low], grouped[rows, high], grouped[:, -1]], axis=1)


def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The buckets covering ``a[i]`` then ``b[i]`` (arrays (n, 4, C))."""
    ay, by = a[:, :, 0], b[:, :, 0]
    take_a_low = (ay[:, LOW] <= by[:, LOW]) | np.isnan(by[:, LOW])
    take_a_high = (ay[:, HIGH] >= by[:, HIGH]) | np.isnan(by[:, HIGH])
    low = np.where(take_a_low[:, None], a[:, LOW], b[:, LOW])
    high = np.where(take_a_high[:, None], a[:, HIGH], b[:, HIGH])
    return np.stack([a[:, FIRST], low, high, b[:, LAST]], axis=1)


def _drawn(buckets: np.ndarray) -> np.ndarray:
    """The points (4n, C) that draw ``buckets`` in x order (the low and high in their order)."""
    low_first = buckets[:, LOW, 1] <= buckets[:, HIGH, 1]
    middle = np.where(low_first[:, None, None], buckets[:, [LOW, HIGH]], buckets[:, [HIGH, LOW]])
    return np.concatenate([buckets[:, :1], middle, buckets[:, 3:]], axis=1).reshape(-1, buckets.shape[2])


class M4Stream:
    """One curve downsampled as it grows: at most ``max_points`` drawn points (+4 while a bucket
    fills).  :meth:`add` says how the drawn points change: keep the first ``keep`` of them and
    append the rows it returns (``keep == 0``: everything was redrawn, which happens each time
    the curve doubles past its budget, so rarely).

    Example::

        >>> s = M4Stream(max_points=8, columns=2)
        >>> keep, new = s.add(np.array([[1.0, 0], [2.0, 1]]))      # (y, x) rows
        >>> keep, new[:, 0].tolist()
        (0, [1.0, 2.0])
        >>> keep, new = s.add(np.array([[float(i), i] for i in range(2, 20)]))
        >>> keep, len(s.points()) <= 8 + 4, float(s.points()[-1, 0])
        (0, True, 19.0)
    """

    def __init__(self, max_points: int = MAX_POINTS, columns: int = 2) -> None:
        self.max_buckets = max(2, max_points // 4)
        self.max_points = max_points
        self.width = 1                                    # points per bucket; 1: every point kept
        self.count = 0
        self._exact = np.zeros((0, columns))               # while width == 1
        self._done = np.zeros((0, 4, columns))             # completed buckets (width > 1)
        self._open: np.ndarray | None = None               # the filling bucket's summary
        self._open_n = 0

    def points(self) -> np.ndarray:
        """The drawn points (rows of the columns given to :meth:`add`)."""
        if self.width == 1:
            return self._exact
        tail = [] if self._open is None else [_drawn(self._open[None])]
        return np.concatenate([_drawn(self._done), *tail])

    def add(self, rows: np.ndarray) -> tuple[int, np.ndarray]:
        """Take new points (rows ``(y, x, ...)``); returns ``(keep, new drawn rows)``."""
        rows = np.asarray(rows, dtype=float)
        if not len(rows):
            return len(self.points()), rows[:0]
        self.count += len(rows)
        if self.width == 1:
            before = len(self._exact)
            self._exact = np.concatenate([self._exact, rows])
            if len(self._exact) <= self.max_points:
                return before, rows
            self._start_buckets()
            return 0, self.points()
        keep = 4 * len(self._done)
        self._fill(rows)
        if len(self._done) + (self._open is not None) > self.max_buckets:
            while len(self._done) + (self._open is not None) > self.max_buckets:
                self._halve()
            return 0, self.points()
        tail = [] if self._open is None else [_drawn(self._open[None])]
        return keep, np.concatenate([_drawn(self._done[keep // 4:]), *tail])

    def _start_buckets(self) -> None:
        points, self._exact = self._exact, self._exact[:0]
        self.width, self._done, self._open, self._open_n = 1, _summaries(points, 1), None, 0
        while len(self._done) + (self._open is not None) > self.max_buckets:
            self._halve()

    def _fill(self, rows: np.ndarray) -> None:
        if self._open is not None:  # complete the filling bucket first
            take = min(self.width - self._open_n, len(rows))
            part = _summaries(rows[:take], take)
            self._open = _merge(self._open[None], part)[0]
            self._open_n += take
            rows = rows[take:]
            if self._open_n == self.width:
                self._done = np.concatenate([self._done, self._open[None]])
                self._open, self._open_n = None, 0
        whole = len(rows) // self.width * self.width
        if whole:
            self._done = np.concatenate([self._done, _summaries(rows[:whole], self.width)])
        if whole < len(rows):
            rest = rows[whole:]
            self._open, self._open_n = _summaries(rest, len(rest))[0], len(rest)

    def _halve(self) -> None:
        """Merge neighbouring buckets: twice the width, half the buckets."""
        done = self._done
        if len(done) % 2:  # the odd one out is the start of the new filling bucket
            last = done[-1]
            self._open = last if self._open is None else _merge(last[None], self._open[None])[0]
            self._open_n += self.width
            done = done[:-1]
        self._done = _merge(done[0::2], done[1::2])
        self.width *= 2
