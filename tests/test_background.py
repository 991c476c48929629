"""``%%distributed_fit --background``: the cell returns at once, the notebook stays usable.

A real IPython shell and a real 2-engine cluster: the handle's status, wait, stop and result;
what is refused while it trains (naming the job); a failure reported like a foreground one.
"""

from __future__ import annotations

import time

import pytest
from conftest import held_until, run_cell
from IPython.core.error import UsageError
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOOP = """import time
from phalanx import log, allreduce
for i in range(STEPS):
    log(loss=1.0 / (i + 1))
    allreduce(1.0)
    time.sleep(0.05)
"""


def test_a_background_run_returns_at_once_and_lands_its_returns(two_engines, shell, tmp_path):
    import phalanx

    run_cell(shell, "STEPS = 60")
    gate = tmp_path / "release"  # the run trains only once the checks made while it runs are done
    asked = time.monotonic()
    run = run_cell(shell, "%%distributed_fit --background --name bg-run --return w --no-widget\n"
                          + held_until(gate, LOOP) + "w = rank + 41\n")
    returned_s = time.monotonic() - asked
    try:
        assert run.status == "running" and run.name == "bg-run"
        [listed] = [r for r in phalanx.runs() if r.run_id == run.run_id]
        assert listed.name == "bg-run" and listed.status == "running"
        assert run_cell(shell, "1 + 1") == 2  # the notebook goes on
        for line, what in (("%cluster stop", "stop the cluster"), ("%cluster restart", "restart"),
                           ("%cluster scale 3", "scale the cluster")):
            with pytest.raises(UsageError, match=f"cannot {what}.*'bg-run' is going"):
                run_cell(shell, line)
        with pytest.raises(UsageError, match="'bg-run' is still running"):
            run_cell(shell, "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n")
        with pytest.raises(RuntimeError, match="has not ended yet"):
            run.result("w")
        gate.touch()
        record = run.wait(timeout=hang_limit(120))
    finally:
        gate.touch()
        run.stop()
        _settle(run)
    assert record.status == "done" and run.status == "done"
    assert shell.user_ns["w"] == 41 and run.result("w") == 41  # rank 0's value
    with pytest.raises(KeyError, match="'v' was not asked for"):
        run.result("v")
    print(f"measured: the --background cell returned in {returned_s:.2f} s")
    run_cell(shell, "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n")  # engines free again


def test_stop_and_failure_of_background_runs(two_engines, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, "STEPS = 2000")
    run = run_cell(shell, "%%distributed_fit --background --name long-bg --no-widget\n" + LOOP)
    try:
        _wait_for(lambda: two_engines.fits.active is not None and two_engines.fits.active.history.rows())
        assert run.stop()
        with pytest.raises(DistributedFitError, match=r"long-bg was stopped \(long-bg.stop\(\)\)"):
            run.wait(timeout=hang_limit(30))
    finally:
        run.stop()
        _settle(run)
    assert run.status == "interrupted"

    failing = run_cell(shell, "%%distributed_fit --background --name bad-bg --no-widget\n"
                              "from phalanx import allreduce\nallreduce(1.0)\n"
                              "if rank == 1:\n    raise ValueError('bad shard on rank 1')\n")
    with pytest.raises(DistributedFitError) as info:
        failing.wait(timeout=hang_limit(60))
    assert failing.status == "failed" and info.value.rank == 1
    assert "rank 1 (engine" in str(info.value) and "ValueError: bad shard on rank 1" in str(info.value)
    assert run_cell(shell, "%%distributed_fit --no-widget\nfrom phalanx import allreduce\nallreduce(1.0)\n") is None


def _wait_for(condition, timeout: float = hang_limit(60)) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _settle(run) -> None:
    """Whatever the test did, the run has ended before the next test uses the engines."""
    try:
        run.wait(timeout=hang_limit(60))
    except Exception:
        pass
