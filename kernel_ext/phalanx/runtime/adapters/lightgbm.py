"""``lgb.train`` in a ``%%distributed_fit`` cell trains one model over every rank's shard.

LightGBM's distributed mode is a network of its own: each machine listens on a port, and the
``machines`` parameter lists every machine's address and port.  For the length of a run,
LightGBM's ``train`` (``lightgbm.train``, ``lightgbm.engine.train`` and the one its
scikit-learn estimators call) gets a thin wrapper that, on the cell's thread:

- picks a free port on this rank's host and learns every rank's address and port over the run's
  own collectives (loopback when every rank is on one host, else each rank's address on the
  route to its peers);
- adds ``machines``, ``local_listen_port``, ``num_machines``, ``pre_partition=True`` (each rank's
  ``--shard`` is its partition), ``tree_learner="data"`` unless the cell chose a parallel
  learner itself, and ``time_out`` from the run's ``--collective-timeout``;
- counts boosting rounds as the run's steps and what LightGBM evaluates per round
  (``valid_sets=``) as the rank's metric rows, like XGBoost's (see :mod:`.xgboost`);
- checks that every rank ended with the same model (one digest, compared across ranks);
- frees LightGBM's network when ``train`` returns or raises: nothing of the run stays listening.

A cell whose parameters already name ``machines`` is left as it is.  LightGBM's own note: its
listener binds every interface while ``train`` runs (LightGBM's design); on a cluster beyond
one host, keep the engines on a private network (see the README's network section).

Example (the engine runtime, around the cell)::

    undo = watch_lightgbm(run)
    try:
        exec(code, namespace)     # model = lgb.train(params, lgb.Dataset(X, y), 50)
    finally:
        undo()                    # takes the wrappers back
"""

from __future__ import annotations

import hashlib
import inspect
import math
import socket
import threading
import warnings
from typing import Any, Callable

from ._import_watch import when_loaded
from ._library_patches import patch_everywhere, take_back_patches
from ..telemetry._metrics import to_number
from . import Adapter

# (module, attribute) of each reference to LightGBM's ``train`` that a cell reaches
_TRAIN = (("lightgbm.engine", "train"), ("lightgbm", "train"), ("lightgbm.sklearn", "train"))
_PARALLEL_LEARNERS = {"data", "data_parallel", "feature", "feature_parallel", "voting",
                      "voting_parallel"}
_NETWORK_KEYS = ("machines", "machine_list_filename", "machine_list_file", "machine_list",
                 "mlist", "workers", "nodes")
LOOPBACK = "127.0.0.1"


class _LightGBMWorld:
    """One run's wrappers of LightGBM's ``train``."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.thread = threading.get_ident()  # the cell's: other threads train alone
        self.active = True
        self.undo: list[Callable[[], None]] = []

    def start(self) -> None:
        self.undo.append(when_loaded("lightgbm.engine", lambda _m: self.wrap_train()))

    def wrap_train(self) -> None:
        import sys

        if self.active:
            self.undo += patch_everywhere(sys.modules["lightgbm.engine"].train, _TRAIN,
                                          self.ours, self.train)

    def ours(self) -> bool:
        """A call this run trains over every rank: the cell's thread, while the run lasts."""
        return self.active and threading.get_ident() == self.thread and self.run.world_size > 1

    def train(self, original: Callable, signature: inspect.Signature, args: tuple,
              kwargs: dict) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        params = dict(bound.arguments.get("params") or {})
        if any(key in params for key in _NETWORK_KEYS):  # the cell set up its own network
            return original(*bound.args, **bound.kwargs)
        params.update(self.network_params(params))
        bound.arguments["params"] = params
        callbacks = list(bound.arguments.get("callbacks") or [])
        callbacks.append(_rounds_callback(self.run, int(bound.arguments["num_boost_round"])))
        bound.arguments["callbacks"] = callbacks
        try:
            booster = original(*bound.args, **bound.kwargs)
        finally:
            _free_network()
        # the trees, without the parameters section (each rank's port and address differ)
        _check_same(self.run, booster.model_to_string().split("\nparameters:\n")[0])
        return booster

    def network_params(self, params: dict) -> dict:
        """``machines`` and the rest of LightGBM's network parameters for this rank."""
        from ..commits._resume import allgather_bytes

        run = self.run
        port = _free_port()
        me = f"{_own_address(run)}:{port}".encode()
        machines, _ = allgather_bytes(run.collectives, me, run.rank, run.world_size)
        group = _group_of(run)
        timeout_s = float(group.timeout_s) if group is not None else 120.0
        out = {"machines": ",".join(m.decode() for m in machines), "local_listen_port": port,
               "num_machines": run.world_size, "pre_partition": True,
               "time_out": max(1, math.ceil(timeout_s / 60))}  # LightGBM counts minutes
        if str(params.get("tree_learner", "serial")) not in _PARALLEL_LEARNERS:
            out["tree_learner"] = "data"
        return out

    def stop(self) -> None:
        self.active = False
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()
        take_back_patches(_TRAIN)


