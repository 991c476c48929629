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
