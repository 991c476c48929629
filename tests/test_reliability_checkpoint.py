"""Checkpoint, resume, automatic restarts and elastic scaling on a real 2-engine cluster.

Scenarios 4 and 5 of issue 9 and its elastic scaling: the training loop is written with
``phalanx.steps(N)``; commits hold model, optimizer, LR scheduler, step and every rank's RNG
states.  On CPU with ``--seed`` a run interrupted by an engine death and resumed ends with
exactly the parameters of an uninterrupted run.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from conftest import run_cell
from test_reliability_helpers import figures, wait_for  # noqa: F401
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

SETUP = """
import os, signal, time
import torch
from phalanx import allreduce, log
from phalanx.runtime import steps
torch.manual_seed(0)
X = torch.randn(64, 5)
y = X @ torch.arange(1.0, 6.0) + 0.3
STEPS, PAUSE = 30, 0.0
"""

# Per-rank noise makes the RNG state part of what must be restored exactly; momentum and the
# scheduler make the optimizer's and the scheduler's state matter too.  fault(rank, step) is
# notebook code deciding whether this rank fails here.
LOOP = """
model = torch.nn.Linear(5, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.8)
for step in steps(STEPS):
    i = (step * 4) % (len(X) - 3)
    xb = X[i:i + 4] + 0.01 * torch.randn(4, 5)
    opt.zero_grad()
    loss = ((model(xb).squeeze(1) - y[i:i + 4]) ** 2).mean()
    loss.backward(); opt.step(); sched.step()
    log(loss=loss.item())
    fault(rank, step)
    time.sleep(PAUSE)
"""

NO_FAULT = "def fault(rank, step):\n    pass\n"


def _kill_once(marker, rank: int, at: int) -> str:
    return f"""
def fault(rank, step):
    if rank == {rank} and step == {at} and not os.path.exists({str(marker)!r}):
        open({str(marker)!r}, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _raise(rank: int, at: int, marker=None) -> str:
    once = f" and not os.path.exists({str(marker)!r})" if marker else ""
    touch = f"\n        open({str(marker)!r}, 'w').close()" if marker else ""
    return f"""
def fault(rank, step):
    if rank == {rank} and step == {at}{once}:{touch}
        raise ValueError("bad shard on rank {rank}")
"""


def _params(model) -> list:
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture
def ckpt(two_engines, shell):
    run_cell(shell, SETUP + NO_FAULT)
    return two_engines


@pytest.fixture
def reference(ckpt, shell):
    """Parameters after an uninterrupted, uncheckpointed run of the loop."""
    run_cell(shell, "%%distributed_fit --shard X,y --seed 1 --return model\n" + LOOP)
    return _params(shell.user_ns["model"])


def _assert_equal(got, want):
    assert all(torch.equal(a, b) for a, b in zip(got, want)), [
        (a - b).abs().max().item() for a, b in zip(got, want)]


def test_resume_after_engine_death_from_a_survivors_memory_equals_uninterrupted(
        ckpt, reference, shell, tmp_path, figures):
    from phalanx.fit import DistributedFitError

    run_cell(shell, _kill_once(tmp_path / "killed", rank=1, at=17))
    with pytest.raises(DistributedFitError, match="rank 1 .* died"):
        run_cell(shell, "%%distributed_fit --shard X,y --seed 1 --checkpoint-every 5\n" + LOOP)
    run_cell(shell, "%cluster restart 1")
    started = time.monotonic()
    run_cell(shell, "%%distributed_fit --shard X,y --seed 1 --resume --return model\n" + LOOP)
    record = ckpt.last_run()
    resumed = record.changes[0]
    assert resumed["kind"] == "resume" and resumed["step"] == 15
    assert resumed["sources"] == ["memory", "peer"]  # rank 1's engine is new: rank 0 sent it
    assert 17 - resumed["step"] <= 5  # lost at most K steps
    assert record.status == "done" and record.steps == {0: 30, 1: 30}
    _assert_equal(_params(shell.user_ns["model"]), reference)
    figures["4_resume_memory_steps_lost"] = 17 - resumed["step"]
    figures["4_resume_memory_run_s"] = round(time.monotonic() - started, 2)


def test_resume_from_a_checkpoint_dir_after_losing_every_engine(ckpt, reference, shell, tmp_path):
    from phalanx.fit import DistributedFitError

    folder = tmp_path / "ckpt"
    run_cell(shell, _kill_once(tmp_path / "killed", rank=1, at=22))
    with pytest.raises(DistributedFitError, match="rank 1 .* died"):
        run_cell(shell, f"%%distributed_fit --shard X,y --seed 1 --checkpoint-every 5 "
                        f"--checkpoint-dir {folder}\n" + LOOP)
    lineage = next(p for p in folder.iterdir() if p.is_dir())
    assert sorted(os.listdir(lineage / "rank-0")) == ["step-15.pt", "step-20.pt"]  # the last 2
    run_cell(shell, "%cluster restart")  # every engine new: nothing left in memory
    ckpt.fits._lineage = None  # as after a kernel restart: the directory says what to resume
    run_cell(shell, f"%%distributed_fit --shard X,y --seed 1 --resume --checkpoint-dir {folder} "
                    "--return model\n" + LOOP)
    resumed = ckpt.last_run().changes[0]
    assert resumed["step"] == 20 and resumed["sources"] == ["disk", "disk"]
    _assert_equal(_params(shell.user_ns["model"]), reference)


def test_max_restarts_restarts_the_failing_rank_and_resumes(ckpt, reference, shell, tmp_path,
                                                           figures):
    run_cell(shell, _raise(rank=1, at=12, marker=tmp_path / "raised"))
    failing_pid = ckpt.cluster.slots()[1].pid
    started = time.monotonic()
    run_cell(shell, "%%distributed_fit --shard X,y --seed 1 --checkpoint-every 5 --max-restarts 1 "
                    "--return model\n" + LOOP)
    record = ckpt.last_run()
    kinds = [(c["kind"], c.get("step")) for c in record.changes]
    assert kinds == [("restart", 13), ("resume", 10)], kinds  # 13 optimizer steps done
    assert record.changes[0]["ranks"] == [1] and record.changes[0]["error"] == "ValueError"
    assert ckpt.cluster.slots()[1].pid != failing_pid  # rank 1 runs on a new engine
    assert record.status == "done"
    _assert_equal(_params(shell.user_ns["model"]), reference)
    figures["5_one_restart_run_s"] = round(time.monotonic() - started, 2)


def test_max_restarts_exhausted_ends_failed_with_the_first_traceback(ckpt, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, _raise(rank=1, at=7))
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --shard X,y --seed 1 --checkpoint-every 5 "
                        "--max-restarts 2\n" + LOOP)
    error = info.value
    message = str(error)
    assert error.status == "failed" and error.rank == 1
    assert "rank 1 (engine" in message and "ValueError: bad shard on rank 1" in message
    assert 'File "<distributed_fit>"' in message  # the remote traceback of the first failure
    assert "resumed 2 time(s)" in message
    record = ckpt.last_run()
    assert record.status == "failed"
    assert [c["kind"] for c in record.changes] == ["restart", "resume", "restart", "resume"]
    run_cell(shell, NO_FAULT)
    run_cell(shell, "%%distributed_fit --shard X,y\n" + LOOP)
    assert ckpt.last_run().status == "done"


