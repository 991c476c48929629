"""%cluster on a real ipyparallel cluster, through a real IPython shell."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest
from IPython.core.error import UsageError

from conftest import assert_all_gone, engine_pids, run_cell
from deadlines import hang_limit

pytestmark = pytest.mark.cluster


def _ranks(session):
    return [(row["rank"], row["engine_id"]) for row in session.status().rows]


def test_start_scale_restart_stop_through_the_magic(shell, capsys):
    from phalanx._session import session_for_shell
    from phalanx.cluster._engine_views import engine_view

    session = session_for_shell(shell)
    session.cluster.stop()
    run_cell(shell, "%cluster start -n 2 --gpus none")
    status = session.status()
    assert [r["rank"] for r in status.rows] == [0, 1]
    assert all(r["state"] == "idle" and r["device"] == "cpu" for r in status.rows)
    first_ids = [r["engine_id"] for r in status.rows]
    assert all(psutil.pid_exists(pid) for pid in engine_pids(session))

    run_cell(shell, "%cluster scale 3")
    assert [rank for rank, _ in _ranks(session)] == [0, 1, 2]
    assert [eid for _, eid in _ranks(session)][:2] == first_ids  # stable when growing

    doomed = session.cluster.slots()[2].pid
    run_cell(shell, "%cluster scale 2")
    assert [eid for _, eid in _ranks(session)] == first_ids
    assert_all_gone([doomed])

    old = session.cluster.slots()[1]
    client = session.cluster.client
    old_view = engine_view(client, old.engine_id)  # runs reuse one view per engine
    assert engine_view(client, old.engine_id) is old_view
    run_cell(shell, "%cluster restart 1")
    new = session.cluster.slots()[1]
    assert new.engine_id != old.engine_id and session.cluster.size == 2
    assert session.cluster.slots()[0].engine_id == first_ids[0]
    assert_all_gone([old.pid])
    assert engine_view(client, new.engine_id).apply_sync(lambda: 6 * 7) == 42
    # the view kept for the replaced engine sends nothing: ipyparallel refuses the gone id
    with pytest.raises(IndexError, match="No such engine"):
        old_view.apply_async(int)
    with pytest.raises(IndexError, match="No such engine"):
        engine_view(client, old.engine_id)  # and it was dropped when the new one was made

    before = engine_pids(session)
    run_cell(shell, "%cluster restart")
    assert session.cluster.size == 2 and not set(engine_pids(session)) & set(before)
    assert_all_gone(before)

    run_cell(shell, "%cluster status")
    assert "rank" in capsys.readouterr().out

    pids = engine_pids(session)
    run_cell(shell, "%cluster stop")
    assert_all_gone(pids)
    capsys.readouterr()
    run_cell(shell, "%cluster stop")
    run_cell(shell, "%cluster status")
    out = capsys.readouterr().out
    assert "no cluster is running" in out


def test_px_follows_the_cluster_across_stop_and_start(shell):
    # ipyparallel binds %px to the first client of the kernel and never again: after a stop and
    # a start it sent to the stopped client ("cannot be used after its sockets have been closed")
    import gc
    import weakref

    from phalanx._session import session_for_shell

    session = session_for_shell(shell)
    session.cluster.stop()  # a cluster of an earlier test, stopped without the session's verb
    run_cell(shell, "%cluster start -n 2 --gpus none")
    run_cell(shell, "%px import os\n%px _px_pid = os.getpid()")
    assert sorted(session.cluster.client[:].pull("_px_pid", block=True)) == sorted(engine_pids(session))
    stopped = weakref.ref(session.cluster.client)
    run_cell(shell, "%cluster stop")
    with pytest.raises(UsageError, match="no cluster is running: start one with %cluster start"):
        run_cell(shell, "%px x = 1")
    gc.collect()
    assert stopped() is None, "the shell still holds the stopped client, its sockets too"
    run_cell(shell, "%cluster start -n 2 --gpus none")
    run_cell(shell, "%px import os\n%px _px_pid = os.getpid()")
    assert sorted(session.cluster.client[:].pull("_px_pid", block=True)) == sorted(engine_pids(session))
    run_cell(shell, "%cluster stop")


def test_start_while_running_says_so_and_keeps_the_cluster(cluster_session, shell, capsys):
    ids = cluster_session.cluster.engine_ids()
    run_cell(shell, "%cluster start -n 4")
    assert "already running with 2 engine(s)" in capsys.readouterr().out
    assert cluster_session.cluster.engine_ids() == ids


@pytest.mark.parametrize("line, message", [
    ("%cluster launch", "unknown %cluster action 'launch'; valid: start, scale, stop"),
    ("%cluster scale 0", "must be at least 1"),
    ("%cluster scale -2", "must be at least 1"),
    ("%cluster scale two", "expected a whole number, got 'two'"),
    ("%cluster restart 7", "rank 7 does not exist"),
    ("%cluster scale 100000", "above this cluster's limit"),
])
def test_bad_requests_change_nothing(two_engines, shell, line, message):
    ids = two_engines.cluster.engine_ids()
    with pytest.raises(UsageError, match=message):
        run_cell(shell, line)
    assert two_engines.cluster.engine_ids() == ids


@pytest.mark.parametrize("line, message", [
    ("%cluster start --gpus 0,9", "device\\(s\\) 0, 9 but host"),
    ("%cluster start --gpus banana", "'banana' is not valid"),
    ("%cluster start --launcher yarn", "unknown launcher 'yarn'"),
    ("%cluster start -n 0", "at least 1 engine"),
])
def test_bad_start_starts_nothing(shell, line, message):
    from phalanx._session import session_for_shell

    session = session_for_shell(shell)
    session.cluster.stop()
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(UsageError, match=message):
        run_cell(shell, line)
    assert not session.cluster.running
    left = lambda: {p.pid for p in psutil.Process().children(recursive=True)} - children  # noqa: E731
    deadline = time.monotonic() + hang_limit(15)  # processes the failed start made have time to exit
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(), f"the failed start left processes: {left()}"


def test_gpu_pinning_gives_each_engine_one_distinct_device():
    """A fake device list stands in for nvidia-smi; the engines really get the variables: each
    sees the host's GPUs (its own at its LOCAL_RANK), and a restarted rank keeps its GPU."""
    from phalanx._session import Session

    def pinning():
        import os
        return os.environ["CUDA_VISIBLE_DEVICES"], os.environ["PHALANX_GPU"]

    session = Session(device_lister=lambda: ["0", "1"])
    try:
        session.start_cluster(gpus="auto")  # default: one engine per GPU
        assert session.cluster.size == 2
        seen = session.cluster.view().apply_sync(pinning)
        assert seen == [("0,1", "0"), ("0,1", "1")]
        assert [r["device"] for r in session.status().rows] == ["0", "1"]
        session.restart(0)  # the host's GPUs are all taken: the new engine takes rank 0's
        assert session.cluster.view().apply_sync(pinning) == seen
        # Engines import torch ahead of the first cell, but nothing initialises CUDA there.
        cuda_started = session.cluster.client[:].apply_sync(
            lambda: "torch" in __import__("sys").modules and __import__("torch").cuda.is_initialized())
        assert cuda_started == [False, False]
    finally:
        session.close()


