"""Per-rank progress figures: steps/s, ETA and straggler marks (pure).

Example::

    >>> stragglers({0: 100, 1: 100, 2: 70})
    {2}
"""

from __future__ import annotations

import statistics
from collections import deque

STRAGGLER_LAG = 0.20  # a rank more than 20% behind the median is marked


def stragglers(steps: dict[int, int]) -> set[int]:
    """Ranks whose step count lags the median by more than :data:`STRAGGLER_LAG`."""
    if len(steps) < 2:
        return set()
    median = statistics.median(steps.values())
    if median <= 0:
        return set()
    return {r for r, s in steps.items() if s < (1 - STRAGGLER_LAG) * median}


class RateMeter:
    """Steps per second over a sliding window of (time, step) samples."""

    def __init__(self, window_s: float = 5.0) -> None:
        self._samples: deque[tuple[float, int]] = deque()
        self._window = window_s

    def add(self, t: float, step: int) -> None:
        self._samples.append((t, step))
        while len(self._samples) > 2 and t - self._samples[0][0] > self._window:
            self._samples.popleft()

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def eta_seconds(step: int, total: int | None, rate: float | None) -> float | None:
    """Seconds left at the current rate, when a total is known."""
    if total is None or not rate or rate <= 0:
        return None
    return max(total - step, 0) / rate
