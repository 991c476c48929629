"""``xgb.train`` in a ``%%distributed_fit`` cell trains one model over every rank's shard.

For the length of a run, XGBoost's ``train`` (``xgboost.train``, ``xgboost.training.train`` and
the one the scikit-learn estimators call) and ``QuantileDMatrix`` (whose quantile sketch must be
the same on every rank) get a thin wrapper.  At the first call on the cell's thread, the rank
joins XGBoost's own communicator (``xgboost.collective.CommunicatorContext``) through the
tracker the kernel started for the attempt (``RunSpec.data_for("xgboost")``; see
:mod:`phalanx.fit.run._xgboost_tracker`), as its own rank (a task id that sorts by rank); it leaves it
at the run's end, whatever happened.  XGBoost then allreduces its histograms and evaluation
metrics itself: every rank ends with the same booster, which a cheap fingerprint in one
allreduce checks (a difference is said in the cell).  A cell that never trains never joins.

``train`` also gets a callback for the run: each boosting round is a step of the run's views,
and what XGBoost evaluates per round (``evals=[(dvalid, "valid")]``) becomes the rank's metric
rows (``valid-rmse`` ...); the run's total steps are the rounds asked for.

Faults: a rank that dies closes its sockets, and its peers' collectives fail at once with an
``XGBoostError``; a rank that froze is given the run's ``--collective-timeout`` (XGBoost's
``dmlc_timeout``); the interrupt that releases the others lands between rounds (the callback is
Python; a rank still waiting in XGBoost's bootstrap takes it when the wait ends).  XGBoost's
own note: each rank listens on an ephemeral port for the tracker's error signal while the
communicator is up (it binds every interface; XGBoost's design).  XGBoost closes it when the
rank leaves, except after a failed bootstrap or shutdown: then phalanx sends it the shutdown
signal XGBoost would have sent, so nothing of the run is left listening.

Example (the engine runtime, around the cell)::

    undo = watch_xgboost(run)
    try:
        exec(code, namespace)     # booster = xgb.train(params, DMatrix(X, y), 50, evals=...)
    finally:
        undo()                    # leaves the communicator, takes the wrappers back
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math
import threading
import warnings
from typing import Any, Callable

from ._import_watch import when_loaded
from ._library_patches import patch_everywhere, take_back_patches, unpatched
from ..telemetry._metrics import to_number
from . import Adapter

log = logging.getLogger("phalanx")

# (module, attribute) of each reference to XGBoost's ``train`` that a cell reaches
_TRAIN = (("xgboost.training", "train"), ("xgboost", "train"), ("xgboost.sklearn", "train"))
_U64 = 2**64 - 1


class _XGBoostWorld:
    """One run's wrappers and its membership of XGBoost's communicator."""

    def __init__(self, run: Any) -> None:
        self.run = run
        data_for = getattr(getattr(run, "spec", None), "data_for", None)
        self.args = dict(data_for("xgboost", ()) if data_for is not None else ())
        self.thread = threading.get_ident()  # the cell's: XGBoost's communicator is per thread
        self.active = True
        self.context: Any = None
        self.warned = False
        self.listening: set[int] = set()   # ports this process listened on before joining
        self.undo: list[Callable[[], None]] = []

    def start(self) -> None:
        self.undo.append(when_loaded("xgboost.training", lambda _m: self.wrap_train()))
        self.undo.append(when_loaded("xgboost.core", self.wrap_quantile))

    def ours(self) -> bool:
        return self.active and threading.get_ident() == self.thread

    # --- the wrappers ---------------------------------------------------------------------

    def wrap_train(self) -> None:
        import sys

        if self.active:
            self.undo += patch_everywhere(sys.modules["xgboost.training"].train, _TRAIN,
                                          self.ours, self.train)

    def wrap_quantile(self, core: Any) -> None:
        cls = getattr(core, "QuantileDMatrix", None)
        if cls is None or not self.active:
            return
        original = unpatched(cls.__init__)
        world = self

        @functools.wraps(original)
        def __init__(obj: Any, *args: Any, **kwargs: Any) -> None:
            if world.ours():
                world.join()  # the quantile sketch is merged across ranks as it is built
            original(obj, *args, **kwargs)

        __init__._phalanx_world = True  # type: ignore[attr-defined]
        cls.__init__ = __init__

    # --- what they do -----------------------------------------------------------------------

    def train(self, original: Callable, signature: inspect.Signature, args: tuple,
              kwargs: dict) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        joined = self.join()
        callbacks = list(bound.arguments.get("callbacks") or [])
        callbacks.append(_rounds_callback(self.run, int(bound.arguments["num_boost_round"])))
        bound.arguments["callbacks"] = callbacks
        booster = original(*bound.args, **bound.kwargs)
        if joined:
            _check_same(booster, self.run.rank)
        return booster

    def join(self) -> bool:
        """Join XGBoost's communicator (once per run); False when this rank trains alone."""
        if self.context is not None:
            return True
        if self.run.world_size < 2:
            return False
        if not self.args:
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"rank {self.run.rank}: xgboost trains on this rank's data alone: the kernel "
                    "started no XGBoost tracker for this run (is xgboost installed in the "
                    "kernel's environment?)", RuntimeWarning, stacklevel=4)
            return False
        from xgboost import collective

        context = collective.CommunicatorContext(
            **self.args, dmlc_task_id=f"phalanx-rank-{self.run.rank:06d}")
        self.listening = _listening_anywhere()
        try:
            context.__enter__()
        except BaseException:
            # a bootstrap that failed (a peer that never came) leaves XGBoost's error listener
            _signal_shutdown(_listening_anywhere() - self.listening)
            raise
        self.context = context
        return True

    def leave(self) -> None:
        context, self.context = self.context, None
        if context is None:
            return
        try:
            context.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - a failed run's peers are gone: nothing to tell
            log.debug("phalanx: leaving XGBoost's communicator: %s", exc)
            # XGBoost's shutdown stops at its first failed step, before the one that closes the
            # rank's error listener: close it as that step would have.
            _signal_shutdown(_listening_anywhere() - self.listening)

    def stop(self) -> None:
        self.active = False
        try:
            self.leave()
        finally:
            for undo in reversed(self.undo):
                undo()
            self.undo.clear()
            _take_back()


