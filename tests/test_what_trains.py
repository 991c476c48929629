"""Zero-change mode attaches to what trains, not to optimizers: hand-written updates, raw tensors
and optimizers reached through other objects, on 2 real ranks against one process on the full
data; a tensor that cannot be made right ends the run with its name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import run_cell

pytestmark = pytest.mark.cluster

DATA = """
import torch
torch.manual_seed(0)
X = torch.randn(64, 5)
y = (X @ torch.linspace(-1.0, 1.0, 5)).unsqueeze(1) + 0.1
"""


def _reference(*cells: str, **names) -> dict:
    ns: dict = {"__name__": "__main__", "rank": 0, "world_size": 1}
    ns.update(names)
    for cell in cells:
        exec(cell, ns)
    return ns


def _params(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


HAND_WRITTEN = """
torch.manual_seed(1 + rank)  # every rank builds a different model: rank 0's must win
model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
for step in range(10):
    loss = ((model(X) - y) ** 2).mean()
    model.zero_grad()
    loss.backward()
    for param in model.parameters():
        param.data.add_(-0.1 * param.grad)
"""


def test_a_hand_written_update_of_a_model_built_in_the_cell(two_engines, shell):
    run_cell(shell, DATA)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return model\n" + HAND_WRITTEN)
    ref = _reference(DATA, HAND_WRITTEN)
    np.testing.assert_allclose(_params(shell.user_ns["model"]), _params(ref["model"]), atol=1e-5)


UNFROZEN = """
torch.manual_seed(1 + rank)
model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
model[0].weight.requires_grad_(False)      # frozen at its first forward
for step in range(8):
    if step == 2:
        model[0].weight.requires_grad_(True)   # and trained from the third step on
    model.zero_grad()
    ((model(X) - y) ** 2).mean().backward()
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param -= 0.1 * param.grad
"""


def test_a_parameter_frozen_at_first_and_trained_later_is_averaged(two_engines, shell):
    run_cell(shell, DATA)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return model\n" + UNFROZEN)
    ref = _reference(DATA, UNFROZEN)
    np.testing.assert_allclose(_params(shell.user_ns["model"]), _params(ref["model"]), atol=1e-5)


RAW = """
w = torch.zeros(5, 1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
"""
RAW_LOOP = """
lr = 0.1
for step in range(10):
    loss = ((X @ w + b - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= w.grad * lr
        b -= b.grad * lr
        w.grad.zero_()
        b.grad.zero_()
"""


def test_raw_tensors_from_an_earlier_cell_updated_by_hand(two_engines, shell):
    run_cell(shell, DATA + RAW)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return w,b\n" + RAW_LOOP)
    ref = _reference(DATA, RAW, RAW_LOOP)
    np.testing.assert_allclose(shell.user_ns["w"].detach(), ref["w"].detach(), atol=1e-6)
    np.testing.assert_allclose(shell.user_ns["b"].detach(), ref["b"].detach(), atol=1e-6)


def test_a_raw_tensor_that_differs_across_ranks_is_named(two_engines, shell):
    run_cell(shell, DATA)
    cell = ("%%distributed_fit --no-widget --shard X,y --return w --seed 0\n"
            "w = torch.randn(5, 1, requires_grad=True)\nb = torch.zeros(1, requires_grad=True)\n"
            + RAW_LOOP)
    with pytest.raises(Exception, match=r"w is trained in this backward pass but held "
                                        r"different values on different ranks"):
        run_cell(shell, cell)
    run_cell(shell, "%%distributed_fit --no-widget\nok = 1\n")  # the engines still work


IN_A_DICT = """
torch.manual_seed(3)
net = torch.nn.Linear(5, 1)
state = {"model": net, "opt": torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)}
"""
DICT_LOOP = """
for step in range(6):
    state["opt"].zero_grad()
    ((state["model"](X) - y) ** 2).mean().backward()
    state["opt"].step()
"""


def test_an_optimizer_reached_only_through_a_dict_averages_its_first_step(two_engines, shell):
    run_cell(shell, DATA + IN_A_DICT)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return state\n" + DICT_LOOP)
    ref = _reference(DATA, IN_A_DICT, DICT_LOOP)
    np.testing.assert_allclose(_params(shell.user_ns["net"]), _params(ref["net"]), atol=1e-6)


DRIFT = """
model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(12):
    opt.zero_grad()
    ((model(X) - y) ** 2).mean().backward()
    opt.step()
    if step == EDIT_AT:
        with torch.no_grad():
            model[2].bias += 0.25 * rank       # a rank-dependent edit: the ranks drift apart
"""


def test_the_guard_names_a_parameter_edited_differently_on_each_rank(two_engines, shell):
    run_cell(shell, DATA + "EDIT_AT = 11\nmodel = 'before'\n")
    with pytest.raises(Exception) as caught:
        run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return model\n" + DRIFT)
    text = str(caught.value)
    assert "no longer hold one model at the end of the run" in text
    assert "model.2.bias (shape (1,)) differs across ranks by up to 0.25" in text
    assert shell.user_ns["model"] == "before"  # the wrong model was not brought back


def test_the_guard_checks_every_k_steps_and_not_where_ranks_stay_apart(two_engines, shell):
    run_cell(shell, DATA + "EDIT_AT = 3\n")
    with pytest.raises(Exception, match=r"no longer hold one model after step 5: model\.2\.bias"):
        run_cell(shell, "%%distributed_fit --no-widget --shard X,y --check-every 5\n" + DRIFT)
    # independent ranks (--sync none) are not checked; localsgd is checked at its end, where
    # its finish averages the drift away
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --sync none\n" + DRIFT)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --sync localsgd --every 4\n" + DRIFT)


FRAMEWORK_OWNED = """
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(5)
net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
WRAP
opt = torch.optim.SGD(net.parameters(), lr=0.1)
LATE
for step in range(6):
    opt.zero_grad()
    ((net(X) - y) ** 2).mean().backward()
    opt.step()
FULL
"""


DDP_PARAMS = "params = [p.detach().clone() for p in net.module.parameters()]"


# "ddp-late": the optimizer is made before the model is wrapped, as ``accelerator.prepare`` does
@pytest.mark.parametrize("wrap,late,full", [
    ("net = DDP(net)", "", DDP_PARAMS),
    ("", "net = DDP(net)", DDP_PARAMS),
    ("from torch.distributed.fsdp import fully_shard\nfully_shard(net[0]); fully_shard(net)", "",
     "params = [p.full_tensor().detach().clone() for p in net.parameters()]"),
], ids=["ddp", "ddp-late", "fsdp2"])
def test_zero_change_mode_stands_aside_for_ddp_and_fsdp2_built_in_the_cell(two_engines, shell, wrap,
                                                                           late, full):
    run_cell(shell, DATA)
    body = FRAMEWORK_OWNED.replace("WRAP", wrap).replace("LATE", late).replace("FULL", full)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return params\n" + body)
    ref = _reference(DATA, FRAMEWORK_OWNED.replace("WRAP", "").replace("LATE", "").replace(
        "FULL", "params = [p.detach().clone() for p in net.parameters()]"))
    for got, want in zip(shell.user_ns["params"], ref["params"]):
        np.testing.assert_allclose(got, want, atol=1e-6)