def test_scaling_during_a_checkpointed_run_reforms_the_group_and_continues(ckpt, shell, figures):
    run_cell(shell, "STEPS, PAUSE = 60, 0.05\n")
    asked: dict = {}

    def click_plus():
        tracker = wait_for(lambda: ckpt.fits.active, 60, what="the run")
        wait_for(lambda: sum(r["rank"] == 0 for r in tracker.history.rows()) >= 12, 60,
                 what="12 steps")
        asked["step"] = max(r["step"] for r in tracker.history.rows() if r["rank"] == 0)
        asked["t"] = time.monotonic()
        ckpt.scale(3)  # what the + button and %cluster scale call

    thread = threading.Thread(target=click_plus, daemon=True)
    thread.start()
    try:
        run_cell(shell, "%%distributed_fit --shard X,y --seed 1 --checkpoint-every 5 "
                        "--return model\n" + LOOP)
    finally:
        thread.join(timeout=hang_limit(5))
    record = ckpt.last_run()
    resize = next(c for c in record.changes if c["kind"] == "resize")
    assert (resize["from"], resize["to"]) == (2, 3)
    assert resize["step"] % 5 == 0 and 0 <= resize["step"] - asked["step"] <= 5
    assert record.status == "done" and record.world_size == 3
    assert record.steps == {0: 60, 1: 60, 2: 60}
    rank2 = [r["step"] for r in record.history.rows() if r["rank"] == 2]
    assert min(rank2) == resize["step"] + 1 and max(rank2) == 60  # it joined at the commit
    assert ckpt.cluster.size == 3
    figures["elastic_resize_commit_delay_steps"] = resize["step"] - asked["step"]
    figures["elastic_steps_lost"] = 0
    run_cell(shell, "%cluster scale 2")


def test_scaling_during_a_run_without_checkpoints_is_refused(ckpt, shell):
    from phalanx.cluster import ClusterError

    refused: dict = {}

    def click_plus():
        wait_for(lambda: ckpt.fits.active is not None and ckpt.fits.active.history.rows(), 60,
                 what="the run")
        try:
            ckpt.scale(3)
        except ClusterError as exc:
            refused["error"] = str(exc)

    thread = threading.Thread(target=click_plus, daemon=True)
    thread.start()
    run_cell(shell, "STEPS, PAUSE = 40, 0.05\n")
    run_cell(shell, "%%distributed_fit --shard X,y\n" + LOOP)
    thread.join(timeout=hang_limit(5))
    assert "only a run with --checkpoint-every K can change its size" in refused["error"]
    assert ckpt.cluster.size == 2 and ckpt.last_run().status == "done"


@pytest.mark.parametrize("flags, message", [
    ("--checkpoint-dir /tmp/x", "--checkpoint-dir needs --checkpoint-every K"),
    ("--checkpoint-every 0", "--checkpoint-every must be a whole number of at least 1"),
    ("--max-restarts -1", "--max-restarts must be a whole number of at least 0"),
    ("--resume --checkpoint-dir /nonexistent/phalanx", "holds no phalanx checkpoints"),
])
def test_bad_recovery_flags_run_nothing(ckpt, shell, flags, message):
    from IPython.core.error import UsageError

    before = len(ckpt.cluster.client.history)
    with pytest.raises(UsageError, match=message):
        run_cell(shell, f"%%distributed_fit {flags}\n" + LOOP)
    assert len(ckpt.cluster.client.history) == before


def test_checkpoint_every_without_steps_loop_warns(ckpt, shell):
    from phalanx.fit import CheckpointWarning

    with pytest.warns(CheckpointWarning, match="committed nothing") as caught:
        run_cell(shell, "%%distributed_fit --checkpoint-every 2\nfor i in range(4):\n    allreduce(1.0)\n")
    # shown at the person's cell, as a warning of their own code is, not inside phalanx
    assert caught[0].filename in shell.compile._filename_map, caught[0].filename
