"""Gradients averaged when ``backward()`` completes: DistributedDataParallel's contract, no wrapper.

Each tracked parameter gets a post-accumulate-grad hook; the first one that fires in a backward
pass queues a callback on torch's autograd engine, which runs once the whole pass is done and
before ``backward()`` returns.  The callback

1. runs the uneven-inputs control round (:mod:`._join`), which also tells every rank which
   parameters got a gradient on *some* rank in this pass;
2. copies every gradient (zeros where a parameter got none here) into flat buckets of one dtype
   and about 25 MB, and hands each strategy its buckets (``strategy.average_gradients``), so a
   model costs one collective per bucket, not one per parameter;
3. copies the averages back into ``.grad`` and leaves ``.grad`` at ``None`` where no rank
   produced a gradient (as one process would, so optimizers skip those parameters);
4. gives every rank rank 0's buffers (BatchNorm running statistics) of the modules that ran
   forward in training mode, as DDP does by default (DDP copies them before each forward; here
   they are copied after each backward, so rank 0's statistics - the ones ``--return`` brings
   back - are the same either way).

Whatever runs between ``backward()`` and ``step()`` - clipping, ``GradScaler.unscale_`` and its
inf check, logging - therefore sees the same gradients on every rank, the ones one process sees
with the full batch.  Gradient accumulation stays exact: ``.grad`` already holds the average of
earlier passes (the same on every rank), so averaging the sum again adds the new average.
:func:`no_sync` skips the communication of micro-steps, as DDP's ``no_sync`` does.

Example (inside ``%%distributed_fit``)::

    for i, (xb, yb) in enumerate(batches):
        with phalanx.no_sync(model) if i % 4 != 3 else contextlib.nullcontext():
            loss_fn(model(xb), yb).backward()   # averaged only every 4th pass
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ._join import KIND_GRADIENTS, JoinControl, RoundInfo

BUCKET_BYTES = 25 * 2**20


class GradientSync:
    """The gradient hooks of one run: which parameters, which strategy averages them."""

    def __init__(self, run: Any, join: JoinControl) -> None:
        self.run, self.join = run, join
        self._groups: list[tuple[Any, Any]] = []  # (strategy, optimizer), in attach order
        self._hooks: dict[int, Any] = {}           # id(param) -> hook handle
        self._suppressed: dict[int, int] = {}      # id(param) -> open no_sync contexts
        self._queued_for: int | None = None  # the autograd graph task our callback waits on
        self._modules: list = []                   # modules with buffers, in first-forward order
        self._module_ids: set[int] = set()
        join.param_count = lambda: len(self._layout_params())
        self._clock = getattr(run.metrics, "clock", None)  # a StepClock, where the run has one

    def track(self, optimizer: Any, strategy: Any) -> None:
        """Average ``optimizer``'s gradients through ``strategy`` at the end of each backward."""
        self._groups.append((strategy, optimizer))
        self.refresh()

    def refresh(self) -> None:
        """Hook parameters added since (``add_param_group``, ``requires_grad`` turned on)."""
        for p in self._layout_params():
            if id(p) not in self._hooks:
                self._hooks[id(p)] = p.register_post_accumulate_grad_hook(self._on_grad)

    def remove(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
        self._modules.clear()

    def on_forward(self, module: Any, args: Any) -> None:
        """Global forward pre-hook: remember training modules that hold buffers."""
        if not module._buffers or id(module) in self._module_ids or not module.training:
            return
        import torch

        if not torch.is_grad_enabled() or not self._groups:
            return
        if isinstance(module, torch.nn.SyncBatchNorm) and self.run.world_size > 1 and \
                args and getattr(args[0], "is_cpu", False):
            raise ValueError("SyncBatchNorm needs CUDA tensors in torch; on CPU keep plain "
                             "BatchNorm (phalanx gives every rank rank 0's running statistics, "
                             "as DDP does) or train on GPUs")
        if any(id(p) in self.run.ddp_param_ids for p in module.parameters(recurse=False)):
            return  # a wrap()ped model: DDP broadcasts its buffers itself
        self._module_ids.add(id(module))
        self._modules.append(module)

    @contextlib.contextmanager
    def suppressed(self, params: list) -> Iterator[None]:
        """Inside: backward passes over ``params`` accumulate locally (no communication)."""
        keys = [id(p) for p in params]
        for k in keys:
            self._suppressed[k] = self._suppressed.get(k, 0) + 1
        try:
            yield
        finally:
            for k in keys:
                self._suppressed[k] -= 1
                if not self._suppressed[k]:
                    del self._suppressed[k]

    # -- the backward pass -----------------------------------------------------------------------

    def _on_grad(self, param: Any) -> None:
        import torch
        from torch.autograd import Variable

        # Keyed by graph task, not a flag: a backward pass that raised never runs its callbacks.
        task = torch._C._current_graph_task_id()
        if self._queued_for == task or id(param) in self._suppressed:
            return
        self._queued_for = task
        if self._clock is not None:
            self._clock.mark("backward_s")  # the step clock: backward starts about now
        Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        try:
            self._average(shadow=False)
        finally:
            self._queued_for = None
            if self._clock is not None:
                self._clock.mark("other_s")  # between backward and the optimizer step

    def shadow(self) -> None:
        """A finished rank's part in another rank's gradient round: zeros, results dropped."""
        self._average(shadow=True)

    def _average(self, shadow: bool) -> None:
        run = self.run
        params = self._layout_params()
        had_grad = [p.grad is not None and id(p) not in self._suppressed for p in params]
        if shadow:
            info = None
        else:
            info = self.join.round(KIND_GRADIENTS, run.steps, run.steps, had_grad)
        scale = _join_scale(info, self.join.world_size)
        active = {id(p) for p in params if id(p) not in self._suppressed}
        for strategy, optimizer in self._groups:
            mine = [p for p in _strategy_params(optimizer, self.run) if id(p) in active]
            buckets = [_Bucket(b, zeros=shadow) for b in _bucketed(mine)]
            if buckets:
                strategy.average_gradients([b.flat for b in buckets], run.steps)
            if not shadow:
                for b in buckets:
                    b.write_back(scale)
        if info is not None:
            for p, used in zip(params, info.used):
                if not used and id(p) in active:
                    p.grad = None  # no rank produced one: keep it absent, as one process would
        buffers = [b for m in self._modules for b in m.buffers(recurse=False) if b is not None]
        if buffers and self.join.world_size > 1:
            self.run.collectives.broadcast(buffers, src=0)

    def _layout_params(self) -> list:
        """Every parameter whose gradient is synchronised, in the same order on every rank."""
        seen: set[int] = set()
        out = []
        for _strategy, optimizer in self._groups:
            for p in _strategy_params(optimizer, self.run):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out


def _strategy_params(optimizer: Any, run: Any) -> list:
    """The optimizer's parameters that take gradients and that no DDP wrapper averages."""
    return [p for group in optimizer.param_groups for p in group["params"]
            if p.requires_grad and id(p) not in run.ddp_param_ids]


def _join_scale(info: RoundInfo | None, world_size: int) -> float | None:
    """Joined ranks gave zeros: rescale a world-size mean to a mean over the training ranks."""
    if info is None or not info.uneven:
        return None
    return world_size / info.training


def _bucketed(params: list) -> list[list]:
    """Consecutive parameters of one (dtype, device), at most ``BUCKET_BYTES`` per bucket."""
    buckets: list[list] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = buckets[-1] if buckets else None
        if last is None or (last[0].dtype, last[0].device) != (p.dtype, p.device) \
                or size + nbytes > BUCKET_BYTES:
            buckets.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return buckets


class _Bucket:
    """Gradients of some parameters, flattened into one tensor and written back after."""

    def __init__(self, params: list, zeros: bool) -> None:
        import torch

        self.params = params
        first = params[0]
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=first.dtype,
                                device=first.device)
        if zeros:
            return
        at = 0
        for p in params:
            n = p.numel()
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise TypeError(f"sparse gradients (a parameter of shape {tuple(p.shape)}) are "
                                    "not averaged by zero-change mode: use wrap(model) (DDP)")
                self.flat[at:at + n].copy_(p.grad.reshape(-1))
            at += n

    def write_back(self, scale: float | None) -> None:
        if scale is not None:
            self.flat.mul_(scale)
        at = 0
        for p in self.params:
            n = p.numel()
            value = self.flat[at:at + n].view(p.shape)
            if p.grad is None:
                p.grad = value.clone()
            else:
                p.grad.copy_(value)
            at += n
