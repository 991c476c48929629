"""Notebook objects a run trained but ``--return`` did not name.

The engines train copies of what the notebook sent; only ``--return`` brings them back.  A person
who trains the notebook's ``model`` in the cell and forgets ``--return model`` finds it untrained
in the next cell and thinks the run did nothing, or worse, a later cell that failed to rebuild it
leaves a trained model from an earlier run in place.  So rank 0 names, at the end of a run, the
shipped names whose parameters (or ``partial_fit`` estimator) the run trained and which were not
returned, and the kernel says so in the run's last line.

Example (on rank 0, at the end of a run)::

    >>> trained_not_returned({}, (), trained=set(), estimators={})
    ()
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Iterable, Mapping

from ...wire._seam import RunSpec
from ._engine_state import RunContext

log = logging.getLogger("phalanx")


def unreturned_names(run: RunContext, spec: RunSpec, shipped: Mapping[str, Any],
                     namespace: Mapping[str, Any]) -> tuple[str, ...]:
    """The notebook's objects (``shipped``: name -> what the notebook sent) this run trained
    that ``--return`` does not bring back.  One returned under another name (``net = model``)
    comes back: the kernel applies it in place.  Only a notice: a failure here never fails
    the run."""
    try:
        returns = spec.train.returns
        by_value = {id(namespace[r]) for r in returns if r in namespace}
        candidates = {n: v for n, v in shipped.items() if id(v) not in by_value}
        return trained_not_returned(candidates, returns, trained_ids(run), run.strategies)
    except Exception as exc:  # noqa: BLE001 - the run's result matters more than the notice
        log.warning("phalanx: could not tell what trained without --return: %s", exc)
        return ()


def trained_ids(run: RunContext) -> set[int]:
    """The ids of the tensors the run trained: its optimizers' parameters, and what the
    training watch found receiving gradients."""
    out: set[int] = set()
    for _strategy, params_fn in run.tracked:
        out.update(id(p) for p in params_fn())
    if run.watch is not None:
        out.update(id(t) for t in run.watch.trainable_synced())
    return out


def trained_not_returned(shipped: Mapping[str, Any], returns: Iterable[str], trained: set[int],
                         estimators: Mapping[int, Any]) -> tuple[str, ...]:
    """The names in ``shipped`` (name -> the object the notebook sent) not in ``returns`` whose
    parameters are among ``trained`` ids, or which are estimators the run synced
    (``estimators``: id -> strategy, optimizers' too, which are left out)."""
    torch = sys.modules.get("torch")
    returned = set(returns)
    found = []
    for name, value in shipped.items():
        if name in returned:
            continue
        if id(value) in estimators and not _is_optimizer(torch, value):  # partial_fit estimators
            found.append(name)
        elif torch is not None and isinstance(value, torch.nn.Module) and trained \
                and any(id(p) in trained for p in value.parameters()):
            found.append(name)
    return tuple(found)


def _is_optimizer(torch: Any, value: Any) -> bool:
    # an optimizer's state comes back with its model's returned parameters; it trains nothing
    return torch is not None and isinstance(value, torch.optim.Optimizer)


def notice(names: tuple[str, ...]) -> str:
    """The line the kernel prints: ``model trained on the engines but not returned: add
    --return model``."""
    listed = ", ".join(names)
    verb = "were" if len(names) > 1 else "was"
    return (f"phalanx: {listed} {verb} trained on the engines but not returned: "
            f"add --return {','.join(names)}")
