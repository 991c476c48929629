"""The forward watch (runtime/sync/_forward_watch.py): which modules' forward passes zero-change mode
sees, and that every other module keeps torch's fast path once the first step is over."""

from __future__ import annotations

import doctest

import torch
from torch.nn.modules import module as torch_module

from phalanx.runtime.sync import _forward_watch
from phalanx.runtime.sync._forward_watch import ForwardWatch


class Recorder:
    """Plays GradientSync's part: remembers modules that run forward in training mode."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.recorded: list[torch.nn.Module] = []

    def __call__(self, module: torch.nn.Module, args: object) -> bool:  # args None: offered
        self.calls.append(type(module).__name__)
        if not module.training:
            return False
        self.recorded.append(module)
        return True


def _model() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1))


def _own_hooks(model: torch.nn.Module) -> dict[str, int]:
    return {type(m).__name__: len(m._forward_pre_hooks) for m in model.modules()}


def test_after_the_window_no_global_hook_is_left_and_only_unrecorded_buffer_modules_keep_one():
    before = len(torch_module._global_forward_pre_hooks)
    rec, model, x = Recorder(), _model(), torch.ones(5, 3)
    watch = ForwardWatch(rec)
    watch.open()
    assert len(torch_module._global_forward_pre_hooks) == before + 1
    model(x)
    watch.step_ended()
    assert len(torch_module._global_forward_pre_hooks) == before
    assert rec.recorded == [model[1]]          # the only module with buffers
    assert sum(_own_hooks(model).values()) == 0  # recorded in the window: nothing stays
    for _ in range(3):
        model(x)
    assert rec.calls == ["BatchNorm1d"]        # asked once, never again
    watch.remove()


def test_a_module_first_run_in_eval_mode_stays_watched_until_it_trains():
    rec, model, x = Recorder(), _model(), torch.ones(5, 3)
    watch = ForwardWatch(rec)
    watch.open()
    model.eval()
    model(x)                # a validation pass before training
    watch.step_ended()
    assert rec.recorded == [] and watch.watched() == 1
    assert _own_hooks(model)["BatchNorm1d"] == 1 and _own_hooks(model)["Linear"] == 0
    model.train()
    model(x)
    assert rec.recorded == [model[1]] and watch.watched() == 0
    watch.remove()


def test_buffer_modules_in_a_tree_that_ran_or_in_a_root_are_taken_when_the_window_closes():
    class Late(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.bn = torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)
            self.late = False

        def forward(self, x):
            h = self.lin(x)
            return self.bn(h) if self.late else h

    rec, x = Recorder(), torch.ones(5, 3)
    net = Late()                                   # runs: its whole tree is walked
    table = torch.nn.ModuleDict({"bn": torch.nn.BatchNorm1d(3)})  # never runs itself
    elsewhere = torch.nn.BatchNorm1d(3)            # neither runs nor is a root
    watch = ForwardWatch(rec)
    watch.open()
    net(x)
    assert rec.recorded == []                      # no module with buffers ran yet
    watch.step_ended(lambda: [table])
    assert rec.recorded == [net.bn, table["bn"]] and watch.watched() == 0
    elsewhere(x)
    assert elsewhere not in rec.recorded
    watch.remove()


def test_a_window_opened_again_closes_at_the_next_step_that_ran_a_module():
    before = len(torch_module._global_forward_pre_hooks)
    rec, model, x = Recorder(), _model(), torch.ones(5, 3)
    watch = ForwardWatch(rec)
    watch.open()
    watch.step_ended()              # a step without a forward pass: the window stays open
    assert watch.is_open
    model(x)
    watch.step_ended()
    assert not watch.is_open and len(torch_module._global_forward_pre_hooks) == before
    watch.open()                    # add_param_group on the same model: nothing new runs
    watch.step_ended()
    assert watch.is_open            # opened in this step, before its forward pass
    model(x)
    watch.step_ended()
    assert not watch.is_open and len(torch_module._global_forward_pre_hooks) == before
    second = _model()
    watch.open()                    # a new optimizer with a new model
    second(x)
    watch.step_ended()
    assert rec.recorded == [model[1], second[1]]
    watch.remove()
    assert len(torch_module._global_forward_pre_hooks) == before


def test_remove_undoes_every_hook():
    before = len(torch_module._global_forward_pre_hooks)
    rec, model, x = Recorder(), _model(), torch.ones(5, 3)
    watch = ForwardWatch(rec)
    watch.open()
    model.eval()
    model(x)
    watch.step_ended()
    assert watch.watched() == 1
    watch.open()
    watch.remove()
    assert len(torch_module._global_forward_pre_hooks) == before
    assert sum(_own_hooks(model).values()) == 0 and watch.watched() == 0


def test_a_compiled_model_keeps_the_global_hook_so_torch_does_not_compile_it_again():
    from torch._dynamo.utils import counters

    rec, model, x = Recorder(), _model(), torch.ones(5, 3)
    compiled = torch.compile(model, backend="eager")
    watch = ForwardWatch(rec)
    watch.open()
    counters.clear()
    compiled(x)
    watch.step_ended()
    assert rec.recorded == [model[1]]  # found in the compiled module's tree
    compiled(x)
    compiled(x)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    watch.remove()


def test_the_docstring_example_runs():
    assert doctest.testmod(_forward_watch).failed == 0
