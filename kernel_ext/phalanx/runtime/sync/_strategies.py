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

Example::

    >>> import numpy as np, threading
    >>> from phalanx.runtime.transport._comm import make_thread_communicators
    >>> comms = make_thread_communicators(2)
    >>> ws = [np.array([float(c.rank)]) for c in comms]
    >>> def run(c, w):
    ...     s = make_strategy("localsgd", c, every=1)
    ...     s.after_step([w], step=0)
    >>> ts = [threading.Thread(target=run, args=cw) for cw in zip(comms, ws)]
    >>> for t in ts: t.start()
    >>> for t in ts: t.join()
    >>> ws[0].tolist(), ws[1].tolist()
    ([0.5], [0.5])
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, Sequence, TypeAlias, TypeGuard

import numpy as np

from ..transport._comm import Communicator

if TYPE_CHECKING:
    import torch


# A parameter (or a gradient, or a strategy's buffer): a torch tensor or a numpy array.
Param: TypeAlias = "torch.Tensor | np.ndarray"

__all__ = ["SyncStrategy", "AllreduceSync", "LocalSGD", "EASGD", "NoSync", "make_strategy",
           "STRATEGIES", "param_values", "param_grads"]


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


class AllreduceSync(SyncStrategy):
    """Gradients averaged every step (``every`` is ignored), like DistributedDataParallel.

    Items without gradients are averaged after every step instead.
    """

    name = "allreduce"
    agreement = "always"
    identity_on_one_rank = True
    buckets_independent = True  # a mean per bucket: averaged as the backward pass fills them

    def average_gradients(self, grads: list[Param], step: int) -> None:
        if grads:
            self.comm.allreduce(grads, op="mean")

    def after_step(self, params: Sequence[Param], step: int) -> None:
        plain = _without_grads(params)
        if plain:
            self.comm.allreduce(plain, op="mean")

    def after_step_communicates(self, params: Sequence[Param], step: int) -> bool:
        return bool(_without_grads(params))


class LocalSGD(SyncStrategy):
    """``every`` local steps, then parameters averaged (post-local SGD, Lin et al. 2020)."""

    name = "localsgd"
    identity_on_one_rank = True

    def __init__(self, comm: Communicator, every: int = 1, alpha: float = 0.5) -> None:
        super().__init__(comm, every, alpha)
        self._dirty = False

    def after_step(self, params: Sequence[Param], step: int) -> None:
        if self.should_sync(step):
            self.comm.allreduce(param_values(params), op="mean")
            self._dirty = False
        else:
            self._dirty = True

    def finish(self, params: Sequence[Param]) -> None:
        """Average once more if local steps happened since the last average."""
        if self._dirty:
            self.comm.allreduce(param_values(params), op="mean")
            self._dirty = False


class EASGD(SyncStrategy):
    """Synchronous elastic averaging SGD (Zhang, Choromanska, LeCun 2015).

    Every ``every`` steps each worker moves ``alpha * (x_i - centre)`` toward the centre and the
    centre moves by the sum of those moves.  Every rank keeps an identical replica of the centre
    (same start, same allreduced update).  The centre's rate is ``beta = world_size * alpha``;
    the paper uses ``beta`` around 0.9, and ``beta > 1`` overshoots.  ``finish`` sets every rank's
    parameters to the centre.
    """

    name = "easgd"
    identity_on_one_rank = False  # the centre still pulls the one worker

    def __init__(self, comm: Communicator, every: int = 1, alpha: float = 0.5) -> None:
        super().__init__(comm, every, alpha)
        self.centre: list[Param] | None = None
        self._moves: list[Param] | None = None

    def start(self, params: Sequence[Param]) -> None:
        super().start(params)
        values = param_values(params)
        self.centre = [_copy(v) for v in values]
        self._moves = [_copy(v) for v in values]

    def after_step(self, params: Sequence[Param], step: int) -> None:
        if not self.should_sync(step):
            return
        centre, moves = self._started(params)
        for x, c, d in zip(param_values(params), centre, moves):
            _elastic_move(x, c, d, self.alpha)  # d = alpha * (x - c); x -= d
        self.comm.allreduce(moves, op="sum")
        for c, d in zip(centre, moves):
            c += d

    def finish(self, params: Sequence[Param]) -> None:
        centre, _ = self._started(params)
        for x, c in zip(param_values(params), centre):
            x[...] = c

    def _started(self, params: Sequence[Param]) -> tuple[list[Param], list[Param]]:
        """The centre and the buffer of moves, which :meth:`start` makes, one per parameter."""
        if self.centre is None or self._moves is None:
            raise RuntimeError("EASGD.start(params) must run before the first step")
        if len(params) != len(self.centre):
            # the centre pairs with the parameters by position: a changed list would pull each
            # parameter toward another one's centre
            raise RuntimeError(
                f"EASGD started with {len(self.centre)} parameters and now steps {len(params)}: "
                "its centre cannot follow parameters added after the optimizer was built "
                "(add_param_group, or a lazy module's parameters, which get their shapes at its "
                "first forward). Build the optimizer after one forward pass of the model.")
        return self.centre, self._moves


