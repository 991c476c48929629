"""``%cluster stacks`` shows where every rank is, while a run is hung, without stopping it.

A real 2-engine cluster: rank 0 waits in a collective that rank 1 does not join (rank 1 waits
for a file the test creates), the run in the background so the notebook is free, as a person's
would be.  The answer names both ranks, the collective and the cell's lines; then the file lets
rank 1 join and the run ends as it would have.
"""

from __future__ import annotations

import time

import pytest
from conftest import run_cell
from deadlines import hang_limit
from IPython.core.error import UsageError

pytestmark = [pytest.mark.cluster]


def hung_run(gate) -> str:
    return f"""%%distributed_fit --no-widget --background --name hung --return total
import os, time
from phalanx import allreduce
if rank == 1:
    while not os.path.exists({str(gate)!r}):
        time.sleep(0.05)
total = allreduce(1.0, op="sum")
"""


def stacks(shell, capsys) -> tuple[str, float]:
    capsys.readouterr()
    began = time.monotonic()
    run_cell(shell, "%cluster stacks")
    took = time.monotonic() - began
    return capsys.readouterr().out, took


def test_stacks_of_a_hung_run_name_the_collective_and_the_cell_lines(shell, two_engines, capsys,
                                                                    tmp_path):
    gate = tmp_path / "join"
    run = run_cell(shell, hung_run(gate))
    try:
        deadline = time.monotonic() + hang_limit(60)
        text, took = stacks(shell, capsys)
        while "waiting" not in text and time.monotonic() < deadline:  # rank 0 not there yet
            time.sleep(0.2)
            text, took = stacks(shell, capsys)
        with capsys.disabled():
            print(f"%cluster stacks answered in {took:.2f} s during the hung run:\n{text}")
        rank0, rank1 = text.split("rank 1 (engine")
        assert rank0.startswith("rank 0 (engine")
        assert "waiting" in rank0 and "in allreduce" in rank0, text
        assert 'File "<distributed_fit>", line 7, in <module>' in rank0
        assert 'total = allreduce(1.0, op="sum")' in rank0
        assert "running (not in a collective)" in rank1, text
        assert 'File "<distributed_fit>", line 6, in <module>' in rank1
        assert "time.sleep(0.05)" in rank1
        assert run.status == "running"  # asking stopped nothing
    finally:
        gate.touch()
    run.wait(timeout=hang_limit(60))
    assert run.result("total") == 2.0  # the run ended as it would have

    text, took = stacks(shell, capsys)
    with capsys.disabled():
        print(f"%cluster stacks answered in {took:.2f} s with the engines idle")
    assert text.count("idle (no run)") == 2, text


def test_a_stall_message_shows_where_the_ranks_still_running_are(shell, two_engines, capsys):
    """A run hung on purpose: rank 1 never reaches the allreduce rank 0 waits in.  The collective
    timeout's message carries rank 1's stack as %cluster stacks shows it (asked before the
    interrupt moved it); rank 0 had returned with its timeout, so it is not asked."""
    from phalanx.fit import DistributedFitError

    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, """%%distributed_fit --no-widget --collective-timeout 2
import time
from phalanx import allreduce
if rank == 1:
    while True:
        time.sleep(0.05)
total = allreduce(1.0, op="sum")
""")
    message = str(info.value)
    with capsys.disabled():
        print(f"the stall's message:\n{message}")
    assert info.value.rank == 1 and "rank 1" in message and "stalled" in message
    head, stacks = message.split("Where the ranks still running were when the deadline passed "
                                 "(as %cluster stacks shows them):\n")
    assert stacks.startswith("rank 1 (engine"), stacks
    assert "rank 0 (engine" not in stacks  # it had returned: nothing to ask
    assert "running (not in a collective)" in stacks
    assert 'File "<distributed_fit>", line 6, in <module>' in stacks
    assert "time.sleep(0.05)" in stacks
    run_cell(shell, "%%distributed_fit --no-widget --return total\n"
                    "from phalanx import allreduce\ntotal = allreduce(1.0, op='sum')\n")
    assert shell.user_ns["total"] == 2.0  # the same engines train at once


def test_stacks_without_a_cluster_says_how_to_start_one(shell, no_cluster):
    with pytest.raises(UsageError, match="no cluster is running: start one with %cluster start"):
        run_cell(shell, "%cluster stacks")
    with pytest.raises(UsageError, match="%cluster stacks takes no '1'"):
        run_cell(shell, "%cluster stacks 1")
