"""Gradients averaged when ``backward()`` completes: DistributedDataParallel's contract, no wrapper.

Each tracked parameter gets a post-accumulate-grad hook.  In a backward pass:

1. the first hook that fires runs the uneven-inputs control round (:mod:`._join`: are all ranks
   still training, and about to average gradients?) and queues a callback on torch's autograd
   engine, which runs once the whole pass is done and before ``backward()`` returns;
2. each hook copies its parameter's gradient into its flat bucket (:mod:`._grad_buckets`: one
   dtype, about 25 MB, last layer first).  When a bucket is full it is handed to the gradient
   thread (:mod:`._overlap`), which averages it while the backward pass goes on computing the
   earlier layers, as DDP's reducer does (see below for when).  Buckets are handed over
   strictly in order, so every rank makes the same collectives in the same order even where
   their passes differ;
3. the callback waits for the handed-over buckets, averages the rest (the last bucket, and
   buckets holding a parameter that got no gradient in this pass) on the training thread, and
   agrees with the other ranks on which parameters got a gradient on *some* rank (one small
   allreduce);
4. it copies the averages back into ``.grad`` and leaves ``.grad`` at ``None`` where no rank
   produced a gradient (as one process would, so optimizers skip those parameters);
5. it gives every rank rank 0's buffers (BatchNorm running statistics) of the training modules
   that hold buffers (found in the first step, :mod:`._forward_watch`), as DDP does by default
   (DDP copies them before each forward; here they are copied after each backward, so rank 0's
   statistics - the ones ``--return`` brings back - are the same either way).

Whatever runs between ``backward()`` and ``step()`` - clipping, ``GradScaler.unscale_`` and its
inf check, logging - therefore sees the same gradients on every rank, the ones one process sees
with the full batch.  Gradient accumulation stays exact: ``.grad`` already holds the average of
earlier passes (the same on every rank), so averaging the sum again adds the new average.
:func:`no_sync` skips the communication of micro-steps, as DDP's ``no_sync`` does.

When buckets are handed over early (``--overlap``): only where the strategy averages each bucket
on its own (``SyncStrategy.buckets_independent``, true for ``allreduce``), only for CPU tensors
(on CUDA the gradient thread would need the stream ordering DDP's reducer keeps, so CUDA buckets
are averaged at the end of the pass; ``wrap()`` gives DDP's overlap there), and by default
(``auto``) only where the ranks span several hosts, so averaging waits on the network.  With
every rank on one host, averaging is memory copies on the same cores backward computes on:
overlapping them measured 0.94x and 1.00x the end-of-pass averaging on the 2-core machine (a
33 MB model, two runs of ``benchmarks/bench_throughput.py``), no gain for a thread's cost;
``--overlap on`` hands over there too.

Example (inside ``%%distributed_fit``)::

    for i, (xb, yb) in enumerate(batches):
        with phalanx.no_sync(model) if i % 4 != 3 else contextlib.nullcontext():
            loss_fn(model(xb), yb).backward()   # averaged only every 4th pass
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ._forward_watch import ForwardWatch
from ._grad_buckets import Bucket, BucketLayout
from ._grad_groups import (Adopted, bucket_per_call, held, param_groups,
                           skips_untouched)
from ._join import KIND_GRADIENTS, JoinControl, RoundInfo, mean_scale
from ._overlap import CommThread
from ._param_snapshot import ParamSnapshot

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

    from ..run._engine_state import RunContext
    from ._strategies import SyncStrategy


@dataclass
class _Pass:
    """One backward pass whose gradients are being averaged."""

    info: RoundInfo | None    # its control round
    layout: BucketLayout
    overlap: bool             # buckets may be handed to the gradient thread as they fill
    launched: int = 0         # buckets handed over so far (always a prefix of the layout)


class GradientSync:
    """The gradient hooks of one run: which parameters, which strategy averages them."""

    def __init__(self, run: RunContext, join: JoinControl) -> None:
        self.run, self.join = run, join
        # (strategy, optimizer), in attach order
        self._groups: list[tuple[SyncStrategy, torch.optim.Optimizer | Adopted]] = []
        self._adopted: Adopted | None = None      # parameters trained without an optimizer
        self._hooks: dict[int, RemovableHandle] = {}  # id(param) -> hook handle
        self._suppressed: dict[int, int] = {}      # id(param) -> open no_sync contexts
        self._unaveraged: set[int] = set()         # ids whose .grad grew under no_sync since
        self._layout: BucketLayout | None = None   # kept between passes
        self._layout_seen: ParamSnapshot | None = None  # the parameters it was laid out for
        self._pass: _Pass | None = None
        self._comm = CommThread()
        self._modules: list = []                   # modules with buffers, in first-forward order
        self._module_ids: set[int] = set()
        # finds them once there are gradients to average; one rank has no one to give them to
        self.forward_watch = ForwardWatch(self._on_forward) if run.world_size > 1 else None
        self._clock = getattr(run.metrics, "clock", None)  # a StepClock, where the run has one
        self._snapshot: ParamSnapshot | None = None  # what the last refresh() worked from

    def track(self, optimizer: torch.optim.Optimizer, strategy: SyncStrategy) -> None:
        """Average ``optimizer``'s gradients through ``strategy`` at the end of each backward."""
        self._groups.append((strategy, optimizer))
        self.refresh()

    def adopt(self, params: list) -> None:
        """Average ``params``' gradients too, whether or not an optimizer holds them (a
        hand-written update, a closure, another library's optimizer; see ``_training_watch``):
        they go to a group of the run's own strategy (an optimizer holding them later keeps
        them there)."""
        if self._adopted is None:
            from ._strategies import run_strategy

            self._adopted = Adopted()
            self._groups.append((run_strategy(self.run), self._adopted))
        self._adopted.add(params)
        self.refresh()

    def averages(self, param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient is averaged when a backward pass ends."""
        return id(param) in self._hooks

    def trained_params(self) -> list:
        """Every parameter whose gradients this run averages (for the agreement check)."""
        return [p for _strategy, params in param_groups(self._groups, self.run) for p in params]

    def synced_buffers(self) -> list:
        """The buffers every rank gets from rank 0 after each backward pass."""
        return [b for m in self._modules for b in m.buffers(recurse=False) if b is not None]

    def refresh(self) -> None:
        """Hook parameters added since (``add_param_group``, ``requires_grad`` turned on), and
        unhook those a framework took over since (an optimizer made before its model was
        wrapped in DDP, as ``accelerator.prepare`` does): a hook left on them is a Python call
        per parameter in every backward pass for nothing."""
        added = False
        current = set()
        for _strategy, params in param_groups(self._groups, self.run):
            for p in params:
                current.add(id(p))
                if id(p) not in self._hooks:
                    self._hooks[id(p)] = p.register_post_accumulate_grad_hook(self._on_grad)
                    added = True
        for key in [k for k in self._hooks if k not in current]:
            self._hooks.pop(key).remove()
        if added and self.forward_watch is not None:
            self.forward_watch.open()  # new parameters may come with new modules: look again
        self._snapshot = ParamSnapshot(held(self._groups), len(self.run.ddp_param_ids))

    def refresh_if_changed(self) -> None:
        """:meth:`refresh` where what it works from changed since the last one: which
        parameters the tracked optimizers hold, their requires_grad and class, the parameters
        DDP took over (every optimizer step asks; see :mod:`._param_snapshot`)."""
        if self._snapshot is None or not self._snapshot.holds(held(self._groups),
                                                              len(self.run.ddp_param_ids)):
            self.refresh()

    def step_ended(self) -> None:
        """An optimizer step ended: the modules that ran since the window opened are known
        (a window opened by ``add_param_group`` in this very step waits for the next)."""
        if self.forward_watch is not None and self.forward_watch.is_open:
            self.forward_watch.step_ended(self._namespace_modules)

    def _namespace_modules(self) -> list:
        import torch

        return [v for v in list(self.run.namespace.values()) if isinstance(v, torch.nn.Module)]

    def remove(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
        self._modules.clear()
        if self.forward_watch is not None:
            self.forward_watch.remove()
        self._comm.close()

    def _on_forward(self, module: torch.nn.Module, args: tuple[object, ...] | None) -> bool:
        """A module that holds buffers is about to run forward (``args`` None: it is in the
        trees of those that ran in the first step): remember it if it trains.  True once it is
        remembered, or is DDP's to look after (no need to watch it more)."""
        if id(module) in self._module_ids:
            return True
        if not module.training:
            return False
        import torch

        if (args is not None and not torch.is_grad_enabled()) or not self._groups:
            return False
        if isinstance(module, torch.nn.SyncBatchNorm) and self.run.world_size > 1 and \
                args and getattr(args[0], "is_cpu", False):
            raise ValueError("SyncBatchNorm needs CUDA tensors in torch; on CPU keep plain "
                             "BatchNorm (phalanx gives every rank rank 0's running statistics, "
                             "as DDP does) or train on GPUs")
        if any(id(p) in self.run.ddp_param_ids for p in module.parameters(recurse=False)):
            return True  # a wrap()ped model: DDP broadcasts its buffers itself
        self._module_ids.add(id(module))
        self._modules.append(module)
        return True

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

    def check_closed(self) -> None:
        """Called before an optimizer step: a pass still open means its ``backward()`` raised
        after averaging began, and the ranks can no longer agree on the next collectives."""
        if self._pass is not None:
            self._pass = None
            raise RuntimeError(_ABANDONED)

    # -- the backward pass -----------------------------------------------------------------------

    def _on_grad(self, param: torch.Tensor) -> None:
        key = id(param)
        if key in self._suppressed:
            # no_sync: its bucket is filled with zeros at the end and it keeps its .grad, which
            # the first pass outside averages whether or not it gives it a gradient
            self._unaveraged.add(key)
            return
        if key in self.run.ddp_param_ids:
            return  # wrap()ped after its optimizer was made: DDP's reducer averages it
        current = self._pass
        if current is None:
            current = self._begin(key)
            if current is None:
                return
        where = current.layout.where.get(key)
        if where is None:
            return
        bucket = current.layout.buckets[where[0]]
        if bucket.filled[where[1]]:  # a second gradient for it: an earlier pass never ended
            self._pass = None
            raise RuntimeError(_ABANDONED)
        bucket.fill(where[1], self._suppressed)
        if current.overlap and bucket.full:
            self._hand_over(current)

    def _begin(self, key: int) -> _Pass | None:
        """The first gradient of a pass: control round, layout, end-of-pass callback."""
        from torch.autograd import Variable

        layout = self._current_layout()
        if key not in layout.where:
            return None  # not a parameter we average (it left the optimizer, or DDP has it)
        if self._clock is not None:
            self._clock.mark("backward_s")  # the step clock: backward starts about now
        info = self.join.round(KIND_GRADIENTS, self.run.steps, self.run.progress)
        layout.reset()
        self._pass = _Pass(info, layout, self._overlaps(layout))
        Variable._execution_engine.queue_callback(self._end_of_backward)
        return self._pass

    def _overlaps(self, layout: BucketLayout) -> bool:
        """Whether this pass hands full buckets to the gradient thread (``--overlap``)."""
        mode = self.run.train.overlap
        if mode == "off" or len(layout.buckets) < 2:
            return False
        if not bucket_per_call(self._groups):
            return False
        if any(b.flat.device.type != "cpu" for b in layout.buckets):
            return False
        return mode == "on" or not getattr(self.run.collectives, "one_host", True)

    def _hand_over(self, current: _Pass) -> None:
        """Give the gradient thread every full bucket next in order; the last one stays for the
        end of the pass, where it is averaged on this thread (no hand-over for a one-bucket model)."""
        buckets = current.layout.buckets
        while current.launched < len(buckets) - 1 and buckets[current.launched].full:
            bucket = buckets[current.launched]
            self._comm.submit(functools.partial(self._reduce, [bucket]))
            current.launched += 1

    def _end_of_backward(self) -> None:
        current, self._pass = self._pass, None
        try:
            if current is not None:
                self._finish(current)
                self.run.passes += 1
                if not self.run.strategies:  # no optimizer steps: a pass is the step's end
                    self.step_ended()
                    if self.run.metrics is not None:
                        self.run.metrics.set_step(self.run.passes)
        finally:
            if self._clock is not None:
                self._clock.mark("other_s")  # between backward and the optimizer step

    def _finish(self, current: _Pass) -> None:
        began = time.perf_counter()
        self._comm.wait()
        if self._clock is not None:  # only the part of the averaging backward did not hide
            self._clock.cut("collective_s", began, time.perf_counter())
        layout, suppressed = current.layout, self._suppressed
        if skips_untouched(self._groups, current.overlap):
            unaveraged = self._unaveraged
            here = [bucket.count > 0 or bool(unaveraged) and any(
                id(p) in unaveraged for p in bucket.params) for bucket in layout.buckets]
            used, touched = self._agree(layout.params, here, shadow=False)
            chosen = [bucket for bucket, t in zip(layout.buckets, touched) if t]
        else:
            used, chosen = None, layout.buckets
        rest = chosen[current.launched:]
        for bucket in rest:
            bucket.fill_rest(suppressed)
        self._reduce_all(rest)
        if used is None:
            used, _ = self._agree(layout.params, [], shadow=False)
        params = layout.params
        keep = set(suppressed) | {id(params[i]) for i in np.flatnonzero(~used)}
        scale = mean_scale(current.info, self.join.world_size)
        for bucket in chosen:  # a parameter no rank has a gradient for stays at None,
            bucket.write_back(scale, keep)  # as in one process (optimizers then skip it)
            if self._unaveraged:
                self._unaveraged.difference_update(id(p) for p in bucket.params
                                                   if id(p) not in suppressed)
        self._broadcast_buffers()

    def shadow(self) -> None:
        """A finished rank's part in another rank's gradient round: the same collectives, with
        zeros, results dropped."""
        layout = self._current_layout()
        chosen = layout.buckets
        if skips_untouched(self._groups, self._overlaps(layout)):
            _, touched = self._agree(layout.params, [False] * len(chosen), shadow=True)
            chosen = [bucket for bucket, t in zip(chosen, touched) if t]
        for bucket in chosen:
            bucket.zero()
        self._reduce_all(chosen)
        if chosen is layout.buckets:
            self._agree(layout.params, [], shadow=True)
        self._broadcast_buffers()

    def _reduce(self, buckets: list[Bucket]) -> None:
        strategy = self._groups[buckets[0].owner][0]
        strategy.average_gradients([b.flat for b in buckets], self.run.steps)

    def _reduce_all(self, buckets: list[Bucket]) -> None:
        """Average ``buckets`` on this thread: one call per bucket where the strategy takes them
        one by one (as the gradient thread does), else one call per strategy with all of its."""
        if bucket_per_call(self._groups):
            for bucket in buckets:
                self._reduce([bucket])
            return
        for owner in range(len(self._groups)):
            mine = [b for b in buckets if b.owner == owner]
            if mine:
                self._reduce(mine)

    def _agree(self, params: list, touched: list[bool], shadow: bool
               ) -> tuple[np.ndarray, np.ndarray]:
        """One int allreduce: per parameter, whether any rank has a gradient for it; per entry
        of ``touched`` (a bucket), whether any rank said so."""
        flags = np.zeros(len(params) + len(touched), dtype=np.int32)
        if not shadow:
            flags[:len(params)] = [p.grad is not None for p in params]
            if self._suppressed:
                flags[:len(params)] &= [id(p) not in self._suppressed for p in params]
            flags[len(params):] = touched
        assert self.run.collectives is not None   # set as the run starts
        self.run.collectives.allreduce([flags], op="sum")
        return flags[:len(params)] > 0, flags[len(params):] > 0

    def _broadcast_buffers(self) -> None:
        buffers = [b for m in self._modules for b in m.buffers(recurse=False) if b is not None]
        if buffers and self.join.world_size > 1:
            assert self.run.collectives is not None   # set as the run starts
            self.run.collectives.broadcast(buffers, src=0)

    def _current_layout(self) -> BucketLayout:
        """The bucket layout of the parameters as they are now: rebuilt when they changed
        (which ones and in what state, :mod:`._param_snapshot`; their dtype or device)."""
        now, taken = held(self._groups), len(self.run.ddp_param_ids)
        if self._layout is None or self._layout_seen is None or \
                not self._layout_seen.holds(now, taken) or self._layout.moved():
            self._layout = BucketLayout(param_groups(self._groups, self.run),
                                        self.run.train.bucket_bytes)
            self._layout_seen = ParamSnapshot(now, taken)
        return self._layout


_ABANDONED = ("a backward() pass raised after phalanx had begun averaging its gradients, and the "
              "loop went on: the ranks can no longer agree on their collectives. Let the error "
              "end the cell (or raise it before backward()), then run the cell again.")
