"""Plot series from metric rows: per metric, one line per rank plus the mean over ranks (pure).

:class:`SeriesBuilder` turns the rows of each ``metrics`` event into the points to *append* to
each line, so a live plot streams only what is new.  The mean at a step is emitted once the step
is settled: every rank logged the metric at that step, or has logged something at a later step
(it never will at this one, since each rank's steps only grow).  A metric only some ranks log
(``if rank == 0: log(val=...)``) therefore still gets a mean line, and so does a run where some
ranks never log at all (after :data:`MAX_OPEN_STEPS` steps).  :meth:`SeriesBuilder.flush`
settles what is left when the run ends.

Example::

    >>> s = SeriesBuilder(world_size=2)
    >>> s.add([{"rank": 0, "step": 1, "t": 0.0, "metrics": {"loss": 1.0}},
    ...        {"rank": 1, "step": 1, "t": 0.0, "metrics": {"loss": 3.0}}])
    {'loss': {0: ([1], [1.0]), 1: ([1], [3.0]), 'mean': ([1], [2.0])}}
"""

from __future__ import annotations

import itertools
from typing import Hashable, Iterable, Mapping

MEAN = "mean"
MAX_OPEN_STEPS = 256  # steps per metric waiting for a rank before their mean is drawn anyway

# {metric: {rank or MEAN: (steps, values)}}
Points = dict[str, dict[Hashable, tuple[list, list]]]


class SeriesBuilder:
    """Split rows ``{rank, step, t, metrics}`` into per-metric, per-rank points and the mean."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.metrics: list[str] = []                         # in order of first appearance
        self._pending: dict[str, dict[int, dict[int, float]]] = {}  # metric -> step -> rank -> v
        self._settled: dict[str, int] = {}                   # metric -> last step with a mean
        self._position: dict[int, int] = {}                  # rank -> last step seen (any metric)

    def add(self, rows: Iterable[Mapping]) -> Points:
        """The new points from ``rows`` (wire form), means included where settled."""
        out: Points = {}
        lines: dict[tuple[str, int], tuple[list, list]] = {}  # the hot loop avoids nested lookups
        position, pending, settled = self._position, self._pending, self._settled
        for row in rows:
            rank, step = row["rank"], row["step"]
            if step > position.get(rank, -1):
                position[rank] = step
            for name, value in row["metrics"].items():
                line = lines.get((name, rank))
                if line is None:
                    if name not in pending:
                        self.metrics.append(name)
                        pending[name] = {}
                    line = lines[(name, rank)] = out.setdefault(name, {}).setdefault(rank, ([], []))
                line[0].append(step)
                line[1].append(value)
                if step > settled.get(name, -1):  # a late duplicate of a settled step: drawn, not averaged
                    by_step = pending[name]
                    at = by_step.get(step)
                    if at is None:
                        at = by_step[step] = {}
                    at[rank] = value
        for name in self.metrics:
            self._settle(name, out, final=False)
        return out

    def flush(self) -> Points:
        """Means of every step still open (the run is over: no more rows will come)."""
        out: Points = {}
        for name in self.metrics:
            self._settle(name, out, final=True)
        return out

    def _settle(self, name: str, out: Points, final: bool) -> None:
        pending = self._pending[name]
        ready = []
        for step, by_rank in pending.items():  # insertion order: steps mostly increase
            if not (final or len(by_rank) >= self.world_size or self._passed(step, by_rank)):
                break  # later steps wait behind this one: the scan costs what settles, no more
            ready.append(step)
        # A rank that never logs (e.g. only rank 0 calls log) would hold every step open: past
        # MAX_OPEN_STEPS the oldest ones are averaged over the ranks that did log them.
        overflow = len(pending) - len(ready) - MAX_OPEN_STEPS
        if overflow > 0:
            ready.extend(itertools.islice(pending, len(ready), len(ready) + overflow))
        if not ready:
            return
        xs, ys = out.setdefault(name, {}).setdefault(MEAN, ([], []))
        for step in sorted(ready):
            values = pending.pop(step).values()
            xs.append(step)
            ys.append(sum(values) / len(values))
        self._settled[name] = max(max(ready), self._settled.get(name, -1))

    def _passed(self, step: int, by_rank: Mapping[int, float]) -> bool:
        """Every rank either logged at ``step`` or has logged at a later one."""
        return all(r in by_rank or self._position.get(r, -1) > step for r in range(self.world_size))


def full_series(rows: Iterable[Mapping], world_size: int) -> Points:
    """Every point of a finished run (rows in wire form), means included.

    Example::

        >>> full_series([{"rank": 0, "step": 1, "t": 0.0, "metrics": {"acc": 0.5}}], 2)["acc"][MEAN]
        ([1], [0.5])
    """
    builder = SeriesBuilder(world_size)
    points = builder.add(rows)
    merge(points, builder.flush())
    return points


def merge(into: Points, more: Points) -> Points:
    """Append ``more`` to ``into`` line by line (both in :data:`Points` form)."""
    for name, lines in more.items():
        for key, (xs, ys) in lines.items():
            have_x, have_y = into.setdefault(name, {}).setdefault(key, ([], []))
            have_x.extend(xs)
            have_y.extend(ys)
    return into


def wire_rows(history_rows: Iterable[Mapping]) -> list[dict]:
    """History rows ``{rank, step, t, <metric>...}`` in the events' wire form.

    Example::

        >>> wire_rows([{"rank": 0, "step": 1, "t": 2.0, "loss": 0.5}])
        [{'rank': 0, 'step': 1, 't': 2.0, 'metrics': {'loss': 0.5}}]
    """
    return [{"rank": r["rank"], "step": r["step"], "t": r["t"],
             "metrics": {k: v for k, v in r.items() if k not in ("rank", "step", "t")}}
            for r in history_rows]
