"""Where a rank's time goes, measured on the engine at the cost of a few clock reads per step.

Measured here, at points the runtime already passes through:

* **phalanx collectives** (``allreduce`` / ``broadcast`` / ``barrier`` through the run's
  communicator): each call's wall-clock start and duration, numbered in call order.  Every rank
  makes the same calls in the same order, so the kernel lines the ranks' calls up by number:
  the time a rank spent before the last peer *arrived* is waiting for the slowest peer, the rest
  is moving bytes (``fit/telemetry/_timing.py``).  Engines on one host share a clock; across hosts the
  split is as good as the hosts' clock agreement.
* **``log()``**: the time the calls took on the training thread (a running total).
* **the step's parts**: the clock is always "in" one part of the step, and the runtime's own
  hooks move it on: an optimizer step ends a step and starts *data & forward*; the first
  gradient hook of a backward pass starts *backward* (only where phalanx averages gradients
  itself, so it has gradient hooks: elsewhere backward stays in *data & forward*); the end of
  backward (after averaging) starts *other* (clipping, unscaling...); the optimizer's pre-step
  hook starts *optimizer*; a collective or a ``log()`` call is cut out of whatever part it
  interrupts.  Collectives of the gradient thread, which run beside backward, are recorded but
  cut out of nothing: what the training thread waits for them at the end of backward is its
  collective time (the averaging backward did not hide).  Each step's time is therefore split
  into parts that add up to it exactly.  The first step starts when the first optimizer is
  attached.  On GPUs the figures are host-side
  (no synchronisation is added): kernel time shows where the host waits for the device.

The records ride on the metric batches (``"timing"``), so nothing new is sent on its own.

Example::

    >>> clock = StepClock()
    >>> with clock.collective():
    ...     pass
    >>> clock.log_s += 0.001
    >>> batch = clock.drain()
    >>> len(batch["collectives"]), batch["log_s"], clock.drain()
    (1, 0.001, None)
    >>> clock.begin(); clock.mark("backward_s"); clock.mark("optimizer_s"); clock.step_end()
    >>> parts = clock.drain()["parts"]
    >>> parts["steps"], sorted(k for k in parts if k.endswith("_s"))[:3]
    (1, ['backward_s', 'collective_s', 'forward_s'])
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

PARTS = ("forward_s", "backward_s", "collective_s", "optimizer_s", "log_s", "other_s")

_now = time.perf_counter

# Set in a thread whose collectives run beside the training thread (the gradient thread of
# ``_overlap``): its calls are recorded but not cut out of the step's parts, which belong to the
# training thread; the training thread's wait for them is what the step's "collective" shows.
_thread_kind = threading.local()


@contextlib.contextmanager
def overlapped_calls() -> Iterator[None]:
    """Collectives made inside run beside the training thread (see ``_thread_kind``)."""
    _thread_kind.overlapped = True
    try:
        yield
    finally:
        _thread_kind.overlapped = False


class StepClock:
    """Collective calls, ``log()`` time and step parts of one rank, drained by the sender."""

    def __init__(self) -> None:
        self.log_s = 0.0                      # cumulative: added to by the training thread only
        self._sent_log_s = 0.0
        self._seq = 0
        self._calls: list[list[float]] = []   # [seq, start (epoch s), duration s]
        self._lock = threading.Lock()
        self._part: str | None = None         # None until the first step begins
        self._since = 0.0
        # Running totals, the step in progress included; a step's end publishes a copy, so the
        # sender only ever sees whole steps.
        self._parts = dict.fromkeys(PARTS, 0.0)
        self._steps = 0
        self._published: tuple[int, tuple[float, ...]] = (0, ())
        self._sent_steps = 0
        self.parts_enabled = True

    # -- the step's parts (training thread only) --------------------------------------------------

    def begin(self) -> None:
        """The first step starts now (its first part: data & forward)."""
        if self._part is None and self.parts_enabled:
            self._part, self._since = "forward_s", _now()

    def mark(self, part: str) -> None:
        """From now on the time is ``part``'s."""
        if self._part is not None:
            now = _now()
            self._parts[self._part] += now - self._since
            self._part, self._since = part, now

    def cut(self, part: str, began: float, ended: float) -> None:
        """``[began, ended]`` (perf_counter) was ``part``'s, inside the current part."""
        if self._part is not None and began >= self._since:
            self._parts[self._part] += began - self._since
            self._parts[part] += ended - began
            self._since = ended

    def step_end(self) -> None:
        """An optimizer step finished: close this step, the next starts with data & forward."""
        if self._part is None:
            return
        self.mark("forward_s")
        self._steps += 1
        # One assignment (atomic under the GIL) publishes the totals to the sender's thread.
        self._published = (self._steps, tuple(self._parts.values()))

    # -- collectives and log() -------------------------------------------------------------------

    @contextlib.contextmanager
    def collective(self) -> Iterator[None]:
        start, began = time.time(), _now()
        try:
            yield
        finally:
            ended = _now()
            if not getattr(_thread_kind, "overlapped", False):
                self.cut("collective_s", began, ended)
            with self._lock:
                self._calls.append([self._seq, start, ended - began])
                self._seq += 1

    def logged(self, began: float, ended: float) -> None:
        """A ``log()`` call took ``[began, ended]``."""
        self.log_s += ended - began
        self.cut("log_s", began, ended)

    def drain(self) -> dict | None:
        """What was measured since the last call (``None`` when nothing was)."""
        with self._lock:
            calls, self._calls = self._calls, []
        steps, totals = self._published
        parts = dict(zip(PARTS, totals))
        log_s = self.log_s  # a running total, so a racing update is sent next time, not lost
        if not calls and log_s == self._sent_log_s and steps == self._sent_steps:
            return None
        self._sent_log_s = log_s
        out: dict = {"collectives": calls, "log_s": log_s}
        if steps:
            self._sent_steps = steps
            out["parts"] = {"steps": steps, **parts}
        return out
