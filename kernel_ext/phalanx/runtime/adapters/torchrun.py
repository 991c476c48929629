"""A torchrun-style script pasted into a ``%%distributed_fit`` cell runs as torchrun would run it.

Such a script expects what torchrun gives each of its processes: the environment variables of
torch's elastic launcher (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ...), a call
to ``init_process_group()`` that forms the group, and a ``destroy_process_group()`` at its end
that takes it down.  An engine already holds the warm default group the cells share (see
:mod:`phalanx.runtime.adapters._group`), so for the duration of one cell :func:`torchrun_world`:

* sets those variables (:func:`torchrun_env`) and restores every one exactly afterwards;
* makes ``init_process_group(...)`` join the warm group instead of failing ("initialize the
  default process group twice"): a different backend warns (:class:`BackendMismatchWarning`),
  a different world size or rank raises (:class:`WorldMismatchError`);
* makes ``destroy_process_group()`` of the default group a no-op, so the next cell still finds
  the warm group (other groups, e.g. from ``new_group()``, are destroyed as usual);
* refuses launchers that would fork or spawn more ranks from this one
  (``torch.multiprocessing.spawn``/``start_processes``, torch's elastic launch, used by
  Lightning's ``ddp_spawn``/``ddp_fork``/``ddp_notebook`` and accelerate's ``notebook_launcher``):
  their children would wait in a collective with peers that never come, and outlive the run;
* hides the engine's interactive prompt (``sys.ps1``, which the engines have) and the
  ``_IS_INTERACTIVE`` flags Lightning computed from it at import (:func:`_not_interactive`):
  an engine runs the cell as torchrun runs a script, and Lightning refuses
  ``Trainer(strategy="ddp")`` in "an interactive environment" (it would relaunch the notebook as
  a script; under torchrun's variables it launches nothing).

``multiprocessing.Process`` and ``Pool`` stay untouched: DataLoader workers use them.

Example::

    with torchrun_world(spec, group):
        exec(code, namespace)   # os.environ["LOCAL_RANK"], dist.init_process_group() ... work

    >>> env = torchrun_env(rank=3, world_size=4, hosts=("a", "a", "b", "b"), run_id="r1")
    >>> env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["MASTER_ADDR"]
    ('1', '2', '1', 'a')
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import warnings
from typing import (TYPE_CHECKING, Callable, Iterator, Mapping, MutableMapping, NoReturn, Sequence,
                    TypeVar)

if TYPE_CHECKING:
    import torch.distributed

    from ..run._group import GroupHandle
    from ...wire._seam import RunSpec

__all__ = ["torchrun_world", "torchrun_env", "TORCHRUN_VARIABLES", "MASTER_PORT",
           "BackendMismatchWarning", "WorldMismatchError", "SpawnInCellError"]

# torchrun's own default for --master-port.  Nothing listens there and nothing should connect:
# the default group already exists, and init_process_group (the one thing that would rendezvous
# through MASTER_ADDR:MASTER_PORT) joins it instead.  A fixed value keeps every rank agreeing
# without a message between them.
MASTER_PORT = 29500

# What torch's local elastic agent puts in each worker's environment (torch/distributed/
# elastic/agent/server/local_elastic_agent.py), less TORCHELASTIC_USE_AGENT_STORE: it tells an
# env:// rendezvous to use an agent's store, and there is no agent (nor a rendezvous) here.
TORCHRUN_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)

_ALTERNATIVE = ("call the training function directly instead of spawning processes "
                "(Lightning: strategy='ddp' instead of 'ddp_notebook'/'ddp_spawn'/'ddp_fork'; "
                "accelerate: call the function instead of notebook_launcher)")


class BackendMismatchWarning(UserWarning):
    """The cell asked ``init_process_group`` for a backend the warm group does not use."""


class WorldMismatchError(RuntimeError):
    """The cell asked ``init_process_group`` for a world size or rank other than the run's."""


class SpawnInCellError(RuntimeError):
    """The cell tried to fork or spawn ranks of its own (each engine already is one)."""


