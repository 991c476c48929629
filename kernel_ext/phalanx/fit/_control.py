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

The wait loop also runs work other threads hand it (:meth:`RunControl.call_soon`): it runs on
the cell's own thread, in the cell's context, where widgets are made and their messages are
addressed to the cell, while the thread asking (the tracker's publisher) keeps going.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("phalanx")

Pump = Callable[[], None]


class RunControl:
    """A run's stop flag and the wait loop's pump (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop_reason: str | None = None
        self._raised = False
        self.stopped_by: str | None = None   # why the last run was stopped, for its error
        self.message_pump: Pump | None = None  # handles the kernel's pending messages (no subshells)
        self._soon: list[Callable[[], object]] = []

    def begin(self) -> None:
        """A new run starts: forget the last one's stop and what was asked of its wait loop."""
        with self._lock:
            self._stop_reason, self._raised, self.stopped_by = None, False, None
            self._soon = []

    def call_soon(self, task: Callable[[], object]) -> None:
        """Run ``task`` in the running run's wait loop, at its next poll (any thread).  A task
        asked for after the loop's last poll is dropped when the next run begins."""
        with self._lock:
            self._soon.append(task)

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
        with self._lock:
            tasks, self._soon = self._soon, []
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