def test_engines_crashing_at_import_fail_fast_with_the_log_tail(tmp_path, monkeypatch):
    """Engines that die while importing: the start fails in seconds, not after the timeout."""
    from phalanx._session import Session

    # Only engine processes carry PHALANX_SLOT, so the controller starts and the engines crash.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.get('PHALANX_SLOT'):\n"
        "    sys.stderr.write('ImportError: phalanx-test: broken engine environment\\n')\n"
        "    sys.stderr.flush()\n"
        "    os._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    session = Session()
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as info:
            session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
        elapsed = time.monotonic() - started
        message = str(info.value)
        assert "local launcher" in message and "broken engine environment" in message
        assert elapsed < hang_limit(20), f"took {elapsed:.1f} s"
        assert not session.cluster.running
    finally:
        session.close()
    time.sleep(0.5)
    leftover = {p.pid for p in psutil.Process().children(recursive=True)} - children
    assert_all_gone(leftover)


@pytest.mark.skipif(not any(os.access(os.path.join(d, "mpiexec"), os.X_OK)
                            for d in os.environ.get("PATH", "").split(os.pathsep) + [os.path.dirname(sys.executable)]),
                    reason="mpiexec not installed (pip install mpich mpi4py)")
def test_mpi_launcher_starts_engines_under_mpiexec():
    from phalanx._session import Session

    session = Session()
    try:
        session.start_cluster(n=2, gpus="none", launcher="mpi")
        assert session.cluster.size == 2
        infos = [s.info for s in session.cluster.slots()]
        assert [i["mpi_rank"] for i in infos] == [0, 1]  # phalanx rank == MPI rank
        pids = engine_pids(session)
        from phalanx.fit import FitOptions

        ns = {"np": __import__("numpy")}
        body = ("from phalanx import allreduce\n"
                "from phalanx.runtime.run._engine_state import current_run\n"
                "total = allreduce(np.full(3, rank + 1.0), op='sum')\n"
                "via = type(current_run().collectives._pick([total])).__name__\n")
        session.distributed_fit(body, FitOptions.build(backend="mpi", returns="total,via"), ns)
        assert ns["total"].tolist() == [3.0, 3.0, 3.0] and ns["via"] == "MpiCommunicator"
        # MPICH's shared memory between the two ranks on this host, as the engines map it
        segments = {line.split()[-1] for pid in pids for line in open(f"/proc/{pid}/maps")
                    if "/dev/shm/mpich_shm_" in line}
        assert segments, "the MPI ranks on one host share no MPICH segment"
    finally:
        session.close()
    assert_all_gone(pids)
    # MPI_Finalize would remove it; engines ended by the stop never run it, the stop does
    assert not [s for s in segments if os.path.exists(s)], "a stopped MPI cluster left /dev/shm behind"