class NoSync(SyncStrategy):
    """Independent ranks (ensembles, debugging): no communication at all, not even at start."""

    name = "none"
    agreement = "never"
    identity_on_one_rank = True

    def after_step_communicates(self, params: Sequence[Param], step: int) -> bool:
        return False

    def start(self, params: Sequence[Param]) -> None:
        pass


# phalanx's own, by --sync name (the kernel knows the names from _options.STRATEGIES, without
# importing these classes; tests/test_plugins.py holds the two lists together)
STRATEGIES: dict[str, type[SyncStrategy]] = {
    cls.name: cls for cls in (AllreduceSync, LocalSGD, EASGD, NoSync)}


def strategy_names() -> list[str]:
    """Every --sync name: phalanx's own, then those other packages installed (entry points of
    ``phalanx.strategies``)."""
    from ...wire import _plugins

    return [*STRATEGIES, *_plugins.installed(_plugins.STRATEGIES)]


def make_strategy(spec: str | type, comm: Communicator, **params: Any) -> SyncStrategy:
    """Build a strategy from a flag value: a known name or ``"pkg.mod.Class"`` of a subclass,
    given the run's strategy parameters (``--every``, ``--alpha``: one open mapping) as keyword
    arguments.

    Example::

        >>> from phalanx.runtime.transport._comm import make_thread_communicators
        >>> make_strategy("easgd", make_thread_communicators(1)[0], every=4, alpha=0.3)
        EASGD(every=4, alpha=0.3)
    """
    cls = spec if isinstance(spec, type) else _resolve(spec)
    if not (isinstance(cls, type) and issubclass(cls, SyncStrategy)):
        raise ValueError(f"sync strategy {spec!r} is not a phalanx SyncStrategy subclass")
    return cls(comm, **params)


def run_strategy(run: Any) -> SyncStrategy:
    """A new instance of a run's strategy, from its flags (one per optimizer, estimator or
    group of parameters trained without an optimizer)."""
    return make_strategy(run.strategy_spec, run.collectives, **run.train.sync_params)


def _resolve(spec: object) -> object:
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"sync strategy must be a name or a dotted class path, got {spec!r}")
    if spec in STRATEGIES:
        return STRATEGIES[spec]
    from ...wire import _plugins

    if spec in _plugins.installed(_plugins.STRATEGIES):  # another package's, by its name
        return _plugins.load(_plugins.STRATEGIES, spec, SyncStrategy, as_class=True)
    module_name, _, attr = spec.rpartition(".")
    if not module_name:
        raise ValueError(f"unknown sync strategy {spec!r}; expected one of "
                         f"{', '.join(strategy_names())} or a dotted name like "
                         "'pkg.mod.MyStrategy'")
    try:
        # import_module, not a sys.modules lookup: a module another thread is still importing
        # sits in sys.modules half-initialised; import_module waits for it
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"sync strategy {spec!r}: cannot import {module_name!r} ({exc})") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"sync strategy {spec!r}: module {module_name!r} has no "
                         f"{attr!r}") from None


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


def _without_grads(params: Sequence[Param]) -> list[Param]:
    return [p.detach() if _is_tensor(p) else p for p in params
            if not (_is_tensor(p) and p.requires_grad)]


def _copy(x: Param) -> Param:
    return x.clone() if _is_tensor(x) else np.array(x, copy=True)


def _elastic_move(x: Param, centre: Param, move: Param, alpha: float) -> None:
    """``move = alpha * (x - centre); x -= move`` in place, without temporaries."""
    if _is_tensor(x) and _is_tensor(move):   # the move is a copy of x: both tensors or neither
        move.copy_(x).sub_(centre).mul_(alpha)
        x.sub_(move)
    else:
        np.subtract(x, centre, out=move)
        move *= alpha
        x -= move
