"""Requests that reach a run while it goes: stop it, or change the cluster's size after it.

The panel's requests arrive on another thread (a kernel subshell) or, where the kernel has no
subshells, from the run's own wait loop pumping the kernel's pending messages.  Either way they
only *ask*: a stop becomes the wait loop's own interrupt at its next poll (so the run ends the
way an interrupt ends it: every rank released, the engines usable), and a resize of a run that
cannot change size is queued and applied by the runner when the run is over.

Example::

    control = RunControl()
    control.request_stop("the panel's Stop button")   # from any thread
    control.pump()        # in the wait loop: raises KeyboardInterrupt once

The wait loop also runs work other threads hand it (:meth:`RunControl.call_soon`), at once or
once the run has gone a while: it runs on the cell's own thread, in the cell's context, where
widgets are made and their messages are addressed to the cell, while the thread asking (the
tracker's publisher) keeps going.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("phalanx")

Pump = Callable[[], None]


class RunControl:
    """A run's stop flag and the wait loop's pump (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._stop_reason: str | None = None
        self._raised = False
        self.stopped_by: str | None = None   # why the last run was stopped, for its error
        self.message_pump: Pump | None = None  # handles the kernel's pending messages (no subshells)
        self._soon: list[tuple[float, Callable[[], object]]] = []  # (when due, task)

    def begin(self) -> None:
        """A new run starts: forget the last one's stop and what was asked of its wait loop."""
        with self._lock:
            self._stop_reason, self._raised, self.stopped_by = None, False, None
            self._soon = []

    def call_soon(self, task: Callable[[], object], delay_s: float = 0.0) -> None:
        """Run ``task`` in the running run's wait loop, at its first poll ``delay_s`` seconds
        from now or later (any thread).  A task the loop's last poll did not run (asked for
        after it, or not due by then) is dropped when the next run begins."""
        with self._lock:
            self._soon.append((self._clock() + delay_s, task))

    def request_stop(self, reason: str) -> None:
        """Ask the running run to stop at its wait loop's next poll (any thread)."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason

    def pump(self) -> None:
        """Called by the wait loop every poll: serve pending messages, then honour a stop.

        Raises ``KeyboardInterrupt`` once per stop: the wait loop treats it as the person's
        interrupt (releases every rank); a second one would abandon the run.
        """
        now = self._clock()
        with self._lock:
            tasks = [task for due, task in self._soon if due <= now]
            self._soon = [(due, task) for due, task in self._soon if due > now]
        for task in tasks:
            try:
                task()
            except Exception:  # a view's work must not end the run it shows
                log.exception("phalanx: a task in the run's wait loop failed")
        if self.message_pump is not None:
            self.message_pump()
        with self._lock:
            if self._stop_reason is None or self._raised:
                return
            self._raised, self.stopped_by = True, self._stop_reason
        raise KeyboardInterrupt(self.stopped_by)
