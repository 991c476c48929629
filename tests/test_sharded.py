"""Sharded models (``wrap(model, shard=True)``: FSDP2 on the run's group): trained through the
magic they equal one process on the full batch once gathered (``--return``); kept live with
``--keep`` the next cell goes on from the shards; each rank holds about half the parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run_cell
from phalanx.fit.run._kept_on_engines import human_size

pytestmark = pytest.mark.cluster

SETUP = """
import torch


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


torch.manual_seed(0)
X = torch.randn(64, 8)
y = X.sum(dim=1) * 0.1
model = Blocks()
"""

TRAIN = """
for _ in range(STEPS):
    opt.zero_grad()
    ((model(X).squeeze(1) - y) ** 2).mean().backward()
    opt.step()
"""

FIRST = ("%%distributed_fit --no-widget --shard X,y --keep model,opt --return model\n"
         "from phalanx import wrap\nSTEPS = 5\nmodel = wrap(model, shard=True)\n"
         "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n" + TRAIN)
NEXT = "%%distributed_fit --no-widget --shard X,y --return model\nSTEPS = 5\n" + TRAIN


def _reference(start: dict, ns: dict, steps: int) -> np.ndarray:
    model = ns["Blocks"]()
    model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        ((model(ns["X"]).squeeze(1) - ns["y"]) ** 2).mean().backward()
        opt.step()
    return _flat(model)


def _flat(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def test_a_sharded_model_trains_as_one_process_and_stays_warm(two_engines, shell, capsys):
    run_cell(shell, SETUP)
    ns = shell.user_ns
    model = ns["model"]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    run_cell(shell, FIRST)
    assert ns["model"] is model                       # the notebook's model, loaded in place
    np.testing.assert_allclose(_flat(model), _reference(start, ns, 5), rtol=0, atol=1e-5)
    record = two_engines.last_run()
    full = sum(p.numel() * 4 for p in model.parameters())
    shares = [record.held[r]["parameters"] for r in (0, 1)]
    assert all(share <= 0.6 * full for share in shares), (shares, full)   # each holds a part
    assert sum(shares) >= full
    status = two_engines.status()                    # what %cluster status shows: each share
    assert [row["share"].split(" / ")[0] for row in status.rows] == [
        human_size(share) for share in shares]
    from phalanx.widgets._cluster_table import ClusterStatus
    assert "last run's params / grads / optimizer" in repr(ClusterStatus.of(status))
    run_cell(shell, NEXT)                              # the kept shards and optimizer go on
    np.testing.assert_allclose(_flat(model), _reference(start, ns, 10), rtol=0, atol=1e-5)
    shell.run_line_magic("cluster", "forget")


def test_returning_a_sharded_models_optimizer_is_refused_with_the_way_out(two_engines, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, SETUP)
    with pytest.raises(DistributedFitError, match="--keep opt instead"):
        run_cell(shell, "%%distributed_fit --no-widget --return opt\n"
                        "from phalanx import wrap\nmodel = wrap(model, shard=True)\n"
                        "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n")


def test_cpu_offload_on_cpu_engines_is_refused_with_the_way_out(two_engines, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, SETUP)
    with pytest.raises(DistributedFitError, match="leave offload=True out"):
        run_cell(shell, "%%distributed_fit --no-widget\n"
                        "from phalanx import wrap\nmodel = wrap(model, shard=True, offload=True)\n")
    run_cell(shell, "%%distributed_fit --no-widget --return model\n"  # the engines go on
                    "from phalanx import wrap\nmodel = wrap(model, shard=True)\n")


# A small transformer: two encoder blocks (each its own FSDP unit) and a head.  48 sequences
# split evenly on 1, 2 or 3 ranks, so the averaged gradient is the full batch's on any of them.
ENCODER = """
import os, signal
import torch


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(
            d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True)
            for _ in range(2)])
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1)).squeeze(1)


def fault(rank, step):
    pass


torch.manual_seed(0)
S = torch.randn(48, 4, 8)
t = S.sum(dim=(1, 2)) * 0.05
net = Encoder()
"""

ENCODER_LOOP = """
from phalanx import wrap
from phalanx.runtime import steps
net = wrap(net, shard=True)
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
for step in steps(TOTAL):
    opt.zero_grad()
    ((net(S) - t) ** 2).mean().backward()
    opt.step()
    fault(rank, step)
