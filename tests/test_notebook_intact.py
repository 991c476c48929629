"""A run never damages the notebook: after every way a run can end, the classes the notebook
defined still build, pickle, compare and call ``super()``, in the kernel and on the engines.

The classes are the shapes people write: an ``nn.Module`` that calls ``super().__init__()``, a
dataclass, a class made by a closure, a subclass whose method calls ``super()``, and a class
defined inside the training cell.  A real 2-engine cluster runs each ending: done, a rank that
raises, Stop (the kernel's interrupt), a collective timeout and a killed engine.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from conftest import run_cell
from deadlines import hang_limit
from test_reliability_helpers import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CLASSES = """
import dataclasses, pickle, time
import cloudpickle, torch
from phalanx import allreduce, log

class Tiny(torch.nn.Module):
    scale = 2.0
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 1)
    def forward(self, x):
        return self.l(x) * self.scale

@dataclasses.dataclass
class Config:
    lr: float = 0.1
    steps: int = 3

def make_counter(start):
    class Counter:
        def __init__(self):
            self.n = start
        def bump(self):
            self.n += 1
            return self
    return Counter

Counter = make_counter(5)

class Base:
    def hello(self):
        return "base"

class Child(Base):
    def hello(self):
        return "child of " + super().hello()

torch.manual_seed(0)
X, y = torch.randn(32, 3), torch.randn(32, 1)
"""

# Every shape used on the engines, then the ending's own tail
TRAIN = """
class InCell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

net, cfg, counter, child, local = Tiny(), Config(), Counter().bump(), Child(), InCell()
greeting = child.hello()
opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)
for _ in range(cfg.steps):
    opt.zero_grad()
    torch.nn.functional.mse_loss(net(X), y).backward()
    opt.step()
"""

HEAD = "%%distributed_fit --shard X,y --seed 0 --no-widget --return net,cfg,counter,child,greeting"

ENDINGS = {
    "done": ("", ""),
    "a rank raises": ("", "if rank == 1:\n    raise ValueError('bad batch')\nallreduce(1.0)\n"),
    "stop": ("", "while True:\n    log(loss=1.0)\n    time.sleep(0.01)\n"),
    "collective timeout": (" --collective-timeout 2",
                           "if rank == 1:\n    time.sleep(30)\nallreduce(1.0)\n"),
    "killed engine": ("", "import os, signal\nif rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                          "allreduce(1.0)\n"),
}

# What a person would try in the next cell; each line must hold
CHECKS = """
assert Tiny()(torch.zeros(1, 3)).shape == (1, 1)
assert Tiny.scale == 2.0 and Tiny.__init__.__qualname__ == "Tiny.__init__"
assert Config() == Config(0.1, 3) and [f.name for f in dataclasses.fields(Config)] == ["lr", "steps"]
assert Counter().n == 5 and Counter().bump().n == 6
assert Child().hello() == "child of base"
again = cloudpickle.loads(cloudpickle.dumps(Tiny()))
assert type(again).__name__ == "Tiny" and again(torch.zeros(1, 3)).shape == (1, 1)
"""

RETURNED = """
assert type(net) is Tiny and isinstance(net, torch.nn.Module) and net(X).shape == (32, 1)
assert type(cfg) is Config and cfg == Config()
assert type(counter) is Counter and counter.n == 6
assert type(child) is Child and child.hello() == greeting == "child of base"
"""

ON_ENGINES = ("%%distributed_fit --no-widget --return shapes\n"
              "shapes = [Tiny()(torch.zeros(1, 3)).shape[1], Config().steps, Counter().n, "
              "Child().hello()]\n")


@pytest.fixture
def notebook(two_engines, shell):
    from notebook_shell import clean_notebook

    clean_notebook()
    run_cell(shell, CLASSES)
    return two_engines


def _interrupt_once_both_ranks_log(session) -> threading.Thread:
    def both_logged() -> bool:
        tracker = session.fits.active
        return tracker is not None and {r["rank"] for r in tracker.history.rows()} == {0, 1}

    def interrupt() -> None:
        try:
            wait_for(both_logged, hang_limit(60), what="both ranks in the loop")
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_notebook_classes_survive_every_ending(notebook, shell, ending):
    from phalanx.fit import DistributedFitError

    flags, tail = ENDINGS[ending]
    thread = _interrupt_once_both_ranks_log(notebook) if ending == "stop" else None
    cell = HEAD + flags + "\n" + TRAIN + tail
    if ending == "done":
        run_cell(shell, cell)
    else:
        with pytest.raises(DistributedFitError):
            run_cell(shell, cell)
    if thread is not None:
        thread.join(timeout=hang_limit(10))
    run_cell(shell, CHECKS)
    if ending in ("done", "stop"):  # both bring the model back
        run_cell(shell, RETURNED)
    if ending == "killed engine":
        run_cell(shell, "%cluster restart 1")
    run_cell(shell, ON_ENGINES)
    assert shell.user_ns["shapes"] == [1, 3, 5, "child of base"]
    run_cell(shell, CHECKS)


def test_a_class_redefined_between_runs_is_the_one_that_trains_and_returns(notebook, shell):
    run_cell(shell, HEAD + "\n" + TRAIN)
    first = shell.user_ns["Tiny"]
    run_cell(shell, CLASSES.replace("scale = 2.0", "scale = 3.0"))
    run_cell(shell, HEAD + "\n" + TRAIN + "scales = [type(net).scale]\n")
    net, tiny = shell.user_ns["net"], shell.user_ns["Tiny"]
    assert tiny is not first and type(net) is tiny and tiny.scale == 3.0
    assert first.scale == 2.0 and first()(shell.user_ns["X"]).shape == (32, 1)  # the old class too
    run_cell(shell, CHECKS.replace("Tiny.scale == 2.0", "Tiny.scale == 3.0"))


def test_repeated_runs_that_return_a_notebook_model_leave_its_class_whole(notebook, shell):
    """The quickstart's shape, run again and again as a person re-runs a cell."""
    for _ in range(3):
        run_cell(shell, HEAD + "\n" + TRAIN)
        run_cell(shell, RETURNED)
        run_cell(shell, CHECKS)


