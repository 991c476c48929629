"""Stop keeps what was trained: ``--return`` brings back rank 0's objects as of the step where the
run stopped (a whole number of optimizer steps, equal to one process trained that many steps on
the full batch), into the notebook's own objects; a run that fails returns nothing and says so."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import run_cell
from test_reliability_helpers import wait_for
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

SETUP = """
import torch
torch.manual_seed(0)
X = torch.randn(64, 5)
y = X @ torch.arange(1.0, 6.0) + 0.3
model = torch.nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""

# Trains until stopped; each rank has its half of the rows (--shard), so the averaged gradient is
# the full batch's.
FOREVER = """%%distributed_fit --no-widget --shard X,y --return model,opt
from phalanx import log
while True:
    opt.zero_grad()
    loss = ((model(X).squeeze(1) - y) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
"""


def _trained(start: dict, X, y, steps: int) -> np.ndarray:
    model = torch.nn.Linear(5, 1)
    model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        ((model(X).squeeze(1) - y) ** 2).mean().backward()
        opt.step()
    return _flat(model)


def _flat(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def test_stop_brings_the_model_back_as_of_the_step_it_stopped_at(two_engines, shell, capsys):
    _stop_and_check_the_model(two_engines, shell, capsys)


def test_stop_brings_the_model_back_when_a_peer_takes_the_interrupt_first(
        two_engines, shell, capsys, monkeypatch):
    """The stop's interrupt reaches rank 1 first: rank 1 gives up, which releases rank 0 from
    the gradient allreduce it waits in before its own interrupt comes (here: never).  Rank 0
    stopped at the same step boundary and brings its model back all the same."""
    from phalanx.fit.run import _waiter

    real = _waiter.signal_engines
    first = two_engines.cluster.slots()[1].engine_id
    monkeypatch.setattr(_waiter, "signal_engines", lambda cluster, targets, signum: real(
        cluster, [t for t in targets if t == first], signum))
    _stop_and_check_the_model(two_engines, shell, capsys)


def _stop_and_check_the_model(two_engines, shell, capsys) -> None:
    run_cell(shell, SETUP)
    ns = shell.user_ns
    model, opt = ns["model"], ns["opt"]
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def stop_when_training():
        def trained_a_while() -> bool:
            tracker = two_engines.fits.active
            return tracker is not None and min(tracker.steps.values(), default=0) >= 20
        try:
            wait_for(trained_a_while, 120, what="20 steps on every rank")
        finally:
            two_engines.stop_run("the test's Stop")

    thread = threading.Thread(target=stop_when_training, daemon=True)
    thread.start()
    capsys.readouterr()
    run_cell(shell, FOREVER)   # a Stop is said in the cell, not raised
    thread.join(timeout=hang_limit(10))
    message = capsys.readouterr().err
    assert "was stopped (the test's Stop)" in message
    assert two_engines.last_run().status == "interrupted"
    stopped_at = two_engines.last_run().steps[0]
    assert f"--return model, opt: brought back from rank 0 as of its step {stopped_at}" in message
    assert stopped_at >= 20
    assert ns["model"] is model and ns["opt"] is opt          # the notebook's own objects
    np.testing.assert_allclose(_flat(model), _trained(start, ns["X"], ns["y"], stopped_at),
                               rtol=0, atol=1e-5)
    assert opt.param_groups[0]["params"][0] is next(model.parameters())  # still steps it
    # the next run goes on from there
    run_cell(shell, "%%distributed_fit --no-widget --return model\n"
                    "opt.zero_grad(); ((model(X).squeeze(1) - y) ** 2).mean().backward(); opt.step()\n")
    np.testing.assert_allclose(_flat(model), _trained(start, ns["X"], ns["y"], stopped_at + 1),
                               rtol=0, atol=1e-5)


def test_a_failed_run_returns_nothing_and_says_so(two_engines, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, SETUP)
    before = _flat(shell.user_ns["model"]).copy()
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --no-widget --return model\n"
                        "for step in range(5):\n"
                        "    opt.zero_grad(); ((model(X).squeeze(1) - y) ** 2).mean().backward()\n"
                        "    opt.step()\n"
                        "    if step == 2 and rank == 1:\n"
                        "        raise ValueError('bad batch')\n")
    assert "ValueError" in str(info.value)
    assert ("--return model: nothing came back; the notebook's model are as before the run"
            in str(info.value))
    np.testing.assert_array_equal(_flat(shell.user_ns["model"]), before)
