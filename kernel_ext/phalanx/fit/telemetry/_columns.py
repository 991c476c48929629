"""Column chunks of a metric history: numpy arrays in memory, ``.npz`` files on disk (pure IO).

A chunk holds consecutive rows in arrival order: ``rank`` (int32), ``step`` (int64), ``t``
(float64) and one float64 column per metric, plus a boolean ``present.<name>`` column only where
some row of the chunk did not log that metric.  That is 20 bytes per row and 8 per metric value,
against ~270 bytes for a row kept as a dict.

Each chunk also keeps, per rank, its row count and step and time range, so a query for one
rank's window opens only the chunks that can hold it.  A chunk on disk is one ``part-NNNNNN.npz``
file (numpy's own format, readable without phalanx: ``np.load(path)["metric.loss"]``).

Example::

    >>> import numpy as np
    >>> c = Chunk.build({"rank": np.array([0, 1]), "step": np.array([1, 1]), "t": np.zeros(2),
    ...                  "metric.loss": np.array([0.5, 0.7])})
    >>> c.rows, c.metric_names(), c.load()["metric.loss"].tolist()
    (2, ['loss'], [0.5, 0.7])
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np

METRIC = "metric."
PRESENT = "present."
BASE = ("rank", "step", "t")
BASE_DTYPES = {"rank": np.int32, "step": np.int64, "t": np.float64}


@dataclass(frozen=True)
class RankSpan:
    """What one chunk holds of one rank: row count, step and time range."""

    rows: int
    step_min: int
    step_max: int
    t_min: float
    t_max: float

    def overlaps(self, steps: tuple | None, times: tuple | None) -> bool:
        return (_meets(self.step_min, self.step_max, steps)
                and _meets(self.t_min, self.t_max, times))


def _meets(low: float, high: float, window: tuple | None) -> bool:
    if window is None:
        return True
    start, stop = window
    return (start is None or high >= start) and (stop is None or low <= stop)


class Chunk:
    """Immutable rows; ``columns`` in memory, or ``path`` once written to disk."""

    def __init__(self, rows: int, names: tuple[str, ...], spans: dict[int, RankSpan],
                 columns: dict[str, np.ndarray] | None = None, path: str | None = None) -> None:
        self.rows, self.names, self.spans = rows, names, spans
        self.columns, self.path = columns, path

    @classmethod
    def build(cls, columns: dict[str, np.ndarray]) -> "Chunk":
        """A chunk of the given columns (``rank``, ``step``, ``t``, ``metric.*``, ``present.*``)."""
        return cls(len(columns["rank"]), tuple(columns), _spans(columns), columns=columns)

    @property
    def in_memory(self) -> bool:
        return self.columns is not None

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns.values()) if self.columns is not None else 0

    def metric_names(self) -> list[str]:
        return [n[len(METRIC):] for n in self.names if n.startswith(METRIC)]

    def load(self) -> dict[str, np.ndarray]:
        """Every column (from memory, or read from the file)."""
        if self.columns is not None:
            return self.columns
        assert self.path is not None, "a chunk holds its columns or the path of its file"
        if not os.path.exists(self.path):
            raise FileNotFoundError(
                f"the metric history file {self.path} is gone (the notebook's run log keeps the "
                "newest PHALANX_KEEP_RUNS runs; pass --keep-history DIR to %%distributed_fit to "
                "keep a run's history for good)")
        with np.load(self.path) as data:
            return {name: data[name] for name in data.files}

    def spill(self, path: str) -> "Chunk":
        """Write the columns to ``path``; the same rows, now read from disk."""
        assert self.columns is not None, "only a chunk in memory is spilled"
        tmp = path + ".tmp.npz"
        # numpy's stub reads **columns as if it could hold savez's allow_pickle flag
        np.savez(tmp, **self.columns)  # type: ignore[arg-type]
        os.replace(tmp, path)  # a reader never sees a half-written part
        return Chunk(self.rows, self.names, self.spans, path=path)

    @classmethod
    def read(cls, path: str) -> "Chunk":
        """The chunk a file holds (its rank spans computed from the file)."""
        with np.load(path) as data:
            base = {name: data[name] for name in BASE}
            return cls(len(base["rank"]), tuple(data.files), _spans(base), path=path)


def _spans(columns: dict[str, np.ndarray]) -> dict[int, RankSpan]:
    ranks, steps, times = columns["rank"], columns["step"], columns["t"]
    spans = {}
    for rank in np.unique(ranks).tolist():
        mask = ranks == rank
        s, t = steps[mask], times[mask]
        spans[int(rank)] = RankSpan(int(mask.sum()), int(s.min()), int(s.max()),
                                    float(t.min()), float(t.max()))
    return spans


class ChunkBuffer:
    """The open chunk: preallocated columns that rows are copied into, sealed when full."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._cols = {name: np.empty(capacity, dtype) for name, dtype in BASE_DTYPES.items()}
        self._values: dict[str, np.ndarray] = {}    # metric name -> its column in _cols
        self._masks: dict[str, np.ndarray] = {}     # only for metrics some row did not log

    @property
    def room(self) -> int:
        return self.capacity - self.used

    def append(self, ranks: np.ndarray | int, steps: np.ndarray, times: np.ndarray,
               metrics: dict[str, tuple[np.ndarray, np.ndarray | None]]) -> None:
        """Copy ``len(steps)`` (<= :attr:`room`) rows in; ``metrics[name] = (values, present)``,
        ``present`` None when every row has the metric."""
        lo, hi = self.used, self.used + len(steps)
        cols, values_of = self._cols, self._values
        cols["rank"][lo:hi] = ranks
        cols["step"][lo:hi] = steps
        cols["t"][lo:hi] = times
        if len(metrics) != len(values_of) or any(name not in values_of for name in metrics):
            self._conform(metrics, lo, hi)
        masks = self._masks
        for name, (values, present) in metrics.items():
            values_of[name][lo:hi] = values
            if present is not None:
                self._mask(name)[lo:hi] = present
            elif masks and name in masks:
                masks[name][lo:hi] = True
        self.used = hi

    def _conform(self, metrics: dict, lo: int, hi: int) -> None:
        """Columns for metrics new to this chunk; rows ``lo:hi`` lack the ones not logged."""
        for name in [n for n in metrics if n not in self._values]:  # in logged order
            self._values[name] = self._cols[METRIC + name] = np.full(self.capacity, np.nan)
            if lo:  # earlier rows of this chunk did not log it
                self._mask(name)[:lo] = False
        for name in [n for n in self._values if n not in metrics]:
            self._values[name][lo:hi] = np.nan
            self._mask(name)[lo:hi] = False

    def _mask(self, name: str) -> np.ndarray:
        if name not in self._masks:
            self._masks[name] = self._cols[PRESENT + name] = np.ones(self.capacity, dtype=bool)
        return self._masks[name]

    def view(self, start: int = 0) -> dict[str, np.ndarray]:
        """A copy of the rows from ``start`` on (readers must not see later writes)."""
        return {name: col[start:self.used].copy() for name, col in self._cols.items()}

    def seal(self) -> Chunk:
        """The rows so far as an immutable chunk (trimmed to size)."""
        return Chunk.build({name: col[:self.used].copy() if self.used < self.capacity else col
                            for name, col in self._cols.items()})


def select(columns: dict[str, np.ndarray], rank: int | None, steps: tuple | None,
           times: tuple | None) -> dict[str, np.ndarray]:
    """The rows of ``columns`` of ``rank`` inside the step and time windows (bounds inclusive)."""
    mask = None
    for col, window in (("step", steps), ("t", times)):
        for bound, keep in zip(window or (None, None), (np.greater_equal, np.less_equal)):
            if bound is not None:
                part = keep(columns[col], bound)
                mask = part if mask is None else mask & part
    if rank is not None:
        part = columns["rank"] == rank
        mask = part if mask is None else mask & part
    if mask is None:
        return columns
    return {name: col[mask] for name, col in columns.items()}


def part_paths(directory: str) -> Iterable[str]:
    """The chunk files of a history directory, in order."""
    names = sorted(n for n in os.listdir(directory) if n.startswith("part-") and n.endswith(".npz")
                   and ".tmp" not in n)
    return [os.path.join(directory, n) for n in names]
