"""``%cluster start --launcher slurm`` against a real Slurm (slurmctld + slurmd + munge).

Engines start as Slurm jobs through ipyparallel's SlurmEngineSetLauncher: real sbatch, squeue
and scancel.  One Slurm cluster serves the whole module (see ``slurm_support``).
"""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import pytest
from IPython.core.error import UsageError

from conftest import assert_all_gone, engine_pids, run_cell
from deadlines import hang_limit
from slurm_support import SlurmCluster, ensure_packages
from test_fit import LOOP, SETUP, _params, _reference
from test_reliability_helpers import figures  # noqa: F401

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def slurm():
    reason = ensure_packages()
    if reason:
        pytest.skip(f"Slurm tests: {reason}")
    cluster = SlurmCluster()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # the kernel's sbatch/squeue talk to it
    try:
        cluster.start()
        yield cluster
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        cluster.stop()


@pytest.fixture
def session(no_cluster, slurm):
    return no_cluster


def test_slurm_engines_train_scale_and_stop(session, shell, slurm, figures):
    started = time.monotonic()
    shell.run_line_magic("cluster", "start -n 2 --launcher slurm --gpus none --timeout 120")
    figures["15_slurm_start_to_ready_s"] = round(time.monotonic() - started, 2)
    jobs = slurm.queue()
    assert len(jobs) == 1 and session.cluster.size == 2  # one job, two engines (srun tasks)
    assert all(s.info.get("local_rank") is not None for s in session.cluster.slots())  # under srun

    run_cell(shell, SETUP + "STEPS = 8\n")
    run_cell(shell, "%%distributed_fit --shard X,y --return model --no-widget\n" + LOOP)
    trained = shell.user_ns["model"]
    run_cell(shell, SETUP)
    np.testing.assert_allclose(_params(trained), _params(_reference(shell, 8)), atol=1e-5)

    shell.run_line_magic("cluster", "scale 3")
    assert session.cluster.size == 3 and len(slurm.queue()) == 2  # scaling added a job

    # one rank of the first job restarts alone: its engine exits (the job goes on with the
    # other), its successor is a job of its own; the old process is gone when restart returns
    old, kept = session.cluster.slots()[1], session.cluster.slots()[0]
    shell.run_line_magic("cluster", "restart 1")
    assert_all_gone([old.pid], timeout=0.5)
    slots = session.cluster.slots()
    assert [s.pid for s in slots][0] == kept.pid and slots[1].pid != old.pid
    assert len(slurm.queue()) == 3 and all(s.restarts_alone for s in slots)
    launcher = session.cluster.state.launcher  # its look inside a job, on the engine's node
    assert launcher.gone_on_node(old, timeout=5) and not launcher.gone_on_node(kept, timeout=1)
    run_cell(shell, "%%distributed_fit --no-widget --return total\n"
                    "from phalanx import allreduce\ntotal = allreduce(1.0, op='sum')\n")
    assert shell.user_ns["total"] == 3.0

    pids = engine_pids(session)
    shell.run_line_magic("cluster", "stop")
    assert slurm.queue() == []
    assert_all_gone(pids)


def test_local_start_to_ready_for_comparison(session, shell, figures):
    started = time.monotonic()
    shell.run_line_magic("cluster", "start -n 2 --gpus none")
    figures["15_local_start_to_ready_s"] = round(time.monotonic() - started, 2)
    assert session.cluster.size == 2


def test_a_job_that_stays_pending_is_reported_with_its_reason(session, shell, slurm):
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("cluster", "start -n 2 --launcher slurm --gpus none --timeout 8 "
                                        "--slurm-args=--begin=now+1hour")
    message = str(caught.value)
    assert "is still pending" in message and "BeginTime" in message, message
    job = message.split("Slurm job ")[1].split()[0]
    assert job.isdigit()
    assert time.monotonic() - started < hang_limit(60)
    assert slurm.queue() == [] and not session.cluster.running  # cancelled, nothing left


def test_a_job_the_partition_will_never_run_is_reported_at_once(session, shell, slurm):
    # The partition's time limit made shorter than what the job asks: Slurm keeps the job pending
    # for ever (reason PartitionTimeLimit), so phalanx says so without waiting out --timeout.
    subprocess.run(["scontrol", "update", "PartitionName=debug", "MaxTime=5"], check=True)
    try:
        started = time.monotonic()
        with pytest.raises(UsageError) as caught:
            shell.run_line_magic("cluster", "start -n 1 --launcher slurm --gpus none --timeout 300 "
                                            "--slurm-args=--time=60")
        waited = time.monotonic() - started
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=debug", "MaxTime=INFINITE"], check=True)
    message = str(caught.value)
    assert "cannot start as asked" in message and "PartitionTimeLimit" in message, message
    assert waited < 150, f"reported after {waited:.0f} s: it waited for the start timeout"
    assert slurm.queue() == [] and not session.cluster.running  # cancelled, nothing left


@pytest.mark.parametrize("how", ["magic", "profile"])
def test_an_unknown_partition_shows_slurms_message(session, shell, slurm, tmp_path, how):
    line = "start -n 1 --launcher slurm --gpus none --timeout 30"
    if how == "magic":
        line += ' --slurm-args "--partition=nosuch --time=5"'
    else:  # the same option read from an ipyparallel profile
        profile = tmp_path / "profile_nosuch"
        profile.mkdir()
        (profile / "ipcluster_config.py").write_text(
            "c.SlurmEngineSetLauncher.queue = 'nosuch'\n")
        line += f" --profile {profile}"
    with pytest.raises(UsageError) as caught:
        shell.run_line_magic("cluster", line)
    message = str(caught.value)
    assert "sbatch refused the engine job" in message
    assert "invalid partition specified: nosuch" in message, message
    assert slurm.queue() == [] and not session.cluster.running


def test_no_sbatch_on_path_says_so(shell, monkeypatch):
    from phalanx._session import session_for_shell

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="sbatch, which is not on PATH"):
        shell.run_line_magic("cluster", "start -n 1 --launcher slurm --gpus none")
    assert not session_for_shell(shell).cluster.running