def _group_of(run: Any) -> Any:
    """The run's group spec (its hosts, its collective deadline); None outside a kernel's run."""
    return getattr(run.spec, "group", None)


def _own_address(run: Any) -> str:
    """This rank's address as its peers reach it: loopback when the run is on one host."""
    group = _group_of(run)
    hosts = tuple(getattr(group, "hosts", ()) or ())
    if len(set(hosts)) <= 1:
        return LOOPBACK
    peer = next((h for i, h in enumerate(hosts) if i != run.rank and h != hosts[run.rank]), None)
    if peer is None:
        return LOOPBACK
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))  # no packet is sent: the kernel only picks the route
        return probe.getsockname()[0]


def _free_port() -> int:
    """A port free on every interface now, which LightGBM binds right after (its listener
    binds every interface)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _free_network() -> None:
    """Close LightGBM's network of this process (its listener and links), whatever happened."""
    import sys

    basic = sys.modules.get("lightgbm.basic")
    if basic is not None:
        basic._safe_call(basic._LIB.LGBM_NetworkFree())


def _rounds_callback(run: Any, rounds: int) -> Callable[[Any], None]:
    """Rounds as the run's steps; what LightGBM evaluated in each round as a metric row."""
    def after_round(env: Any) -> None:
        metrics = run.metrics
        if env.iteration == env.begin_iteration and metrics is not None \
                and metrics.total is None and rounds > 0:
            metrics.set_total(run.steps + rounds)
        run.steps += 1
        if metrics is None:
            return
        metrics.set_step(run.steps)
        row = {}
        for data, metric, value, *_ in env.evaluation_result_list or ():
            number = to_number(value)
            if number is not None and math.isfinite(number):
                row[f"{data}-{metric}"] = number
        if row:
            metrics.record(run.steps, row)

    after_round.order = 30  # type: ignore[attr-defined]  # after LightGBM's own callbacks
    return after_round


def _check_same(run: Any, model: str) -> None:
    """Every rank must hold the same model: their digests, compared across ranks."""
    from ..commits._resume import allgather_bytes

    digest = hashlib.sha256(model.encode()).digest()
    digests, _ = allgather_bytes(run.collectives, digest, run.rank, run.world_size)
    if len(set(digests)) > 1:
        warnings.warn(f"rank {run.rank}: LightGBM's ranks ended with different models: its "
                      "distributed training did not keep them in step", RuntimeWarning,
                      stacklevel=4)


def watch_lightgbm(run: Any) -> Callable[[], None]:
    """Make ``lgb.train`` in ``run`` train across its ranks; returns what undoes it."""
    world = _LightGBMWorld(run)
    world.start()
    return world.stop


ADAPTER = Adapter("lightgbm", "LightGBM's world", lambda run, namespace, shard: watch_lightgbm(run))