def torchrun_env(rank: int, world_size: int, hosts: Sequence[str], run_id: str,
                 environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables torchrun would set for ``rank``; ``hosts`` is the host of each rank (empty:
    all on one host).  A host's ranks are its "workers", hosts count in order of first rank."""
    hosts = tuple(hosts) if len(hosts) == world_size else ("",) * world_size
    order = list(dict.fromkeys(hosts))          # hosts in order of their first rank
    here = hosts[rank]
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(hosts[:rank].count(here)),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(hosts.count(here)),
        "GROUP_RANK": str(order.index(here)),
        "GROUP_WORLD_SIZE": str(len(order)),
        "ROLE_RANK": str(rank),                 # one role: a role's ranks are all the ranks
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",                 # torchrun's --role default
        # rank 0's host; on one host the loopback, where the engines' gloo listens (see _group)
        "MASTER_ADDR": hosts[0] if len(order) > 1 else "127.0.0.1",
        "MASTER_PORT": str(MASTER_PORT),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",      # phalanx's retries are new runs, not restarts
        "TORCHELASTIC_MAX_RESTARTS": "0",
        # torchrun keeps the launcher's value, else sets "1"; it only affects NCCL groups the cell
        # itself creates (new_group), the warm group exists already
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


@contextlib.contextmanager
def torchrun_world(spec: RunSpec, group: GroupHandle | None = None) -> Iterator[dict[str, str]]:
    """For the cell of ``spec`` (a :class:`~phalanx.runtime.adapters._seam.RunSpec`): torchrun's environment, and
    torch's init/destroy/spawn calls fitted to the warm group.  ``group`` (the engine's
    :class:`~phalanx.runtime.adapters._group.GroupHandle`) is accepted for symmetry; the default group itself is read
    from torch.  Yields the variables set."""
    env = torchrun_env(spec.rank, spec.world_size, spec.group.hosts, spec.run_id)
    with _environment(env), _patched(_patches(spec.rank, spec.world_size)), _not_interactive():
        yield env


# Lightning (lightning.fabric.utilities.imports) evaluates hasattr(sys, "ps1") once, at import, and
# its modules copy the result under this name.
_INTERACTIVE_FLAG = "_IS_INTERACTIVE"


@contextlib.contextmanager
def _not_interactive(modules: Mapping[str, object] = sys.modules) -> Iterator[None]:
    """No ``sys.ps1`` for the block, and every loaded module's ``_IS_INTERACTIVE`` flag False (one
    imported meanwhile computes False itself).  Afterwards ``sys.ps1`` is back, and the flags of
    modules loaded before it True again; those loaded during it hold what they would outside."""
    had_prompt = hasattr(sys, "ps1")
    prompt = getattr(sys, "ps1", None)
    outside = had_prompt or bool(sys.flags.interactive)   # Lightning's own expression
    holders = _FLAG_HOLDERS.setdefault(id(modules), _FlagHolders())
    holders.scan(modules)
    loaded = set(holders.modules)
    flagged = [m for m in holders.modules.values() if _interactive_flag(m) is True]
    try:
        if had_prompt:
            del sys.ps1
        for module in flagged:
            setattr(module, _INTERACTIVE_FLAG, False)
        yield
    finally:
        holders.scan(modules)
        steps = [functools.partial(setattr, module, _INTERACTIVE_FLAG, True) for module in flagged]
        steps += [functools.partial(setattr, module, _INTERACTIVE_FLAG, outside)
                  for name, module in list(holders.modules.items())
                  if name not in loaded and _interactive_flag(module) is False]
        if had_prompt:
            steps.append(functools.partial(setattr, sys, "ps1", prompt))
        _uninterrupted(steps)


class _FlagHolders:
    """The modules of one module table that have an ``_IS_INTERACTIVE`` flag.  Each cell looks
    only at the modules loaded since the last look: reading all ~2,500 of a warm engine took
    1.3 ms a cell (measured), on a warm re-run of about 28 ms."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.modules: dict[str, object] = {}
        self._size = -1  # the table's size at the last look: unchanged, nothing was imported

    def scan(self, table: Mapping[str, object]) -> None:
        if len(table) == self._size:
            return
        self._size = len(table)
        for name in [n for n in list(table) if n not in self.seen]:
            self.seen.add(name)
            if _interactive_flag(table.get(name)) is not None:
                self.modules[name] = table[name]


_FLAG_HOLDERS: dict[int, _FlagHolders] = {}  # id(module table) -> its holders (sys.modules: one)


def _interactive_flag(module: object) -> object:
    """The module's ``_IS_INTERACTIVE`` (None without one), read without a module __getattr__."""
    try:
        return vars(module).get(_INTERACTIVE_FLAG)
    except TypeError:   # not a module (sys.modules may hold anything)
        return None


@contextlib.contextmanager
def _environment(values: Mapping[str, str],
                 environ: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """``values`` set in ``environ``; afterwards each name as it was before (unset if it was),
    whatever the cell did to it meanwhile."""
    before = {name: environ.get(name) for name in values}
    try:
        environ.update(values)
        yield
    finally:
        _uninterrupted([functools.partial(_put_back, environ, name, old)
                        for name, old in before.items()])


def _put_back(environ: MutableMapping[str, str], name: str, old: str | None) -> None:
    if old is None:
        environ.pop(name, None)
    else:
        environ[name] = old


Patch = tuple[object, str, Callable[..., object]]   # (owner, name, replacement)
F = TypeVar("F", bound=Callable[..., object])


@contextlib.contextmanager
def _patched(patches: list[Patch]) -> Iterator[None]:
    """Each ``(owner, name, replacement)`` set for the block, the original put back after."""
    undo = []
    try:
        for owner, name, replacement in patches:
            original = _unwrapped(getattr(owner, name))
            undo.append(functools.partial(setattr, owner, name, original))
            setattr(owner, name, replacement)
        yield
    finally:
        _uninterrupted(undo[::-1])


def _uninterrupted(steps: Sequence[Callable[[], object]]) -> None:
    """Run every step even if the kernel's interrupt lands meanwhile (a patch left behind would
    turn the next group's formation into a no-op); the interrupt is raised once all are done."""
    interrupted = None
    for step in steps:
        for _attempt in range(3):
            try:
                step()
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
    if interrupted is not None:
        raise interrupted


def _patches(rank: int, world_size: int) -> list[Patch]:
    """What to replace for the cell: in every module a script may take the name from."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.multiprocessing as tmp

    spawn_module = sys.modules["torch.multiprocessing.spawn"]  # the attribute is the function
    init = _join_warm_group(_unwrapped(c10d.init_process_group), rank, world_size)
    destroy = _keep_warm_group(_unwrapped(c10d.destroy_process_group))
    patches: list[Patch] = [(m, "init_process_group", init) for m in (dist, c10d)]
    patches += [(m, "destroy_process_group", destroy) for m in (dist, c10d)]
    launchers = [(owner, name, f"torch.multiprocessing.{name}") for owner in (tmp, spawn_module)
                 for name in ("spawn", "start_processes")]
    try:  # torch's elastic launch (torchrun's own, accelerate's notebook_launcher) forks too
        import torch.distributed.launcher.api as launcher

        launchers += [(launcher, name, f"torch.distributed.launcher.{name}")
                      for name in ("elastic_launch", "launch_agent")]
    except ImportError:
        pass
    for owner, name, what in launchers:
        original = _unwrapped(getattr(owner, name))
        patches.append((owner, name, _refuse(what, original, rank, world_size)))
    return patches


def _unwrapped(fn: F) -> F:
    """torch's own function, should a patch of ours have been left in place (never restore a
    patch as if it were the original)."""
    return getattr(fn, "_phalanx_original", fn)


def _join_warm_group(original: Callable[..., None], rank: int,
                     world_size: int) -> Callable[..., None]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: object, **kwargs: object) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():  # never in a run (its group is formed first): torch's way
            return original(*args, **kwargs)
        asked = signature.bind(*args, **kwargs).arguments  # a wrong call fails as torch's would
        _check_world(asked.get("world_size", -1), asked.get("rank", -1), rank, world_size)
        _check_backend(asked.get("backend"), str(dist.get_backend()))
        return None  # the warm group is the default group: nothing to form

    _mark_original(init_process_group, original)
    return init_process_group


def _check_world(asked_world: int | None, asked_rank: int | None, rank: int, world_size: int) -> None:
    if asked_world not in (None, -1) and int(asked_world) != world_size:
        raise WorldMismatchError(
            f"init_process_group(world_size={asked_world}) in a %%distributed_fit cell, but this "
            f"run has {world_size} ranks (one per engine): scale the cluster to {asked_world} "
            f"engines (%cluster scale {asked_world}) or leave world_size out")
    if asked_rank not in (None, -1) and int(asked_rank) != rank:
        raise WorldMismatchError(
            f"init_process_group(rank={asked_rank}) on the engine that runs rank {rank} of "
            f"{world_size}: take the rank from os.environ['RANK'] or leave it out")


def _backends(name: str) -> set[str]:
    """``"gloo"`` -> {"gloo"}; ``"cpu:gloo,cuda:nccl"`` -> {"gloo", "nccl"}."""
    return {part.split(":")[-1].strip() for part in name.lower().split(",") if part.strip()}


def _check_backend(asked: str | None, actual: str) -> None:
    if asked is None or _backends(str(asked)) <= _backends(actual):
        return
    warnings.warn(BackendMismatchWarning(
        f"init_process_group(backend={str(asked)!r}) joins phalanx's warm process group, which "
        f"uses {actual!r}: this run communicates over {actual}, not {asked}"
        + (" (these engines have no NCCL group: start the cluster with GPUs for NCCL)"
           if "nccl" in _backends(str(asked)) and "nccl" not in _backends(actual) else "")),
        stacklevel=3)  # at the cell's line that called init_process_group


def _keep_warm_group(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def destroy_process_group(group: torch.distributed.ProcessGroup | None = None) -> None:
        import torch.distributed as dist

        # The script's teardown of the default group: the warm group outlives the cell (phalanx
        # destroys it itself when the engine set changes or a run fails).
        if group is None or (dist.is_initialized() and group is dist.GroupMember.WORLD):
            return None
        return original(group)

    _mark_original(destroy_process_group, original)
    return destroy_process_group


def _refuse(what: str, original: Callable[..., object], rank: int,
            world_size: int) -> Callable[..., NoReturn]:
    def refused(*args: object, **kwargs: object) -> NoReturn:
        raise SpawnInCellError(
            f"{what} inside a %%distributed_fit cell: phalanx already runs this cell once per "
            f"engine (rank {rank} of {world_size}): {_ALTERNATIVE}")

    refused.__name__ = refused.__qualname__ = what.rsplit(".", 1)[-1]
    _mark_original(refused, original)
    return refused


def _mark_original(patch: Callable[..., object], original: Callable[..., object]) -> None:
    """Where :func:`_unwrapped` finds torch's own function behind a patch of ours."""
    vars(patch)["_phalanx_original"] = original
