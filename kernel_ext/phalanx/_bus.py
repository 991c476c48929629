"""A tiny synchronous publish/subscribe bus for :mod:`phalanx.events` dicts.

The session owns one bus.  Producers (cluster manager, run tracker, learning networks) call
:meth:`EventBus.emit`; views (notebook widgets, the lab comm) subscribe.  A subscriber that
raises is logged and kept: one broken view must never break training or another view.

The bus also remembers the latest event of each "state" type so a view that attaches late (or a
reloaded lab page) can ask for :meth:`EventBus.snapshot`.

Example::

    >>> bus = EventBus()
    >>> seen = []
    >>> unsubscribe = bus.subscribe(seen.append)
    >>> bus.emit({"v": 1, "type": "run_ended", "run": "r", "status": "done", "wall_s": 0.1})
    >>> len(seen)
    1
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("phalanx")

Subscriber = Callable[[dict], None]

# Event types whose latest value describes the current state (metrics/progress are streams and
# are replayed from the run history instead).
# ``time`` carries every rank's totals each time: its latest is the run's breakdown so far.
_STATE_TYPES = ("cluster", "run_started", "run_ended", "network", "time")


class EventBus:
    """Fan events out to subscribers and keep the latest state for late joiners."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._latest: dict[str, dict] = {}
        self._networks: dict[str, dict] = {}

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every future event; returns an unsubscribe function."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def emit(self, event: dict) -> None:
        """Deliver ``event`` to every subscriber (in the caller's thread)."""
        kind = event.get("type")
        with self._lock:
            if kind == "network":
                self._networks[event["network"]] = event
            elif kind in _STATE_TYPES:
                self._latest[kind] = event
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # a broken view must not break the producer
                log.exception("phalanx: event subscriber %r failed on %s event", callback, kind)

    def snapshot(self) -> list[dict]:
        """The latest state events (cluster, last run, every network), oldest kind first."""
        with self._lock:
            states = [self._latest[k] for k in _STATE_TYPES if k in self._latest]
            return states + list(self._networks.values())
