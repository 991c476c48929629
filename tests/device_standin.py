"""Engines told they have GPUs, on a machine without any: each framework's device choice runs
through its real code, and the device it picks is reported.

Run as a script (its own process: it replaces parts of ``torch.cuda`` and forms torch's "fake"
process group), with a JSON list of engines on stdin, each ``{"rank", "hosts", "env",
"lightning"}`` (``env``: the engine's pinning environment).  For each engine it sets the
engine's pinning and torchrun's variables, lets CUDA count the GPUs that
``CUDA_VISIBLE_DEVICES`` lists (``set_device`` of one beyond them fails as CUDA's "invalid
device ordinal" does), then asks, in order: phalanx's own choice (``use_own_gpu``), what
``"cuda"`` then means, a torchrun script's ``set_device(LOCAL_RANK)``, accelerate's
``PartialState``, Hugging Face ``TrainingArguments`` and Lightning's ``Trainer(devices=N,
num_nodes=M, strategy="ddp")``.  Prints one JSON object per engine: each pick as ``"cuda:N"``
or ``"error: ..."``, and who is the local main process.

Example::

    echo '[{"rank": 1, "hosts": ["a", "a"], "env": {"CUDA_VISIBLE_DEVICES": "0,1",
           "PHALANX_GPU": "1"}, "lightning": true}]' | python tests/device_standin.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.distributed as dist

from phalanx.runtime.run._own_gpu import use_own_gpu
from phalanx.runtime.adapters.torchrun import TORCHRUN_VARIABLES, torchrun_env

_current = {"index": 0}


def _visible() -> int:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in listed.split(",") if d.strip()])


def _set_device(device: Any) -> None:
    index = device if isinstance(device, int) else torch.device(device).index
    index = 0 if index is None else index
    if not 0 <= index < _visible():
        raise RuntimeError("CUDA error: invalid device ordinal")
    _current["index"] = index


def pretend_gpus() -> None:
    """CUDA as an engine would find it: as many GPUs as CUDA_VISIBLE_DEVICES lists."""
    cuda = torch.cuda
    cuda.is_available = lambda: _visible() > 0
    cuda.device_count = _visible
    cuda.current_device = lambda: _current["index"]
    cuda.set_device = _set_device
    cuda.get_device_capability = lambda device=None: (9, 0)
    cuda.get_device_name = lambda device=None: "a GPU that is not there"
    cuda.is_bf16_supported = lambda *args, **kwargs: True


def pick(ask: Callable[[], Any]) -> str:
    try:
        device = torch.device(ask())
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    index = _current["index"] if device.index is None else device.index
    return f"{device.type}:{index}" if device.type == "cuda" else device.type


def one_engine(engine: dict, folder: str) -> dict:
    hosts = engine["hosts"]
    rank, world = engine["rank"], len(hosts)
    for name in TORCHRUN_VARIABLES + ("CUDA_VISIBLE_DEVICES", "PHALANX_GPU"):
        os.environ.pop(name, None)
    os.environ.update(engine["env"])
    os.environ.update(torchrun_env(rank, world, hosts, "standin", environ={}))
    _current["index"] = 0  # a new process's current device
    if dist.is_initialized():
        dist.destroy_process_group()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    spec = SimpleNamespace(rank=rank, world_size=world, group=SimpleNamespace(hosts=tuple(hosts)),
                           run_id="standin")
    picks = {"phalanx": pick(lambda: use_own_gpu(spec)), "cuda": pick(lambda: "cuda")}
    picks["torchrun"] = pick(lambda: _torchrun_script())
    picks["accelerate"], local_main = _accelerate()
    picks["transformers"] = pick(lambda: _transformers(folder))
    if engine.get("lightning"):
        picks["lightning"] = pick(lambda: _lightning(int(os.environ["LOCAL_WORLD_SIZE"]),
                                                     int(os.environ["GROUP_WORLD_SIZE"])))
    return {"rank": rank, "picks": picks, "local_main": local_main}


def _torchrun_script() -> Any:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _accelerate() -> tuple[str, bool]:
    from accelerate import PartialState

    PartialState._reset_state()
    state = PartialState()
    return pick(lambda: state.device), bool(state.is_local_main_process)


def _transformers(folder: str) -> Any:
    from accelerate import PartialState
    from transformers import TrainingArguments

    PartialState._reset_state()
    return TrainingArguments(output_dir=folder, report_to=[]).device


def _lightning(devices: int, nodes: int) -> Any:
    import lightning

    trainer = lightning.Trainer(accelerator="gpu", devices=devices, num_nodes=nodes,
                                strategy="ddp", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    device = trainer.strategy.root_device
    trainer.strategy.accelerator.setup_device(device)  # what its fit does first: set_device
    return device


def main() -> None:
    warnings.simplefilter("ignore")
    pretend_gpus()
    engines = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as folder:
        for engine in engines:
            print(json.dumps(one_engine(engine, folder)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
