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

from ._timing import overlapped_calls

log = logging.getLogger("phalanx")

_CLOSE_WAIT_S = 5.0


class CommThread:
    """An ordered queue of callables run by one daemon thread, started on first use."""

    def __init__(self, name: str = "phalanx-gradients") -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # No lock is shared with the training thread: the kernel's interrupt is raised there
        # between bytecodes, also just after a ``with lock:`` acquired and before its block began,
        # which leaves the lock held and the gradient thread blocked on it for good.  A queue
        # (C-level, its put and get whole) carries one token per finished item instead.
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = 0  # handed over, not waited for yet (the training thread's own count)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, work: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._outstanding += 1
        self._queue.put(work)

    def wait(self) -> None:
        """Return once everything handed over has run; raise the first error any of it raised."""
        while self._outstanding:
            self._finished.get()
            self._outstanding -= 1
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
                try:
                    if self._error is None:
                        work()
                except BaseException as exc:  # handed to the training thread by wait()
                    self._error = exc
                finally:
                    self._finished.put(None)
