"""The notebook's object graph arrives whole on the engines and comes back into the notebook's own
objects: the multi-cell layout of every beginner tutorial (model, then optimizer and scheduler,
then a train() function, then the loop) trains the very model it returns, on 2 real ranks,
against the same cells run in one process on the full data."""

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
MODEL = """
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh())
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.body(x))

model = Net()
"""
OPTIMIZER = """
loss_fn = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
"""
TRAIN_FN = """
def train(X, y, model, loss_fn, optimizer):
    model.train()
    loss = loss_fn(model(X), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
"""
LOOP = """
losses = []
for epoch in range(8):
    losses.append(train(X, y, model, loss_fn, optimizer))
    scheduler.step()
"""


def _params(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def _reference(*cells: str) -> dict:
    ns: dict = {"__name__": "__main__"}
    for cell in cells:
        exec(cell, ns)
    return ns


def test_an_optimizer_and_scheduler_from_earlier_cells_train_the_returned_model(two_engines, shell):
    for cell in (DATA, MODEL, OPTIMIZER, TRAIN_FN):
        run_cell(shell, cell)
    before = shell.user_ns["model"]
    first_param = before.head.weight
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y --return model,losses\n" + LOOP)
    ref = _reference(DATA, MODEL, OPTIMIZER, TRAIN_FN, LOOP)
    ns = shell.user_ns
    assert ns["losses"][-1] < ns["losses"][0] / 2  # it trained (rank 0's loss on its half)
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)
    # the notebook's own model object, trained: the optimizer of the earlier cell still steps it
    assert ns["model"] is before and ns["model"].head.weight is first_param
    assert ns["optimizer"].param_groups[0]["params"][0] is ns["model"].body[0].weight


def test_a_rerun_after_a_return_keeps_training_the_same_model(two_engines, shell):
    """The second run ships the returned model and the optimizer of the earlier cell: they still
    share their parameters, so training goes on (it stood still before)."""
    for cell in (DATA, MODEL, OPTIMIZER, TRAIN_FN):
        run_cell(shell, cell)
    fit = "%%distributed_fit --no-widget --shard X,y --return model,optimizer,scheduler\n" + LOOP
    run_cell(shell, fit)
    optimizer = shell.user_ns["optimizer"]
    run_cell(shell, fit)
    ref = _reference(DATA, MODEL, OPTIMIZER, TRAIN_FN, LOOP, LOOP)
    assert shell.user_ns["optimizer"] is optimizer
    assert optimizer.param_groups[0]["lr"] == ref["optimizer"].param_groups[0]["lr"]
    np.testing.assert_allclose(_params(shell.user_ns["model"]), _params(ref["model"]), atol=1e-5)


SHARED = """
import torch
base = torch.arange(6.0)
view = base[2:4]
holder = {"net": torch.nn.Linear(2, 2), "views": [view]}
net = holder["net"]
"""


def test_names_that_share_objects_share_them_on_the_engines(two_engines, shell):
    run_cell(shell, SHARED)
    run_cell(shell, """%%distributed_fit --no-widget --return same,ties
view += 100.0
same = (holder["net"] is net, holder["views"][0] is view)
ties = base.tolist()
""")
    assert shell.user_ns["same"] == (True, True)
    assert shell.user_ns["ties"] == [0.0, 1.0, 102.0, 103.0, 4.0, 5.0]


def test_notebook_functions_see_the_cell_globals(two_engines, shell):
    """A function defined in an earlier cell reads the names the cell binds, as in the notebook."""
    run_cell(shell, "scale = 1.0\ndef scaled(x):\n    return x * scale\n")
    run_cell(shell, "%%distributed_fit --no-widget --return out\nscale = 3.0\nout = scaled(2.0)\n")
    assert shell.user_ns["out"] == 6.0


def test_the_cell_runs_as_main_and_pickles_notebook_classes(two_engines, shell):
    run_cell(shell, DATA + MODEL)
    run_cell(shell, """%%distributed_fit --no-widget --return name,restored_ok,deep_ok
import io, copy
buffer = io.BytesIO()
torch.save(model, buffer)                      # pickles __main__.Net by reference
buffer.seek(0)
restored = torch.load(buffer, weights_only=False)
restored_ok = type(restored) is Net and torch.equal(restored.head.weight, model.head.weight)
deep_ok = type(copy.deepcopy(model)) is Net
name = __name__
""")
    assert shell.user_ns["name"] == "__main__"
    assert shell.user_ns["restored_ok"] and shell.user_ns["deep_ok"]


def test_a_notebook_functions_error_shows_its_own_lines_in_the_remote_traceback(two_engines, shell):
    """Code from an earlier cell keeps its cell's name and lines on the engines (cloudpickle
    alone names the frame <dynamic-code> and shows no source)."""
    from phalanx.fit import DistributedFitError

    run_cell(shell, "def scaled_loss(x):\n"
                    "    factor = len(x)\n"
                    "    raise ValueError(f'no loss for {factor} rows')\n")
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --no-widget\nscaled_loss([1, 2, 3])\n")
    message = str(info.value)
    assert "<dynamic-code>" not in message
    assert "raise ValueError(f'no loss for {factor} rows')" in message, message
    assert "in scaled_loss" in message and "ValueError: no loss for 3 rows" in message
