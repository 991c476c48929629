"""phalanx's own sync strategies (allreduce, localsgd, easgd, none) and the --sync registry
that finds them, other packages' (entry points) and dotted class paths.

The hooks every strategy has, and the helpers for writing one, are in :mod:`._strategy_api`.

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
from typing import Any, Sequence

import numpy as np

from ..transport._comm import Communicator
from ._strategy_api import Param, SyncStrategy, _is_tensor, param_grads, param_values

__all__ = ["SyncStrategy", "AllreduceSync", "LocalSGD", "EASGD", "NoSync", "make_strategy",
           "STRATEGIES", "param_values", "param_grads"]


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


def _without_grads(params: Sequence[Param]) -> list[Param]:
    """The items that take no gradient (arrays, tensors without requires_grad), detached.
    Asked twice at every step of an ``allreduce`` run: one attribute read per parameter (an
    array has no ``requires_grad``); two type checks each took 29 us a call for 100 (7 now)."""
    return [p.detach() if _is_tensor(p) else p for p in params
            if not getattr(p, "requires_grad", False)]


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
