"""Calls on engines that an engine may leave at any moment: each failure names its rank.

ipyparallel forgets an engine the moment its controller notices it is gone - on its own IO
thread, between any check of ours and the next call.  A call then fails with whatever
ipyparallel raises at that point (``KeyError`` or ``IndexError`` for an id it no longer knows,
``CompositeError`` or ``EngineError`` for a task stranded on it).  Everything here calls one
engine per rank, so a failure belongs to a rank, and turns it into the run's one error
(:func:`~._errors.engine_fault`): the rank, its host and the cause.

Example::

    versions = call_each(cluster, slots, engine_versions, what="checking package versions")
    signal_engines(cluster, [0, 1], signal.SIGINT)   # ids already gone are skipped
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from ...cluster._engine_views import engine_view
from ._errors import engine_fault

log = logging.getLogger("phalanx")


class Undelivered:
    """Stands in for the AsyncResult of a task that could not be sent: ready, and failing."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def ready(self) -> bool:
        return True

    def done(self) -> bool:
        return True

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        fn(self)  # as a finished concurrent.futures.Future does: at once

    def get(self, timeout: float | None = None) -> Any:
        raise self.exc

    def wait_for_output(self, timeout: float | None = None) -> bool:
        return True  # nothing ran: no output will come


def registered(cluster: Any, engine_id: int | None) -> bool:
    """Whether ipyparallel still knows ``engine_id`` (False once the cluster itself is gone)."""
    client = getattr(cluster, "client", None)
    try:
        return client is not None and engine_id in client.ids
    except Exception:  # a client being closed under us
        return False


def dispatch(cluster: Any, slot: Any, fn: Callable, *args: Any) -> Any:
    """``apply_async`` on one slot's engine; an engine already gone gives an :class:`Undelivered`."""
    try:
        return engine_view(cluster.client, slot.engine_id).apply_async(fn, *args)
    except Exception as exc:
        return Undelivered(exc)


def call_each(cluster: Any, slots: list, fn: Callable, *args: Any, what: str,
              timeout: float = 60.0, with_rank: bool = False) -> list:
    """``fn(*args)`` (``fn(*args, rank)`` when ``with_rank``) on every slot's engine, results
    in rank order.

    Raises the run's :class:`DistributedFitError` naming the first rank whose call failed
    (a dead engine before a live one that merely raised).
    """
    ars = [dispatch(cluster, slot, fn, *args, *((rank,) if with_rank else ()))
           for rank, slot in enumerate(slots)]
    results, failures = [], {}
    for rank, ar in enumerate(ars):
        try:
            results.append(ar.get(timeout=timeout))
        except Exception as exc:
            failures[rank] = exc
            results.append(None)
    if failures:
        raise fault_of(cluster, slots, failures, what)
    return results


def fault_of(cluster: Any, slots: list, failures: Mapping[int, BaseException],
             what: str) -> Exception:
    """The one error for calls that failed on ``failures`` (rank -> exception)."""
    gone = [r for r in failures if not alive(cluster, slots[r])]
    rank = (gone or sorted(failures))[0]
    return engine_fault(rank, slots[rank], failures[rank], what, died=rank in gone)


def alive(cluster: Any, slot: Any) -> bool:
    """Whether a slot's engine can still be reached: not reported dead, still registered."""
    return slot.state not in ("dead", "stopping") and registered(cluster, slot.engine_id)


def signal_engines(cluster: Any, engine_ids: list[int], sig: int) -> list[int]:
    """Send ``sig`` to each engine through the control channel; returns the ids not reached.

    One request per engine: ipyparallel refuses a whole request when any target is unknown,
    and an engine that vanished needs no signal.
    """
    missed = []
    for engine_id in engine_ids:
        try:
            cluster.client.send_signal(sig, targets=[engine_id], block=False)
        except Exception as exc:
            log.debug("phalanx: engine %s did not take signal %s: %r", engine_id, sig, exc)
            missed.append(engine_id)
    return missed
