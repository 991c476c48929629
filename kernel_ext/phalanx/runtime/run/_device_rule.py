"""Which GPU an engine trains on, and what each framework picks there (pure: no torch import).

The rule is torchrun's layout.  Every engine on a host sees the same GPUs: the ones the cluster
may use there (``--gpus auto``: the host's; ``--gpus 2,0``: those), in the order its engines
take them.  The engine that is ``LOCAL_RANK`` k on its host owns the k-th of them, and its
current CUDA device is set to it before the cell runs.  So ``"cuda"`` (the current device),
``cuda:{LOCAL_RANK}``, ``torch.cuda.set_device(LOCAL_RANK)``, accelerate, Hugging Face
``Trainer`` and Lightning ``Trainer(devices=N)`` all mean the engine's own GPU, while
``LOCAL_RANK`` still counts the engines of a host, so "local main process first" runs once a
host.  Seeing its peers' GPUs also lets NCCL check P2P/NVLink between them with CUDA (with a
peer it cannot see, NCCL assumes P2P without checking).  What cannot hold as well: a
hand-written ``"cuda:0"`` on an engine whose ``LOCAL_RANK`` is not 0 means another engine's GPU;
:func:`foreign_device_message` says so at the first step.

``PHALANX_GPU`` names an engine's own GPU (as ``CUDA_VISIBLE_DEVICES`` names it), set with the
visible list when the engine is pinned, before anything in it touches CUDA.

Example::

    >>> views = engine_views(["a", "a", "b"], ["0", "1", "0"], {"a": ["0", "1"], "b": ["0"]})
    >>> [(v.local_rank, v.cuda_visible_devices, v.own_index) for v in views]
    [(0, '0,1', 0), (1, '0,1', 1), (0, '0', 0)]
    >>> views[1].framework_devices()["lightning"]
    'cuda:1'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..adapters.torchrun import torchrun_env

__all__ = ["GPU_VARIABLE", "EngineView", "engine_views", "pinning_env", "own_gpu_index",
           "foreign_device_message", "FRAMEWORKS"]

GPU_VARIABLE = "PHALANX_GPU"

# How each framework picks its device from torchrun's variables (read from the installed
# packages): accelerate's PartialState.set_device takes cuda:(LOCAL_RANK % device_count) and
# Hugging Face TrainingArguments takes accelerate's; Lightning's DDP strategy takes
# parallel_devices[LOCAL_RANK] of cuda:0..devices-1; a torchrun script calls
# torch.cuda.set_device(LOCAL_RANK); a hand-written loop says "cuda", the current device.
FRAMEWORKS = ("cuda", "torchrun", "accelerate", "transformers", "lightning")


@dataclass(frozen=True)
class EngineView:
    """What one engine sees during a run: its GPUs, torchrun's variables, the device it gets."""

    rank: int
    host: str
    gpu: str | None                 # its own GPU as CUDA_VISIBLE_DEVICES names it; None: CPU
    visible: tuple[str, ...]        # its CUDA_VISIBLE_DEVICES, in order
    local_rank: int
    local_world_size: int
    group_rank: int

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.visible)

    @property
    def own_index(self) -> int | None:
        """Its own GPU's index among the visible ones (``cuda:own_index``); None on CPU."""
        return self.visible.index(self.gpu) if self.gpu is not None else None

    def framework_devices(self) -> dict[str, str]:
        """The device each of :data:`FRAMEWORKS` picks on this engine (``"cpu"`` without one)."""
        if self.gpu is None:
            return dict.fromkeys(FRAMEWORKS, "cpu")
        count = len(self.visible)
        return {"cuda": f"cuda:{self.own_index}",  # phalanx sets the current device
                "torchrun": f"cuda:{self.local_rank}",
                "accelerate": f"cuda:{self.local_rank % count}",
                "transformers": f"cuda:{self.local_rank % count}",
                "lightning": f"cuda:{self.local_rank}"}

    def environment(self) -> dict[str, str]:
        """What pins the engine (see :func:`pinning_env`)."""
        return pinning_env(self.gpu, self.visible)


