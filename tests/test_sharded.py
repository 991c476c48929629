"""Sharded models (``wrap(model, shard=True)``: FSDP2 on the run's group): trained through the
magic they equal one process on the full batch once gathered (``--return``); kept live with
``--keep`` the next cell goes on from the shards; each rank holds about half the parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run_cell

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
