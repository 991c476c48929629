"""ShmCommunicator across real processes: results, faults, abort, and a clean /dev/shm.

This file doubles as the worker script: ``python tests/test_shm.py <scenario> <rank> <world>
<group_id> <slot_bytes> <small_bytes>``; each worker prints JSON lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from phalanx.runtime.transport._comm import (CollectiveAborted, CollectiveMismatch,
                                             CollectiveTimeout, PeerDied)
from phalanx.runtime.transport._comm_util import Backoff
from phalanx.runtime.transport._shm import ShmCommunicator
from phalanx.runtime.transport._shm_layout import signature
from phalanx.runtime.transport._shm_segment import (STATE_FAILED, W_SEQ, W_SIG, Segment,
                                                    cleanup_stale, segment_name)
from deadlines import hang_limit

HERE = Path(__file__).resolve()
KERNEL_EXT = HERE.parent.parent / "kernel_ext"
SHM = Path("/dev/shm")
TINY = (16384, 4096)  # slot and small-path sizes that force chunking in every test size


def ours(group_id):
    return sorted(p.name for p in SHM.glob(f"phx_{group_id}_*"))


@pytest.fixture
def group():
    """A fresh group id; afterwards /dev/shm must hold nothing of it."""
    gid = uuid.uuid4().hex[:12]
    yield gid
    assert ours(gid) == [], "segments leaked into /dev/shm"


@pytest.fixture
def ranks():
    """Start worker processes; kill any left at the end (no orphans)."""
    started: list[subprocess.Popen] = []

    def start(scenario, gid, world=2, slot=(1 << 20, 1 << 16), only=None, futex=True):
        for r in range(world) if only is None else only:
            started.append(subprocess.Popen(
                [sys.executable, str(HERE), scenario, str(r), str(world), gid, str(slot[0]),
                 str(slot[1])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(KERNEL_EXT),
                     "PHX_TEST_FUTEX": "1" if futex else "0"}))
        return started[-(world if only is None else len(only)):]

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=hang_limit(10))


def lines(p, timeout=hang_limit(60)):
    out, err = p.communicate(timeout=timeout)
    got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert got, f"rank printed nothing (rc={p.returncode}):\n{err[-3000:]}"
    return got


def first_line(p, timeout=hang_limit(30)):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.startswith("{"):
            return json.loads(line)
        if not line and p.poll() is not None:
            raise AssertionError(p.stderr.read()[-3000:])
    raise AssertionError("no output in time")


# -- correctness --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("world, slot", [(2, (1 << 20, 1 << 16)), (2, TINY), (3, TINY)],
                         ids=["2-default", "2-chunked", "3-chunked"])
def test_ops_dtypes_sizes_torch_and_numpy(ranks, group, world, slot):
    for p in ranks("ops", group, world, slot):
        assert lines(p)[-1] == {"ok": True}


def test_world_size_one_is_a_no_op_and_bad_arguments_are_refused(group):
    with ShmCommunicator(group, 0, 1, timeout_s=1) as comm:
        x = np.arange(4.0)
        comm.allreduce(x, op="mean")
        comm.broadcast([x])
        comm.barrier()
        assert (x == np.arange(4.0)).all() and comm.bytes_sent == 0
        with pytest.raises(ValueError, match="src 1 outside"):
            comm.broadcast([x], src=1)
        with pytest.raises(TypeError, match="floating-point"):
            comm.allreduce(np.ones(2, np.int64), op="mean")
    with pytest.raises(ValueError, match="group_id"):
        ShmCommunicator("bad/id", 0, 2)
    with pytest.raises(ValueError, match="rank 2 outside"):
        ShmCommunicator(group, 2, 2)
    with pytest.raises(ValueError, match="slot_bytes"):
        ShmCommunicator(group, 0, 2, slot_bytes=1000)


# -- faults ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_peer_killed_mid_collective_raises_peer_died_within_2s(ranks, group):
    r0, r1 = ranks("kill", group)
    assert first_line(r1) == {"looping": True}
    time.sleep(0.2)
    killed_at = time.time()
    r1.send_signal(signal.SIGKILL)
    out = lines(r0)[-1]
    assert out["type"] == "PeerDied" and out["ranks"] == [1], out
    assert f"rank 1 (pid {r1.pid}) died" in out["msg"]
    assert out["t"] - killed_at < 2.0


@pytest.mark.slow
def test_late_rank_times_out_named_with_its_progress_and_is_released(ranks, group):
    r0, r1 = ranks("late", group)
    out0, out1 = lines(r0)[-1], lines(r1)[-1]
    assert out0["type"] == "CollectiveTimeout" and out0["ranks"] == [1], out0
    assert "not arrived: rank 1" in out0["msg"] and "last completed collective #2" in out0["msg"]
    assert 0.9 < out0["waited_s"] < 2.0
    # the late rank arrives after rank 0 gave up: released at once, told why
    assert out1["type"] == "CollectiveAborted" and out1["ranks"] == [0], out1
    assert "timed out" in out1["msg"] and out1["waited_s"] < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("futex", [True, False], ids=["futex", "naps"])
def test_abort_from_another_thread_releases_promptly_and_frees_the_peer(ranks, group, futex):
    r0, r1 = ranks("abort", group, futex=futex)
    out0, out1 = lines(r0)[-1], lines(r1)[-1]
    assert out0["type"] == "CollectiveAborted" and "stop pressed" in out0["msg"], out0
    assert out0["after_abort_s"] < 0.5
    assert out1["type"] == "CollectiveAborted" and out1["ranks"] == [0], out1
    assert "stop pressed" in out1["msg"] and out1["waited_s"] < 0.5


@pytest.mark.slow
def test_abort_outside_a_collective_then_close_releases_a_waiting_peer(ranks, group):
    """The runtime's path when user code raises on one rank: abort(reason), then close()."""
    r0, r1 = ranks("poison", group)
    out1 = lines(r1)[-1]
    assert out1["type"] == "CollectiveAborted" and out1["ranks"] == [0], out1
    assert "ValueError in the loop" in out1["msg"]
    aborted_at, after = lines(r0)
    assert out1["t"] - aborted_at["t"] < 0.5
    assert after["type"] == "CollectiveAborted" and "aborted" in after["msg"]  # no later use


