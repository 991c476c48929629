"""Commits of a sharded run: torch's distributed checkpoint (DCP), one folder per commit.

A replicated commit is one rank's ``torch.save`` of the whole state: any rank's copy restores
every rank.  A sharded model's state dict on a rank is only that rank's shard, so a sharded
commit is a DCP checkpoint instead: every rank writes its shards of the sharded models and of
their optimizers' state, in parallel, into one folder ``BASE/<lineage>/sharded/step-<S>/``; a
resume on any number of ranks reads, for each of its new shards, the pieces of the saved ones
it covers (DCP reshards on load).  BASE is ``--checkpoint-dir`` (a filesystem every host reads),
else a private folder of the kernel's, which its own host's engines share.

Beside DCP's files rank 0 writes ``commit.pt``: the step, the optimizer-step count, the world
size, every rank's RNG states and the state of the cell's other objects (LR schedulers, a
model left unsharded: the same on every rank, so rank 0's copy).  It is written last and
atomically, so it marks the commit complete: a folder without it is a commit some rank did not
finish, never resumed from.  Read with ``torch.load(weights_only=True)``: no code is unpickled.

Example (inside ``%%distributed_fit --checkpoint-every 50 --checkpoint-dir ckpt``)::

    model = wrap(Transformer(), shard=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in steps(1000):   # commits at 50, 100, ...; --resume on 3 ranks continues
        ...
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import Any

from . import _checkpoint as ck
from ._commits import KEEP
from ..sync._sharded import is_sharded

__all__ = ["save", "load", "complete_steps", "prune_after", "folder"]

MARKER = "commit.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def folder(base: str, key: str, step: int) -> str:
    return os.path.join(_steps_dir(base, key), f"step-{step}")


def _steps_dir(base: str, key: str) -> str:
    return os.path.join(os.path.expanduser(base), key, "sharded")


def _all_steps(base: str, key: str) -> list[int]:
    try:
        names = os.listdir(_steps_dir(base, key))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_STEP_DIR.match, names) if m)


def complete_steps(base: str | None, key: str) -> list[int]:
    """The steps of ``key`` whose sharded commit every rank finished (the marker is there)."""
    if not base:
        return []
    return [s for s in _all_steps(base, key)
            if os.path.exists(os.path.join(folder(base, key, s), MARKER))]


def save(objects: dict[str, Any], base: str, key: str, rank: int, meta: dict) -> None:
    """Commit ``objects`` at ``meta["step"]`` (a collective: every rank calls it)."""
    import torch.distributed.checkpoint as dcp

    path = folder(base, key, meta["step"])
    if rank == 0:  # a marker left by an abandoned timeline must not vouch for these files
        _remove(os.path.join(path, MARKER))
    sharded = {name: obj for name, obj in objects.items() if _model_of(obj, objects) is not None}
    dcp.save(_sharded_state(sharded, objects), checkpoint_id=path)
    if rank != 0:
        return
    plain = {name: obj for name, obj in objects.items() if name not in sharded}
    blob = ck.to_bytes({**meta, "sharded": sorted(sharded), "plain": ck.save_state(plain)})
    partial = os.path.join(path, f"{MARKER}.{os.getpid()}.partial")
    with open(partial, "wb") as f:
        f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, os.path.join(path, MARKER))
    kept = complete_steps(base, key)[-KEEP:]
    for old in _all_steps(base, key):
        if old < kept[0]:
            shutil.rmtree(folder(base, key, old), ignore_errors=True)


def load(objects: dict[str, Any], base: str, key: str, step: int) -> dict:
    """Load commit ``step`` into the cell's objects of the same names, resharded for this
    world (a collective); returns what ``commit.pt`` holds."""
    import torch.distributed.checkpoint as dcp

    path = folder(base, key, step)
    with open(os.path.join(path, MARKER), "rb") as f:
        meta = ck.from_bytes(f.read())
    missing = [name for name in meta["sharded"] if _model_of(objects.get(name), objects) is None]
    if missing:
        raise RuntimeError(
            f"cannot resume from step {step}: the commit holds the sharded "
            f"{', '.join(map(repr, missing))}, which the cell has not sharded when "
            f"phalanx.steps() starts; wrap the model (wrap(model, shard=True)) and create its "
            f"optimizer under the same names before the loop")
    sharded = {name: objects[name] for name in meta["sharded"]}
    state = _sharded_state(sharded, objects)  # this world's shards, for DCP to fill
    dcp.load(state, checkpoint_id=path)
    _set_sharded_state(sharded, objects, state)
    ck.load_state({n: o for n, o in objects.items() if n not in sharded}, meta["plain"], step)
    return meta


def prune_after(base: str, key: str, step: int) -> None:
    """Forget commits past ``step``: they belong to a timeline that was abandoned (rank 0)."""
    for later in _all_steps(base, key):
        if later > step:
            shutil.rmtree(folder(base, key, later), ignore_errors=True)


def _sharded_state(sharded: dict[str, Any], objects: dict[str, Any]) -> dict:
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict)

    state = {}
    for name, obj in sharded.items():
        model = _model_of(obj, objects)
        state[name] = get_model_state_dict(obj) if model is obj \
            else get_optimizer_state_dict(model, obj)
    return state


def _set_sharded_state(sharded: dict[str, Any], objects: dict[str, Any], state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import (set_model_state_dict,
                                                         set_optimizer_state_dict)

    for name, obj in sharded.items():
        model = _model_of(obj, objects)
        if model is obj:
            set_model_state_dict(obj, state[name])
        else:
            set_optimizer_state_dict(model, obj, state[name])


def _model_of(obj: Any, objects: dict[str, Any]) -> Any:
    """``obj`` itself when it is a sharded model; the sharded model of ``objects`` whose
    parameters it trains when it is an optimizer; else None (saved as a plain state dict)."""
    if is_sharded(obj):
        return obj
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.optim.Optimizer):
        return None
    trained = {id(p) for group in obj.param_groups for p in group["params"]}
    for model in (o for o in objects.values() if is_sharded(o)):
        if any(id(p) in trained for p in model.parameters()):
            return model
    from ..sync._training_watch import is_dtensor

    if any(is_dtensor(p) for group in obj.param_groups for p in group["params"]):
        raise RuntimeError("an optimizer of a sharded model can be committed only with its "
                           "model: bind the model to a name at the top level of the cell")
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
