"""The run's ledger of what it changed in other libraries: everything is taken back, last
first, whatever fails on the way; on a real cluster, every undo made to fail in turn still
leaves the engine as it was and the failure is named in the cell."""

from __future__ import annotations

import types

import pytest
from conftest import run_cell
from phalanx.runtime.run._patch_ledger import PatchLedger


def test_undo_runs_last_first_and_puts_back_originals_and_inherited_lookups():
    class Base:
        def hello(self):
            return "base"

    class Child(Base):
        pass

    module = types.SimpleNamespace(train=lambda: "library")
    order, ledger = [], PatchLedger()
    original = ledger.set(module, "train", lambda: "ours", "train")
    assert original() == "library" and module.train() == "ours"
    inherited = ledger.set(Child, "hello", lambda self: "patched", "hello")
    assert inherited is Base.hello and Child().hello() == "patched"
    ledger.on_undo(lambda: order.append("first"), "first")
    ledger.on_undo(lambda: order.append("second"), "second")
    assert ledger.undo_all() == []
    assert order == ["second", "first"]
    assert module.train() == "library" and "hello" not in vars(Child) and Child().hello() == "base"
    assert len(ledger) == 0 and ledger.undo_all() == []  # a second end is a no-op


def test_a_failing_undo_skips_nothing_and_is_named():
    module = types.SimpleNamespace(train="library")
    done, ledger = [], PatchLedger()
    ledger.on_undo(lambda: done.append("early"), "early")
    ledger.set(module, "train", "ours", "train patch")

    def broken():
        raise OSError("socket already closed")

    ledger.on_undo(broken, "LightGBM's world")
    ledger.on_undo(lambda: done.append("late"), "late")
    failures = ledger.undo_all()
    assert failures == ["undoing LightGBM's world failed: OSError: socket already closed"]
    assert done == ["late", "early"] and module.train == "library"


def test_an_attribute_an_adapter_changed_again_is_put_back_and_said():
    class Library:
        def train(self):
            return "library"

    original = Library.__dict__["train"]
    ledger = PatchLedger()
    # registered first, so it is undone last: it leaves its own function where train was
    ledger.on_undo(lambda: setattr(Library, "train", lambda self: "stray"), "a sloppy adapter")
    ledger.set(Library, "train", lambda self: "ours", "train patch")
    failures = ledger.undo_all()
    assert len(failures) == 1 and "was not train patch's original" in failures[0]
    assert Library.__dict__["train"] is original


# --- on a real cluster ---------------------------------------------------------------------

TRAIN = """
from phalanx.runtime.run._engine_state import current_run
import torch
ledger = current_run().patches
entries = ledger.describe()
if BREAK is not None:
    entry = ledger._entries[BREAK]
    def broken(real=entry.undo):
        raise RuntimeError("undo made to fail")
    entry.undo = broken
net = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    net(torch.ones(4, 3)).sum().backward()
    opt.step()
"""

@pytest.mark.cluster
def test_every_undo_made_to_fail_in_turn_leaves_the_engine_whole(two_engines, shell, capfd):
    from notebook_shell import clean_notebook

    clean_notebook()
    # the originals, as the engines have them outside any run
    counts = two_engines.cluster.client[:].apply_sync(_torch_patch_points)
    assert counts[0] == counts[1]
    shell.user_ns["BREAK"] = None
    run_cell(shell, "%%distributed_fit --no-widget --return entries\n" + TRAIN)
    entries = shell.user_ns["entries"]
    assert any("Optimizer.__init__" in e for e in entries) and len(entries) >= 8, entries
    for index, what in enumerate(entries):
        shell.user_ns["BREAK"] = index
        capfd.readouterr()
        run_cell(shell, "%%distributed_fit --no-widget\n" + TRAIN)
        said = capfd.readouterr()
        assert f"undoing {what} failed: RuntimeError: undo made to fail" in said.out + said.err, what
        assert two_engines.cluster.client[:].apply_sync(_torch_patch_points) == counts, what


def _torch_patch_points():
    import importlib

    import torch

    module, optimizer = (importlib.import_module(name) for name in
                         ("torch.nn.modules.module", "torch.optim.optimizer"))
    return (id(torch.optim.Optimizer.__init__), id(torch.autograd.backward),
            len(module._global_forward_pre_hooks), len(module._global_parameter_registration_hooks),
            len(optimizer._global_optimizer_pre_hooks), len(optimizer._global_optimizer_post_hooks))