def engine_views(hosts: Sequence[str], gpus: Sequence[str | None],
                 host_gpus: Mapping[str, Sequence[str]]) -> list[EngineView]:
    """Each rank's view: rank ``r`` runs on ``hosts[r]`` and owns ``gpus[r]``; ``host_gpus[h]``
    lists the GPUs the cluster may use on host ``h``, in the order its engines take them."""
    views = []
    for rank, (host, gpu) in enumerate(zip(hosts, gpus)):
        env = torchrun_env(rank, len(hosts), hosts, "", environ={})
        views.append(EngineView(rank=rank, host=host, gpu=gpu,
                                visible=tuple(host_gpus.get(host, ())) if gpu is not None else (),
                                local_rank=int(env["LOCAL_RANK"]),
                                local_world_size=int(env["LOCAL_WORLD_SIZE"]),
                                group_rank=int(env["GROUP_RANK"])))
    return views


def pinning_env(gpu: str | None, visible: Sequence[str] = ()) -> dict[str, str]:
    """The environment that pins an engine to ``gpu`` among ``visible`` (its host's GPUs; just
    ``gpu`` if empty), or hides every GPU from a CPU engine.

    Example::

        >>> pinning_env("5", ["4", "5"])
        {'CUDA_VISIBLE_DEVICES': '4,5', 'PHALANX_GPU': '5'}
    """
    if gpu is None:
        return {"CUDA_VISIBLE_DEVICES": ""}
    shown = list(visible) or [gpu]
    if gpu not in shown:
        raise ValueError(f"GPU {gpu} is not among the GPUs {','.join(shown)} it would see")
    return {"CUDA_VISIBLE_DEVICES": ",".join(shown), GPU_VARIABLE: gpu}


def own_gpu_index(environ: Mapping[str, str], local_rank: int | None = None) -> int | None:
    """This engine's own GPU as an index for ``cuda:N``, read from its environment (never from
    CUDA); None where the environment does not say (a CPU engine, or none of the below).

    Pinned by phalanx: ``PHALANX_GPU``'s place in ``CUDA_VISIBLE_DEVICES``.  An engine started
    by hand (adopted) with one GPU visible: that one.  With several or all visible: torchrun's
    convention, ``local_rank``.

    Example::

        >>> own_gpu_index({"CUDA_VISIBLE_DEVICES": "4,5", "PHALANX_GPU": "5"})
        1
    """
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        visible = [d.strip() for d in listed.split(",") if d.strip()]
        if not visible or visible[0] == "-1":
            return None
        gpu = environ.get(GPU_VARIABLE)
        if gpu and gpu in visible:
            return visible.index(gpu)
        if len(visible) == 1:
            return 0
    return local_rank


def foreign_device_message(rank: int, local_rank: int, local_world_size: int, used: int,
                           own: int, visible: Sequence[str] = ()) -> str | None:
    """What to say when rank ``rank`` computes on ``cuda:used`` but owns ``cuda:own``: None
    unless ``cuda:used`` is the GPU of another engine on this host (the ranks would pile up
    on it).

    Example::

        >>> print(foreign_device_message(1, 1, 2, used=0, own=1))  # doctest: +ELLIPSIS
        rank 1 (LOCAL_RANK 1) computes on cuda:0, the GPU of LOCAL_RANK 0 on this host...
    """
    if used == own or not 0 <= used < local_world_size:
        return None
    physical = f" (GPU {visible[used]})" if used < len(visible) else ""
    return (f"rank {rank} (LOCAL_RANK {local_rank}) computes on cuda:{used}, the GPU of "
            f"LOCAL_RANK {used} on this host{physical}, so the ranks would share one GPU. "
            f"Each engine sees its host's GPUs as torchrun gives them; its own is "
            f"cuda:{own}, which is the current device: write device=\"cuda\" (or phalanx's "
            f"`device`, or f\"cuda:{{os.environ['LOCAL_RANK']}}\") instead of \"cuda:{used}\"; "
            f"load checkpoints with map_location=device")
