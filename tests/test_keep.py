"""``--keep``: objects left live on the engines between cells.  The next cell on the same
engines reads the very objects (not a copy, not the notebook's name of the same name); status
lists them with their memory; ``%cluster forget`` and a restart release them."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from conftest import run_cell

pytestmark = pytest.mark.cluster

BUILD = """%%distributed_fit --no-widget --keep model,opt --return first_id
import torch
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(3):
    opt.zero_grad(); model(torch.ones(4, 64)).sum().backward(); opt.step()
first_id = id(model)
"""

# Reads the kept names: the same objects, and Adam's state carried on (3 steps, then a 4th).
CONTINUE = """%%distributed_fit --no-widget --return same_id,adam_steps
import torch
opt.zero_grad(); model(torch.ones(4, 64)).sum().backward(); opt.step()
same_id = id(model)
adam_steps = int(opt.state[model.weight]["step"])
"""


def test_kept_objects_are_the_live_ones_until_forgotten(two_engines, shell, capsys):
    import torch

    run_cell(shell, BUILD)
    first = shell.user_ns["first_id"]
    shell.user_ns["model"] = torch.nn.Linear(2, 2)   # a notebook name of the same name
    run_cell(shell, CONTINUE)
    assert shell.user_ns["same_id"] == first           # the live object, not the notebook's
    assert shell.user_ns["adam_steps"] == 4            # its optimizer went on from step 3
    capsys.readouterr()
    shell.run_line_magic("cluster", "status")
    kept_line = capsys.readouterr().out
    # 64*64 + 64 floats; Adam's two moments and step counters on top for opt
    assert "kept on the engines (--keep): model (up to 16.2 KB per rank, 2 ranks)" in kept_line
    assert "opt (up to 32.5 KB per rank, 2 ranks)" in kept_line
    shell.run_line_magic("cluster", "forget model")
    assert "released: model" in capsys.readouterr().out
    run_cell(shell, "%%distributed_fit --no-widget --return shape\nshape = tuple(model.weight.shape)\n")
    assert shell.user_ns["shape"] == (2, 2)             # the notebook's model again
    shell.run_line_magic("cluster", "forget")
    assert "released: opt" in capsys.readouterr().out


def test_a_restart_releases_kept_objects_and_the_next_run_says_so(two_engines, shell, capsys):
    run_cell(shell, BUILD)
    shell.run_line_magic("cluster", "restart")
    capsys.readouterr()
    shell.user_ns.pop("model", None)
    with pytest.raises(UsageError, match="'model'"):     # kept nowhere now, nor in the notebook
        run_cell(shell, CONTINUE)
    import torch

    shell.user_ns["model"] = torch.nn.Linear(64, 64)
    shell.user_ns["opt"] = torch.optim.Adam(shell.user_ns["model"].parameters())
    run_cell(shell, CONTINUE)
    assert "model, opt (--keep) released" in capsys.readouterr().err
    assert shell.user_ns["adam_steps"] == 1            # the notebook's fresh optimizer


def test_a_keep_typo_is_one_line(two_engines, shell):
    with pytest.raises(UsageError, match=r"--keep 'modle': .* did you mean 'model'"):
        run_cell(shell, "%%distributed_fit --keep modle\nmodel = 1\n")
