"""Smart retraining: what a machine's fit depended on, and whether it must fit again.

Pure decisions over plain records (no graph, no IO), so every rule is testable in
microseconds.  A machine remembers a :class:`FitRecord` of its last successful fit: its
estimator type, per-hyperparameter fingerprints, the result counters of the machines upstream
of it, the content fingerprints of the sources its training data comes from, and the rows.
:func:`decide` compares that record with the present one.

Example::

    >>> rec = FitRecord("Ridge", {"alpha": "a1"}, {"alpha": 1.0}, {}, {"X": "d1"}, "all")
    >>> state = MachineState(fitted=object(), n_results=1, record=rec, status="fitted")
    >>> decide(state, rec).action
    'skip'
    >>> decide(state, FitRecord("Ridge", {"alpha": "a2"}, {"alpha": 2.0}, {}, {"X": "d1"},
    ...                         "all")).reason
    'hyperparameters changed: alpha'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Number
from typing import Any

FIT, UPDATE, SKIP = "fit", "update", "skip"

# Hyperparameters that a warm-started estimator can grow and simply continue training.
WARM_GROWTH_PARAMS = frozenset({"n_estimators", "max_iter"})


@dataclass(frozen=True)
class FitRecord:
    """What one fit of a machine depended on."""

    model_type: str
    params: Mapping[str, str]          # hyperparameter name -> content fingerprint
    scalars: Mapping[str, Any]         # scalar hyperparameter values (to judge warm updates)
    upstream: Mapping[str, int]        # upstream machine uid -> its result counter
    data: Mapping[str, str]            # source uid -> content fingerprint
    rows: str                          # fingerprint of the rows trained on ("all" for all)
    structure: str = ""                # fingerprint of the graph computing its training data

    def with_upstream(self, upstream: Mapping[str, int]) -> FitRecord:
        """The same record with upstream counters as they stand after this fit."""
        return dataclasses.replace(self, upstream=dict(upstream))


@dataclass
class MachineState:
    """The kernel-side state of a machine; replaced, never mutated, by a fit."""

    fitted: Any = None
    n_results: int = 0                 # bumped by every fit or update: "a new fit result"
    record: FitRecord | None = None
    status: str = "fresh"              # fresh | fitted | failed
    last_action: str | None = None
    fit_time_s: float | None = None
    error: BaseException | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Decision:
    """What to do with one machine in a fit, and why."""

    action: str
    reason: str


def decide(state: MachineState, current: FitRecord, *, frozen: bool = False,
           force: bool = False, refitting_upstream: Sequence[str] = (),
           names: Mapping[str, str] | None = None, ignore_rows: bool = False) -> Decision:
    """Decide ``fit``, ``update`` or ``skip`` for one machine.

    ``refitting_upstream`` names upstream machines that get a new result in this same fit;
    ``names`` maps uids to names for readable reasons; ``ignore_rows`` is for previews that
    do not know which rows the next fit will use.

    Example::

        >>> decide(MachineState(), None).reason
        'never trained'
    """
    names = names or {}
    if state.fitted is None or state.record is None:
        return Decision(FIT, "never trained")
    if frozen:
        return Decision(SKIP, "frozen")
    if force:
        return Decision(FIT, "forced")
    old = state.record
    if old.model_type != current.model_type:
        return Decision(FIT, f"estimator replaced: {old.model_type} -> {current.model_type}")
    if old.structure != current.structure:
        return Decision(FIT, "its training graph changed")
    if refitting_upstream:
        return Decision(FIT, f"upstream {refitting_upstream[0]!r} refits")
    moved = _first_difference(old.upstream, current.upstream)
    if moved is not None:
        return Decision(FIT, f"upstream {names.get(moved, moved)!r} has a new fit result")
    changed_source = _first_difference(old.data, current.data)
    if changed_source is not None:
        return Decision(FIT, f"data of source {names.get(changed_source, changed_source)!r} "
                             "changed")
    if not ignore_rows and old.rows != current.rows:
        return Decision(FIT, "rows changed")
    changed = changed_params(old, current)
    if not changed:
        return Decision(SKIP, "up to date")
    if can_update(old, current, changed):
        grown = ", ".join(f"{k} {old.scalars[k]} -> {current.scalars[k]}" for k in changed)
        return Decision(UPDATE, f"warm start: {grown}")
    return Decision(FIT, "hyperparameters changed: " + ", ".join(changed))


def same_inputs(old: FitRecord | None, new: FitRecord) -> bool:
    """Whether a fit with ``new`` would see exactly the training inputs of the ``old`` fit."""
    return (old is not None and old.upstream == new.upstream and old.data == new.data
            and old.rows == new.rows and old.structure == new.structure)


def changed_params(old: FitRecord, new: FitRecord) -> list[str]:
    """Names of hyperparameters whose value differs (added or removed ones included)."""
    keys = sorted(set(old.params) | set(new.params))
    return [k for k in keys if old.params.get(k) != new.params.get(k)]


def can_update(old: FitRecord, new: FitRecord, changed: Sequence[str]) -> bool:
    """Whether a warm ``update`` may replace a fresh fit.

    Only when ``warm_start`` is on before and after and every changed hyperparameter is a
    growth parameter (``n_estimators``, ``max_iter``) that grew: anything else could leave the
    previous fit inconsistent with the new settings.

    Example::

        >>> old = FitRecord("GBR", {"n_estimators": "a"}, {"warm_start": True, "n_estimators": 10},
        ...                 {}, {}, "all")
        >>> new = FitRecord("GBR", {"n_estimators": "b"}, {"warm_start": True, "n_estimators": 20},
        ...                 {}, {}, "all")
        >>> can_update(old, new, ["n_estimators"])
        True
    """
    if not changed or old.scalars.get("warm_start") is not True:
        return False
    if new.scalars.get("warm_start") is not True:
        return False
    for key in changed:
        before, after = old.scalars.get(key), new.scalars.get(key)
        if key not in WARM_GROWTH_PARAMS or not _grew(before, after):
            return False
    return True


def _grew(before: Any, after: Any) -> bool:
    numbers = isinstance(before, Number) and isinstance(after, Number)
    return numbers and not isinstance(before, bool) and after > before


def _first_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    for key in list(new) + [k for k in old if k not in new]:
        if old.get(key) != new.get(key):
            return key
    return None
