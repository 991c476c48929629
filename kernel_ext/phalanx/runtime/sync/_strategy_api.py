"""Sync strategies: *when* and *how* data-parallel ranks agree (Platoon's split).

The runtime calls the hooks around the user's own loop::

    strategy.start(params)                  # once: every rank starts from rank 0's parameters
    for step, batch in enumerate(...):      # the user's loop
        loss.backward()                     # when it returns: strategy.average_gradients(buckets, step)
        strategy.before_step(params, step)  # just before opt.step()
        opt.step()
        strategy.after_step(params, step)   # parameter averaging / elastic updates
    strategy.finish(params)                 # ranks agree on the final model where one is implied

Gradients are averaged by the time ``backward()`` returns (DistributedDataParallel's contract),
so whatever the loop does between backward and step (clipping, ``GradScaler.unscale_``, logging)
sees the gradients one process would see with the full batch.

``step`` is the 0-based index of the optimizer step, the same for both hooks of one step;
``should_sync(step)`` is true every ``every``-th step (steps ``every-1``, ``2*every-1``, ...).
``params`` is a list of torch parameters (their ``.data`` and ``.grad`` are used) and/or numpy
arrays such as scikit-learn's ``coef_`` and ``intercept_``.  Items without gradients (numpy
arrays, tensors that do not require grad) are synchronised by averaging their values where a
strategy would average gradients.  The list must have the same structure on every rank and from
call to call.

The built-in strategies, the --sync registry and a worked example are in :mod:`._strategies`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Sequence, TypeAlias, TypeGuard

from ..transport._comm import Communicator

if TYPE_CHECKING:
    import numpy as np
    import torch


# A parameter (or a gradient, or a strategy's buffer): a torch tensor or a numpy array.
Param: TypeAlias = "torch.Tensor | np.ndarray"


class SyncStrategy:
    """Base class: no synchronisation except the initial broadcast; subclass and override hooks.

    Hooks, in the order the runtime calls them (every rank calls the same hooks in the same order,
    so a hook may communicate through ``self.comm``):

    - ``start(params)``: once per optimizer, when it is created (default: broadcast from rank 0);
    - ``average_gradients(grads, step)``: once per backward pass, when ``loss.backward()``
      completes and before it returns (not inside ``phalanx.no_sync(model)``).  ``grads`` are
      flat gradient buckets (one dtype each, about 25 MB) holding every gradient of the
      optimizer's parameters (zeros where a parameter got none on this rank); reduce them *in
      place*.  The runtime copies them back into ``.grad``.  Only strategies that override it
      get gradient hooks; while ranks that ran out of data have joined (uneven inputs) they
      contribute zeros and the runtime rescales the result to the ranks still training;
    - ``before_step(params, step)``: just before ``optimizer.step()``;
    - ``after_step(params, step)``: just after it (parameter averaging, elastic updates);
    - ``finish(params)``: once, after the cell's last line.

    ``step`` is the 0-based index of the optimizer step being taken (micro-steps of gradient
    accumulation share it).  Class attributes: ``name`` (for messages),
    ``identity_on_one_rank`` - set it to True when every hook changes nothing with a single
    rank, so a one-worker run skips the hooks and costs what a plain loop costs - and
    ``buckets_independent`` - set it to True when ``average_gradients`` treats each bucket on
    its own (as an allreduce does): the runtime then hands it each bucket as soon as the backward
    pass has filled it, from a communication thread, so the averaging overlaps the rest of the
    pass (one call per bucket, in the same order on every rank).

    Example::

        class EveryOther(SyncStrategy):
            "Average gradients on even steps only; parameters on odd ones."
            name = "every-other"
            identity_on_one_rank = True

            def average_gradients(self, grads, step):
                if step % 2 == 0:
                    self.comm.allreduce(grads, op="mean")

            def after_step(self, params, step):
                if step % 2:
                    self.comm.allreduce(param_values(params), op="mean")
    """

    name = "base"
    #: When the ranks' parameters must be identical (phalanx checks it, see ``_agreement``):
    #: ``"always"`` (after every step: checked every ``--check-every`` steps and at the end),
    #: ``"at_end"`` (after ``finish``: checked at the end of the run) or ``"never"`` (the ranks
    #: stay apart on purpose: not checked).
    agreement = "at_end"
    #: True when every hook is the identity with one rank: a one-rank run may skip them.
    identity_on_one_rank = False
    #: True when ``average_gradients`` may get one bucket per call, from another thread, while
    #: the backward pass still runs (see the class docstring).
    buckets_independent = False

    @property
    def averages_gradients(self) -> bool:
        """Whether the strategy acts on gradients (overrides :meth:`average_gradients`)."""
        return type(self).average_gradients is not SyncStrategy.average_gradients

    def __init__(self, comm: Communicator, every: int = 1, alpha: float = 0.5) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        if not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.comm, self.every, self.alpha = comm, every, float(alpha)

    def should_sync(self, step: int) -> bool:
        """Whether ``step`` (0-based) is a synchronisation step."""
        return (step + 1) % self.every == 0

    def start(self, params: Sequence[Param]) -> None:
        """Give every rank rank 0's parameters."""
        self.comm.broadcast(param_values(params), src=0)

    def average_gradients(self, grads: list[Param], step: int) -> None:
        """Called when a backward pass completes with the gradient buckets; reduce in place.

        Example::

            def average_gradients(self, grads, step):
                self.comm.allreduce(grads, op="mean")
        """

    def before_step(self, params: Sequence[Param], step: int) -> None:
        """Called just before ``optimizer.step()`` (gradients are already averaged)."""

    def after_step(self, params: Sequence[Param], step: int) -> None:
        """Called after ``optimizer.step()``."""

    def after_step_communicates(self, params: Sequence[Param], step: int) -> bool:
        """Whether :meth:`after_step` may communicate at ``step``: must be the same on every
        rank.  The runtime keeps ranks that ran out of data answering only those steps.

        Example::

            def after_step_communicates(self, params, step):
                return self.should_sync(step)
        """
        return type(self).after_step is not SyncStrategy.after_step

    def finish(self, params: Sequence[Param]) -> None:
        """Called once after the last step."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(every={self.every}, alpha={self.alpha})"


# -- parameter access: torch parameters and numpy arrays ------------------------------------------


def _is_tensor(x: object) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def param_values(params: Sequence[Param]) -> list[Param]:
    """The arrays holding the parameter values (``.data`` of tensors, numpy arrays as they are),
    ready to be reduced in place by a communicator; for user strategies.

    Example::

        >>> import numpy as np
        >>> param_values([np.zeros(2)])[0].tolist()
        [0.0, 0.0]
    """
    return [p.detach() if _is_tensor(p) else p for p in params]


def param_grads(params: Sequence[Param]) -> list[Param]:
    """Gradients of the tensors that require grad; a missing one becomes zeros so that every
    rank contributes the same list (as DDP does for unused parameters).  Numpy arrays have none.

    Example::

        comm.allreduce(param_grads(model.parameters()), op="mean")
    """
    torch = sys.modules.get("torch")
    if torch is None:  # no tensor exists, and numpy arrays have no gradients
        return []
    out = []
    for p in params:
        if isinstance(p, torch.Tensor) and p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            out.append(p.grad)
    return out