"""


def _encoder_reference(start: dict, ns: dict, steps: int) -> np.ndarray:
    net = ns["Encoder"]()
    net.load_state_dict(start)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        ((net(ns["S"]) - ns["t"]) ** 2).mean().backward()
        opt.step()
    return _flat(net)


def _fit_encoder(shell, total: int, flags: str) -> None:
    run_cell(shell, f"%%distributed_fit --no-widget --shard S,t --return net {flags}\n"
                    f"TOTAL = {total}\n" + ENCODER_LOOP)


@pytest.fixture
def encoder_start(two_engines, shell) -> dict:
    """The notebook's fresh encoder's state, before any run."""
    run_cell(shell, ENCODER)
    return {k: v.clone() for k, v in shell.user_ns["net"].state_dict().items()}


def test_a_sharded_commit_resumes_resharded_on_three_ranks_and_on_one(
        encoder_start, shell, tmp_path, capsys):
    ns, start = shell.user_ns, encoder_start
    folder = tmp_path / "ckpt"
    _fit_encoder(shell, 4, f"--checkpoint-every 2 --checkpoint-dir {folder}")
    np.testing.assert_allclose(_flat(ns["net"]), _encoder_reference(start, ns, 4), atol=1e-5)
    lineage = next(p for p in folder.iterdir() if p.is_dir())
    assert sorted(p.name for p in (lineage / "sharded").iterdir()) == ["step-2", "step-4"]
    assert len(list((lineage / "sharded" / "step-4").glob("*.distcp"))) == 2  # a file a rank

    run_cell(shell, "%cluster scale 3")
    _fit_encoder(shell, 8, f"--resume --checkpoint-dir {folder}")
    assert "at step 4 (3 rank(s) from the sharded commit)" in capsys.readouterr().out
    np.testing.assert_allclose(_flat(ns["net"]), _encoder_reference(start, ns, 8), atol=1e-5)
    assert sorted(p.name for p in (lineage / "sharded").iterdir()) == ["step-6", "step-8"]

    run_cell(shell, "%cluster scale 1")
    _fit_encoder(shell, 10, f"--resume --checkpoint-dir {folder}")
    assert "at step 8 (1 rank(s) from the sharded commit)" in capsys.readouterr().out
    np.testing.assert_allclose(_flat(ns["net"]), _encoder_reference(start, ns, 10), atol=1e-5)


def test_a_killed_rank_of_a_sharded_run_is_restarted_and_resumes_exactly(
        encoder_start, shell, tmp_path, capsys):
    ns, start = shell.user_ns, encoder_start
    marker = tmp_path / "killed"
    run_cell(shell, f"""
def fault(rank, step):
    if rank == 1 and step == 5 and not os.path.exists({str(marker)!r}):
        open({str(marker)!r}, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
""")
    _fit_encoder(shell, 8, "--checkpoint-every 2 --max-restarts 1")  # commits in the kernel's folder
    assert marker.exists()
    assert "at step 4 (2 rank(s) from the sharded commit)" in capsys.readouterr().out
    np.testing.assert_allclose(_flat(ns["net"]), _encoder_reference(start, ns, 8), atol=1e-5)


def test_a_sharded_run_leaves_nothing_of_its_model_on_the_engines(two_engines, shell):
    """Without --keep, a sharded run's model and optimizer are freed with the run (torch's
    cache of the classes fully_shard derives held a cell's class, and through it the cell)."""
    run_cell(shell, SETUP)
    for _ in range(2):
        run_cell(shell, "%%distributed_fit --no-widget --shard X,y\n"
                        "import sys, weakref\nfrom phalanx import wrap\nSTEPS = 1\n"
                        "model = wrap(Blocks(), shard=True)\n"
                        "opt = torch.optim.AdamW(model.parameters())\n" + TRAIN +
                        "sys.phalanx_test_refs = getattr(sys, 'phalanx_test_refs', []) + "
                        "[weakref.ref(model), weakref.ref(opt)]\n")
    run_cell(shell, "%%distributed_fit --no-widget --return alive\nimport gc, sys\ngc.collect()\n"
                    "alive = [ref() is not None for ref in sys.phalanx_test_refs]\n"
                    "del sys.phalanx_test_refs\n")
    assert shell.user_ns["alive"] == [False] * 4