@pytest.mark.slow
def test_close_from_another_thread_aborts_the_collective_then_unmaps(ranks, group):
    r0, r1 = ranks("close_from_thread", group)
    out0, out1 = lines(r0)[-1], lines(r1)[-1]
    assert out0["type"] == "CollectiveAborted" and "communicator closed" in out0["msg"], out0
    assert out0["unmapped"] and out0["waited_s"] < 1.0
    assert out1["type"] == "CollectiveAborted" and out1["ranks"] == [0], out1


@pytest.mark.slow
def test_ctrl_c_in_a_collective_releases_the_peers(ranks, group):
    r0, r1 = ranks("interrupt", group)
    assert first_line(r0) == {"waiting": True}
    time.sleep(0.2)
    r0.send_signal(signal.SIGINT)
    assert lines(r0)[-1]["type"] == "KeyboardInterrupt"
    out1 = lines(r1)[-1]
    assert out1["type"] == "CollectiveAborted" and "KeyboardInterrupt" in out1["msg"], out1


@pytest.mark.slow
def test_mismatched_collectives_are_reported_on_both_ranks(ranks, group):
    for p in ranks("mismatch", group):
        out = lines(p)[-1]
        assert out["type"] == "CollectiveMismatch" and "allreduce of 8" in out["msg"], out


