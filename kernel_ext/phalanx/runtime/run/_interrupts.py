"""Let the kernel's interrupt land only where a rank can answer it.

The kernel interrupts ranks still running when a peer fails (ipyparallel relays SIGINT through
the engine's nanny).  A rank that failed on its own may be in its return path by then.  Under
Python's default handler the KeyboardInterrupt lands wherever the engine is: in our cleanup (the
rank's own error is replaced by "interrupted"), or after ``run_cell`` has returned, inside
ipyparallel's reply (ipykernel logs "KeyboardInterrupt caught in kernel" and no reply is ever
sent, so the kernel waits its grace period and reports the rank unresponsive).

:class:`InterruptGate` is the SIGINT handler while a run is on the engine: open while the cell and
the run's collectives execute (the interrupt is raised there, as before), closed once the rank
is on its way back (the interrupt is dropped: the rank is returning anyway).  ipykernel puts its
own handler back once the reply is sent, so the gate never outlives the request.

While an optimizer updates the parameters the gate *defers* the interrupt to the update's end
(:meth:`InterruptGate.defer` / :meth:`InterruptGate.resume`): a stopped run's model is then as
of a whole number of steps, which is what ``--return`` brings back after Stop.  An update that
holds the interrupt longer than :data:`DEFER_LIMIT_S` (a step stuck somewhere) gets it anyway.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

DEFER_LIMIT_S = 10.0


class InterruptGate:
    """A SIGINT handler that raises KeyboardInterrupt only while open."""

    def __init__(self) -> None:
        self.is_open = False
        self.dropped = 0   # interrupts that arrived while the rank was returning
        self.deferred_since: float | None = None  # inside an optimizer's update
        self.pending = False                      # an interrupt arrived during that update

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.is_open:
            self.dropped += 1
            return
        since = self.deferred_since
        if since is not None and time.monotonic() - since < DEFER_LIMIT_S:
            self.pending = True
            return
        raise KeyboardInterrupt

    def defer(self) -> None:
        """An optimizer's update begins: an interrupt waits for its end."""
        self.deferred_since = time.monotonic()

    def resume(self) -> bool:
        """The update ended: whether an interrupt arrived meanwhile (the caller raises it)."""
        self.deferred_since = None
        pending, self.pending = self.pending, False
        return pending

    def install_open(self) -> None:
        """Become the SIGINT handler, open (signal handlers can only be set by the main thread;
        elsewhere, as in threaded tests, the process's handler stays)."""
        self.is_open = True
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self)

    def close(self) -> None:
        self.is_open = False
        self.deferred_since = None
