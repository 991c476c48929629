"""A clock-driven throttle: say "now" at most once per interval (pure, injectable clock).

Views get events at up to ~10/s; some of them (a text line, a table with process lookups) should
redraw less often.  The caller keeps the latest state and draws it when the throttle allows, and
always draws the final state, so throttling never hides where a run ended.

Example::

    >>> clock = iter([0.0, 0.5, 1.2]).__next__
    >>> t = Throttle(1.0, clock=clock)
    >>> [t.ready(), t.ready(), t.ready()]
    [True, False, True]
"""

from __future__ import annotations

import time
from typing import Callable


class Throttle:
    """``ready()`` is True at most once every ``interval_s`` seconds."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None

    def ready(self) -> bool:
        """True (and the interval restarts) when the last ``True`` is ``interval_s`` old or more."""
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True


class CpuBudget:
    """A token bucket of CPU time: updates may use ``share`` of one core on average.

    A view measures what each update cost (thread CPU seconds) and :meth:`spend`\\ s it; it asks
    :meth:`ready` before the next one.  Cheap updates come every ``min_interval_s``; costly ones
    (many rows, a new metric's figures) space the following ones out, so the kernel's share of
    the CPU stays bounded however fast the engines log.  ``burst_s`` lets a one-off cost (a new
    figure) through without freezing the view afterwards.

    Example::

        >>> clock = iter([0.0, 0.1, 0.2, 5.0]).__next__
        >>> budget = CpuBudget(share=0.02, burst_s=0.05, min_interval_s=0.1, clock=clock)
        >>> budget.ready()          # t=0.0: a full bucket
        True
        >>> budget.spend(0.08)      # an update that cost 80 ms of CPU: the bucket is in debt
        >>> budget.ready(), budget.ready()   # t=0.1 and 0.2: still paying it back
        (False, False)
        >>> budget.ready()          # t=5.0: 4.8 s at 2% paid it back
        True
    """

    def __init__(self, share: float, burst_s: float, min_interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.share, self.burst_s, self.min_interval_s = share, burst_s, min_interval_s
        self._clock = clock
        self._tokens = burst_s
        self._refilled: float | None = None
        self._last: float | None = None

    def ready(self) -> bool:
        """True when the bucket is not in debt and ``min_interval_s`` passed since the last True."""
        now = self._clock()
        if self._refilled is not None:
            self._tokens = min(self.burst_s, self._tokens + (now - self._refilled) * self.share)
        self._refilled = now
        if self._tokens < 0 or (self._last is not None and now - self._last < self.min_interval_s):
            return False
        self._last = now
        return True

    def spend(self, cpu_s: float) -> None:
        """Charge an update's measured CPU time."""
        self._tokens -= cpu_s
