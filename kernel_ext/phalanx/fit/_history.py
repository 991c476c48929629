"""The kernel's complete metric history of a run (every row of every rank, never thinned).

Example::

    >>> h = MetricHistory()
    >>> added = h.extend(0, [[1, 0.0, {"loss": 0.5}]])
    >>> h.rows()[0]["loss"]
    0.5
"""

from __future__ import annotations

import threading
from typing import Any


class MetricHistory:
    """Rows ``{"rank", "step", "t", <metric>: value}`` in arrival order; thread-safe."""

    def __init__(self) -> None:
        self._rows: list[dict] = []
        self._latest: dict[int, dict[str, float]] = {}
        self._lock = threading.Lock()

    def extend(self, rank: int, rows: list) -> list[dict]:
        """Add wire rows ``[step, t, {metrics}]`` of ``rank``; returns them as dicts."""
        added = [{"rank": rank, "step": int(step), "t": float(t), **metrics}
                 for step, t, metrics in rows]
        with self._lock:
            self._rows.extend(added)
            # Kept up to date here because the run tracker asks for it at ~10/s per rank: a scan
            # of the whole history there grew with the run and starved the receiver thread.
            latest = self._latest.setdefault(rank, {})
            for row in added:
                latest.update({k: v for k, v in row.items() if k not in ("rank", "step", "t")})
        return added

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self, start: int = 0) -> list[dict]:
        """A copy of the rows from index ``start`` on."""
        with self._lock:
            return list(self._rows[start:])

    def metric_names(self) -> list[str]:
        names: dict[str, None] = {}
        for row in self.rows():
            for key in row:
                if key not in ("rank", "step", "t"):
                    names.setdefault(key)
        return list(names)

    def latest(self, rank: int) -> dict[str, float]:
        """The last logged value of each metric of ``rank``."""
        with self._lock:
            return dict(self._latest.get(rank, {}))

    def to_pandas(self) -> Any:
        """The history as a DataFrame (columns rank, step, t and one per metric)."""
        import pandas as pd

        return pd.DataFrame(self.rows(), columns=["rank", "step", "t", *self.metric_names()])

    def __repr__(self) -> str:
        return f"<MetricHistory: {len(self)} rows, metrics {self.metric_names()}>"
