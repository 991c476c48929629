"""Training frameworks run data-parallel through ``%%distributed_fit`` unchanged: Hugging Face's
``Trainer``, accelerate's ``Accelerator`` and Lightning's ``Trainer(strategy="ddp")``, each on
2 real CPU engines against the same script launched by ``torchrun --nproc_per_node 2`` on this
machine.  Each script is written as its framework documents it (a tiny model built from code or a
config, generated data, nothing downloaded, no loggers) and saves, per rank, the trained
parameters and the dataset rows that rank read: the parameters agree within 1e-5 and every rank
read the same rows under both launchers.  The framework's DDP averages the gradients: phalanx's
zero-change mode averages none of them itself (its count of averaged backward passes stays 0).

One cluster for the module; one ``torchrun`` launch runs the three scripts in turn (in each
worker, as the engines run the cells), started while the cluster starts."""

from __future__ import annotations

import os
import subprocess
import sys

import types

import numpy as np
import pytest

from conftest import run_cell
from phalanx.runtime.adapters.torchrun import _not_interactive
from deadlines import hang_limit

cluster = pytest.mark.cluster

# The rows a rank reads are recorded by the dataset itself (DataLoader workers: none).
HF_TRAINER = """\
import os
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class RandomSentences(torch.utils.data.Dataset):
    def __init__(self, n):
        generator = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(0, 64, (n, 8), generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)
        self.seen = []

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        self.seen.append(int(i))
        return {"input_ids": self.input_ids[i], "labels": self.labels[i]}


torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=37, max_position_embeddings=16, num_labels=2,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
model = BertForSequenceClassification(config)
dataset = RandomSentences(64)
args = TrainingArguments(output_dir=OUT + ".hf", use_cpu=True, report_to="none",
                         per_device_train_batch_size=4, max_steps=6, learning_rate=1e-3,
                         save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=dataset)
trainer.train()

params = [p.detach().clone() for p in model.parameters()]
torch.save({"params": params, "seen": dataset.seen}, f"{OUT}.{os.environ['RANK']}")
"""

ACCELERATE = """\
import os
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator


class Rows(TensorDataset):
    seen = []

    def __getitem__(self, i):
        self.seen.append(int(i))
        return super().__getitem__(i)


accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
X = torch.randn(64, 5)
y = X @ torch.linspace(-1.0, 1.0, 5).unsqueeze(1) + 0.1
model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
dataset = Rows(X, y)
loader = DataLoader(dataset, batch_size=8, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()

params = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
torch.save({"params": params, "seen": dataset.seen}, f"{OUT}.{os.environ['RANK']}")
"""

LIGHTNING = """\
import os
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning as L


class Rows(TensorDataset):
    seen = []

    def __getitem__(self, i):
        self.seen.append(int(i))
        return super().__getitem__(i)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                       torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(0)
X = torch.randn(64, 5)
y = X @ torch.linspace(-1.0, 1.0, 5).unsqueeze(1) + 0.1
model = Regressor()
dataset = Rows(X, y)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=OUT + ".pl")
trainer.fit(model, DataLoader(dataset, batch_size=8, shuffle=True))

params = [p.detach().clone() for p in model.parameters()]
torch.save({"params": params, "seen": dataset.seen}, f"{OUT}.{os.environ['RANK']}")
"""

SCRIPTS = {"hf_trainer": HF_TRAINER, "accelerate": ACCELERATE, "lightning": LIGHTNING}

# After the script, in the cell only: how many backward passes phalanx averaged itself.
PASSES = """
from phalanx.runtime.run._engine_state import current_run
phalanx_passes = current_run().passes
"""

NEXT_CELL = """%%distributed_fit --no-widget --return total
import torch, torch.distributed as dist
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
total = t.item()
"""


def _script(name: str, out) -> str:
    return f"OUT = {str(out)!r}\n" + SCRIPTS[name]


