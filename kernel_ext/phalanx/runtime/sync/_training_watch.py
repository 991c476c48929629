"""Zero-change mode attaches to what trains: every tensor that receives a gradient in the cell.

An optimizer is one way a loop trains, not the only one: a hand-written update
(``p -= lr * p.grad``), a closure, another library's optimizer.  So phalanx looks at what the
cell trains, wherever it was built, rather than at optimizers:

* **first forward**: while a *discovery window* is open, torch's global forward pre-hook sees
  every module call; a module in training mode run with gradients on whose parameters phalanx
  has not synced yet
  gets rank 0's parameters and buffers (one broadcast) before it computes anything, and its
  parameters get their gradients averaged when backward returns (:mod:`._grad_sync`).  The
  window is open from the start of the run and again whenever a module registers a new
  parameter (a model built in the cell); it closes after a backward pass that brought nothing
  new, at its forward or in its graph (a loop that trains several models one after another
  brings a new one pass after pass), and every module call gets torch's fast path back.  A
  lazy module (``LazyLinear``) is synced once its first input gave its parameters their shapes
  (:mod:`phalanx.wire._lazy_params`);
* **every backward**: ``torch.autograd.backward`` (which ``loss.backward()`` calls) first
  walks the graph to the leaves that will receive a gradient.  A leaf phalanx does not average
  yet (a raw tensor created with ``requires_grad``, a parameter used through a functional call)
  is checked to hold the same values on every rank (one small allreduce) and then averaged
  like the others; one whose values differ is an error naming it, since its gradients were
  computed at different points and no averaging can make the step right.

Parameters a framework synchronises itself are left to it: those of a ``wrap()``/DDP module
and DTensor parameters (FSDP2).  With a strategy that does not average gradients (``localsgd``,
``easgd``, ``none``), parameters are still synced before their first forward, and the
strategy acts at ``opt.step()`` as before.

Example (inside ``%%distributed_fit``, no optimizer)::

    model = torch.nn.Linear(4, 1)              # synced from rank 0 at its first forward
    for xb, yb in batches(X, y):
        loss = ((model(xb) - yb) ** 2).mean()
        loss.backward()                        # .grad averaged across ranks when it returns
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeGuard

from ._agreement import differing, labels_in
from ..run._own_gpu import check_training_device
from ...wire._lazy_params import LazyModules, is_lazy

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

    from ..run._engine_state import RunContext


WALKS_AFTER_CHANGE = 3
SPOT_CHECK = 32


class DivergentLeafError(RuntimeError):
    """Tensors a backward pass trains held different values on different ranks."""


class TrainingWatch:
    """The hooks of one run that find what trains; ``adopt(params)`` averages their gradients."""

    def __init__(self, run: RunContext, adopt: Callable[[list], None], averages: bool,
                 averaged: Callable[[torch.Tensor], bool]) -> None:
        self.run = run
        self._adopt = adopt            # GradientSync.adopt: average these parameters' gradients
        self._averaged = averaged      # GradientSync.averages: is this one's gradient averaged?
        self._averages = averages      # whether the run's strategy averages gradients at all
        self._synced: set[int] = set()   # ids of tensors that hold rank 0's values
        self._keep: list = []            # ... and the tensors, so those ids stay theirs
        self._global: RemovableHandle | None = None  # the forward pre-hook while the window is open
        self._backward: Callable[..., None] | None = None  # torch.autograd.backward as it was
        self._framework_modules: set[int] = set()  # modules DDP or FSDP2 syncs (see _on_forward)
        self._fsdp: list = []            # FSDP2 modules seen: their unsharded parameters are theirs
        # lazy modules (LazyLinear...): synced once their first input gave their parameters shapes
        self._lazy = LazyModules(self._on_forward)
        # Walking the graph costs ~1 us a node at every pass: it is done until WALKS_AFTER_CHANGE
        # passes in a row found nothing new (a loop training several models in turn shows a new
        # one pass after pass), then at every SPOT_CHECK-th pass (the agreement check at the
        # end of the run would name a leaf that first trained in between)
        self._walks = WALKS_AFTER_CHANGE
        self._passes = 0
        self._registration: RemovableHandle | None = None
        self._synced_at_forward = False  # a module's forward synced something since the last pass

    def install(self) -> None:
        if self.run.world_size == 1:
            # One rank has no peer to sync with or to differ from: no hook in its steps (the
            # backward patch alone was two Python calls in every step's backward)
            return
        import torch
        from torch.nn.modules.module import register_module_parameter_registration_hook

        registration = self._registration = \
            register_module_parameter_registration_hook(self._on_new_parameter)
        # also in the run's ledger, as remove() may be the undo that failed (twice is harmless)
        self.run.patches.on_undo(registration.remove, "torch's parameter registration hook")
        self.run.patches.on_undo(self._close, "the training watch's forward pre-hook")
        watch = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if watch._backward is not None:  # not after the watch was removed
                # Most passes are only counted, here (a call less in every step): a pass is
                # walked after a change, then every SPOT_CHECK-th one
                watch._passes += 1
                if watch._walks > 0 or not watch._passes % SPOT_CHECK:
                    watch.before_backward(tensors, kwargs.get("inputs"))
            return original(tensors, *args, **kwargs)

        # loss.backward() calls it through the module; the run's ledger puts it back
        original = self.run.patches.set(torch.autograd, "backward", backward,
                                        "torch.autograd.backward (the training watch)")
        self._backward = original
        self._open()

    def remove(self) -> None:
        self._backward = None  # torch.autograd.backward is the run's ledger's to put back
        self._close()
        if self._registration is not None:
            self._registration.remove()
            self._registration = None
        self._lazy.remove()
        self._synced.clear()
        self._keep.clear()

    def mark_synced(self, tensors: list) -> None:
        """These tensors hold rank 0's values already (an optimizer's start broadcast them)."""
        for t in tensors:
            if id(t) not in self._synced:
                self._synced.add(id(t))
                self._keep.append(t)

    def trainable_synced(self) -> list:
        """The tensors given rank 0's values that require gradients, in the order synced."""
        return [t for t in self._keep if _is_tensor(t) and t.requires_grad]

    # -- the discovery window ------------------------------------------------------------------

    def _open(self) -> None:
        self._walks = WALKS_AFTER_CHANGE
        if self._global is None and self.run.world_size > 1:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._global = register_module_forward_pre_hook(self._on_forward)

    def _close(self) -> None:
        if self._global is not None:
            self._global.remove()
            self._global = None

    def _on_new_parameter(self, module: torch.nn.Module, name: str,
                          param: torch.nn.Parameter | None) -> None:
        # _backward is None once the watch was removed: a hook that outlived its run does nothing
        if param is not None and self._backward is not None and id(param) not in self._synced:
            self._open()  # a model built in the cell: sync it at its first forward

    def _on_forward(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        import torch

        if not module.training or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            # evaluation (or tracing): nothing is trained by this call, and evaluation may run
            # on one rank alone, where a broadcast would wait for the others
            return
        if id(module) in self._framework_modules:
            return
        if isinstance(module, torch.nn.parallel.DistributedDataParallel) or _is_fsdp(module):
            # the cell's own DDP or FSDP2: it syncs these modules' parameters itself
            self._framework_modules.update(id(m) for m in module.modules())
            self._keep.extend(module.modules())  # so those ids stay theirs
            self.run.ddp_param_ids.update(id(p) for p in module.parameters())
            self._fsdp.extend(m for m in module.modules() if _is_fsdp(m))
            return
        params = list(module.parameters())
        if any(is_lazy(p) for p in params):
            self._lazy.watch(module)  # no values to sync yet: at their materialisation
        fresh = [p for p in params if id(p) not in self._synced and _ours(self.run, p)]
        if not any(p.requires_grad for p in fresh):
            return
        check_training_device(self.run, fresh[:1])  # before a broadcast on another's GPU
        buffers = [b for b in module.buffers() if id(b) not in self._synced and not is_lazy(b)]
        assert self.run.collectives is not None   # set as the run starts
        self.run.collectives.broadcast([t.detach() for t in fresh + buffers], src=0)
        self.mark_synced(fresh + buffers)
        self._synced_at_forward = True
        trained = [p for p in fresh if p.requires_grad]
        if self._averages:
            self._adopt(trained)

    # -- every backward pass ---------------------------------------------------------------------

    def before_backward(self, tensors: torch.Tensor | Sequence[torch.Tensor],
                        inputs: torch.Tensor | Sequence[torch.Tensor] | None) -> None:
        """Find the leaves this pass trains; sync and adopt those phalanx does not know yet
        (a pass the patched ``backward`` chose to walk: it counts the passes)."""
        self._walks -= 1
        roots = [tensors] if _is_tensor(tensors) else list(tensors or ())
        check_training_device(self.run, roots[:1])
        leaves = _leaves(roots) if inputs is None else _as_list(inputs)
        if self._fsdp:  # FSDP2 trains its unsharded parameters, which no module lists
            self.run.ddp_param_ids.update(_fsdp_unsharded_ids(self._fsdp))
        # New here: a leaf whose gradient is not averaged yet (with a strategy that averages
        # gradients: also a parameter synced while frozen and trained since), else one whose
        # values were never synced.
        known = self._averaged if self._averages else (lambda t: id(t) in self._synced)
        fresh = [t for t in leaves if not known(t) and _ours(self.run, t)]
        new_at_forward, self._synced_at_forward = self._synced_at_forward, False
        if fresh or new_at_forward:
            self._walks = WALKS_AFTER_CHANGE  # something new trained: more may follow
        if not fresh:
            # A pass that brought nothing new, at its forward or here: every module that trains
            # is synced, so torch's fast path back for every module call.  A model first used
            # later is still found: a new parameter reopens the window, and the next walks (up
            # to WALKS_AFTER_CHANGE, then every SPOT_CHECK-th pass) see its leaves.
            if not new_at_forward:
                self._close()
            return
        self._check_same(fresh)  # also for ones synced before: they may have drifted since
        self.mark_synced(fresh)
        if self._averages:
            self._adopt(fresh)

    def _check_same(self, fresh: list) -> None:
        """One allreduce: do these tensors hold the same values on every rank?"""
        assert self.run.collectives is not None   # set as the run starts
        differ = differing(self.run.collectives, fresh)
        if differ:
            labels = labels_in(self.run.namespace)
            names = [labels.get(id(fresh[i])) for i in differ[:3]]
            shown = ", ".join(name or f"a tensor of shape {tuple(fresh[i].shape)}"
                              for name, i in zip(names, differ))
            call = f"phalanx.broadcast({names[0]})" if names[0] and names[0].isidentifier() \
                else "phalanx.broadcast(t)"
            raise DivergentLeafError(
                f"{shown} {'is' if len(differ) == 1 else 'are'} trained in this backward pass but "
                "held different values on different ranks when the forward pass used "
                f"{'it' if len(differ) == 1 else 'them'}: the ranks computed gradients of "
                "different models, and averaging cannot make that step right. Create it in an "
                "earlier cell (shipped, it is the same on every rank), make it a parameter of a "
                "torch.nn.Module (phalanx gives every rank rank 0's parameters at the module's "
                f"first forward), or call {call} right after drawing it (every rank then "
                "holds rank 0's draw).")


def _ours(run: RunContext, tensor: torch.Tensor) -> bool:
    """A tensor phalanx syncs: not a framework's, and holding its values (a parameter whose
    storage was freed is a framework's gathered copy, FSDP2's between uses)."""
    if framework_synced(run, tensor) or is_lazy(tensor):
        return False  # a lazy module's parameter has no values until its first forward
    return tensor.numel() == 0 or tensor.untyped_storage().nbytes() > 0


def framework_synced(run: RunContext, tensor: torch.Tensor) -> bool:
    """A tensor a framework keeps in sync itself: a DDP module's parameter (``wrap()`` or the
    cell's own DDP) or a DTensor (FSDP2's ``fully_shard``, tensor parallelism)."""
    return id(tensor) in run.ddp_param_ids or is_dtensor(tensor)


def is_dtensor(tensor: object) -> bool:
    """A DTensor (FSDP2, tensor parallelism): its local piece differs from rank to rank by
    design, and its framework keeps it in step."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(tensor, dtensor.DTensor)


def _is_fsdp(module: torch.nn.Module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def _fsdp_unsharded_ids(modules: list) -> set[int]:
    """The ids of the unsharded parameters FSDP2 gathers for ``modules`` (its own state: the
    forward pass runs on these, and FSDP reduce-scatters their gradients itself)."""
    ids: set[int] = set()
    for module in modules:
        try:
            group = module._get_fsdp_state()._fsdp_param_group
        except Exception:  # another torch: nothing to exclude beyond the DTensors
            continue
        for fsdp_param in getattr(group, "fsdp_params", None) or ():
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                ids.add(id(unsharded))
    return ids


def _is_tensor(x: object) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _as_list(inputs: torch.Tensor | Sequence[torch.Tensor]) -> list:
    """The leaves among ``backward(inputs=...)`` (only leaves accumulate a ``.grad``)."""
    tensors = [inputs] if _is_tensor(inputs) else list(inputs)
    return [t for t in tensors if t.grad_fn is None and t.requires_grad]


def _leaves(roots: list) -> list:
    """The leaf tensors a backward pass from ``roots`` accumulates gradients into, in a
    deterministic order (the same graph gives the same order on every rank)."""
    leaves, seen = [], set()
    stack = [r.grad_fn for r in reversed(roots) if r.grad_fn is not None]
    for root in roots:
        if root.grad_fn is None and root.requires_grad and id(root) not in seen:
            seen.add(id(root))
            leaves.append(root)
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        variable = getattr(node, "variable", None)  # an AccumulateGrad node
        if variable is not None and id(variable) not in seen:
            seen.add(id(variable))
            leaves.append(variable)
        for child, _index in reversed(node.next_functions):
            if child is not None and id(child) not in visited:
                stack.append(child)
    return leaves
