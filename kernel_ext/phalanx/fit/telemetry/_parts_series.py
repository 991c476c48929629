"""Each rank's step parts through the run, at bounded size: when a rank became slow, and where.

With every metric batch (about 20 a second) the engines send running totals of their completed
steps' parts (``runtime/telemetry/_timing.py``).  Each batch that finished steps becomes one point here:
the run's step it reached, its wall time, how many steps it covers, and the seconds per step of
each part over those steps.  A run that lasts days keeps at most ``max_points`` points per rank:
when full, neighbouring points are merged in pairs (weighted by their steps), so the series
still covers the whole run, more coarsely, and its parts still add up to the step time.
Collective time is one part here (``collective_s``); the run's totals split it into waiting and
moving bytes (``last_run().timing``).

    >>> s = PartsSeries(max_points=2)
    >>> s.add(0, 10, 1.0, {"steps": 2, "forward_s": 0.4, "optimizer_s": 0.2})
    >>> s.add(0, 14, 2.0, {"steps": 6, "forward_s": 1.6, "optimizer_s": 0.4})
    >>> [(p["step"], p["steps"], round(p["forward_s"], 2)) for p in s.points(0)]
    [(10, 2, 0.2), (14, 4, 0.3)]
    >>> s.add(0, 16, 3.0, {"steps": 8, "forward_s": 2.0, "optimizer_s": 0.5})
    >>> [(p["step"], p["steps"], round(p["forward_s"], 3)) for p in s.points(0)]
    [(14, 6, 0.267), (16, 2, 0.2)]
"""

from __future__ import annotations

from typing import Mapping

RAW_PARTS = ("forward_s", "backward_s", "collective_s", "optimizer_s", "log_s", "other_s")


class PartsSeries:
    """Per rank, points ``{step, t, steps, forward_s, backward_s, ...}`` (seconds per step)."""

    def __init__(self, max_points: int = 2000) -> None:
        self.max_points = max_points
        self._totals: dict[int, dict[str, float]] = {}
        self._points: dict[int, list[dict]] = {}

    def add(self, rank: int, step: int, t: float, parts: Mapping[str, float]) -> None:
        """One batch's running totals (``parts``) from ``rank``, which had reached ``step``."""
        last = self._totals.get(rank, {})
        if parts.get("steps", 0) < last.get("steps", 0):
            last = {}  # a new attempt (restart, resize): the engine's totals start again
        done = int(parts.get("steps", 0) - last.get("steps", 0))
        if done <= 0:
            return
        point: dict = {"step": int(step), "t": float(t), "steps": done}
        for name in RAW_PARTS:
            point[name] = (float(parts.get(name, 0.0)) - float(last.get(name, 0.0))) / done
        self._totals[rank] = {k: float(v) for k, v in parts.items()}
        points = self._points.setdefault(rank, [])
        points.append(point)
        if len(points) > self.max_points:
            self._points[rank] = _merged_in_pairs(points)

    def points(self, rank: int) -> list[dict]:
        return [dict(p) for p in self._points.get(rank, [])]

    def rows(self) -> list[dict]:
        """Every rank's points, each with its ``rank``."""
        return [{"rank": r, **p} for r in sorted(self._points) for p in self._points[r]]


def _merged_in_pairs(points: list[dict]) -> list[dict]:
    merged = []
    for a, b in zip(points[0::2], points[1::2]):
        steps = a["steps"] + b["steps"]
        point = {"step": b["step"], "t": b["t"], "steps": steps}
        for name in RAW_PARTS:
            point[name] = (a[name] * a["steps"] + b[name] * b["steps"]) / steps
        merged.append(point)
    if len(points) % 2:
        merged.append(points[-1])
    return merged