def test_a_peer_that_arrived_then_failed_on_a_mismatch_is_reported_as_the_mismatch(group):
    # The race the two-process test above can only hit by chance: rank 1 read rank 0 as not yet
    # arrived, then rank 0 posted the same sync point, found the mismatch and published its
    # failure, all before rank 1's next check. Rank 1 must still name the mismatch.
    segs = [Segment.create(segment_name(group, r), 4096, 2) for r in (0, 1)]
    comm = ShmCommunicator.__new__(ShmCommunicator)
    comm.rank, comm.timeout_s, comm._segs, comm._peers = 1, 5.0, segs, [(0, segs[0])]
    comm._seq = comm._done = comm._abandoned = 0
    comm._abort_reason, comm._futex = None, False
    try:
        theirs, mine = signature("allreduce", 1, 8), signature("allreduce", 1, 16)
        segs[0].set_reason(STATE_FAILED, "rank 0 found a mismatch", failed_at=2)
        with pytest.raises(CollectiveAborted, match="rank 0 gave up"):  # failed, never arrived
            comm._check(1, [0], "allreduce", Backoff(time.monotonic() + 5), check_alive=True)
        segs[0].hdr[W_SIG + 1], segs[0].hdr[W_SEQ] = theirs, 1
        comm._check(1, [0], "allreduce", Backoff(time.monotonic() + 5), check_alive=True)
        with pytest.raises(CollectiveMismatch, match="allreduce of 8 B"):
            comm._sync(mine, "allreduce")
    finally:
        for seg in segs:
            seg.unlink()
            seg.close()


def test_rendezvous_with_a_missing_rank_times_out_and_cleans_up(group):
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeout, match=r"ranks \[1\] never created their segment"):
        ShmCommunicator(group, 0, 2, timeout_s=0.5)
    assert time.monotonic() - t0 < 2.0


def test_rendezvous_notices_a_dead_peer_pid(group):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(PeerDied, match=f"rank 1 \\(pid {dead.pid}\\) died before the rendezvous"):
        ShmCommunicator(group, 0, 2, peer_pids=[os.getpid(), dead.pid], timeout_s=10)


def test_rendezvous_abort(group):
    comm = ShmCommunicator.__new__(ShmCommunicator)  # abort() before __init__ returns
    threading.Timer(0.1, comm.abort, args=("stop",)).start()
    with pytest.raises(CollectiveAborted):
        comm.__init__(group, 0, 2, timeout_s=5)


# -- /dev/shm hygiene ---------------------------------------------------------------------------


def test_stale_segment_of_a_killed_creator_is_reclaimed(group):
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]);"
            "from phalanx.runtime.transport._shm_segment import Segment;"
            f"Segment.create({segment_name(group, 0)!r}, 4096); print('made', flush=True);"
            "import time; time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(KERNEL_EXT)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "made"
        with pytest.raises(FileExistsError, match=f"live pid {child.pid}"):
            Segment.create(segment_name(group, 0), 4096)  # still alive: refuse
    finally:
        child.kill()
        child.wait()
    assert ours(group) == [f"phx_{group}_0"]  # SIGKILL during a rendezvous leaves the name ...
    seg = Segment.create(segment_name(group, 0), 4096)  # ... which the next creator reclaims
    assert seg.pid == os.getpid()
    seg.unlink()
    seg.close()


def test_cleanup_stale_removes_only_dead_creators(group):
    live = Segment.create(segment_name(group, 0), 4096)
    code = ("import sys; sys.path.insert(0, sys.argv[1]);"
            "from phalanx.runtime.transport._shm_segment import Segment;"
            f"Segment.create({segment_name(group, 1)!r}, 4096)")
    subprocess.run([sys.executable, "-c", code, str(KERNEL_EXT)], check=True, timeout=hang_limit(30))
    assert ours(group) == [f"phx_{group}_0", f"phx_{group}_1"]
    assert f"phx_{group}_1" in cleanup_stale()
    assert ours(group) == [f"phx_{group}_0"]
    live.unlink()
    live.close()


# -- worker side --------------------------------------------------------------------------------


def emit(**fields):
    print(json.dumps(fields), flush=True)


def report(exc, **extra):
    emit(type=type(exc).__name__, msg=str(exc), ranks=getattr(exc, "ranks", None), t=time.time(),
         **extra)


