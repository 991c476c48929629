"""XGBoost's own collective for a ``%%distributed_fit`` attempt: its tracker, in the kernel.

A cell that calls ``xgb.train(...)`` on each rank's ``--shard`` trains one model over all
shards when every rank's XGBoost joins one communicator (``xgboost.collective``).  Its
coordinator is XGBoost's :class:`~xgboost.tracker.RabitTracker`: the kernel starts one for each
attempt of a run whose cell uses xgboost, and the engines enter the communicator with its
address (``RunSpec.adapter_data``; see :mod:`phalanx.runtime.adapters.xgboost`).

- It listens where the rest of phalanx does: loopback when every engine is on this host, else
  only the address on the route to the engines.
- Ranks are XGBoost's ranks: each rank names itself by a task id that sorts by rank
  (``sortby="task"``).
- Each rank's bootstrap and collectives have a deadline, the run's ``--collective-timeout``
  and a grace (``dmlc_timeout``); the tracker has none of its own (a cell may prepare data for long
  before it trains): it lives as long as the attempt.
- The tracker is freed when the attempt ends, whatever happened: nothing is left listening.

Example::

    with xgboost_tracker(body, user_ns, slots, timeout_s=60.0) as args:
        specs = [dataclasses.replace(s, adapter_data=(("xgboost", args),)) for s in specs]
        ...                                       # the attempt runs
    # closed here
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import re
import threading
import types
from typing import Any, Iterator

log = logging.getLogger("phalanx")

LOOPBACK = "127.0.0.1"
FREE_WAIT_S = 5.0   # how long closing waits for the tracker's thread (its port closes at once)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# seconds XGBoost's own deadline comes after the run's (see XGBoostTracker.args)
XGBOOST_GRACE_S = 5


def uses_xgboost(body: str, user_ns: dict) -> bool:
    """Whether the cell imports xgboost or uses a notebook name that comes from it (``xgb``
    imported in an earlier cell, a ``DMatrix`` or ``XGBRegressor`` built there)."""
    if "xgboost" in body:
        return True
    for name in set(_IDENTIFIER.findall(body)):
        if name in user_ns and _from_xgboost(user_ns[name]):
            return True
    return False


def _from_xgboost(value: Any) -> bool:
    if isinstance(value, types.ModuleType):
        module = value.__name__
    else:
        module = getattr(value, "__module__", None) or type(value).__module__
    return isinstance(module, str) and (module == "xgboost" or module.startswith("xgboost."))


def tracker_host(slots: list) -> str:
    """Where the tracker listens: loopback for engines on this host, else this host's address
    on the route to the engines (never every interface)."""
    from ...cluster import is_local
    from ._dispatch import reachable_ip

    away = [s for s in slots if not is_local(s)]
    return LOOPBACK if not away else reachable_ip(away[0].address)


class XGBoostTracker:
    """One attempt's :class:`~xgboost.tracker.RabitTracker` and what its ranks need to join."""

    def __init__(self, n_workers: int, host: str, timeout_s: float) -> None:
        from xgboost.tracker import RabitTracker

        # No deadline for the tracker itself: ranks may prepare their data for long before they
        # train, and the tracker goes with the attempt anyway.  The ranks have one instead.
        self._tracker: Any = RabitTracker(n_workers=n_workers, host_ip=host, port=0,
                                          sortby="task", timeout=0)
        try:
            self._tracker.start()
            worker = self._tracker.worker_args()
        except BaseException:
            self.close()
            raise
        # a rank's bootstrap and collectives end with an error after this long, rather than
        # waiting forever for a peer that froze or never trains (one that died closes its
        # sockets: its peers fail at once); a few seconds after the run's own deadline, which
        # names the rank that stalled (XGBoost's error at the same moment named the waiting
        # one instead on a busy machine)
        self.args: tuple[tuple[str, str | int], ...] = (
            ("dmlc_tracker_uri", str(worker["dmlc_tracker_uri"])),
            ("dmlc_tracker_port", int(worker["dmlc_tracker_port"])),
            ("dmlc_timeout", max(1, math.ceil(timeout_s)) + XGBOOST_GRACE_S),
        )

    def close(self) -> None:
        """Stop listening now (idempotent).  XGBoost's ``free`` closes the listener first, then
        waits for the tracker's thread: on a thread of its own, given a few seconds, so that a
        tracker stuck with a frozen rank never holds the kernel."""
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        freeing = threading.Thread(target=_free, args=(tracker,), name="phalanx-xgb-tracker",
                                   daemon=True)
        freeing.start()
        freeing.join(FREE_WAIT_S)
        if freeing.is_alive():
            log.warning("phalanx: XGBoost's tracker did not stop within %g s (its port is "
                        "closed)", FREE_WAIT_S)


def _free(tracker: Any) -> None:
    try:
        tracker.free()
    except Exception as exc:  # noqa: BLE001 - the listener is closed regardless
        # a tracker still waiting for a rank that died or was interrupted reports the accept
        # it was in: no news, the attempt's own error tells what happened
        log.debug("phalanx: XGBoost's tracker ended with: %s", exc)


@contextlib.contextmanager
def xgboost_tracker(body: str, user_ns: dict, slots: list,
                    timeout_s: float) -> Iterator[tuple[tuple[str, str | int], ...]]:
    """XGBoost's communicator arguments for this attempt's ranks (empty when the cell does not
    use xgboost, or the kernel has no xgboost to start a tracker with: the ranks then say so
    if they train), its tracker closed on the way out."""
    if len(slots) < 2 or not uses_xgboost(body, user_ns) \
            or importlib.util.find_spec("xgboost") is None:
        yield ()
        return
    tracker = XGBoostTracker(len(slots), tracker_host(slots), timeout_s)
    try:
        yield tracker.args
    finally:
        tracker.close()
