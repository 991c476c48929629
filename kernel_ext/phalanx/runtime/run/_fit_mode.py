"""How a model lives across the ranks of a run: the fit mode.

Every feature that touches the trained objects as a whole asks the run's :class:`FitMode`
instead of assuming each rank holds the full model:

- ``--return``: :meth:`FitMode.returned` - what rank 0 sends back to the notebook;
- checkpoints and ``--resume``: :meth:`FitMode.checkpointed` - the objects a commit saves and a
  resume loads; :attr:`FitMode.commits_to_folder` - whether a commit is one rank's bytes (any
  rank's copy restores every rank) or a folder every rank writes its shards to;
- elastic resize (``%cluster scale`` during a checkpointed run): :attr:`FitMode.resizable`;
- memory figures: :meth:`FitMode.held_bytes` - this rank's share of parameters, gradients and
  optimizer state.

:class:`Replicated`: every rank holds the whole model, and the ranks agree on it.
:class:`Sharded`: the cell holds a model FSDP2 sharded (``wrap(model, shard=True)`` or its own
``fully_shard``): ``--return`` gathers it whole (every rank takes part), memory figures count each
rank's shard, commits are torch's distributed checkpoints (:mod:`phalanx.runtime.commits._sharded_commits`), which a
resume on another number of ranks reshards.
:func:`mode_for` picks the mode of a run from what its cell holds.

Example::

    >>> import types
    >>> mode = fit_mode("replicated")
    >>> mode.name, mode.resizable
    ('replicated', True)
    >>> sorted(mode.checkpointed({"w": types.SimpleNamespace(state_dict=dict,
    ...                                                      load_state_dict=print), "n": 3}))
    ['w']
"""

from __future__ import annotations

import sys
import types
from typing import Any, Iterable

from ...wire._options import FIT_MODES

__all__ = ["FitMode", "Replicated", "Sharded", "fit_mode", "mode_for"]


class FitMode:
    """The interface every fit mode implements (see the module's docstring)."""

    name = ""
    resizable = False
    commits_to_folder = False

    def returned(self, rank: int, namespace: dict, names: Iterable[str]) -> dict | None:
        """What this rank sends back for ``--return names`` (None: nothing from this rank)."""
        raise NotImplementedError

    def checkpointed(self, namespace: dict) -> dict[str, Any]:
        """The cell's objects a commit saves and a resume loads, by name."""
        raise NotImplementedError

    def held_bytes(self, namespace: dict) -> dict[str, int]:
        """This rank's bytes of parameters, gradients and optimizer state."""
        raise NotImplementedError


class Replicated(FitMode):
    """Every rank holds the whole model; the ranks agree on it, so rank 0's copy is the run's."""

    name = "replicated"
    resizable = True  # any rank's commit restores the whole model on any number of ranks

    def returned(self, rank: int, namespace: dict, names: Iterable[str]) -> dict | None:
        names = tuple(names)
        if not names or rank != 0:  # rank 0's copy is the one brought back
            return None
        out = {}
        for name in names:
            if name not in namespace:
                raise NameError(f"--return {name}: the cell did not define {name!r}")
            value = namespace[name]
            out[name] = getattr(value, "module", value) if _is_ddp(value) else value
        return out

    def checkpointed(self, namespace: dict) -> dict[str, Any]:
        """Top-level objects with ``state_dict`` and ``load_state_dict``."""
        found = {}
        for name in sorted(namespace):
            value = namespace[name]
            if name.startswith("__") or isinstance(value, (type, types.ModuleType)):
                continue
            if callable(getattr(value, "state_dict", None)) and \
                    callable(getattr(value, "load_state_dict", None)):
                found[name] = value
        return found

    def held_bytes(self, namespace: dict) -> dict[str, int]:
        """Bytes of this rank's tensors (a sharded parameter's local shard only)."""
        from ._kept_objects import object_bytes

        torch = sys.modules.get("torch")
        held = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
        if torch is None:
            return held
        seen: set[int] = set()
        for value in namespace.values():
            if isinstance(value, torch.nn.Module):
                for p in value.parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        held["parameters"] += object_bytes(p)
                        held["gradients"] += object_bytes(p.grad) if p.grad is not None else 0
            elif isinstance(value, torch.optim.Optimizer):
                held["optimizer_state"] += object_bytes(value)
        return held


class Sharded(Replicated):
    """A model FSDP2 shards across the ranks: each holds a part; none holds the model."""

    name = "sharded"
    resizable = True  # a resume on any number of ranks reshards the commit
    commits_to_folder = True  # a rank's state dict is only its shard

    def returned(self, rank: int, namespace: dict, names: Iterable[str]) -> dict | None:
        """Every rank gathers each sharded model it is asked for (in the same order: it is a
        collective); rank 0 sends the full state dicts and the other names' values."""
        from ..sync._sharded import full_state_dict, is_sharded

        names = tuple(names)
        missing = [n for n in names if n not in namespace]
        if missing:  # said on every rank alike, before any gather some rank would not join
            raise NameError(f"--return {missing[0]}: the cell did not define {missing[0]!r}")
        out = {}
        for name in names:
            value = namespace.get(name)
            if is_sharded(value):
                out[name] = full_state_dict(value)
            elif _is_optimizer_of_shards(value):
                raise ValueError(f"--return {name}: an optimizer of a sharded model holds only "
                                 f"this rank's part of its state; keep it on the engines with "
                                 f"--keep {name} instead")
            elif rank == 0:
                out.update(super().returned(0, namespace, [name]) or {})
        return out if rank == 0 and names else None


def _is_optimizer_of_shards(value: Any) -> bool:
    from ..sync._training_watch import is_dtensor

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.optim.Optimizer) and any(
        is_dtensor(p) for group in value.param_groups for p in group["params"])


def mode_for(namespace: dict, requested: str = "replicated") -> FitMode:
    """The mode of a run whose cell holds ``namespace``: sharded as soon as it holds a module
    FSDP2 sharded, whatever was asked; else ``requested``."""
    from ..sync._sharded import is_sharded

    if any(is_sharded(v) for v in list(namespace.values())):
        return Sharded()
    return fit_mode(requested)


_MODES: dict[str, type[FitMode]] = {"replicated": Replicated, "sharded": Sharded}
assert set(_MODES) == set(FIT_MODES), "every mode named in _options has a class here"


def fit_mode(name: str) -> FitMode:
    """The mode called ``name`` (one of :data:`~phalanx.wire._options.FIT_MODES`)."""
    try:
        return _MODES[name]()
    except KeyError:
        raise ValueError(f"unknown fit mode {name!r}; known: {', '.join(_MODES)}") from None


def _is_ddp(value: Any) -> bool:
    ddp = sys.modules.get("torch.nn.parallel")
    return ddp is not None and isinstance(value, ddp.DistributedDataParallel)
