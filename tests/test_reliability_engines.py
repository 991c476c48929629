"""Engines that cannot work: crashing at start-up on scale/restart, other package versions.

Scenarios 8 and 9 of issue 9.  A ``sitecustomize.py`` put on the engines' PYTHONPATH plays the
broken environment; it is gated on ``PHALANX_SLOT`` (set only in engine processes) and a test
variable, so the kernel and the controller are untouched and only engines started while the
variable is set are affected.
"""

from __future__ import annotations

import time

import pytest
from IPython.core.error import UsageError

from conftest import run_cell
from test_reliability_helpers import figures, write_sitecustomize  # noqa: F401
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

CRASH = """import os, sys
if os.environ.get("PHALANX_SLOT") and os.environ.get("PHALANX_TEST_CRASH"):
    sys.stderr.write("ImportError: phalanx-test: broken engine environment\\n")
    sys.stderr.flush()
    os._exit(3)
"""

# PHALANX_TEST_FAKE_VERSIONS="cloudpickle=0.0.1,torch=1.0.0": what importlib.metadata reports.
FAKE_VERSIONS = """import os
fake = os.environ.get("PHALANX_TEST_FAKE_VERSIONS")
if os.environ.get("PHALANX_SLOT") and fake:
    import importlib.metadata as md
    wanted = dict(item.split("=") for item in fake.split(","))
    real = md.version
    md.version = lambda name: wanted.get(name) or real(name)
"""


def _next_run_works(shell, session):
    run_cell(shell, "%%distributed_fit --return total\nfrom phalanx import allreduce\n"
                    "total = allreduce(1.0, op='sum')\n")
    assert shell.user_ns["total"] == 2.0 and session.last_run().status == "done"


def test_scale_and_restart_with_crashing_engines_fail_fast(two_engines, shell, tmp_path,
                                                           monkeypatch, figures):
    from phalanx.cluster import ClusterError

    session = two_engines
    ids = session.cluster.engine_ids()
    write_sitecustomize(tmp_path, monkeypatch, CRASH)
    monkeypatch.setenv("PHALANX_TEST_CRASH", "1")

    started = time.monotonic()
    with pytest.raises(ClusterError, match="broken engine environment") as info:
        session.scale(3)
    scale_s = time.monotonic() - started
    assert "exited before registering" in str(info.value) and scale_s < 20, scale_s
    assert session.cluster.engine_ids() == ids  # the working engines are untouched

    started = time.monotonic()
    with pytest.raises(ClusterError, match="broken engine environment"):
        session.restart(1)
    restart_s = time.monotonic() - started
    assert restart_s < 20, restart_s
    assert [s.state for s in session.cluster.slots()] == ["idle", "dead"]
    figures["8_scale_crashing_engine_fails_s"] = round(scale_s, 2)
    figures["8_restart_crashing_engine_fails_s"] = round(restart_s, 2)

    with pytest.raises(UsageError, match=r"rank\(s\) 1 are dead: bring them back"):
        run_cell(shell, "%%distributed_fit\npass\n")
    monkeypatch.delenv("PHALANX_TEST_CRASH")
    session.restart(1)
    _next_run_works(shell, session)


def test_an_engine_that_exits_before_its_start_returns_still_fails_fast(two_engines, tmp_path,
                                                                        monkeypatch):
    """On a loaded machine the broken engine can be gone before the launcher's start call
    returns (a restart once waited out the whole 60 s registration timeout that way): force
    that order, and the scale still fails at once, naming the cause."""
    from phalanx.cluster import ClusterError

    session = two_engines
    manager = session.cluster
    ids = manager.engine_ids()
    write_sitecustomize(tmp_path, monkeypatch, CRASH)
    monkeypatch.setenv("PHALANX_TEST_CRASH", "1")
    start_set = manager.engine_starter._start_set
    exited = []

    def start_and_wait_for_exit(set_id, count, env):
        start_set(set_id, count, env)
        engine_set = manager.state.cluster.engines[set_id]
        deadline = time.monotonic() + hang_limit(30)
        while engine_set.state != "after" and time.monotonic() < deadline:
            time.sleep(0.02)
        exited.append((engine_set.state == "after", time.monotonic()))

    monkeypatch.setattr(manager.engine_starter, "_start_set", start_and_wait_for_exit)
    with pytest.raises(ClusterError, match="exited before registering"):
        session.scale(3)
    (gone, returned_at), = exited
    verdict_s = time.monotonic() - returned_at
    assert gone  # the order under test did happen
    # Before, the exit went unnoticed and the wait ran out its 60 s timeout.
    assert verdict_s < hang_limit(15), verdict_s
    assert manager.engine_ids() == ids and [s.state for s in manager.slots()] == ["idle", "idle"]


def test_version_skew_refuses_the_run_and_lists_versions_per_engine(two_engines, shell, tmp_path,
                                                                    monkeypatch):
    import cloudpickle
    import torch

    from phalanx.runtime.run._entry import cached_hashes

    session = two_engines
    write_sitecustomize(tmp_path, monkeypatch, FAKE_VERSIONS)
    monkeypatch.setenv("PHALANX_TEST_FAKE_VERSIONS", "cloudpickle=0.0.1,torch=1.0.0")
    session.restart(1)  # only rank 1's new engine runs in the skewed environment
    run_cell(shell, "shipped_thing = [1, 2, 3]\n")
    with pytest.raises(UsageError) as info:
        run_cell(shell, "%%distributed_fit\nprint(shipped_thing)\n")
    message = str(info.value)
    host = session.cluster.slots()[1].host
    assert f"rank 1 on {host}: torch 1.0.0 (kernel {torch.__version__}), cloudpickle 0.0.1 " \
           f"(kernel {cloudpickle.__version__})" in message
    assert "rank 0" not in message and "restart the engines" in message
    rank1 = session.cluster.slots()[1].engine_id
    assert session.cluster.client[rank1].apply_sync(cached_hashes) == {}  # nothing was shipped

    with pytest.raises(UsageError, match="other versions"):  # refused again, not cached as fine
        run_cell(shell, "%%distributed_fit\nprint(shipped_thing)\n")
    monkeypatch.delenv("PHALANX_TEST_FAKE_VERSIONS")
    session.restart(1)
    _next_run_works(shell, session)
