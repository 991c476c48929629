"""Per-run state and the entry points: :func:`patch_partial_fit`,
:func:`patch_namespace_estimators` and :func:`install_estimator_sync`."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from ...run._engine_state import RunContext
from ._estimator_sync import _EstimatorSync
from ._fitted import is_incremental_estimator
from ._hook import _HOOK
from ._patch import _BY_THREAD, _LOCK, _STATES, _patch_class, _unpatch_all


class _RunSync:
    """One run's estimators.  ``depth`` counts synchronising calls in progress: a nested call
    (a meta-estimator's inner ``partial_fit``, ``partial_fit`` inside ``fit``) runs plain.  It
    is per run, not per thread: meta-estimators with ``n_jobs`` call the inner estimators from
    joblib's threads."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.depth = 0
        self.closed = False
        self.creation_hook = False
        self.syncs: dict[int, tuple[Any, _EstimatorSync]] = {}

    def call(self, attr: str, est: Any, method: Callable, args: tuple, kwargs: dict) -> Any:
        if self.closed or self.depth:
            return method(*args, **kwargs)
        self.depth += 1
        try:
            if attr != "partial_fit":
                return method(*args, **kwargs)
            return self._sync_for(est).call(est, method, args, kwargs)
        finally:
            self.depth -= 1

    def _sync_for(self, est: Any) -> _EstimatorSync:
        entry = self.syncs.get(id(est))
        if entry is None or entry[0] is not est:  # the estimator is held: its id is not reused
            entry = self.syncs[id(est)] = (est, _EstimatorSync(self.run))
        return entry[1]

    def close(self) -> None:
        """End of the run: forget its estimators; the last run restores the classes."""
        with _LOCK:
            if self.closed:
                return
            self.closed = True
            self.syncs.clear()
            if _STATES.get(id(self.run)) is self:
                del _STATES[id(self.run)]
            for ident in [t for t, s in _BY_THREAD.items() if s is self]:
                del _BY_THREAD[ident]
            if self.creation_hook:
                _HOOK.users -= 1
                if not _HOOK.users:
                    _HOOK.stop()
            if not _STATES:
                _unpatch_all()


def _state_for(run: RunContext) -> _RunSync:
    with _LOCK:
        state = _STATES.get(id(run))
        if state is None or state.run is not run:
            state = _STATES[id(run)] = _RunSync(run)
            run.patches.on_undo(state.close, "partial_fit merging of scikit-learn estimators")
        _BY_THREAD[threading.get_ident()] = state
        return state


def _patch_instance(estimator: Any, state: _RunSync) -> None:
    """Fallback for a class that cannot be patched: an instance attribute, removed at the end."""
    if "partial_fit" in getattr(estimator, "__dict__", {}):
        return
    method = estimator.partial_fit
    try:
        estimator.partial_fit = functools.wraps(method)(
            lambda *args, **kwargs: state.call("partial_fit", estimator, method, args, kwargs))
    except (TypeError, AttributeError) as exc:
        raise TypeError(f"phalanx cannot synchronise partial_fit of {type(estimator).__name__}: "
                        f"neither its class nor the instance accepts a new attribute") from exc
    state.run.patches.on_undo(lambda: vars(estimator).pop("partial_fit", None),
                              f"partial_fit of a {type(estimator).__name__} instance")


def patch_partial_fit(estimator: Any, run: RunContext) -> Any:
    """Make ``estimator.partial_fit`` merge across ranks for the rest of ``run``; returns it.

    Example (what ``wrap(estimator)`` does)::

        clf = patch_partial_fit(SGDClassifier(), current_run())
    """
    state = _state_for(run)
    if not _patch_class(type(estimator)):
        _patch_instance(estimator, state)
    return estimator


def patch_namespace_estimators(run: RunContext, namespace: dict) -> int:
    """Synchronise the estimators with ``partial_fit`` the cell received (values of the
    namespace, and items of lists, tuples and dicts there); returns how many."""
    found = 0
    for name, value in list(namespace.items()):
        if name.startswith("__"):  # the module's own (__builtins__: the builtins' dict)
            continue
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        for item in items:
            if is_incremental_estimator(item):
                patch_partial_fit(item, run)
                found += 1
    return found


def install_estimator_sync(run: RunContext) -> Callable[[], None]:
    """Synchronise ``partial_fit`` of every scikit-learn estimator the cell builds while ``run``
    is active; returns the undo (also written in ``run.patches``; calling both is fine).

    Costs nothing when scikit-learn is not installed; when it is installed but not imported,
    nothing is imported until the cell does.

    Example::

        undo = install_estimator_sync(run)
        try:
            exec(cell, namespace)
        finally:
            undo()
    """
    state = _state_for(run)
    with _LOCK:
        if not state.creation_hook:
            state.creation_hook = True
            _HOOK.users += 1
            if _HOOK.users == 1:
                _HOOK.start()
    return state.close
