"""``--shard`` data split again by a framework: said in the cell, at once.

``--shard X,y`` gives each rank its rows of ``X`` and ``y``.  A framework that splits the data
itself (torch's ``DistributedSampler``, which Lightning puts into every loader, or accelerate's
``prepare``, which Hugging Face's ``Trainer`` uses) would then give each rank a ``1/world`` part
of its part: every rank trains on ``1/world**2`` of the data, and nothing fails.  Which split a
user meant cannot be known, so neither is dropped silently: while a run has ``--shard`` names,
the moment a framework splits a data set made from them (it holds one of their tensors or
arrays, or has exactly this rank's number of shard rows), rank 0 warns with both ways out.

Example (the engine runtime, around the cell)::

    undo = watch_double_split(run, spec.shard, namespace)
    ...                    # DistributedSampler(TensorDataset(X, y)) -> DoubleSplitWarning
    undo()
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable, Iterable

from ._import_watch import when_loaded
from ...wire._seam import CELL_FILENAME
from . import Adapter

__all__ = ["DoubleSplitWarning", "watch_double_split"]

_WALK_DEPTH = 3      # dataset -> its attributes -> their items: where wrappers keep their data
_WALK_WIDTH = 32     # items looked at per container (a list of a million samples is not walked)


class DoubleSplitWarning(UserWarning):
    """A framework split data that ``--shard`` had split already."""


class _ShardData:
    """What this rank received for the ``--shard`` names: the objects, their memory, their
    row count."""

    def __init__(self, names: Iterable[str], namespace: dict) -> None:
        self.names = [n for n in names if n in namespace]
        values = [namespace[n] for n in self.names]
        self.ids = {id(v) for v in values}
        self.buffers = {b for b in map(_buffer_of, values) if b is not None}
        self.rows = {_rows(v) for v in values} - {None}

    def made_from(self, dataset: Any) -> bool:
        """Whether ``dataset`` holds shard data, or has this rank's number of shard rows."""
        try:
            if len(dataset) in self.rows:
                return True
        except Exception:  # an iterable data set has no length
            pass
        return self._holds(dataset, _WALK_DEPTH, set())

    def _holds(self, obj: Any, depth: int, seen: set[int]) -> bool:
        if id(obj) in self.ids or _buffer_of(obj) in self.buffers - {None}:
            return True
        if depth == 0 or id(obj) in seen or isinstance(obj, (str, bytes, int, float)):
            return False
        seen.add(id(obj))
        if isinstance(obj, dict):
            items: Iterable[Any] = list(obj.values())[:_WALK_WIDTH]
        elif isinstance(obj, (list, tuple)):
            items = obj[:_WALK_WIDTH]
        else:
            items = list(getattr(obj, "__dict__", {}).values())[:_WALK_WIDTH]
        return any(self._holds(item, depth - 1, seen) for item in items)


def _buffer_of(value: Any) -> int | None:
    """The address of the memory under a tensor or array (a view shares its base's)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        try:
            return int(value.untyped_storage().data_ptr()) or None
        except Exception:  # a tensor subclass without storage
            return None
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        base = value
        while isinstance(base.base, numpy.ndarray):
            base = base.base
        return int(base.__array_interface__["data"][0]) or None
    return None


def _rows(value: Any) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(value) if isinstance(value, (list, tuple)) else None


def _warn_at_cell_line(warning: Warning) -> None:
    """Warn naming the line of the cell that led here (the framework's own frames in between
    would point the user at code they did not write)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != CELL_FILENAME:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        warnings.warn(warning, stacklevel=3)
    else:
        warnings.warn_explicit(warning, type(warning), CELL_FILENAME, frame.f_lineno,
                               module="__main__")


class _Watch:
    def __init__(self, rank: int, shards: _ShardData) -> None:
        self.rank, self.shards = rank, shards
        self.active = True
        self.warned = False
        self.undo: list[Callable[[], None]] = []

    def check(self, what: str, dataset: Any, replicas: Any) -> None:
        if not self.active or self.warned or not isinstance(replicas, int) or replicas < 2:
            return
        if not self.shards.made_from(dataset):
            return
        self.warned = True
        if self.rank != 0:  # one warning for the run, not one per rank
            return
        names = ",".join(self.shards.names)
        _warn_at_cell_line(DoubleSplitWarning(
            f"{what} splits a data set made from the --shard data ({names}) across "
            f"{replicas} ranks again: each rank trains on 1/{replicas} of its shard, "
            f"1/{replicas * replicas} of the data. Either drop --shard {names} and give the "
            f"framework the whole data set (it splits it), or keep --shard and stop the second "
            f"split (e.g. DistributedSampler(dataset, num_replicas=1, rank=0))."))

    def wrap(self, cls: Any, method: str, inspect: Callable[[Any, tuple, dict], None]) -> None:
        original = cls.__dict__.get(method)
        if original is None or not self.active:
            return

        @functools.wraps(original)
        def checked(obj: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(obj, *args, **kwargs)
            inspect(obj, args, kwargs)
            return result

        def restore() -> None:
            if cls.__dict__.get(method) is checked:  # not replaced since by someone else
                setattr(cls, method, original)

        setattr(cls, method, checked)
        self.undo.append(restore)

    def stop(self) -> None:
        self.active = False
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


def watch_double_split(rank: int, shard_names: Iterable[str], namespace: dict) -> Callable[[], None]:
    """Warn if a framework splits ``--shard`` data again during the run; returns the undo.

    Looks at torch's ``DistributedSampler`` and accelerate's ``Accelerator.prepare_data_loader``,
    loaded now or by the cell.
    """
    shards = _ShardData(shard_names, namespace)
    watch = _Watch(rank, shards)
    if not shards.names:
        return watch.stop

    def on_samplers(module: Any) -> None:
        watch.wrap(module.DistributedSampler, "__init__",
                   lambda sampler, args, kwargs: watch.check(
                       "DistributedSampler", sampler.dataset, sampler.num_replicas))

    def on_accelerate(module: Any) -> None:
        def inspect(accelerator: Any, args: tuple, kwargs: dict) -> None:
            loader = args[0] if args else kwargs.get("data_loader")
            watch.check("accelerate's prepare", getattr(loader, "dataset", None),
                        accelerator.num_processes)

        watch.wrap(module.Accelerator, "prepare_data_loader", inspect)

    watch.undo.append(when_loaded("torch.utils.data.distributed", on_samplers))
    watch.undo.append(when_loaded("accelerate.accelerator", on_accelerate))
    return watch.stop


ADAPTER = Adapter("double split", "the double-split watch",
                  lambda run, namespace, shard: watch_double_split(run.rank, shard, namespace))
