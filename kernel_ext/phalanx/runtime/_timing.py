"""Where a rank's time goes, measured on the engine at the cost of two clock reads per call.

Two parts of the step are measured here, independently of the training hooks:

* **phalanx collectives** (``allreduce`` / ``broadcast`` / ``barrier`` through the run's
  communicator): each call's wall-clock start and duration, numbered in call order.  Every rank
  makes the same calls in the same order, so the kernel lines the ranks' calls up by number:
  the time a rank spent before the last peer *arrived* is waiting for the slowest peer, the rest
  is moving bytes (``fit/_timing.py``).  Engines on one host share a clock; across hosts the
  split is as good as the hosts' clock agreement.
* **``log()``**: the time the calls took on the training thread (a running total).

The records ride on the metric batches (``"timing"``), so nothing new is sent on its own.

Example::

    >>> clock = StepClock()
    >>> with clock.collective():
    ...     pass
    >>> clock.log_s += 0.001
    >>> batch = clock.drain()
    >>> len(batch["collectives"]), batch["log_s"], clock.drain()
    (1, 0.001, None)
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


class StepClock:
    """Collective calls and ``log()`` time of one rank, drained by the metrics sender."""

    def __init__(self) -> None:
        self.log_s = 0.0                      # cumulative: added to by the training thread only
        self._sent_log_s = 0.0
        self._seq = 0
        self._calls: list[list[float]] = []   # [seq, start (epoch s), duration s]
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def collective(self) -> Iterator[None]:
        start, began = time.time(), time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - began
            with self._lock:
                self._calls.append([self._seq, start, took])
                self._seq += 1

    def drain(self) -> dict | None:
        """What was measured since the last call (``None`` when nothing was)."""
        with self._lock:
            calls, self._calls = self._calls, []
        log_s = self.log_s  # a running total, so a racing update is sent next time, not lost
        if not calls and log_s == self._sent_log_s:
            return None
        self._sent_log_s = log_s
        return {"collectives": calls, "log_s": log_s}
