"""One estimator in one run: first-call checks that the ranks agree, its rule's merge after
each ``partial_fit``, its averaged arrays through the run's sync strategy, and the warnings."""

from __future__ import annotations

import hashlib
import sys
import types
import warnings
from typing import Any, Callable

from ...run._engine_state import RunContext
from ._choose import _choose_rule
from ._fitted import _is_fitted
from ._merge_rules import _Rule

# The modules of this package: the frames a warning's stacklevel skips (see _caller_level).
_PACKAGE = __name__.rpartition(".")[0] + "."


class EstimatorAveragingWarning(UserWarning):
    """An estimator's ``partial_fit`` has no exact merge across ranks: phalanx averages its float
    fitted attributes, which need not give the model one process would learn."""


class EstimatorSyncError(ValueError):
    """Ranks cannot be kept in agreement: different classes, shapes or fitted states."""


def _digest(text: str) -> float:
    # 48 bits: exact in a float64, which every transport reduces
    return float(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "big"))


_DISAGREE = {
    "estimator": "ranks reached partial_fit of different estimators (the cell must call "
                 "partial_fit in the same order on every rank)",
    "fitted": "the estimator was fitted on some ranks only before its first partial_fit here: "
              "fit it the same way on every rank (or on none)",
    "classes_": "classes_ differ across ranks: pass the same classes= at the first partial_fit "
                "on every rank (e.g. np.unique of the full labels, computed in the notebook)",
    "n_features_in_": "ranks passed different numbers of features",
    "structure": "its fitted arrays differ in shape across ranks, so they cannot be merged: fit "
                 "it on one rank, or run with --sync none and combine the models yourself",
}


def _agree(comm: Any, facts: dict[str, str], estimator: Any) -> None:
    """Raise the same EstimatorSyncError on every rank when ranks disagree on ``facts``."""
    import numpy as np

    keys = sorted(facts)
    mine = [_digest(facts[k]) for k in keys]
    both = np.array(mine + [-d for d in mine], dtype=np.float64)
    comm.allreduce([both], op="max")  # max and -min in one call
    bad = [k for i, k in enumerate(keys) if both[i] != -both[len(keys) + i]]
    if bad:
        raise EstimatorSyncError(f"{type(estimator).__name__}.partial_fit: "
                                 + "; ".join(_DISAGREE[k] for k in bad))


def _count_step(run: RunContext) -> None:
    run.steps += 1
    if run.metrics is not None:
        run.metrics.set_step(run.steps)


class _EstimatorSync:
    """One estimator in one run: its rule, its strategy, its first-call checks."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.rule: _Rule | None = None
        self.strategy: Any = None
        self.active = False          # merging at all: not --sync none, not a no-op on one rank
        self.fitted_before = False   # fitted when its first partial_fit here began
        self.merged = False
        self.started = False         # strategy.start() ran on its averaged arrays
        self.warned: set[str] = set()

    def call(self, est: Any, method: Callable, args: tuple, kwargs: dict) -> Any:
        rule = self.rule or self._open(est)
        rebase = self.active and not self.merged and self.fitted_before
        if self.active:
            rule.before(est, args, kwargs)
        try:
            result = method(*args, **kwargs)
        except BaseException:
            if self.active:
                rule.restore(est)
            raise
        if self.active:
            self._merge(est, rule, rebase)
        _count_step(self.run)
        return result

    def _open(self, est: Any) -> _Rule:
        from ...sync._strategies import NoSync, run_strategy

        run = self.run
        rule = self.rule = _choose_rule(est)
        strategy = self.strategy = run_strategy(run)
        self.active = not isinstance(strategy, NoSync) and not (
            run.world_size == 1 and strategy.identity_on_one_rank)
        self.fitted_before = _is_fitted(est)
        if not self.active:
            return rule
        kind = f"{type(est).__module__}.{type(est).__qualname__}"
        _agree(run.collectives, {"estimator": kind, "fitted": str(self.fitted_before)}, est)
        self._warn(rule.warnings())
        arrays = rule.averaged(est) if self.fitted_before else []
        if arrays:  # shipped fitted: every rank starts from rank 0's model, as torch's do
            self._start(est, rule, arrays, average_first=False)
        return rule

    def _merge(self, est: Any, rule: _Rule, rebase: bool) -> None:
        comm = self.run.collectives
        if not self.merged or rule.check_every_call:
            facts = {"structure": rule.signature(est)}
            if not self.merged:
                facts["classes_"] = repr(_listed(getattr(est, "classes_", None)))
                facts["n_features_in_"] = repr(getattr(est, "n_features_in_", None))
            _agree(comm, facts, est)
        rule.merge(est, comm, rebase)
        self.merged = True
        self._warn(rule.warnings())  # a composite knows its inner estimators only now
        arrays = rule.averaged(est)
        if not arrays:
            return
        if not self.started:
            self._start(est, rule, arrays, average_first=True)
        self.strategy.after_step(arrays, self.run.steps)  # 0-based, like torch's

    def _start(self, est: Any, rule: _Rule, arrays: list, average_first: bool) -> None:
        """First arrays of the estimator: ranks agree, then the strategy starts from them.

        Built during the first call (random initialisations may differ), the ranks' first
        models are averaged - no rank's first batch is dropped - before ``start`` (rank 0's
        broadcast, EASGD's centre)."""
        if average_first:
            assert self.run.collectives is not None   # set as the run starts
            self.run.collectives.allreduce(arrays, op="mean")
        self.strategy.start(arrays)
        self.started = True
        self.run.tracked.append((self.strategy, lambda: rule.averaged(est)))

    def _warn(self, messages: list[str]) -> None:
        if self.run.world_size == 1 or self.run.rank != 0:  # once per run, not once per rank
            return
        for message in messages:
            if message not in self.warned:
                self.warned.add(message)
                warnings.warn(message, EstimatorAveragingWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this package: the warning then shows the
    cell's own ``partial_fit`` line, not phalanx's."""
    frame: types.FrameType | None = sys._getframe(1)  # level 1: the frame calling warn()
    level = 1
    while frame is not None and str(frame.f_globals.get("__name__")).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _listed(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value
