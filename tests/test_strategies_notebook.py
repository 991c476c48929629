"""Sync strategies defined in a notebook cell and passed to ``%%distributed_fit --sync NAME``,
on a real 2-engine cluster."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from IPython.core.error import UsageError

from conftest import run_cell
from test_fit import LOOP as FIT_LOOP, SETUP as FIT_SETUP  # the fit tests' data and loop

pytestmark = pytest.mark.cluster

SETUP = FIT_SETUP + "from phalanx import SyncStrategy, param_values, latest_metrics\nSTEPS = 12\n"

# The fit tests' loop, logging every parameter after each step so the kernel sees whether the
# ranks agree.
LOOP = "%%distributed_fit --shard X,y --sync Periodic\n" + FIT_LOOP.replace(
    "    log(loss=loss.item())",
    "    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()\n"
    "    log(loss=loss.item(), **{f\"w{i}\": v for i, v in enumerate(flat)})")
assert "flat" in LOOP  # the fit tests' loop still logs where we expect


def periodic(period: int) -> str:
    """A notebook cell defining ``Periodic``: parameter averaging every ``period`` steps."""
    return f"""
class Periodic(SyncStrategy):
    def before_step(self, params, step):
        log(before_hook=step)
    def after_step(self, params, step):
        log(after_hook=step, seen_loss=latest_metrics().get("loss", -1.0))
        if step % {period} == {period - 1}:
            self.comm.allreduce(param_values(params), op="mean")
"""


def _column(rows: list[dict], rank: int, name: str) -> list[float]:
    return [r[name] for r in rows if r["rank"] == rank and name in r]


def _weights_by_step(rows: list[dict], rank: int) -> dict[int, np.ndarray]:
    return {r["step"]: np.array([r[f"w{i}"] for i in range(6)])
            for r in rows if r["rank"] == rank and "w0" in r}


def _synced_steps(rows: list[dict]) -> list[int]:
    """The logged steps at which both ranks hold the same parameters."""
    w0, w1 = _weights_by_step(rows, 0), _weights_by_step(rows, 1)
    assert sorted(w0) == sorted(w1) == list(range(1, 13))
    diffs = {s: float(np.abs(w0[s] - w1[s]).max()) for s in w0}
    agree = [s for s, d in diffs.items() if d < 1e-6]
    assert all(d > 1e-4 for s, d in diffs.items() if s not in agree), diffs  # clearly apart
    return sorted(agree)


@pytest.fixture
def notebook(two_engines, shell):
    run_cell(shell, SETUP)
    return two_engines


def test_notebook_strategy_runs_its_hooks_and_syncs_when_it_says(notebook, shell):
    run_cell(shell, periodic(3))
    run_cell(shell, LOOP)
    record = notebook.last_run()
    assert record.status == "done" and record.steps == {0: 12, 1: 12}
    rows = record.history.rows()
    for rank in (0, 1):  # both hooks ran on every rank, once per optimizer step, in order
        assert _column(rows, rank, "before_hook") == list(range(12))
        assert _column(rows, rank, "after_hook") == list(range(12))
    # Averaged after steps 2, 5, 8, 11 (0-based): the loop logs them as steps 3, 6, 9, 12.
    assert _synced_steps(rows) == [3, 6, 9, 12]
    assert record.manifest["strategy"]["notebook"] == "Periodic"
    assert "Periodic" in record.manifest["data"]


def test_strategy_reads_the_metrics_the_loop_logged(notebook, shell):
    run_cell(shell, periodic(3))
    run_cell(shell, LOOP)
    rows = notebook.last_run().history.rows()
    for rank in (0, 1):
        seen = _column(rows, rank, "seen_loss")
        logged = _column(rows, rank, "loss")
        # The hook of step s sees the loss the loop logged after step s - 1; none before step 0.
        assert seen[0] == -1.0 and seen[1:] == logged[:-1]


def test_redefining_the_class_changes_the_next_run(notebook, shell):
    run_cell(shell, periodic(3))
    run_cell(shell, LOOP)
    first = notebook.last_run()
    run_cell(shell, periodic(4))
    run_cell(shell, LOOP)
    second = notebook.last_run()
    assert _synced_steps(second.history.rows()) == [4, 8, 12]
    assert first.manifest["data"]["Periodic"]["hash"] != second.manifest["data"]["Periodic"]["hash"]
    run_cell(shell, periodic(3))  # and back: the engines take the new class again
    run_cell(shell, LOOP)
    assert _synced_steps(notebook.last_run().history.rows()) == [3, 6, 9, 12]


def test_dunder_main_name_means_the_notebook_class(notebook, shell):
    run_cell(shell, periodic(6))
    run_cell(shell, LOOP.replace("--sync Periodic", "--sync __main__.Periodic"))
    assert _synced_steps(notebook.last_run().history.rows()) == [6, 12]


def test_strategy_that_averages_gradients_keeps_ranks_in_lockstep(notebook, shell):
    run_cell(shell, """
