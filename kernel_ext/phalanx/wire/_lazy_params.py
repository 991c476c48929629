"""Lazy modules (``torch.nn.LazyLinear``, ``LazyConv2d``, ``LazyBatchNorm1d``...) get their
parameters' shapes from their first input: until then a parameter holds no values at all
(``numel()`` raises ``ValueError: uninitialized parameter``).

So phalanx leaves a lazy parameter alone (no broadcast, no gradient bucket, no fingerprint) and
syncs it the moment it is materialised: a lazy module seen at a forward gets a forward pre-hook
of its own, registered after torch's, which materialises the parameters; it runs before the
module computes anything, so every rank then computes with rank 0's values, as for any module at
its first forward.

Example::

    >>> import torch
    >>> layer, seen = torch.nn.LazyLinear(2), []
    >>> lazy = LazyModules(lambda module, args: seen.append(module.weight.shape))
    >>> lazy.watch(layer)
    >>> any(is_lazy(p) for p in layer.parameters()), seen
    (True, [])
    >>> _ = layer(torch.ones(1, 3)); seen
    [torch.Size([2, 3])]
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle


def is_lazy(tensor: object) -> bool:
    """An uninitialised parameter or buffer of a lazy module (no shape, no values yet)."""
    parameter = sys.modules.get("torch.nn.parameter")
    return parameter is not None and isinstance(tensor, parameter.UninitializedTensorMixin)


def holds_lazy(module: torch.nn.Module, recurse: bool = True) -> bool:
    """Whether ``module`` (with its submodules, unless ``recurse`` is false) has a lazy tensor."""
    return any(is_lazy(t) for t in (*module.parameters(recurse=recurse),
                                    *module.buffers(recurse=recurse)))


class LazyModules:
    """Calls ``materialised(module, args)`` once a watched lazy module has its parameters, at
    the forward that gave them, before that forward computes."""

    def __init__(self, materialised: Callable[[torch.nn.Module, tuple[object, ...]], None]
                 ) -> None:
        self._materialised = materialised
        self._hooks: dict[int, RemovableHandle] = {}  # id(module) -> its hook, until it is materialised

    def watch(self, module: torch.nn.Module) -> None:
        """Hook ``module`` and its submodules that hold lazy tensors (idempotent)."""
        for sub in module.modules():
            if id(sub) not in self._hooks and holds_lazy(sub, recurse=False):
                # appended after torch's own initialising hook (registered when the module was
                # built), so it runs once the parameters have their values
                self._hooks[id(sub)] = sub.register_forward_pre_hook(self._after_init)

    def remove(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()

    def _after_init(self, module: torch.nn.Module, args: tuple[object, ...]) -> None:
        if holds_lazy(module, recurse=False):
            return  # not materialised by this call (a module that initialises elsewhere)
        handle = self._hooks.pop(id(module), None)
        if handle is not None:
            handle.remove()  # torch iterates over a copy of the hooks: removing here is safe
        self._materialised(module, args)


def materialise_like(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """Give a lazy ``tensor`` (a notebook model's, never run there) ``value``'s shape, dtype
    and device, as its module's first forward would have: a model trained on the engines comes
    back into it."""
    tensor.materialize(value.shape, device=value.device, dtype=value.dtype)
