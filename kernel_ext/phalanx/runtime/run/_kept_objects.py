"""Objects kept live on an engine between cells (``--keep``).

A run with ``--keep model,opt`` leaves those objects of the cell in the engine's keeping when it
ends well: the next cell on the same engines finds the very objects (no re-shipping, no
re-sharding, GPU memory kept), in place of any notebook name of the same name.  They stay until
``%cluster forget NAMES``, a restart or a stop (the engine process goes), or a run on another set
of engines (the kernel then asks the engines to forget them).

Example::

    >>> import types
    >>> state = types.SimpleNamespace(kept={})
    >>> sizes = keep(state, ("w",), {"w": bytearray(8)})
    >>> ns = {}; put_kept(state, ("w",), ns); ns["w"] is state.kept["w"]
    True
"""

from __future__ import annotations

import sys
from typing import Iterable, Protocol


class KeepsObjects(Protocol):
    """Where kept objects live: the engine's state (a stand-in in tests)."""

    kept: dict[str, object]

__all__ = ["keep", "put_kept", "forget_kept", "object_bytes"]


def keep(state: KeepsObjects, names: Iterable[str], namespace: dict) -> dict[str, int]:
    """Keep ``names`` of the cell's ``namespace`` in ``state.kept``; returns each one's bytes."""
    sizes = {}
    for name in names:
        if name not in namespace:
            raise NameError(f"--keep {name}: the cell did not define {name!r}")
        state.kept[name] = namespace[name]
        sizes[name] = object_bytes(namespace[name])
    return sizes


def put_kept(state: KeepsObjects, names: Iterable[str], namespace: dict) -> None:
    """Put the kept ``names`` in a run's namespace (over any shipped notebook value)."""
    for name in names:
        if name not in state.kept:
            raise RuntimeError(f"{name!r} is no longer kept on this engine (it was restarted); "
                               f"run the cell that builds it again, with --keep {name}")
        namespace[name] = state.kept[name]


def forget_kept(names: Iterable[str] | None = None) -> list[str]:
    """On an engine: drop kept objects (all of them with ``names=None``) and give their memory
    back (the cycle collector, then CUDA's cache); returns the names dropped."""
    import gc

    from ._engine_state import engine_state

    state = engine_state()
    dropped = [n for n in (list(state.kept) if names is None else names) if n in state.kept]
    for name in dropped:
        del state.kept[name]
    if dropped:
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    return dropped


def object_bytes(value: object, depth: int = 2) -> int:
    """The bytes of tensors and arrays an object holds on this rank (a sharded parameter: its
    local shard), looked into a few levels (modules, optimizers, containers)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            return int(local.numel() * local.element_size())
        if isinstance(value, torch.nn.Module):
            return sum(object_bytes(t, 0) for t in [*value.parameters(), *value.buffers()])
        if isinstance(value, torch.optim.Optimizer):
            return sum(object_bytes(t, 0) for s in value.state.values() for t in s.values())
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):  # numpy arrays and the like
        return nbytes
    if depth <= 0:
        return 0
    if isinstance(value, dict):
        return sum(object_bytes(v, depth - 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(object_bytes(v, depth - 1) for v in value)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return 0