def _take_back() -> None:
    """Every reference to ``train`` and ``QuantileDMatrix.__init__`` back to XGBoost's own."""
    import sys

    take_back_patches(_TRAIN)
    core = sys.modules.get("xgboost.core")
    cls = getattr(core, "QuantileDMatrix", None)
    if cls is not None:
        cls.__init__ = unpatched(cls.__init__)


def _listening_anywhere() -> set[int]:
    """Ports this process listens on at every interface (how XGBoost binds its workers')."""
    import os

    import psutil

    try:
        connections = psutil.Process(os.getpid()).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN
            and c.laddr.ip in ("0.0.0.0", "::")}


def _signal_shutdown(ports: set[int]) -> None:
    """Send XGBoost's shutdown signal (an int32 0) to its error listeners on these ports."""
    import socket
    import struct

    for port in ports:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2.0) as conn:
                conn.sendall(struct.pack("=i", 0))
        except OSError as exc:
            log.debug("phalanx: closing XGBoost's error listener on port %s: %s", port, exc)


def _rounds_callback(run: Any, rounds: int) -> Any:
    """A ``TrainingCallback`` for one ``train`` call: rounds as the run's steps, what XGBoost
    evaluated in each round as this rank's metric row."""
    from xgboost.callback import TrainingCallback

    class PhalanxRounds(TrainingCallback):
        def before_training(self, model: Any) -> Any:
            metrics = run.metrics
            if metrics is not None and metrics.total is None and rounds > 0:
                metrics.set_total(run.steps + rounds)
            return model

        def after_iteration(self, model: Any, epoch: int, evals_log: dict) -> bool:
            run.steps += 1
            metrics = run.metrics
            if metrics is None:
                return False
            metrics.set_step(run.steps)
            row = _last_scores(evals_log)
            if row:
                metrics.record(run.steps, row)
            return False

    return PhalanxRounds()


def _last_scores(evals_log: dict) -> dict[str, float]:
    """``{"valid-rmse": 0.31, ...}``: each evaluation's latest score, named as XGBoost prints it
    (a ``(mean, std)`` score counts by its mean)."""
    row: dict[str, float] = {}
    for data, scores in (evals_log or {}).items():
        for metric, values in (scores or {}).items():
            if not values:
                continue
            last = values[-1]
            number = to_number(last[0] if isinstance(last, tuple) else last)
            if number is not None and math.isfinite(number):
                row[f"{data}-{metric}"] = number
    return row


def _check_same(booster: Any, rank: int) -> None:
    """Every rank must hold the same booster: one allreduce of a fingerprint of its model."""
    import numpy as np
    from xgboost import collective

    digest = int.from_bytes(hashlib.blake2b(bytes(booster.save_raw("ubj")),
                                            digest_size=8).digest(), "little")
    mine = np.array([digest, _U64 - digest], dtype=np.uint64)
    top = collective.allreduce(mine, collective.Op.MAX)
    if not np.array_equal(top, mine):
        warnings.warn(f"rank {rank}: the XGBoost booster differs across ranks after training "
                      "(was a DMatrix or model built differently on some rank?)",
                      RuntimeWarning, stacklevel=4)


def watch_xgboost(run: Any) -> Callable[[], None]:
    """Make ``xgb.train`` in ``run`` train across its ranks; returns what undoes it all."""
    world = _XGBoostWorld(run)
    world.start()
    return world.stop


ADAPTER = Adapter("xgboost", "XGBoost's world", lambda run, namespace, shard: watch_xgboost(run))