def check_all(comm):
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE.parent))
    from test_comm_transports import check_ops
    check_ops(comm, lambda a: np.array(a, copy=True))
    check_ops(comm, lambda a: torch.from_numpy(np.array(a, copy=True)))
    r, n = comm.rank, comm.world_size
    big = [np.full(k, r + 1.0, np.float32) for k in (5, 70_001, 1, 9_000)] + [
        np.full(40_000, r + 1, np.int64), torch.full((300, 301), float(r + 1), dtype=torch.float64)]
    comm.allreduce(big, op="sum")  # several dtypes on the chunked path, spans across arrays
    assert all((np.asarray(b) == n * (n + 1) // 2).all() for b in big)
    if n == 2:  # one array passed twice: each occurrence is the plain sum (as with gloo)
        for size in (10, 300_001):
            x = np.full(size, r + 1.0)
            comm.allreduce([x, x], op="sum")
            assert (x == 3.0).all()
    payload = [np.full(50_001, float(r)), np.full(3, r, np.int16)]
    comm.broadcast(payload, src=n - 1)  # several chunks when slots are small
    assert (payload[0] == n - 1).all() and (payload[1] == n - 1).all()
    emit(ok=True)


def worker(scenario, rank, world, gid, slot, small):
    comm = ShmCommunicator(gid, rank, world, timeout_s=20.0, slot_bytes=slot, small_bytes=small)
    comm._futex = comm._futex and os.environ.get("PHX_TEST_FUTEX") != "0"  # test the fallback
    if scenario == "late":
        comm.timeout_s = 1.0  # after the rendezvous, which may take longer on a busy machine
    if scenario == "ops":
        check_all(comm)
    elif scenario == "kill":
        x = np.ones(1 << 21, np.float32)  # 8 MiB: many chunks in flight
        comm.allreduce(x)
        if rank == 1:
            emit(looping=True)
        try:
            while True:
                comm.allreduce(x, op="max")
        except Exception as exc:  # noqa: BLE001 - reported to the test
            report(exc)
    elif scenario in ("late", "abort", "interrupt", "close_from_thread"):
        stall(comm, scenario)
    elif scenario == "poison":
        comm.barrier()
        if rank == 0:
            time.sleep(0.3)
            emit(t=time.time())
            comm.abort("rank 0 failed: ValueError in the loop")
            try:
                comm.barrier()
            except Exception as exc:  # noqa: BLE001 - reported to the test
                report(exc)
        else:
            try:
                comm.allreduce(np.ones(4))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                report(exc)
    elif scenario == "mismatch":
        try:
            comm.allreduce(np.ones(1 + rank))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            report(exc)
    comm.close()


def stall(comm, scenario):
    """Rank 1 arrives late at the third collective; rank 0 times out, is aborted or interrupted."""
    comm.barrier()
    comm.allreduce(np.ones(4))
    if comm.rank == 1:
        time.sleep(1.5)
    stamp = {}
    if comm.rank == 0 and scenario == "abort":
        threading.Timer(0.3, lambda: (stamp.setdefault("t", time.monotonic()),
                                      comm.abort("stop pressed"))).start()
    if comm.rank == 0 and scenario == "interrupt":
        emit(waiting=True)
    if comm.rank == 0 and scenario == "close_from_thread":
        threading.Timer(0.3, comm.close).start()
    t0 = time.monotonic()
    try:
        comm.allreduce(np.ones(4))
        emit(type="completed")
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt is a scenario
        now = time.monotonic()
        report(exc, waited_s=now - t0, after_abort_s=now - stamp.get("t", t0),
               unmapped=not comm._segs)


if __name__ == "__main__":
    signal.alarm(120)  # a worker never outlives a broken test run
    name, rank_, world_, gid_, slot_, small_ = sys.argv[1:7]
    worker(name, int(rank_), int(world_), gid_, int(slot_), int(small_))