# torchrun's workers run the three scripts one after another, as the engines run the cells (one
# launch: each worker imports torch and the frameworks once, as each engine does).
RUN_ALL = """\
import runpy, sys
for script in sys.argv[1:]:
    runpy.run_path(script, run_name="__main__")
"""


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The scripts under ``torchrun --standalone --nproc_per_node 2``, started at once; yields a
    function that waits for the launch and returns one script's output path."""
    root = tmp_path_factory.mktemp("torchrun")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    scripts = []
    for name in SCRIPTS:
        scripts.append(root / f"train_{name}.py")
        scripts[-1].write_text(_script(name, root / name))
    (root / "run_all.py").write_text(RUN_ALL)
    proc = subprocess.Popen([torchrun, "--standalone", "--nproc_per_node", "2",
                             f"--log-dir={root / 'logs'}", "run_all.py",  # not a /tmp/torchelastic_*
                             *map(str, scripts)], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

    output: list[str] = []

    def result(name: str):
        if proc.returncode is None:
            output.append(proc.communicate(timeout=hang_limit(240))[0])
        # Judged by what the workers wrote, not by torchrun's exit code: gloo's teardown at exit
        # aborts now and then ("terminate called without an active exception") after the
        # scripts have finished, which is the launcher's fault, not the scripts'.
        written = [root / f"{name}.{rank}" for rank in (0, 1)]
        assert all(path.exists() for path in written), \
            f"torchrun exited {proc.returncode} before {name} wrote its result:\n" + output[-1][-4000:]
        return root / name

    yield result
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _interactive() -> tuple:
    """On an engine: its prompt, and Lightning's flag (None before Lightning is imported)."""
    import sys

    flags = sys.modules.get("lightning.fabric.utilities.imports")
    return hasattr(sys, "ps1"), getattr(flags, "_IS_INTERACTIVE", None)


def _load(path, rank: int) -> dict:
    import torch

    return torch.load(f"{path}.{rank}")


def test_the_engine_is_not_interactive_for_the_cell_and_is_again_afterwards(monkeypatch):
    """Lightning's flag, copied into its modules at import, reads False inside the block (loaded
    before it or during it) and as outside afterwards; the prompt is back."""
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    before = types.ModuleType("lightning_like")
    before._IS_INTERACTIVE = hasattr(sys, "ps1")
    other = types.ModuleType("other")
    modules = {"lightning_like": before, "other": other, "odd": object()}
    with _not_interactive(modules):
        assert not hasattr(sys, "ps1") and before._IS_INTERACTIVE is False
        during = types.ModuleType("imported_in_the_cell")
        during._IS_INTERACTIVE = hasattr(sys, "ps1")
        modules["imported_in_the_cell"] = during
    assert sys.ps1 == ">>> "
    assert before._IS_INTERACTIVE is True and during._IS_INTERACTIVE is True
    assert not hasattr(other, "_IS_INTERACTIVE")
    monkeypatch.delattr(sys, "ps1")
    with _not_interactive(modules):
        assert before._IS_INTERACTIVE is False
    assert not hasattr(sys, "ps1") and before._IS_INTERACTIVE is True   # as it was


@cluster
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_framework_trains_as_under_its_launcher(name, launched, two_engines, shell, tmp_path):
    out = tmp_path / "out"
    view = two_engines.cluster.view()
    prompts = [prompt for prompt, _ in view.apply_sync(_interactive)]
    run_cell(shell, "%%distributed_fit --no-widget --return params,phalanx_passes\n"
             + _script(name, out) + PASSES)
    reference = launched(name)
    for rank in (0, 1):
        got, want = _load(out, rank), _load(reference, rank)
        assert got["seen"] == want["seen"], (rank, got["seen"], want["seen"])
        assert len(got["params"]) == len(want["params"])
        for a, b in zip(got["params"], want["params"]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-5)
    diff = max(float((a - b).abs().max()) for a, b in
               zip(shell.user_ns["params"], _load(reference, 0)["params"]))
    assert diff <= 1e-5
    print(f"{name}: max |param diff| vs torchrun {diff:.3g}")
    assert shell.user_ns["phalanx_passes"] == 0      # DDP averaged; phalanx did not too
    # the engines' prompt is back, and Lightning's flag (imported by the Lightning cell) with it
    after = view.apply_sync(_interactive)
    assert [prompt for prompt, _ in after] == prompts
    assert all(flag in ((None, prompt) if name != "lightning" else (prompt,))
               for prompt, flag in after), after
    run_cell(shell, NEXT_CELL)
    assert shell.user_ns["total"] == 3.0


# --- what the frameworks log reaches the live views; their progress bars stay one line ---------

HF_LOGGING = """\
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=37, max_position_embeddings=16, num_labels=2)
data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(64)]
args = TrainingArguments(output_dir=OUT, use_cpu=True, report_to="none", max_steps=6,
                         per_device_train_batch_size=4, logging_steps=1, save_strategy="no")
Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=data).train()
"""

LIGHTNING_LOGGING = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning as L


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(5, 1)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                    log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
                    default_root_dir=OUT)