NOTEBOOK_MODEL = "model = Tiny()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
STEP = ("for _ in range(3):\n    opt.zero_grad()\n"
        "    torch.nn.functional.mse_loss(model(X), y).backward()\n    opt.step()\n")


@pytest.mark.parametrize("flags, cell, said", [
    ("", STEP, True),                                   # the notebook's model, trained, forgotten
    (" --return model", STEP, False),
    (" --return net", "net = model\n" + STEP, False),   # returned under another name: in place
    ("", "model = Tiny()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n" + STEP, False),
    ("", "total = allreduce(1.0)\n", False),            # nothing trained
])
def test_a_notebook_model_trained_but_not_returned_is_said(notebook, shell, capsys, flags, cell,
                                                           said):
    run_cell(shell, NOTEBOOK_MODEL)
    capsys.readouterr()
    run_cell(shell, "%%distributed_fit --shard X,y --seed 0 --no-widget" + flags + "\n" + cell)
    out = capsys.readouterr()
    line = "phalanx: model was trained on the engines but not returned: add --return model"
    assert (line in out.err) is said, out.err[-2000:]


def test_a_failing_line_is_numbered_as_the_editor_numbers_the_cell(notebook, shell):
    from phalanx.fit import DistributedFitError

    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --no-widget\nx = 1\ny = 2\n"
                        "if rank == 1:\n    raise ValueError('bad batch')\n")
    assert 'line 5, in <module>\n    raise ValueError' in str(info.value).replace("\n        ", "\n    ")


def test_the_cell_runs_as_the_notebook_runs_it_annotations_evaluated(notebook, shell):
    # The engine's own module postpones annotations (a __future__ import): the cell must not
    # inherit that, or a dataclass or pydantic model defined in it sees strings for types.
    run_cell(shell, "%%distributed_fit --no-widget --return kinds\n"
                    "def scaled(x: float) -> float:\n    return x\n"
                    "kinds = [scaled.__annotations__['x'] is float] * 2\n")
    assert shell.user_ns["kinds"] == [True, True]
