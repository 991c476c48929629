"""The groups of one run's gradient averaging: which parameters each strategy averages, and what
its strategies allow.

A group is ``(strategy, holder)``: an optimizer the run tracks, or :class:`Adopted`, the
parameters the training watch found trained without one.  :func:`param_groups` lists each
strategy's parameters as they are now (a parameter in two optimizers counts for the first);
:func:`held` lists what the holders hold, as the step's snapshot compares it
(:mod:`._param_snapshot`).

Example::

    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> adopted = Adopted(); adopted.add([w]); adopted.add([w])
    >>> held([("mean", adopted)]) == [w]
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ...wire._lazy_params import is_lazy
from ._training_watch import framework_synced

if TYPE_CHECKING:
    from ..run._engine_state import RunContext

Group = tuple[Any, Any]  # (strategy, an optimizer or Adopted)


class Adopted:
    """Parameters trained without an optimizer phalanx saw, shaped like one (``param_groups``)."""

    def __init__(self) -> None:
        self.param_groups: list[dict] = [{"params": []}]
        self._ids: set[int] = set()

    def add(self, params: list) -> None:
        for p in params:
            if id(p) not in self._ids:
                self._ids.add(id(p))
                self.param_groups[0]["params"].append(p)


def held(groups: Sequence[Group]) -> list:
    """Every parameter the groups' holders hold, as listed."""
    return [p for _strategy, holder in groups for group in holder.param_groups
            for p in group["params"]]


def param_groups(groups: Sequence[Group], run: RunContext) -> list[tuple[Any, list]]:
    """Each strategy's parameters (a parameter in two optimizers counts for the first)."""
    seen: set[int] = set()
    out = []
    for strategy, holder in groups:
        params = []
        for p in strategy_params(holder, run):
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        out.append((strategy, params))
    return out


def strategy_params(holder: Any, run: RunContext) -> list:
    """The holder's parameters that take gradients and that no DDP wrapper averages (a lazy
    one joins once its module's first forward gave it values)."""
    return [p for group in holder.param_groups for p in group["params"]
            if p.requires_grad and not framework_synced(run, p) and not is_lazy(p)]


def bucket_per_call(groups: Sequence[Group]) -> bool:
    """Whether every strategy takes its buckets one by one (``buckets_independent``)."""
    return all(getattr(s, "buckets_independent", False) for s, _ in groups)


def skips_untouched(groups: Sequence[Group], overlap: bool) -> bool:
    """Whether a pass leaves out the buckets no rank gave anything new: their ``.grad`` holds
    the last average on every rank, and a mean of equal values changes nothing.  A loop that
    trains models one after another keeps the earlier ones' parameters in the layout; averaging
    them again at every pass cost about 1.5 ms a step per earlier 100-parameter model
    (measured).  Only where every group averages with the built-in mean (a user strategy may
    keep state per call), and not with ``--overlap`` (full buckets go out during the pass,
    before the ranks can agree on the rest).  The same answer on every rank, a finished one's
    shadow included."""
    from ._strategies import AllreduceSync

    mean = AllreduceSync.average_gradients
    return not overlap and all(type(s).average_gradients is mean for s, _ in groups)