trainer.fit(Regressor(), DataLoader(TensorDataset(X, y), batch_size=8))
"""


ACCELERATE_LOGGING = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(5, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(X, y), batch_size=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for xb, yb in loader:
    optimizer.zero_grad()
    loss = F.mse_loss(model(xb), yb)
    accelerator.backward(loss)
    optimizer.step()
    accelerator.log({"train_loss": loss.item(), "note": "text is not a curve"})
"""


def _wrapped_on_engines(session) -> list:
    """Per engine: the framework methods that still carry phalanx's wrapper (none after a run)."""
    def wrapped():
        import sys

        found = []
        for module, cls, method in (("transformers.trainer", "Trainer", "log"),
                                    ("accelerate.accelerator", "Accelerator", "log"),
                                    ("torch.utils.data.distributed", "DistributedSampler",
                                     "__init__")):
            owner = getattr(sys.modules.get(module), cls, None)
            function = getattr(owner, method, None)
            if getattr(function, "_phalanx_records", False) or hasattr(function, "__wrapped__"):
                found.append(f"{cls}.{method}")
        return found

    return session.cluster.view().apply_sync(wrapped)


def _mpi_started() -> bool:
    import sys

    return "mpi4py.MPI" in sys.modules


def _logged(session, name: str) -> dict[int, list[int]]:
    """The steps at which each rank recorded ``name``."""
    steps: dict[int, list[int]] = {}
    for row in session.last_run().history.rows():
        if name in row and row[name] == row[name]:  # NaN: the row has other metrics only
            steps.setdefault(row["rank"], []).append(row["step"])
    return steps


def _bar_lines(out: str, rank: int) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"[rank {rank}]") and "it/s]" in line
            or line.startswith(f"[rank {rank}]") and "s/it]" in line]


@cluster
def test_a_trainers_logged_metrics_reach_the_run_history_and_its_bar_is_one_line(
        two_engines, shell, tmp_path, capsys):
    """Hugging Face's loss and learning rate, logged every step, are each rank's rows at steps
    1..6 without a log() call; the run knows its 6 steps; tqdm's redraws come out as one line."""
    capsys.readouterr()
    run_cell(shell, f"%%distributed_fit --no-widget\nOUT = {str(tmp_path / 'hf')!r}\n" + HF_LOGGING)
    out = capsys.readouterr().out
    assert _logged(two_engines, "loss") == {0: [1, 2, 3, 4, 5, 6], 1: [1, 2, 3, 4, 5, 6]}
    assert set(_logged(two_engines, "learning_rate")) == {0, 1}
    assert "train_runtime" not in two_engines.last_run().history.rows()[-1]
    assert two_engines.last_run().total_steps == 6
    assert len(_bar_lines(out, 0)) <= 2, out   # the training bar (and no redraw of it)
    assert _wrapped_on_engines(two_engines) == [[], []]   # the framework is as it was


