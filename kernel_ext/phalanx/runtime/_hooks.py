"""Zero-change mode: the sync strategy is applied around the user's own optimizer steps.

While a cell runs, phalanx

* wraps ``torch.optim.Optimizer.__init__`` so every new optimizer's parameters are broadcast from
  rank 0 *before* the first forward pass (every rank then computes gradients on the same model);
* registers torch's global optimizer step pre/post hooks: before ``step()`` the strategy may
  average gradients, after it the strategy may average parameters, and the step is counted;
* patches ``partial_fit`` of scikit-learn estimators the cell received, so incremental learners
  get parameter averaging through the same strategies.

Everything is undone when the cell ends.  ``wrap(model)`` gives the full-speed path: a
DistributedDataParallel model (bucketing, overlap of communication with backward) with a comm hook
chosen by the strategy.
"""

from __future__ import annotations

from typing import Any, Callable

from ._state import RunContext, current_run


def _make_strategy(run: RunContext) -> Any:
    from ._sync import make_strategy

    return make_strategy(run.strategy_spec, run.collectives, run.every, run.alpha)


def _optimizer_params(optimizer: Any) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


class StepHooks:
    """Install and remove the torch hooks for one run."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self._handles: list = []
        self._orig_init: Callable | None = None
        self._primary: int | None = None
        # On one rank these strategies change nothing: skip them so a one-worker run costs what
        # a plain loop costs (EASGD is not the identity on one rank: its centre still pulls).
        self._identity = run.world_size == 1 and run.strategy_spec in ("allreduce", "localsgd", "none")

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self._handles = [register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step)]
        orig = self._orig_init = torch.optim.Optimizer.__init__
        hooks = self

        def init_and_sync(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            orig(optimizer, *args, **kwargs)
            if type(optimizer).__init__ is not init_and_sync:
                hooks.attach(optimizer)

        torch.optim.Optimizer.__init__ = init_and_sync  # type: ignore[method-assign]

    def remove(self) -> None:
        import torch

        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._orig_init is not None:
            torch.optim.Optimizer.__init__ = self._orig_init  # type: ignore[method-assign]
            self._orig_init = None

    def attach(self, optimizer: Any) -> None:
        """Start syncing ``optimizer``: broadcast its parameters from rank 0 now."""
        key = id(optimizer)
        if key in self.run.strategies:
            return
        strategy = _make_strategy(self.run)
        params = _optimizer_params(optimizer)
        strategy.start(params)
        self.run.strategies[key] = strategy
        self.run.tracked.append((strategy, lambda o=optimizer: _optimizer_params(o)))
        if self._primary is None:
            self._primary = key

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if id(optimizer) not in self.run.strategies:
            self.attach(optimizer)  # created before the cell started (shipped from the notebook)
        if self._identity:
            return
        strategy = self.run.strategies[id(optimizer)]
        params = _optimizer_params(optimizer)
        if strategy.averages_gradients and self.run.ddp_param_ids:
            params = [p for p in params if id(p) not in self.run.ddp_param_ids]  # DDP did it
            if not params:
                return
        strategy.before_step(params, self.run.steps)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._identity:
            strategy = self.run.strategies[id(optimizer)]
            # Strategies take the 0-based index of the step just taken (as before_step saw it).
            strategy.after_step(_optimizer_params(optimizer), self.run.steps)
        if id(optimizer) == self._primary:
            self.run.steps += 1
            if self.run.metrics is not None:
                self.run.metrics.set_step(self.run.steps)


# --- scikit-learn incremental learners --------------------------------------------------------

def _sklearn_params(estimator: Any) -> list:
    return [getattr(estimator, name) for name in ("coef_", "intercept_")
            if getattr(estimator, name, None) is not None]


def is_incremental_estimator(obj: Any) -> bool:
    return hasattr(obj, "partial_fit") and hasattr(obj, "get_params") and not isinstance(obj, type)


def patch_partial_fit(estimator: Any, run: RunContext) -> Any:
    """Make ``estimator.partial_fit`` average ``coef_``/``intercept_`` through the strategy."""
    if "partial_fit" in vars(estimator):
        return estimator
    original = estimator.partial_fit
    strategy = _make_strategy(run)

    def partial_fit(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        for name in ("coef_", "intercept_"):  # averaging happens in place: need own buffers
            value = getattr(estimator, name, None)
            if value is not None and not value.flags.c_contiguous:
                setattr(estimator, name, value.copy(order="C"))
        strategy.after_step(_sklearn_params(estimator), run.steps)  # 0-based, like torch's
        run.steps += 1
        if run.metrics is not None:
            run.metrics.set_step(run.steps)
        return result

    estimator.partial_fit = partial_fit
    run.tracked.append((strategy, lambda e=estimator: _sklearn_params(e)))
    run.extra_cleanup.append(lambda e=estimator: vars(e).pop("partial_fit", None))
    return estimator


# --- DDP -------------------------------------------------------------------------------------

def _noop_hook(state: Any, bucket: Any) -> Any:
    """A DDP comm hook that keeps local gradients: for strategies that average parameters."""
    import torch

    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def wrap(obj: Any) -> Any:
    """Full-speed data parallelism for ``obj`` under the cell's sync strategy.

    A torch module becomes a DistributedDataParallel module (gradients averaged in buckets that
    overlap the backward pass); with a parameter-averaging strategy (localsgd, easgd, none) DDP
    keeps local gradients and the strategy averages parameters after ``step()``.  A scikit-learn
    estimator with ``partial_fit`` gets parameter averaging.

    Example (inside ``%%distributed_fit``)::

        model = wrap(MLP().to(device))
    """
    run = current_run()
    if is_incremental_estimator(obj):
        return patch_partial_fit(obj, run)
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(obj, torch.nn.Module):
        raise TypeError(f"wrap() takes a torch.nn.Module or a scikit-learn estimator with "
                        f"partial_fit, got {type(obj).__name__}")
    if isinstance(obj, DistributedDataParallel):
        return obj
    on_cuda = any(p.is_cuda for p in obj.parameters())
    ddp = DistributedDataParallel(obj, device_ids=[torch.cuda.current_device()] if on_cuda else None)
    strategy = _make_strategy(run)
    if not strategy.averages_gradients:
        ddp.register_comm_hook(None, _noop_hook)
    run.ddp_param_ids.update(id(p) for p in obj.parameters())
    return ddp
