"""How a model lives across the ranks of a run: the fit mode.

Every feature that touches the trained objects as a whole asks the run's :class:`FitMode`
instead of assuming each rank holds the full model:

- ``--return``: :meth:`FitMode.returned` - what rank 0 sends back to the notebook;
- checkpoints and ``--resume``: :meth:`FitMode.checkpointed` - the objects a commit saves and a
  resume loads;
- elastic resize (``%cluster scale`` during a checkpointed run): :attr:`FitMode.resizable`;
- memory figures: :meth:`FitMode.held_bytes` - this rank's share of parameters, gradients and
  optimizer state.

Today there is one mode, :class:`Replicated` (every rank holds the whole model, and the ranks
agree on it).  A sharded mode (FSDP2, each rank a part) implements the same methods: gathering
for ``--return``, a distributed checkpoint for commits, resharding on resize.

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

from ._options import FIT_MODES

__all__ = ["FitMode", "Replicated", "fit_mode"]


class FitMode:
    """The interface every fit mode implements (see the module's docstring)."""

    name = ""
    resizable = False

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
                        held["parameters"] += p.numel() * p.element_size()
                        if p.grad is not None:
                            held["gradients"] += p.grad.numel() * p.grad.element_size()
            elif isinstance(value, torch.optim.Optimizer):
                for state in value.state.values():
                    held["optimizer_state"] += sum(t.numel() * t.element_size()
                                                   for t in state.values()
                                                   if isinstance(t, torch.Tensor))
        return held


_MODES: dict[str, type[FitMode]] = {"replicated": Replicated}
assert set(_MODES) == set(FIT_MODES), "every mode named in _options has a class here"


def fit_mode(name: str) -> FitMode:
    """The mode called ``name`` (one of :data:`~._options.FIT_MODES`)."""
    try:
        return _MODES[name]()
    except KeyError:
        raise ValueError(f"unknown fit mode {name!r}; known: {', '.join(_MODES)}") from None


def _is_ddp(value: Any) -> bool:
    ddp = sys.modules.get("torch.nn.parallel")
    return ddp is not None and isinstance(value, ddp.DistributedDataParallel)
