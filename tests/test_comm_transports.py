"""Communicator interface over the real transports: torch.distributed (gloo) and MPI (mpich via
mpiexec) across 2 processes; the in-process fake is tested in test_comm.py.

This file doubles as the worker script for the multi-process tests:
``python tests/test_comm_transports.py torch <scenario> <rank> <store_file>`` or, under mpiexec,
``python tests/test_comm_transports.py mpi <scenario>``.
"""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from deadlines import hang_limit

HERE = Path(__file__).resolve()
KERNEL_EXT = HERE.parent.parent / "kernel_ext"
VENV_BIN = Path(sys.executable).parent


# -- real transports: helpers -----------------------------------------------------------------


def spawn(args, env=None):
    return subprocess.Popen([sys.executable, str(HERE), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(KERNEL_EXT), **(env or {})})


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:  # no orphans, whatever the test did
        if p.poll() is None:
            p.kill()
        p.wait(timeout=hang_limit(10))


def results(p, timeout=hang_limit(60)):
    out, err = p.communicate(timeout=timeout)
    # Both ranks write to one pipe: their lines can run together, so split on the objects.
    lines = [json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", out)]
    assert lines, f"rank printed nothing; rc={p.returncode}\n{err[-3000:]}"
    return lines


def torch_pair(procs, scenario, tmp_path):
    store = tmp_path / "store"
    for r in (0, 1):
        procs.append(spawn(["torch", scenario, str(r), str(store)], {"GLOO_SOCKET_IFNAME": "lo"}))
    return procs


# -- torch.distributed (gloo) -----------------------------------------------------------------


@pytest.mark.slow
def test_torch_gloo_ops_dtypes_sizes_broadcast_barrier(procs, tmp_path):
    for p in torch_pair(procs, "ops", tmp_path):
        assert results(p)[-1] == {"ok": True}


@pytest.mark.slow
def test_torch_gloo_peer_killed_mid_collective_is_named(procs, tmp_path):
    r0, r1 = torch_pair(procs, "kill", tmp_path)
    assert results_line(r1) == {"looping": True}
    killed_at = time.time()
    r1.kill()
    out = results(r0)[-1]
    assert out["type"] == "PeerDied" and out["ranks"] == [1], out
    assert f"pid {r1.pid}" in out["msg"]
    assert out["t"] - killed_at < 5.0 + 3.0  # deadline 5 s; usually gloo fails at once


@pytest.mark.slow
def test_torch_gloo_abort_and_late_rank_timeout(procs, tmp_path):
    r0, _ = torch_pair(procs, "stall", tmp_path)
    aborted, timed_out = results(r0)
    assert aborted["type"] == "CollectiveAborted" and aborted["after_abort_s"] < 0.5, aborted
    assert timed_out["type"] == "CollectiveTimeout" and timed_out["ranks"] == [1], timed_out
    assert "not arrived: rank 1" in timed_out["msg"] and timed_out["waited_s"] < 3.0


def results_line(p, timeout=hang_limit(60)):
    """The first JSON line a rank prints (it keeps running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.startswith("{"):
            return json.loads(line)
        if not line and p.poll() is not None:
            raise AssertionError(f"rank exited: {p.stderr.read()[-3000:]}")
    raise AssertionError("no output in time")


# -- MPI (mpich) ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["ops", "stall"])
def test_mpi_under_mpiexec(scenario):
    mpiexec = VENV_BIN / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec not installed in the venv")
    cmd = [str(mpiexec), "-n", "2", sys.executable, str(HERE), "mpi", scenario]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(KERNEL_EXT)},
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=hang_limit(90))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=hang_limit(10))
    assert proc.returncode == 0, err[-3000:]
    # Both ranks write to one pipe: their lines can run together, so split on the objects.
    lines = [json.loads(obj) for obj in re.findall(r"\{[^{}]*\}", out)]
    if scenario == "ops":
        assert sorted(line["rank"] for line in lines if line.get("ok")) == [0, 1]
    else:
        by_kind = {line["type"]: line for line in lines}
        assert by_kind["CollectiveAborted"]["after_abort_s"] < 0.5
        timeout = by_kind["CollectiveTimeout"]
        assert timeout["waited_s"] < 3.0 and "cannot tell which ranks" in timeout["msg"]


# -- worker side ------------------------------------------------------------------------------


def emit(**fields):
    print(json.dumps(fields), flush=True)


def error_fields(exc, **extra):
    return dict(type=type(exc).__name__, msg=str(exc), ranks=getattr(exc, "ranks", None),
                t=time.time(), **extra)


def check_ops(comm, make):
    """Every op on several dtypes and sizes, a coalesced mixed list, broadcast and barrier.
    ``make(values)`` turns a numpy array into what the transport is tested with."""
    r, n = comm.rank, comm.world_size
    for size in (1, 1000, 300_001):
        for dtype in (np.float32, np.float64, np.int64):
            base = (np.arange(size) % 7).astype(dtype)
            for op in ("sum", "mean", "max", "min"):
                if op == "mean" and dtype == np.int64:
                    continue
                x = make(base + r)
                comm.allreduce(x, op=op)
                expect = {"sum": base * n + n * (n - 1) // 2, "mean": base + (n - 1) / 2,
                          "max": base + n - 1, "min": base}[op].astype(dtype)
                np.testing.assert_array_equal(np.asarray(x), expect, err_msg=f"{op} {dtype} {size}")
    mixed = [make(np.full(7, r + 1.0, np.float32)), make(np.full((3, 5), r + 1, np.int64)),
             np.full(4, r + 1.0), make(np.full((4, 4), r + 1.0))[:, 1]]
    comm.allreduce(mixed, op="sum")
    assert all((np.asarray(m) == n * (n + 1) / 2).all() for m in mixed)
    data = [make(np.full(5, float(r))), np.full(3, r, np.int32)]
    comm.broadcast(data, src=1)
    assert (np.asarray(data[0]) == 1).all() and (data[1] == 1).all()
    comm.barrier()
    assert comm.bytes_sent > 0


def torch_child(scenario, rank, store_path):
    import datetime

    import torch
    import torch.distributed as dist

    from phalanx.runtime.transport._comm import TorchCommunicator
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=hang_limit(20)))
    def make():
        return TorchCommunicator(timeout_s=5 if scenario == "kill" else 1.0, store=store,
                                 heartbeat_s=0.5)
    comm = make()
    if scenario == "ops":
        check_ops(comm, lambda a: torch.from_numpy(np.ascontiguousarray(a)).clone())
        emit(ok=True)
    elif scenario == "kill":
        x = torch.ones(1 << 18)
        comm.allreduce(x)
        if rank == 1:
            emit(looping=True)
        try:
            while True:
                comm.allreduce(x, op="max")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            emit(**error_fields(exc))
    elif scenario == "stall":
        torch_stall(comm, make, rank)
    os._exit(0)  # gloo threads may still wait on a dead peer: do not let them hold the exit


def torch_stall(comm, make, rank):
    """Rank 0 is aborted while rank 1 is late, then times out on a fresh communicator."""
    x = np.ones(4)
    if rank == 1:
        time.sleep(1.5)
        comm.allreduce(x)  # completes rank 0's abandoned collective
        comm.close()
        comm = make()
        time.sleep(3.0)
        try:
            comm.allreduce(x)
        except Exception:  # noqa: BLE001 - rank 0 is gone by now
            pass
        return
    for attempt, fresh in (("abort", False), ("timeout", True)):
        if fresh:
            comm.close()
            comm = make()
        stamp = {}
        if attempt == "abort":
            threading.Timer(0.2, lambda stamp=stamp, comm=comm: (
                stamp.setdefault("t", time.monotonic()), comm.abort("stop pressed"))).start()
        t0 = time.monotonic()
        try:
            comm.allreduce(x)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            now = time.monotonic()
            emit(**error_fields(exc, waited_s=now - t0, after_abort_s=now - stamp.get("t", t0)))


def mpi_child(scenario):
    from mpi4py import MPI

    from phalanx.runtime.transport._comm import MpiCommunicator
    comm = MpiCommunicator(MPI.COMM_WORLD, timeout_s=0.5)
    if scenario == "ops":
        check_ops(comm, lambda a: np.array(a, copy=True))
        emit(ok=True, rank=comm.rank)
        return
    x = np.ones(4)
    if comm.rank == 1:
        for _ in range(2):
            time.sleep(1.5)
            comm.allreduce(x)  # matches rank 0's abandoned collective
        return
    for attempt in ("abort", "timeout"):
        c = MpiCommunicator(MPI.COMM_WORLD, timeout_s=30 if attempt == "abort" else 0.5)
        stamp = {}
        if attempt == "abort":
            threading.Timer(0.2, lambda stamp=stamp, c=c: (
                stamp.setdefault("t", time.monotonic()), c.abort("stop pressed"))).start()
        t0 = time.monotonic()
        try:
            c.allreduce(x)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            now = time.monotonic()
            emit(**error_fields(exc, waited_s=now - t0, after_abort_s=now - stamp.get("t", t0)))
        for request in c._stuck:
            request.Wait()  # let MPI finish it once rank 1 arrives, so the job ends cleanly


if __name__ == "__main__":
    signal.alarm(120)  # a worker never outlives a broken test run
    if sys.argv[1] == "torch":
        torch_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        mpi_child(sys.argv[2])
