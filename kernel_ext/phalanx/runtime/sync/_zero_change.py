"""Zero-change mode: the sync strategy is applied around the user's own loop.

While a cell runs, phalanx

* wraps ``torch.optim.Optimizer.__init__`` so every new optimizer's parameters are broadcast from
  rank 0 *before* the first forward pass (every rank then computes gradients on the same model);
  optimizers that reached the cell already built are attached when the cell starts;
* averages gradients when each ``backward()`` completes (:mod:`._grad_sync`), for strategies that
  act on gradients, so clipping, GradScaler and logging see single-process gradients;
* registers torch's global optimizer step pre/post hooks: after ``step()`` the strategy may
  average parameters, and the step is counted;
* makes ``partial_fit`` of scikit-learn estimators (received or built by the cell) merge across
  ranks: exactly for count-based estimators, through the same strategies for gradient-trained
  ones, with a warning for the rest (:mod:`phalanx.runtime.adapters.sklearn`).

Ranks that run out of data early keep answering the others (:mod:`._join`).  Everything is undone
when the cell ends.  ``wrap(model)`` gives DistributedDataParallel itself, with a comm hook
chosen by the strategy.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Iterator

from ._agreement import check_every_steps
from ._join import KIND_CHECK, KIND_GRADIENTS
from ...wire._lazy_params import is_lazy
from ..adapters import wrap_estimator
from ..run._engine_state import RunContext, current_run, engine_state
from ._param_snapshot import ParamSnapshot
from ._step_count import StepCount
from ._strategies import run_strategy
from ._training_watch import TrainingWatch, framework_synced, is_dtensor

if TYPE_CHECKING:
    import torch

    from ._strategies import SyncStrategy


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list:
    """What the strategy syncs: the optimizer's parameters but DTensors (FSDP2 keeps its
    shards in step itself; their local pieces differ from rank to rank by design) and lazy ones
    (no values before their module's first forward, which syncs them: ``_lazy_params``)."""
    return [p for group in optimizer.param_groups for p in group["params"]
            if not is_dtensor(p) and not is_lazy(p)]


class StepHooks:
    """Install and remove the torch hooks for one run."""

    def __init__(self, run: RunContext) -> None:
        from ._grad_sync import GradientSync

        self.run = run
        self._handles: list = []
        self.live = False  # between install and remove
        self._count = StepCount()  # which optimizer's steps are the run's
        assert run.join is not None   # set as the run starts
        self.grads = run.grad_sync = GradientSync(run, run.join)
        # The hooks run at every optimizer step: what they need is looked up once, here and at
        # attach (measured: 8 us a step of hook time on one rank before, a step of the
        # benchmarks' small MLP being about 0.9 ms).
        self._clock = getattr(run.metrics, "clock", None)
        self._skip: set[int] = set()  # optimizers whose strategy does nothing here
        # id(optimizer) -> its parameters, from a step's pre-hook to its post-hook (listed once
        # a step: the list is a measurable part of a short step's hook time); None where a
        # framework keeps them in step
        self._stepping: dict[int, list | None] = {}
        # id(optimizer) -> its parameters as held and as synced, listed again when they change
        self._listed: dict[int, tuple[ParamSnapshot, list]] = {}
        # id(optimizer) -> (the shape it was judged at, whether a framework owns all it holds)
        self._owned: dict[int, tuple[tuple[int, list[int]], bool]] = {}
        # What trains, found as the cell runs (not only what optimizers hold): see
        # _training_watch.  Strategies that keep ranks apart on purpose get no syncing.
        kind = run_strategy(run)
        run.agreement = kind.agreement
        # steps between the guard's checks, where it checks during the run (0: it does not);
        # asked of the step count here rather than by a call at every step
        self._check_every = run.train.check_every \
            if kind.agreement == "always" and run.world_size > 1 else 0
        self.watch = run.watch = None if kind.agreement == "never" else \
            TrainingWatch(run, self.grads.adopt, kind.averages_gradients, self.grads.averages)

    def _skipped(self, strategy: SyncStrategy) -> bool:
        """On one rank a strategy that says it is the identity there costs nothing."""
        return self.run.world_size == 1 and bool(strategy.identity_on_one_rank)

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self._handles = [register_optimizer_step_pre_hook(self._before_step),
                         register_optimizer_step_post_hook(self._after_step)]
        # each handle also its own line in the ledger (removing one twice is harmless): one
        # undo that fails, this object's remove() or a handle's, leaves no hook behind
        for handle, what in zip(self._handles, ("pre", "post")):
            self.run.patches.on_undo(handle.remove, f"torch's optimizer step {what}-hook")
        hooks = self
        self.live = True

        def init_and_sync(optimizer: torch.optim.Optimizer, *args: object, **kwargs: object
                          ) -> None:
            orig(optimizer, *args, **kwargs)
            # only while the run is on: a patch that outlived its run attaches nothing
            if hooks.live and type(optimizer).__init__ is not init_and_sync:
                hooks.attach(optimizer)

        orig = self.run.patches.set(torch.optim.Optimizer, "__init__", init_and_sync,
                                    "torch.optim.Optimizer.__init__ (optimizers join the run)")
        if self.watch is not None:
            self.watch.install()

    def remove(self) -> None:
        self.live = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stepping.clear()
        self._listed.clear()
        self._owned.clear()
        if self.watch is not None:
            self.watch.remove()
        self.grads.remove()  # Optimizer.__init__ is the run's ledger's to put back

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Start syncing ``optimizer``: broadcast its parameters from rank 0 now."""
        key = id(optimizer)
        if key in self.run.strategies:
            return
        strategy = run_strategy(self.run)
        params = _optimizer_params(optimizer)
        strategy.start(params)
        if self.watch is not None:
            self.watch.mark_synced(params)  # broadcast by start: no need at their first forward
        self.run.strategies[key] = strategy
        self.run.tracked.append((strategy, functools.partial(_optimizer_params, optimizer)))
        if self._skipped(strategy):
            self._skip.add(key)
        elif strategy.averages_gradients:
            self.grads.track(optimizer, strategy)
        if self._count.counting is None and self._clock is not None:
            self._clock.begin()  # the first step's time starts once there is an optimizer
        self._count.attached(key)

    def _before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self._clock is not None:
            self._clock.mark("optimizer_s")
        if self.run.interrupts is not None:  # Stop lands after the update, not inside it
            self.run.interrupts.defer()
        key = id(optimizer)
        if key not in self.run.strategies:
            self.attach(optimizer)  # created outside the hooks' reach
        if key in self._skip:
            return
        self.grads.check_closed()
        if self._framework_owned(key, optimizer):
            self._stepping[key] = None  # the post-hook's verdict too: nothing to do this step
            return
        self.grads.refresh_if_changed()  # add_param_group, requires_grad switched on
        params = self._stepping[key] = self._synced_params(key, optimizer)  # the post-hook's too
        self.run.strategies[key].before_step(params, self.run.steps)

    def _synced_params(self, key: int, optimizer: torch.optim.Optimizer) -> list:
        """``_optimizer_params(optimizer)``, listed again only when the optimizer's parameters
        changed (:mod:`._param_snapshot`); a copy each step, the strategy's to keep."""
        held = [p for group in optimizer.param_groups for p in group["params"]]
        listed = self._listed.get(key)
        if listed is None or not listed[0].holds(held):
            # what _optimizer_params leaves out (DTensors, lazy ones) shows in their class
            listed = self._listed[key] = (ParamSnapshot(held, requires_grad=False),
                                          _optimizer_params(optimizer))
        return list(listed[1])

    def _framework_owned(self, key: int, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a framework keeps every parameter of ``optimizer`` in step (a DDP model's,
        FSDP2's DTensors: a Hugging Face ``Trainer``, ``accelerator.prepare``, Lightning), so an
        averaging strategy has nothing to do at its steps.  Looked at again whenever its groups
        or the framework's parameters change; the step hooks' work on such an optimizer was
        about 5% of an accelerate loop's 3 ms step (measured, same engines with and without a
        run around the loop)."""
        shape = (len(self.run.ddp_param_ids), [len(g["params"]) for g in optimizer.param_groups])
        known = self._owned.get(key)
        if known is not None and known[0] == shape:
            return known[1]
        owned = self.run.strategies[key].averages_gradients and all(
            framework_synced(self.run, p) for p in _optimizer_params(optimizer))
        self._owned[key] = (shape, owned)
        self.grads.refresh()  # the framework's parameters changed: hooks follow
        return owned

    def _after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        run, key = self.run, id(optimizer)
        if run.interrupts is not None and run.interrupts.resume():
            # Stopped during the update: the parameters are a step further, and so is the count
            if key == self._count.counting:
                run.steps += 1
            raise KeyboardInterrupt
        # What the pre-hook found: the parameters the strategy syncs, or None where a framework
        # keeps them in step (asked again only where the pre-hook did not run to its end)
        if key in self._skip:
            params = None
        elif key in self._stepping:
            params = self._stepping.pop(key)
        else:
            params = None if self._framework_owned(key, optimizer) else _optimizer_params(optimizer)
        if params is not None:
            strategy = run.strategies[key]
            # Strategies take the 0-based index of the step just taken (as before_step saw it).
            if strategy.after_step_communicates(params, run.steps):
                assert run.join is not None   # set as the run starts
                run.join.round(after_step_kind(run, strategy), run.steps, run.steps)
            strategy.after_step(params, run.steps)
        if self._count.stepped(key):
            self.grads.step_ended()
            run.steps += 1
            if run.metrics is not None:
                run.metrics.set_step(run.steps)
            if self._clock is not None:
                self._clock.step_end()
            if self._check_every and not run.steps % self._check_every:
                check_every_steps(run)
        elif self._clock is not None:
            self._clock.mark("other_s")


def after_step_kind(run: RunContext, strategy: SyncStrategy) -> int:
    """The control-round kind announcing ``strategy``'s after_step (see :mod:`._join`)."""
    index = next(i for i, (s, _) in enumerate(run.tracked) if s is strategy)
    return KIND_GRADIENTS + 1 + index


def attach_existing_optimizers(hooks: StepHooks, namespace: dict) -> None:
    """Optimizers built in the notebook and shipped with the cell, by name or one level into a
    list, tuple or dict (``optimizers = [SGD(net.parameters()) for net in nets]``): attach
    before the first backward pass, so their gradients are averaged from the first step on
    (same order on every rank: the namespace is built from the same names)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return
    for value in list(namespace.values()):
        for item in _one_level_in(value):
            if isinstance(item, torch.optim.Optimizer):
                hooks.attach(item)


def _one_level_in(value: object, most: int = 1000) -> list:
    """``value``, then the first ``most`` items a list, tuple or dict holds directly (a list of
    a million numbers is data, not a holder of optimizers)."""
    import itertools

    if isinstance(value, dict):
        return [value, *itertools.islice(value.values(), most)]
    if isinstance(value, (list, tuple)):
        return [value, *value[:most]]
    return [value]


def finish_uneven(run: RunContext) -> None:
    """The cell body returned: answer the ranks still training until every rank is done, then
    give every rank the parameters of the rank that ran the most steps."""
    if run.world_size == 1 or run.join is None:
        return

    def shadow(kind: int, step: int) -> None:
        if kind == KIND_CHECK:
            return  # the training ranks skip the check while some ranks have finished
        if kind == KIND_GRADIENTS:
            assert run.grad_sync is not None   # gradients are averaged, so there are hooks
            run.grad_sync.shadow()
        else:
            strategy, params_fn = run.tracked[kind - KIND_GRADIENTS - 1]
            strategy.after_step(params_fn(), step)

    info = run.join.serve(run.progress, shadow)
    if len(set(info.steps)) > 1:
        from ._agreement import trained_values
        from ._strategies import param_values

        src = info.steps.index(max(info.steps))
        assert run.collectives is not None   # set as the run starts
        run.collectives.broadcast(param_values(trained_values(run)), src=src)


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Backward passes inside skip the gradient averaging of ``model``'s parameters: gradients
    accumulate locally and the next backward pass outside averages the sum (DDP's ``no_sync``).

    Outside ``%%distributed_fit`` it does nothing, so the same loop runs in one process.

    Example (gradient accumulation over 4 micro-batches)::

        for i, (xb, yb) in enumerate(batches):
            ctx = no_sync(model) if (i + 1) % 4 else contextlib.nullcontext()
            with ctx:
                (loss_fn(model(xb), yb) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step(); opt.zero_grad()
    """
    if hasattr(model, "no_sync") and hasattr(model, "module"):  # a wrap()ped (DDP) model
        with model.no_sync():
            yield
        return
    run = engine_state().run
    if run is None or run.grad_sync is None:
        yield
        return
    with run.grad_sync.suppressed(list(model.parameters())):
        yield


# --- DDP -------------------------------------------------------------------------------------

# DDP refuses a comm hook whose ``bucket`` or return annotation is anything but GradBucket and
# Future[Tensor] (as strings under ``from __future__ import annotations``): the hooks have none.
def _noop_hook(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook that keeps local gradients: for strategies that average parameters."""
    import torch

    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _strategy_hook(strategy, bucket):  # type: ignore[no-untyped-def]
    """A DDP comm hook handing each bucket to a user strategy's ``average_gradients``."""
    import torch

    strategy.average_gradients([bucket.buffer()], current_run().steps)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def wrap(obj: Any, shard: bool = False, **shard_options: Any) -> Any:
    """Full-speed data parallelism for ``obj`` under the cell's sync strategy.

    ``shard=True`` shards a torch module across the ranks instead (FSDP2's ``fully_shard`` per
    block, then the whole model; options ``reshard_after_forward``, ``mp_policy`` - a
    ``MixedPrecisionPolicy`` or a dtype such as ``torch.bfloat16`` - and ``offload=True`` for
    CPU offload): each rank holds a part of every parameter, for models larger than one device.
    Build the optimizer after it (FSDP2 replaces the parameters).  See :mod:`._sharded`.

    A torch module becomes a DistributedDataParallel module (gradients averaged in buckets that
    overlap the backward pass); with a parameter-averaging strategy (localsgd, easgd, none) DDP
    keeps local gradients and the strategy averages parameters after ``step()``; a user strategy
    that overrides ``average_gradients`` gets each DDP bucket there.  A scikit-learn
    estimator with ``partial_fit`` gets parameter averaging.

    Example (inside ``%%distributed_fit``)::

        model = wrap(MLP().to(device))
    """
    run = current_run()
    if shard:
        from ._sharded import shard_model

        return shard_model(obj, run.device, **shard_options)
    estimator = wrap_estimator(obj, run)
    if estimator is not None:
        return estimator
    import torch
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(obj, torch.nn.Module):
        raise TypeError(f"wrap() takes a torch.nn.Module or a scikit-learn estimator with "
                        f"partial_fit, got {type(obj).__name__}")
    if isinstance(obj, DistributedDataParallel):
        return obj
    on_cuda = any(p.is_cuda for p in obj.parameters())
    ddp = DistributedDataParallel(obj, device_ids=[torch.cuda.current_device()] if on_cuda else None)
    from ._strategies import AllreduceSync

    strategy = run_strategy(run)
    if not strategy.averages_gradients:
        ddp.register_comm_hook(None, _noop_hook)
    elif type(strategy).average_gradients is not AllreduceSync.average_gradients:
        ddp.register_comm_hook(strategy, _strategy_hook)
    run.ddp_param_ids.update(id(p) for p in obj.parameters())
    return ddp
