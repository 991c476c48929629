"""At the process's exit, the clusters still running stop through their own stop path.

ipyparallel stops a ``Cluster(shutdown_atexit=True)`` at exit from the main thread, on an event
loop of its own, while phalanx's cluster loop thread still takes the engines' exit notices and
removes them from the same tables: the two raced ("RuntimeError: dictionary changed size during
iteration", then ipyparallel's "Error stopping cluster" and its traceback on the way out of a
script).  phalanx's clusters opt out of ipyparallel's handler (see ``_controller``) and are
stopped here by :meth:`ClusterManager.stop`, every step of which runs on the cluster loop thread
(a daemon thread still runs while exit handlers do).  Should that fail, the cluster's watchdogs
end what is left once the process is gone (``_warden``, ``_supervise``).
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import Protocol

log = logging.getLogger("phalanx")


class _Stoppable(Protocol):
    @property
    def running(self) -> bool: ...

    def stop(self) -> bool: ...


_running: "weakref.WeakSet[_Stoppable]" = weakref.WeakSet()
_registered = [False]


def stop_at_exit(manager: _Stoppable) -> None:
    """Stop ``manager``'s cluster when the process exits, if it still runs then."""
    _running.add(manager)
    if not _registered[0]:
        atexit.register(stop_running_clusters)
        _registered[0] = True


def stop_running_clusters() -> None:
    """Stop every cluster still running (the exit handler; harmless to call at any time)."""
    for manager in list(_running):
        if not manager.running:
            continue
        try:
            manager.stop()
        except Exception as exc:  # the watchdogs end what is left once the process is gone
            log.warning("phalanx: stopping a cluster at exit failed: %r", exc)
