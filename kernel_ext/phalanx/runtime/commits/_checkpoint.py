"""Checkpoints of a run's training state: what a commit saves, where it is kept, how it is read.

A commit is taken at a :func:`phalanx.steps` boundary (see :mod:`._resume`) and holds

* the objects the run's fit mode names (:meth:`~phalanx.runtime.run._fit_mode.FitMode.checkpointed`; replicated:
  every object bound at the top level of the cell that has ``state_dict``/``load_state_dict``,
  such as models, optimizers, LR schedulers, grad scalers), serialized with ``torch.save``;
* the loop step (iterations completed) and the optimizer-step counter;
* the RNG states (``random``, ``numpy``, ``torch`` and CUDA when used) of *every* rank, gathered
  at commit time, so a rank whose engine died can get its own back from any survivor.

Commits live in the engine's memory (the last :data:`~._commits.KEEP` of the current lineage, in
the :class:`~._commits.CommitStore` of :mod:`._commits`; a lineage is one chain of runs: a run and
its ``--resume``s) and, with ``--checkpoint-dir``, on disk as
``DIR/<lineage>/rank-<r>/step-<S>.pt`` (written to a temporary name, then renamed: a reader never
sees half a file).  Everything is stored as tensors and plain Python types, so reading a commit
uses ``torch.load(weights_only=True)`` and never unpickles code.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

from ._commits import KEEP, Commit

# --- what is saved ------------------------------------------------------------------------------

def to_bytes(obj: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def from_bytes(blob: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(blob), weights_only=True, map_location=_onto_this_gpu)


def _onto_this_gpu(storage: Any, location: str) -> Any:
    """A tensor saved on a GPU comes back on this engine's (the current device): a commit a
    peer sends holds that peer's ``cuda:LOCAL_RANK``, another engine's GPU here."""
    if location.startswith("cuda"):
        import torch

        return storage.cuda(torch.cuda.current_device())
    return storage


def save_state(objects: dict[str, Any]) -> bytes:
    return to_bytes({name: obj.state_dict() for name, obj in objects.items()})


def load_state(objects: dict[str, Any], blob: bytes, step: int) -> None:
    """Load a commit's states into the cell's objects of the same names."""
    saved = from_bytes(blob)
    missing = [name for name in saved if name not in objects]
    if missing:
        raise RuntimeError(
            f"cannot resume from step {step}: the checkpoint holds {', '.join(map(repr, missing))} "
            f"but the cell has no such object when phalanx.steps() starts; create the model and "
            f"optimizer under the same names before the loop")
    for name, state in saved.items():
        objects[name].load_state_dict(state)


def capture_rng() -> bytes:
    """This process's RNG states (random, numpy, torch, CUDA when initialised) as bytes."""
    import random

    import numpy as np
    import torch

    legacy = np.random.get_state()
    assert isinstance(legacy, tuple)  # numpy's global generator is an MT19937: its state a tuple
    kind, keys, pos, has_gauss, cached = legacy
    state = {"random": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return to_bytes(state)


def restore_rng(blob: bytes) -> None:
    import random

    import numpy as np
    import torch

    state = from_bytes(blob)
    version, internal, gauss = state["random"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- on disk ------------------------------------------------------------------------------------

_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


def rank_dir(directory: str, key: str, rank: int) -> str:
    return os.path.join(os.path.expanduser(directory), key, f"rank-{rank}")


def write_commit(directory: str, key: str, rank: int, commit: Commit) -> str:
    """Write this rank's part of ``commit`` (its own RNG only); keep the last ``KEEP``."""
    folder = rank_dir(directory, key, rank)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step-{commit.step}.pt")
    blob = to_bytes({"step": commit.step, "opt_steps": commit.opt_steps,
                     "world_size": commit.world_size, "state": commit.state, "rng": commit.rng[rank]})
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    for old in disk_steps(directory, key, rank)[:-KEEP]:
        try:
            os.remove(os.path.join(folder, f"step-{old}.pt"))
        except FileNotFoundError:
            pass
    return path


def disk_steps(directory: str | None, key: str, rank: int) -> list[int]:
    if not directory:
        return []
    try:
        names = os.listdir(rank_dir(directory, key, rank))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_STEP_FILE.match, names) if m)


def read_commit(directory: str, key: str, rank: int, step: int) -> tuple[Commit, bytes]:
    """A commit from disk and this rank's RNG states."""
    with open(os.path.join(rank_dir(directory, key, rank), f"step-{step}.pt"), "rb") as f:
        saved = from_bytes(f.read())
    commit = Commit(saved["step"], saved["opt_steps"], saved["world_size"], saved["state"], [])
    return commit, saved["rng"]

