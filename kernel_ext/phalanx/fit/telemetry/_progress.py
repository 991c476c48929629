"""Per-rank progress figures: steps/s, ETA and straggler marks (pure).

Example::

    >>> stragglers({0: 100, 1: 100, 2: 70}, trained_s=60.0)
    {2}
    >>> stragglers({0: 100, 1: 100, 2: 70}, trained_s=1.0)   # too early to tell
    set()
"""

from __future__ import annotations

import statistics
from collections import deque

STRAGGLER_LAG = 0.20  # a rank more than 20% behind the median is marked
# ... but only with evidence.  Ranks start their loops a few hundred ms apart and report their
# counts in batches, so in a run's first seconds one rank is "20% behind" by chance alone (a
# 0.8 s run marked its faster rank).  A mark needs this many seconds of steps ...
STRAGGLER_MIN_S = 5.0
# ... and a lag of at least this many steps: one batch in flight is one or two steps behind.
STRAGGLER_MIN_LAG_STEPS = 3


def stragglers(steps: dict[int, int], trained_s: float | None = None) -> set[int]:
    """Ranks whose step count lags the median by more than :data:`STRAGGLER_LAG` and by
    :data:`STRAGGLER_MIN_LAG_STEPS`, once the run has trained :data:`STRAGGLER_MIN_S`
    (``trained_s``: seconds since its first step; ``None``: not yet)."""
    if len(steps) < 2 or trained_s is None or trained_s < STRAGGLER_MIN_S:
        return set()
    median = statistics.median(steps.values())
    if median <= 0:
        return set()
    return {r for r, s in steps.items()
            if s < (1 - STRAGGLER_LAG) * median and median - s >= STRAGGLER_MIN_LAG_STEPS}


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
    """Seconds left at the current rate, when a total is known and the rank has not gone past
    it (then the total is wrong, and "ETA 0 s" would be too).

    Example::

        >>> eta_seconds(50, 100, 10.0), eta_seconds(120, 100, 10.0)
        (5.0, None)
    """
    if total is None or not rate or rate <= 0 or step > total:
        return None
    return (total - step) / rate
