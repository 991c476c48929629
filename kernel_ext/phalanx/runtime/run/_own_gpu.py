"""An engine takes its own GPU for a run, and says so when a cell computes on a peer's.

:mod:`._device_rule` decides; this module carries it out in the engine: :func:`use_own_gpu` sets
the current CUDA device before the cell runs (so ``"cuda"`` and ``cuda:{LOCAL_RANK}`` are the
engine's GPU), and :func:`check_training_device` stops a cell at its first step when what it
trains lives on the GPU of another engine of the host (a hand-written ``"cuda:0"`` on
``LOCAL_RANK`` 1), instead of letting every rank pile up on one GPU.

Example (what the run does)::

    run.device = use_own_gpu(spec)            # torch.device("cuda", LOCAL_RANK)
    check_training_device(run, [loss])        # at the first forward and backward
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterable

from ._device_rule import foreign_device_message, own_gpu_index
from ..adapters.torchrun import torchrun_env

__all__ = ["use_own_gpu", "check_training_device", "ForeignDeviceError", "LocalRankDeviceWarning"]


class ForeignDeviceError(RuntimeError):
    """The cell computes on the GPU of another engine of this host."""


class LocalRankDeviceWarning(UserWarning):
    """This engine's GPU is not ``cuda:{LOCAL_RANK}`` (an engine started by hand, pinned alone)."""


def use_own_gpu(spec: Any) -> Any:
    """Make this engine's own GPU the current CUDA device for the run of ``spec`` (a
    :class:`~phalanx.wire._seam.RunSpec`) and return it as a ``torch.device``."""
    import torch

    local_rank = _local(spec)[0]
    index = own_gpu_index(os.environ, local_rank)
    count = torch.cuda.device_count()
    if index is None or not 0 <= index < count:
        raise RuntimeError(
            f"rank {spec.rank} has no GPU of its own (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, {count} visible, LOCAL_RANK "
            f"{local_rank}): start GPU engines with %cluster start --gpus auto, or run the "
            "cell with --backend gloo")
    if index != local_rank:
        warnings.warn(LocalRankDeviceWarning(
            f"rank {spec.rank} trains on cuda:{index} but its LOCAL_RANK is {local_rank}: "
            f"frameworks that take cuda:LOCAL_RANK (accelerate, Trainer, Lightning) would use "
            f"another GPU. An engine started by hand needs CUDA_VISIBLE_DEVICES listing its "
            f"host's GPUs in rank order and PHALANX_GPU naming its own"), stacklevel=2)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def check_training_device(run: Any, tensors: Iterable[Any]) -> None:
    """Raise :class:`ForeignDeviceError` when one of ``tensors`` lives on the GPU of another
    engine of this host (``run.device`` is this engine's own)."""
    mine, spec = getattr(run, "device", None), getattr(run, "spec", None)
    own = getattr(mine, "index", None)
    if getattr(mine, "type", None) != "cuda" or own is None or spec is None:
        return  # a CPU run, or a test's stand-in run
    for tensor in tensors:
        device: Any = getattr(tensor, "device", None)
        if getattr(device, "type", None) != "cuda" or device.index in (None, own):
            continue
        local_rank, local_world = _local(spec)
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        message = foreign_device_message(run.rank, local_rank, local_world, device.index, own,
                                         visible)
        if message is not None:
            raise ForeignDeviceError(message)


def _local(spec: Any) -> tuple[int, int]:
    """``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` of ``spec``'s rank, as the run sets them."""
    env = torchrun_env(spec.rank, spec.world_size, spec.group.hosts, spec.run_id, environ={})
    return int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