@cluster
def test_lightnings_self_log_reaches_the_run_history_and_shard_split_twice_is_said(
        two_engines, shell, tmp_path, capsys):
    """``self.log`` rows arrive per rank at each optimizer step; --shard data that Lightning's
    DistributedSampler splits again is said in the cell, once."""
    import torch

    torch.manual_seed(0)
    shell.user_ns.update(X=torch.randn(64, 5), y=torch.randn(64, 1))
    capsys.readouterr()
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y\n"
             f"OUT = {str(tmp_path / 'pl')!r}\n" + LIGHTNING_LOGGING)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    # 32 rows per rank, Lightning's sampler takes 16 of them: 2 batches an epoch, 2 epochs
    assert _logged(two_engines, "train_loss") == {0: [1, 2, 3, 4], 1: [1, 2, 3, 4]}
    assert two_engines.last_run().total_steps == 4
    print(out)
    assert out.count("DoubleSplitWarning") == 1, out
    assert "--shard X,y" in out and "1/4 of the data" in out
    assert "[rank 0] <distributed_fit>:" in out          # it names the cell's line
    assert len(_bar_lines(out, 0)) <= 2, out
    # Lightning took torchrun's world (its TorchElastic environment) and never probed for MPI,
    # whose start-up leaves a file in /dev/shm behind an engine that is stopped or restarted
    assert two_engines.cluster.view().apply_sync(_mpi_started) == [False, False]


@cluster
def test_accelerators_log_reaches_the_run_history_and_shard_split_twice_is_said(
        two_engines, shell, capsys):
    """``accelerator.log`` rows are each rank's own numbers (text left out); accelerate's
    ``prepare`` splitting --shard data again is said once, then nothing stays wrapped."""
    import torch

    torch.manual_seed(0)
    shell.user_ns.update(X=torch.randn(64, 5), y=torch.randn(64, 1))
    capsys.readouterr()
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y\n" + ACCELERATE_LOGGING)
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert _logged(two_engines, "train_loss") == {0: [1, 2], 1: [1, 2]}
    assert "note" not in two_engines.last_run().history.rows()[0]
    assert out.count("DoubleSplitWarning") == 1 and "accelerate's prepare" in out, out
    assert _wrapped_on_engines(two_engines) == [[], []]


def test_a_progress_bar_comes_out_as_its_last_drawing():
    """tqdm's carriage-return redraws and a colour-only line: one line each, as a terminal
    leaves them."""
    from phalanx.fit.run._output import as_shown

    bar = "".join(f"\r{i * 10:3d}%|{'#' * i:<10}| {i}/10" for i in range(11)) + "\n"
    assert as_shown("epoch 1\n" + bar + "\x1b[?25h\n\ndone\n") == [
        "epoch 1", "100%|##########| 10/10", "", "done"]


def test_a_framework_imported_by_the_cell_is_wrapped_once_it_loads(tmp_path, monkeypatch):
    """The watch fires when the module loads (not before), and a withdrawn watch never does."""
    from phalanx.runtime.adapters._import_watch import when_loaded

    (tmp_path / "phalanx_fw_probe.py").write_text("class Trainer:\n    pass\n")
    (tmp_path / "phalanx_fw_never.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded: list = []
    when_loaded("phalanx_fw_probe", loaded.append)
    withdraw = when_loaded("phalanx_fw_never", loaded.append)
    assert loaded == []
    withdraw()
    import phalanx_fw_never  # noqa: F401
    import phalanx_fw_probe

    assert loaded == [phalanx_fw_probe]
    when_loaded("phalanx_fw_probe", loaded.append)   # loaded already: at once
    assert loaded == [phalanx_fw_probe, phalanx_fw_probe]
    for name in ("phalanx_fw_probe", "phalanx_fw_never"):
        monkeypatch.delitem(sys.modules, name)
