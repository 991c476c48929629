"""Sharded models: ``wrap(model, shard=True)`` (torch's FSDP2) and what a run does with them.

``shard_model`` applies ``fully_shard`` per block (each module of the model's ``ModuleList`` s,
the layers of a transformer; else the top-level children of a ``Sequential``) and then to the
whole model, as torch's own FSDP2 examples do: each rank holds a ``1/world`` shard of every
parameter, gathered for a block's forward and backward and freed after.  Every rank first takes
rank 0's values (one broadcast), so the shards are cut from one model whatever each rank built.

The run's fit mode (:class:`~phalanx.runtime.run._fit_mode.Sharded`) then answers for such a model: ``--return``
gathers a full state dict (every rank takes part; rank 0 sends it, on the CPU) that the kernel
loads into the notebook's own model; its memory figures count each rank's shard.

Example (inside ``%%distributed_fit --keep model,opt``)::

    model = wrap(Transformer(), shard=True)          # before the optimizer, as FSDP2 requires
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ...wire._seam import FullStateDict

if TYPE_CHECKING:
    import torch

__all__ = ["shard_model", "is_sharded", "FullStateDict", "full_state_dict",
           "release_derived_classes"]


def is_sharded(value: object) -> bool:
    """Whether ``value`` is a module FSDP2 has sharded."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(value, fsdp.FSDPModule)


def shard_model(model: torch.nn.Module, device: torch.device | None = None,
                reshard_after_forward: bool = True,
                mp_policy: torch.distributed.fsdp.MixedPrecisionPolicy | torch.dtype | None = None,
                offload: bool = False) -> torch.nn.Module:
    """``fully_shard`` per block, then the whole model (in place; returns the model)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise RuntimeError("wrap(model, shard=True) runs inside %%distributed_fit (the ranks' "
                           "group shards the model)")
    on_gpu = device is not None and device.type == "cuda"
    if offload and not on_gpu:  # torch's own words: "Cannot access accelerator device ..."
        raise ValueError(f"wrap(model, shard=True, offload=True): offload keeps the shards in "
                         f"host memory between a GPU's uses, and this run's device is {device}; "
                         "on CPU engines the shards are in host memory already: leave "
                         "offload=True out")
    if on_gpu and not offload:
        model = model.to(device)
    _take_rank0_values(model, device)
    options: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        options["mp_policy"] = mp_policy if isinstance(mp_policy, MixedPrecisionPolicy) \
            else MixedPrecisionPolicy(param_dtype=mp_policy, reduce_dtype=torch.float32)
    if offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for block in _blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def _take_rank0_values(model: torch.nn.Module, device: torch.device | None) -> None:
    """Every rank's model takes rank 0's values: one model to cut the shards from.

    With CPU offload on a GPU run the model stays on the CPU, which NCCL cannot broadcast
    ("No backend type associated with device type cpu", measured on an H200): such a tensor
    goes through the run's GPU, one at a time, so at most one tensor's copy is on it."""
    import torch
    import torch.distributed as dist

    staged = device is not None and device.type == "cuda"
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if staged and tensor.device.type == "cpu":
                on_device = tensor.data.to(device)
                dist.broadcast(on_device, src=0)
                tensor.data.copy_(on_device)
            else:
                dist.broadcast(tensor.data, src=0)


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The units sharded one by one: the modules of every ``ModuleList`` (transformer layers),
    else the children of a ``Sequential`` that hold parameters."""
    import torch

    blocks = [m for container in model.modules() if isinstance(container, torch.nn.ModuleList)
              for m in container if any(True for _ in m.parameters())]
    if not blocks and isinstance(model, torch.nn.Sequential):
        blocks = [m for m in model.children() if any(True for _ in m.parameters())]
    return blocks


def full_state_dict(model: torch.nn.Module) -> FullStateDict:
    """Gather ``model``'s full state dict on the CPU (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return FullStateDict(get_model_state_dict(model, options=options))


def release_derived_classes() -> None:
    """Forget the classes ``fully_shard`` derived during the run (called at every run's end).

    torch caches, for each model class it shards, the FSDP class it derives from it
    (``cls_to_fsdp_cls``).  A model class defined in a cell holds the cell's globals through its
    methods, so that cache kept each run's model and optimizer alive on the engines after the
    run (measured: about 193 MB an engine after each run of a 25M-parameter model with AdamW,
    ``benchmarks/bench_sharded.py``).  The cache only saves deriving a class again; a model kept
    with ``--keep`` holds its own class.
    """
    module = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    cache = getattr(module, "cls_to_fsdp_cls", None)
    if isinstance(cache, dict):
        cache.clear()