from phalanx import param_grads
class Periodic(SyncStrategy):
    def before_step(self, params, step):
        self.comm.allreduce(param_grads(params), op="mean")
""")
    run_cell(shell, LOOP)
    assert _synced_steps(notebook.last_run().history.rows()) == list(range(1, 13))


def test_a_failing_strategy_names_its_rank_and_the_next_run_works(notebook, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, """
class Periodic(SyncStrategy):
    def after_step(self, params, step):
        if step == 4 and self.comm.rank == 1:
            raise ValueError("the strategy gave up on rank 1")
        self.comm.allreduce(param_values(params), op="mean")
""")
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, LOOP)
    message = str(info.value)
    assert info.value.rank == 1 and "ValueError: the strategy gave up on rank 1" in message
    assert "after_step" in message  # the traceback reaches into the notebook's class
    run_cell(shell, periodic(3))
    run_cell(shell, LOOP)
    assert _synced_steps(notebook.last_run().history.rows()) == [3, 6, 9, 12]


BAD = {
    "seven = 7": ("seven", r"--sync seven: 'seven' is an int \(7\), not a SyncStrategy subclass; "
                           r"pass the name of a class defined as `class MySync\(SyncStrategy\)"),
    "def helper(params, step):\n    pass": ("helper", r"'helper' is a function, not a SyncStrategy"),
    "class Plain:\n    def after_step(self, params, step):\n        pass":
        ("Plain", r"class 'Plain' \(bases: object\) does not subclass phalanx.SyncStrategy; "
                  r"define it as `class Plain\(SyncStrategy\)"),
    "inst = SyncStrategy.__new__(SyncStrategy)":
        ("inst", r"'inst' is a SyncStrategy instance \(pass the class itself"),
    "class Needs(SyncStrategy):\n    def __init__(self, comm, lr):\n        super().__init__(comm)":
        ("Needs", r"Needs\(comm, every=\.\.\., alpha=\.\.\.\), which its __init__ does not accept"),
    "": ("no_such_strategy", r"unknown --sync 'no_such_strategy': it is not a built-in strategy "
                             r"and the notebook defines no 'no_such_strategy'"),
}


@pytest.mark.parametrize("definition", list(BAD), ids=[v[0] for v in BAD.values()])
def test_bad_values_are_refused_before_dispatch(notebook, shell, definition):
    name, message = BAD[definition]
    run_cell(shell, definition)
    client = notebook.cluster.client
    before_record, before_tasks = notebook.fits.last, len(client.history)
    with pytest.raises(UsageError, match=message):
        run_cell(shell, LOOP.replace("--sync Periodic", f"--sync {name}"))
    assert notebook.fits.last is before_record       # no run was recorded
    assert len(client.history) == before_tasks       # and nothing was sent to any engine
    assert notebook.fits.active is None


def test_public_strategy_api_and_its_examples():
    import phalanx
    import phalanx.runtime
    from phalanx.fit.run import _strategy
    from phalanx.runtime.sync import _strategies as _sync
    from phalanx.runtime.transport import _comm

    assert phalanx.SyncStrategy is phalanx.runtime.SyncStrategy is _sync.SyncStrategy
    assert phalanx.param_values is _sync.param_values and phalanx.param_grads is _sync.param_grads
    assert phalanx.Communicator is _comm.Communicator
    assert {"SyncStrategy", "param_values", "param_grads", "Communicator",
            "latest_metrics"} <= set(phalanx.__all__) & set(phalanx.runtime.__all__)
    for module in (phalanx.runtime, _strategy):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__
    with pytest.raises(phalanx.runtime.NotInRunError):
        phalanx.latest_metrics()


def test_learning_network_machine_takes_a_notebook_strategy_class(notebook, shell):
    import phalanx
    from phalanx.fit import FitUsageError
    from phalanx.network import machine, source
    from test_data_parallel import TorchRegressor

    run_cell(shell, periodic(5))
    strategy = shell.user_ns["Periodic"]
    rng = np.random.default_rng(0)
    X_data = rng.normal(size=(40, 3))
    X, y = source(X_data, name="X"), source(X_data @ np.ones(3), name="y")
    runner = phalanx.data_parallel(sync=strategy, session=notebook)
    reg = machine(TorchRegressor(epochs=10), X, y, name="dp", fit_runner=runner)
    assert notebook.fit_network(reg.predict(X)).actions == {"dp": "fit"}
    rows = notebook.last_run().history.rows()
    for rank in (0, 1):
        assert _column(rows, rank, "after_hook") == list(range(10))
    assert notebook.last_run().manifest["strategy"]["notebook"] == "Periodic"
    with pytest.raises(TypeError, match="takes a strategy name or a SyncStrategy subclass, got int"):
        phalanx.data_parallel(sync=7)
    with pytest.raises(FitUsageError, match="class 'dict' .* does not subclass phalanx.SyncStrategy"):
        phalanx.data_parallel(sync=dict)
