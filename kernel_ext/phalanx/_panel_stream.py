"""What the lab panel is sent about runs: metric rows bounded per flush, and the kernel's runs.

A run that logs fast would send every row to every panel (8 ranks logging 1,000 steps a second
is 8,000 rows a second on IOPub), while the panel keeps only a min/max-preserving downsampling
(M4) of each line.  So each flush carries about :data:`LINE_POINTS` rows per rank at most,
chosen the same way: M4 over the flush's rows of that rank, the buckets shared out among its
metrics.  Consecutive chunks thinned by M4 and downsampled again by the panel still show every
chunk's extremes, so spikes and the last point survive.  The mean over ranks is not taken from
these rows (one step's rows of different ranks are thinned differently): the kernel's digest
takes it from every row and the event carries it as ``means``, thinned the same way here.

The panel lists the kernel's runs and shows an earlier one when picked: :class:`RunArchive`
keeps each run's entry and, once it ended, its record (its history is on disk by then, its
curves a bounded digest), and answers the panel's ``request_run`` and zoomed windows from it.

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

from typing import Any, Callable

import numpy as np

from . import events
from ._outbox import wire_safe
from ._schema import SchemaError
from .fit.telemetry._downsample import m4_indices

# Rows per rank in one flush (a few flushes a second): a line gains a few hundred points a second
# at most, more than a chart a few thousand pixels wide redraws usefully.
LINE_POINTS = 64
# The runs a panel can list and pick from: the kernel's last this many.
MAX_RUNS = 50


def thin_metrics(event: dict, line_points: int = LINE_POINTS) -> dict:
    """``event`` (``metrics``) with about ``line_points`` rows per rank at most and as many mean
    points per metric; every row of a rank that has no more than that."""
    rows, buckets = event["rows"], max(1, line_points // 4)
    kept = _rows_shown(rows, line_points)
    thinned = rows if len(kept) == len(rows) else [rows[i] for i in kept.tolist()]
    means = {name: [points[i] for i in m4_indices(np.array([p[1] for p in points], float),
                                                  buckets).tolist()]
             for name, points in (event.get("means") or {}).items()}
    return {**event, "rows": thinned, "means": means}


def _rows_shown(rows: list[dict], line_points: int) -> np.ndarray:
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


def history_chunks(run: str, rows: list[dict], means: dict[str, list],
                   chunk_rows: int) -> list[dict]:
    """``run``'s curves as ``metrics`` events of at most ``chunk_rows`` rows, the last with the
    mean lines (one message of unbounded size would hold up the comm)."""
    starts = range(0, len(rows), chunk_rows)
    out = [wire_safe(events.metrics(run, rows[start:start + chunk_rows],
                                    means if start == starts[-1] else None))
           for start in starts]
    if means and not rows:
        out.append(wire_safe(events.metrics(run, [], means)))
    return out


class RunArchive:
    """The kernel's runs as the panel lists them, oldest first, and each ended run's record.

    Fed every bus event (:meth:`note`), the record of the run that just ended with its
    ``run_ended``; not thread-safe (the lab comm calls it under its lock).

    Example::

        >>> archive = RunArchive()
        >>> archive.note(events.run_started("r1", 2, 10, "allreduce", name="train"))
        >>> archive.note(events.run_ended("r1", "done", 1.5))
        >>> [(e["name"], e["status"], e["wall_s"]) for e in archive.entries()]
        [('train', 'done', 1.5)]
    """

    def __init__(self, limit: int = MAX_RUNS, earlier: Callable[[], list] | None = None) -> None:
        self._limit = limit
        self._entries: dict[str, dict] = {}
        self._details: dict[str, dict] = {}  # total_steps and strategy, from run_started
        self._records: dict[str, Any] = {}
        # The notebook's recorded runs (``phalanx.runs()``: earlier kernels' too), listed before
        # this kernel's own; a picked one is read back from its log.
        self._earlier = earlier
        self._earlier_runs: dict[str, Any] = {}

    def note(self, event: dict, record: Any = None) -> None:
        """Take in a bus event; ``record``: the session's last run record (kept with the
        ``run_ended`` of its run)."""
        if event["type"] not in ("run_started", "run_ended"):
            return
        run: str = event["run"]
        if event["type"] == "run_started":
            self._entries[run] = {"run": run, "name": event.get("name"), "status": "running",
                                  "world_size": event["world_size"], "wall_s": None,
                                  "error": None}
            self._details[run] = {"total_steps": event.get("total_steps"),
                                  "strategy": event.get("strategy")}
            for old in list(self._entries)[:-self._limit]:
                for kept in (self._entries, self._details, self._records):
                    kept.pop(old, None)
        elif run in self._entries:
            self._entries[run].update(status=event["status"], wall_s=event["wall_s"],
                                      error=event.get("error"))
            if record is not None and getattr(record, "run_id", None) == run:
                self._records[run] = record
                self._entries[run]["world_size"] = record.world_size  # an elastic run's last

    def entries(self) -> list[dict]:
        """Every run listed, oldest first (``runs`` event entries): the notebook's recorded
        runs of earlier kernels, then this kernel's."""
        own = [dict(e) for e in self._entries.values()]
        return ([*self._earlier_entries(), *own])[-self._limit:]

    def _earlier_entries(self) -> list[dict]:
        if self._earlier is None:
            return []
        try:
            found = [r for r in self._earlier() if r.run_id not in self._entries]
        except Exception:  # a log that cannot be read leaves this kernel's runs listed
            return []
        self._earlier_runs = {r.run_id: r for r in found}
        return [{"run": r.run_id, "name": r.name, "status": r.status,
                 "world_size": r.world_size, "wall_s": r.wall_s, "error": r.error}
                for r in found]

    def record(self, run: str) -> Any:
        """The record of ``run`` if it ended in this kernel and is still listed, or was
        recorded by an earlier kernel of the notebook; else None."""
        found = self._records.get(run)
        if found is None and run in self._earlier_runs and self._earlier_runs[run].status != "running":
            found = self._records[run] = self._earlier_runs[run].record()
        return found

    def _entry(self, run: str) -> dict:
        if run in self._entries:
            return self._entries[run]
        r = self._earlier_runs[run]
        return {"run": run, "name": r.name, "status": r.status, "world_size": r.world_size,
                "wall_s": r.wall_s, "error": r.error}

    def messages(self, run: str, chunk_rows: int) -> list[dict] | None:
        """What a panel that picked ``run`` needs: its ``run_record`` then its curves as
        ``metrics`` chunks; None when the kernel has no record of it."""
        record = self.record(run)
        if record is None:
            return None
        record.curves()  # builds the digest of a record that has none
        details = self._details.get(run, {})
        total = record.total_steps if record.total_steps is not None else details.get("total_steps")
        ranks = [{"rank": r, "step": int(record.steps.get(r, 0)), "total": total,
                  "metrics": record.history.latest(r)} for r in range(record.world_size)]
        times = [{"rank": r, **t} for r, t in sorted(record.timing.items())]
        message = events.run_record(self._entry(run), total, details.get("strategy"), ranks,
                                    times)
        try:
            first = wire_safe(events.validate_event(message))
        except SchemaError:  # step parts of a shape the panel cannot draw: the rest still can
            first = wire_safe(events.validate_event({**message, "times": []}))
        digest = record.digest
        return [first, *history_chunks(run, digest.wire_rows(), digest.mean_points(), chunk_rows)]

    def window(self, run: str, start: float, end: float,
               max_points: int) -> tuple[list[dict], dict[str, list]] | None:
        """An ended run's rows and means in a step window at full resolution up to
        ``max_points`` per line (a zoomed chart of a picked run); None without its record."""
        from .fit.telemetry._digest import MEAN, window_points, window_rows

        record = self.record(run)
        if record is None:
            return None
        history = record.history
        means = {}
        for name in history.metric_names():
            xs, ys = window_points(history, name, MEAN, start, end, max_points=max_points)
            means[name] = [[int(x), y] for x, y in zip(xs.tolist(), ys.tolist())]
        return window_rows(history, (start, end), None, None, max_points), means
