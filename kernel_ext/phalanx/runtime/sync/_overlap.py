"""A rank's communication thread: runs gradient collectives in the order they are handed over, so
they overlap the rest of the backward pass (DDP's reducer does the same with gloo's threads and
NCCL's streams).

The training thread hands over a bucket as soon as the backward pass has filled it and goes on
computing; at the end of the pass it waits for what it handed over.  Every rank hands over the
same collectives in the same order, so the thread needs no coordination of its own.  After a
collective fails, the rest of the queue is dropped (the communicator is broken: every later call
would fail too) and :meth:`CommThread.wait` raises that first error on the training thread.

Example::

    >>> done = []
    >>> worker = CommThread()
    >>> worker.submit(lambda: done.append(1)); worker.submit(lambda: done.append(2))
    >>> worker.wait(); done
    [1, 2]
    >>> worker.submit(lambda: 1 / 0); worker.wait()
    Traceback (most recent call last):
    ...
    ZeroDivisionError: division by zero
    >>> worker.close()
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import traceback
from typing import Callable

from ..telemetry._timing import overlapped_calls

log = logging.getLogger("phalanx")

_CLOSE_WAIT_S = 5.0


class CommThread:
    """An ordered queue of callables run by one daemon thread, started on first use."""

    def __init__(self, name: str = "phalanx-gradients") -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # No lock is shared with the training thread: the kernel's interrupt is raised there
        # between bytecodes, also just after a ``with lock:`` acquired and before its block began,
        # which leaves the lock held and the gradient thread blocked on it for good.  Each count
        # has one writer, and a slow wait goes by a marker through the queue (C-level, its put
        # and get whole), so no interrupt between two lines can leave a wait hung for good.
        self._submitted = 0  # handed over (written by the training thread only)
        self._completed = 0  # run or dropped (written by the gradient thread only)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, work: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        # counted before the put: an interrupt between the two leaves the count high, which only
        # sends wait() the exact way (a count left low would let it return too early)
        self._submitted += 1
        self._queue.put(work)

    def wait(self) -> None:
        """Return once everything handed over has run; raise the first error any of it raised."""
        if self._completed != self._submitted:
            # The queue runs in order: once the thread reaches this marker, everything handed
            # over before it has run.  Interrupted here, the marker is simply never read.
            marker: queue.SimpleQueue = queue.SimpleQueue()
            self._queue.put(marker)
            marker.get()
            self._submitted = self._completed  # exact again: nothing was handed over meanwhile
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the thread (after what is queued; a collective stuck on a lost peer is released
        by the run's abort, which the failure path sends before this)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        thread.join(_CLOSE_WAIT_S)
        if thread.is_alive():  # say where it is stuck
            frame = sys._current_frames().get(thread.ident or -1)
            where = "".join(traceback.format_stack(frame)[-4:]) if frame is not None else "?"
            log.warning("phalanx: the gradient thread did not stop within %g s; it is in:\n%s",
                        _CLOSE_WAIT_S, where)

    def _serve(self) -> None:
        with overlapped_calls():
            while True:
                work = self._queue.get()
                if work is None:
                    return
                if isinstance(work, queue.SimpleQueue):  # a wait's marker
                    work.put(None)
                    continue
                try:
                    if self._error is None:
                        work()
                except BaseException as exc:  # handed to the training thread by wait()
                    self._error = exc
                finally:
                    self._completed += 1
