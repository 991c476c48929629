"""A torchrun-style script pasted into a ``%%distributed_fit`` cell runs as torchrun would run it
(``runtime/adapters/torchrun.py``): torchrun's environment variables for the cell only, its
``init_process_group()`` joining the warm group, its ``destroy_process_group()`` leaving that group
to the next cell, and fork/spawn launchers refused at once.

The unit tests need no cluster (one of them runs a real one-rank gloo group in a subprocess);
those marked ``cluster`` run on 2 real engines."""

from __future__ import annotations

import os
import subprocess
import sys
import re
import time
import warnings

import numpy as np
import pytest

from conftest import run_cell
from phalanx.runtime.adapters.torchrun import (MASTER_PORT, TORCHRUN_VARIABLES,
                                             BackendMismatchWarning, WorldMismatchError,
                                             _backends, _check_backend, _check_world,
                                             _environment, torchrun_env)
from deadlines import hang_limit

cluster = pytest.mark.cluster


# ----------------------------------------------------------------------------- unit: no cluster

def test_the_variables_of_two_hosts_with_two_ranks_each():
    hosts = ("a", "a", "b", "b")
    envs = [torchrun_env(r, 4, hosts, "run-7", environ={}) for r in range(4)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2", "2", "2", "2"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["ROLE_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in envs} == {e["ROLE_WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["MASTER_ADDR"] for e in envs} == {"a"}           # rank 0's host
    assert {e["MASTER_PORT"] for e in envs} == {str(MASTER_PORT)}
    assert {e["ROLE_NAME"] for e in envs} == {"default"}
    assert {e["TORCHELASTIC_RUN_ID"] for e in envs} == {"run-7"}
    assert {e["TORCHELASTIC_RESTART_COUNT"] for e in envs} == {"0"}
    assert {e["TORCHELASTIC_MAX_RESTARTS"] for e in envs} == {"0"}
    assert {e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for e in envs} == {"1"}   # torchrun's default
    assert set(envs[0]) == set(TORCHRUN_VARIABLES)


def test_hosts_count_in_order_of_first_rank_and_may_hold_unequal_shares():
    hosts = ("b", "a", "b", "c", "a", "b")
    envs = [torchrun_env(r, 6, hosts, "r", environ={}) for r in range(6)]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "1", "0", "2", "1", "0"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1", "0", "1", "2"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["3", "2", "3", "1", "2", "3"]
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["MASTER_ADDR"] for e in envs} == {"b"}


def test_one_host_uses_the_loopback_and_unknown_hosts_count_as_one():
    for hosts in (("h", "h", "h"), ()):
        env = torchrun_env(2, 3, hosts, "r", environ={})
        assert (env["MASTER_ADDR"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"],
                env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("127.0.0.1", "2", "3", "0", "1")


def test_a_launcher_setting_of_nccl_error_handling_is_kept_as_torchrun_keeps_it():
    env = torchrun_env(0, 1, ("h",), "r", environ={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


def test_the_environment_is_restored_exactly_even_when_the_block_raises():
    environ = {"MASTER_PORT": "1234", "HOME": "/h"}
    values = torchrun_env(1, 2, ("a", "a"), "r", environ={})
    with pytest.raises(ValueError), _environment(values, environ):
        assert environ["MASTER_PORT"] == str(MASTER_PORT) and environ["LOCAL_RANK"] == "1"
        environ["RANK"] = "changed by the cell"
        del environ["WORLD_SIZE"]
        raise ValueError("the cell failed")
    assert environ == {"MASTER_PORT": "1234", "HOME": "/h"}   # set ones back, unset ones gone


def test_the_backend_and_world_checks():
    assert _backends("cpu:gloo,cuda:NCCL") == {"gloo", "nccl"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for asked in (None, "gloo", "GLOO", "cpu:gloo"):
            _check_backend(asked, "gloo")                       # no warning
    with pytest.warns(BackendMismatchWarning, match=r"backend='nccl'.*uses 'gloo'.*no NCCL group"):
        _check_backend("nccl", "gloo")
    _check_world(-1, -1, rank=1, world_size=2)
    _check_world(2, 1, rank=1, world_size=2)
    with pytest.raises(WorldMismatchError, match=r"world_size=4.*this run has 2 ranks"):
        _check_world(4, -1, rank=1, world_size=2)
    with pytest.raises(WorldMismatchError, match=r"rank=0\) on the engine that runs rank 1 of 2"):
        _check_world(-1, 0, rank=1, world_size=2)


ONE_RANK = """
import os, tempfile, types, warnings
import torch, torch.distributed as dist, torch.multiprocessing as mp
from phalanx.runtime.run._group import GroupSpec
from phalanx.runtime.adapters.torchrun import torchrun_world, SpawnInCellError

before = (dict(os.environ), dist.init_process_group, dist.destroy_process_group, mp.spawn,
          mp.start_processes)
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
warm = dist.GroupMember.WORLD
group = GroupSpec("k", 0, 1, ("file", ""), "gloo", 30.0, hosts=("h",))
spec = types.SimpleNamespace(rank=0, world_size=1, run_id="run-1", group=group)
with torchrun_world(spec) as env:
    assert os.environ["TORCHELASTIC_RUN_ID"] == "run-1" and os.environ["LOCAL_RANK"] == "0"
    from torch.distributed import init_process_group, destroy_process_group
    init_process_group()                      # torchrun style: from the environment
    init_process_group(backend="gloo", rank=0, world_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.distributed_c10d.init_process_group("nccl")
    assert "BackendMismatchWarning" in [type(w.message).__name__ for w in caught], caught
    sub = dist.new_group([0])
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group(sub)           # a group of the cell's own: really destroyed
    destroy_process_group()                   # the warm one: kept
    assert dist.is_initialized() and dist.GroupMember.WORLD is warm
    try:
        mp.spawn(print, nprocs=2)
    except SpawnInCellError as exc:
        assert "rank 0 of 1" in str(exc), exc
    else:
        raise AssertionError("spawn ran")
after = (dict(os.environ), dist.init_process_group, dist.destroy_process_group, mp.spawn,
         mp.start_processes)
assert after == before, [name for name, a, b in zip("env init destroy spawn start".split(),
                                                    after, before) if a != b]
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()                  # outside the cell torch's own again
assert not dist.is_initialized()
print("ok", flush=True)
# torch's gloo threads can abort the interpreter's teardown on a busy machine ("terminate called
# without an active exception", after "ok"): what is tested here has run by now.
os._exit(0)
"""


def test_a_real_one_rank_group_joined_kept_and_restored():
    """The patches on a real gloo group, in a fresh interpreter (this one holds no group)."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    done = subprocess.run([sys.executable, "-c", ONE_RANK], capture_output=True, text=True,
                          env=env, timeout=hang_limit(120))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


# ---------------------------------------------------------------- a public torchrun script, pasted

# pytorch/examples, distributed/ddp-tutorial-series/multigpu_torchrun.py (and its datautils.py),
# at commit 77f55b912142e11fcfdf5b530231fb9c52f181e8 (the script last changed in a308b4e9, datautils
# in f45e4184), https://github.com/pytorch/examples, BSD 3-Clause License:
#
#   Copyright (c) 2017, Pytorch contributors
#   All rights reserved.
#
#   Redistribution and use in source and binary forms, with or without modification, are
#   permitted provided that the following conditions are met:
#   * Redistributions of source code must retain the above copyright notice, this list of
#     conditions and the following disclaimer.
#   * Redistributions in binary form must reproduce the above copyright notice, this list of
#     conditions and the following disclaimer in the documentation and/or other materials
#     provided with the distribution.
#   * Neither the name of the copyright holder nor the names of its contributors may be used to
#     endorse or promote products derived from this software without specific prior written
#     permission.
#   THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS OR
#   IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND
#   FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR
#   CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR
#   CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
#   SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY
#   THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR
#   OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE
#   POSSIBILITY OF SUCH DAMAGE.
#
# Changed, and only so that it runs on CPU engines with gloo: each line marked "CHANGED (CPU)"
# (no torch.cuda.set_device; backend "gloo" for "nccl"; .to("cpu") for .to(self.gpu_id) on the
# model and each batch; DDP without device_ids; the snapshot loaded to "cpu").  Everything else,
# the torchrun parts included (LOCAL_RANK from the environment, init_process_group() without
# rank or world size, DistributedSampler, destroy_process_group() at the end, argparse under
# ``if __name__ == "__main__"``), is the upstream text.
DATAUTILS = """\
import torch
from torch.utils.data import Dataset

class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size
    
    def __getitem__(self, index):
        return self.data[index]
"""

MULTIGPU_TORCHRUN = """\
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
from datautils import MyTrainDataset

import torch.multiprocessing as mp
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
import os


def ddp_setup():
    # CHANGED (CPU): torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) removed
    init_process_group(backend="gloo")  # CHANGED (CPU): was "nccl"

class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to("cpu")  # CHANGED (CPU): was .to(self.gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)

        self.model = DDP(self.model)  # CHANGED (CPU): device_ids=[self.gpu_id] dropped

    def _load_snapshot(self, snapshot_path):
        loc = "cpu"  # CHANGED (CPU): was f"cuda:{self.gpu_id}"
        snapshot = torch.load(snapshot_path, map_location=loc)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to("cpu")  # CHANGED (CPU): was .to(self.gpu_id)
            targets = targets.to("cpu")  # CHANGED (CPU): was .to(self.gpu_id)
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=32, type=int, help='Input batch size on each device (default: 32)')
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size)
"""


def _torchrun_cell(workdir, script: str = MULTIGPU_TORCHRUN) -> str:
    """The script as a cell, after what torchrun would give it besides its environment: its
    sibling module, its command line (``multigpu_torchrun.py 2 1``: 2 epochs, a snapshot after
    each), its working directory (for ``snapshot.pt``), and one dataset on every rank (as if read
    from one file: the upstream one is random)."""
    setup = (f"import os, sys, types, torch\n"
             f"datautils = types.ModuleType('datautils')\n"
             f"exec({DATAUTILS!r}, datautils.__dict__)\n"
             f"sys.modules['datautils'] = datautils\n"
             f"sys.argv = ['multigpu_torchrun.py', '2', '1', '--batch_size', '32']\n"
             f"os.chdir({str(workdir)!r})\n"
             f"torch.manual_seed(0)\n")
    return "%%distributed_fit --no-widget\n" + setup + script


def _reference(loss: str) -> tuple[dict, dict]:
    """The same training in one process on the full data: the global batch of 2 ranks x 32 is
    the 64 rows a one-rank DistributedSampler gives at once (rank r takes every other row of the
    same shuffle).  Returns the initial and the trained state."""
    import types

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    datautils = types.ModuleType("datautils")
    exec(DATAUTILS, datautils.__dict__)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        dataset = datautils.MyTrainDataset(2048)
        model = torch.nn.Linear(20, 1)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for source, targets in DataLoader(dataset, batch_size=64, sampler=sampler):
            optimizer.zero_grad()
            getattr(F, loss)(model(source), targets).backward()
            optimizer.step()
    return initial, model.state_dict()


def _engine_process() -> dict:
    import os
    import sys

    import torch.distributed as dist

    return {"pid": os.getpid(), "cwd": os.getcwd(), "argv": list(sys.argv),
            "env": {name: os.environ.get(name) for name in TORCHRUN_VARIABLES},
            "world": id(dist.GroupMember.WORLD) if dist.is_initialized() else None}


def _put_engine_back(before: list[dict]) -> None:
    import os
    import sys

    mine = next(state for state in before if state["pid"] == os.getpid())
    os.chdir(mine["cwd"])
    sys.argv[:] = mine["argv"]
    sys.modules.pop("datautils", None)


@pytest.fixture
def engines(two_engines, shell):
    """The 2 engines with a formed group, put back afterwards (working directory, argv)."""
    run_cell(shell, "%%distributed_fit --no-widget\nwarm = 1\n")
    view = two_engines.cluster.view()
    before = view.apply_sync(_engine_process)
    yield view
    view.apply_sync(_put_engine_back, before)


NEXT_CELL = """%%distributed_fit --no-widget --return total
import torch, torch.distributed as dist
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
total = t.item()
"""


def _same_group_serves_the_next_cell(shell, view, before: list[dict]) -> None:
    """The script's destroy_process_group() left the warm group to the next cell."""
    assert [s["world"] for s in view.apply_sync(_engine_process)] == [s["world"] for s in before]
    run_cell(shell, NEXT_CELL)
    assert shell.user_ns["total"] == 3.0
    assert [s["world"] for s in view.apply_sync(_engine_process)] == [s["world"] for s in before]


def _snapshot(workdir) -> dict:
    import torch

    return torch.load(os.path.join(workdir, "snapshot.pt"))


@cluster
def test_the_upstream_torchrun_script_runs_unchanged_and_leaves_the_group(engines, shell, tmp_path):
    """Its loss, cross_entropy of one output column, is 0 whatever the model (a softmax over one
    class), so upstream's training leaves the parameters where they started: the one-process
    reference does too, and the cell must agree with it, then leave a working group behind."""
    before = engines.apply_sync(_engine_process)
    run_cell(shell, _torchrun_cell(tmp_path))
    snapshot = _snapshot(tmp_path)
    initial, trained = _reference("cross_entropy")
    assert snapshot["EPOCHS_RUN"] == 1                      # rank 0 saved after its last epoch
    for name, want in trained.items():
        np.testing.assert_allclose(snapshot["MODEL_STATE"][name], want, atol=1e-5)
        np.testing.assert_allclose(want, initial[name])     # the constant loss: nothing moves
    _same_group_serves_the_next_cell(shell, engines, before)


@cluster
def test_the_torchrun_script_with_a_loss_that_trains_matches_one_process(engines, shell, tmp_path):
    """The same script with ``F.mse_loss`` for ``F.cross_entropy`` (the one further change), so
    that training moves the model: 2 ranks with DDP and DistributedSampler equal one process on
    the full data."""
    script = MULTIGPU_TORCHRUN.replace("F.cross_entropy(", "F.mse_loss(")
    before = engines.apply_sync(_engine_process)
    run_cell(shell, _torchrun_cell(tmp_path, script))
    snapshot = _snapshot(tmp_path)
    initial, trained = _reference("mse_loss")
    moved = max(float((trained[k] - initial[k]).abs().max()) for k in trained)
    assert moved > 1e-3
    for name, want in trained.items():
        np.testing.assert_allclose(snapshot["MODEL_STATE"][name], want, atol=1e-5)
    _same_group_serves_the_next_cell(shell, engines, before)


# ----------------------------------------------------------------- the environment, on 2 engines

ENV_CELL = """
import os, torch.distributed as dist
from phalanx.runtime.adapters.torchrun import TORCHRUN_VARIABLES
mine = {name: os.environ.get(name) for name in TORCHRUN_VARIABLES}
envs = [None] * world_size
dist.all_gather_object(envs, mine)
"""


def _set_master_port(value: str | None) -> None:
    import os

    if value is None:
        os.environ.pop("MASTER_PORT", None)
    else:
        os.environ["MASTER_PORT"] = value


def _torch_is_torchs() -> list[str]:
    """Names of ours still in place of torch's functions (none, outside a cell)."""
    import sys

    import torch.distributed as dist
    import torch.multiprocessing as tmp

    owners = {"dist": dist, "c10d": dist.distributed_c10d, "mp": tmp,
              "mp.spawn": sys.modules["torch.multiprocessing.spawn"],
              "launcher": sys.modules.get("torch.distributed.launcher.api")}
    names = ("init_process_group", "destroy_process_group", "spawn", "start_processes",
             "elastic_launch", "launch_agent")
    return [f"{where}.{name}" for where, owner in owners.items() for name in names
            if owner is not None and hasattr(getattr(owner, name, None), "_phalanx_original")]


@cluster
def test_torchruns_variables_in_the_cell_and_as_before_after_it(engines, shell):
    engines.apply_sync(_set_master_port, "12345")   # one set before the cell must come back
    try:
        before = [s["env"] for s in engines.apply_sync(_engine_process)]
        assert before == [{**{n: None for n in TORCHRUN_VARIABLES}, "MASTER_PORT": "12345"}] * 2
        run_cell(shell, "%%distributed_fit --no-widget --return envs\n" + ENV_CELL)
        envs = shell.user_ns["envs"]
        assert [(e["RANK"], e["LOCAL_RANK"], e["ROLE_RANK"]) for e in envs] == \
            [("0", "0", "0"), ("1", "1", "1")]
        for env in envs:
            assert {k: env[k] for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE",
                                        "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
                                        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                                        "TORCHELASTIC_MAX_RESTARTS")} == {
                "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "2",
                "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(MASTER_PORT),
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}
        assert envs[0]["TORCHELASTIC_RUN_ID"] and \
            envs[0]["TORCHELASTIC_RUN_ID"] == envs[1]["TORCHELASTIC_RUN_ID"]
        assert [s["env"] for s in engines.apply_sync(_engine_process)] == before
        assert engines.apply_sync(_torch_is_torchs) == [[], []]
        # also when the cell fails, after changing one of them itself
        with pytest.raises(Exception, match="the cell failed"):
            run_cell(shell, "%%distributed_fit --no-widget\nimport os\n"
                            "assert os.environ['RANK'] == str(rank)\n"
                            "os.environ['MASTER_PORT'] = '1'\n"
                            "raise ValueError('the cell failed')\n")
        assert [s["env"] for s in engines.apply_sync(_engine_process)] == before
        assert engines.apply_sync(_torch_is_torchs) == [[], []]
    finally:
        engines.apply_sync(_set_master_port, None)


# ------------------------------------------------------------ init_process_group, on 2 engines

NCCL_CELL = """%%distributed_fit --no-widget --return warned,total
import warnings, torch, torch.distributed as dist
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    dist.init_process_group("nccl")
warned = [(type(w.message).__name__, str(w.message)) for w in caught]
t = torch.ones(1)
dist.all_reduce(t)
total = t.item()
"""


@cluster
def test_asking_for_nccl_on_cpu_engines_warns_and_runs_on_gloo(engines, shell):
    run_cell(shell, NCCL_CELL)
    (kind, message), = shell.user_ns["warned"]
    assert kind == "BackendMismatchWarning"
    assert "backend='nccl'" in message and "uses 'gloo'" in message
    assert shell.user_ns["total"] == 2.0


@cluster
def test_asking_for_another_world_size_is_a_clear_error(engines, shell):
    with pytest.raises(Exception, match=r"world_size=4\) in a %%distributed_fit cell, but this "
                                        r"run has 2 ranks"):
        run_cell(shell, "%%distributed_fit --no-widget\nimport torch.distributed as dist\n"
                        "dist.init_process_group('gloo', world_size=4)\n")
    run_cell(shell, NEXT_CELL)       # a fresh group serves the next cell
    assert shell.user_ns["total"] == 3.0


# ----------------------------------------------------------------- spawning, on 2 engines

def _children() -> list[int]:
    import psutil

    return sorted(p.pid for p in psutil.Process().children(recursive=True))


REFUSED = (r"phalanx already runs this cell once per engine \(rank [01] of 2\): call the "
           r"training function directly instead of spawning processes \(Lightning: "
           r"strategy='ddp' instead of 'ddp_notebook'/'ddp_spawn'/'ddp_fork'; accelerate: call "
           r"the function instead of notebook_launcher\)")


@cluster
def test_mp_spawn_in_a_cell_is_refused_at_once_and_starts_nothing(engines, shell):
    children = engines.apply_sync(_children)
    started = time.monotonic()
    with pytest.raises(Exception, match=REFUSED):
        run_cell(shell, "%%distributed_fit --no-widget\nimport time\n"
                        "import torch.multiprocessing as mp\n"
                        "def train(index):\n    time.sleep(600)\n"
                        "mp.spawn(train, nprocs=2)\n")
    assert time.monotonic() - started < hang_limit(15)   # not the collective timeout
    assert engines.apply_sync(_children) == children


LAUNCHERS = """%%distributed_fit --no-widget --return refusals,rows
import torch, torch.multiprocessing as mp
from torch.multiprocessing.spawn import start_processes
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

def train(*args):
    pass

launches = [lambda: mp.start_processes(train, nprocs=2, start_method="fork"),
            lambda: start_processes(train, nprocs=2, start_method="fork"),
            lambda: elastic_launch(LaunchConfig(1, 1, 2), train)()]
refusals = []
for launch in launches:
    try:
        launch()
        refusals.append(None)
    except Exception as exc:
        refusals.append(f"{type(exc).__name__}: {exc}")
# DataLoader workers (multiprocessing, not torch's launchers) still start and end
data = torch.utils.data.TensorDataset(torch.arange(40.0))
loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2)
rows = int(sum(batch[0].numel() for batch in loader))
"""


@cluster
def test_every_launcher_is_refused_and_dataloader_workers_still_run(engines, shell):
    children = engines.apply_sync(_children)
    run_cell(shell, LAUNCHERS)
    refusals = shell.user_ns["refusals"]
    assert len(refusals) == 3
    for refusal, what in zip(refusals, ("torch.multiprocessing.start_processes",
                                        "torch.multiprocessing.start_processes",
                                        "torch.distributed.launcher.elastic_launch")):
        assert refusal.startswith(f"SpawnInCellError: {what} inside a %%distributed_fit cell")
        assert re.search(REFUSED, refusal)
    assert shell.user_ns["rows"] == 40
    deadline = time.monotonic() + hang_limit(10)
    while engines.apply_sync(_children) != children and time.monotonic() < deadline:
        time.sleep(0.2)   # the DataLoader's workers take a moment to exit
    assert engines.apply_sync(_children) == children


# ----------------------------------------------------------------- new_group, on 2 engines

NEW_GROUP = """%%distributed_fit --no-widget --return sums,gone
import torch, torch.distributed as dist
pair = dist.new_group([0, 1])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, group=pair)
dist.destroy_process_group(pair)
try:
    dist.get_rank(pair)          # torch forgets a destroyed group
    gone = False
except Exception:
    gone = True
after = torch.ones(1)
dist.all_reduce(after)          # the default group is untouched
sums = (t.item(), after.item())
"""


@cluster
def test_a_new_group_works_and_is_really_destroyed(engines, shell):
    run_cell(shell, NEW_GROUP)
    assert shell.user_ns["sums"] == (3.0, 2.0)
    assert shell.user_ns["gone"] is True


# ------------------------------------------------- what a failed cell started ends with it

STARTS_CHILDREN = """%%distributed_fit --no-widget --timeout 4
import multiprocessing, subprocess, time
sleeper = subprocess.Popen(["sleep", "300"])
worker = multiprocessing.Process(target=time.sleep, args=(300,))
worker.start()
with open(f"{DIR}/{rank}", "w") as pids:
    pids.write(f"{sleeper.pid} {worker.pid}")
while True:
    time.sleep(0.05)
"""


@cluster
def test_what_a_timed_out_cell_started_ends_with_it_and_the_engines_go_on(engines, shell, tmp_path):
    """A subprocess and a multiprocessing child the cell started (then the cell overran
    --timeout) are gone when the cell's error is shown; the engines' own children stay."""
    import psutil

    from phalanx.fit import DistributedFitError

    children = engines.apply_sync(_children)
    shell.user_ns["DIR"] = str(tmp_path)
    with pytest.raises(DistributedFitError, match="--timeout 4"):
        run_cell(shell, STARTS_CHILDREN)
    started = [int(pid) for rank in (0, 1) for pid in (tmp_path / str(rank)).read_text().split()]
    assert len(started) == 4

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert [pid for pid in started if running(pid)] == []   # gone before the error was shown
    assert engines.apply_sync(_children) == children
    run_cell(shell, NEXT_CELL)
    assert shell.user_ns["total"] == 3.0
