"""ShmCommunicator's fast path for a repeated small allreduce, and its waiting (issue 59).

Two ranks run as two threads of this process: the collectives, the spin and the futex sleeps
are the real ones (a spinning thread holds the GIL for at most the spin budget, then sleeps in
the kernel without it).
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest
import torch

from phalanx.runtime.transport import _shm_futex as futex
from phalanx.runtime.transport import _shm_wait
from phalanx.runtime.transport._comm import CollectiveAborted
from phalanx.runtime.transport._shm import ShmCommunicator
from phalanx.runtime.transport._shm_layout import LastCall
from phalanx.runtime.transport._shm_segment import W_SEQ, Segment, segment_name
from deadlines import hang_limit


def on_two_ranks(body):
    """Run ``body(comm)`` on ranks 0 and 1 (threads of this process); their results by rank."""
    gid = uuid.uuid4().hex[:12]
    results: list[object] = [None, None]

    def rank(r):
        try:
            with ShmCommunicator(gid, r, 2, timeout_s=hang_limit(10)) as comm:
                results[r] = body(comm)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(hang_limit(30))
    assert not any(t.is_alive() for t in threads), "a rank hung"
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_a_repeated_allreduce_takes_the_fast_path_and_stays_right():
    def body(comm):
        me = comm.rank + 1.0
        t = torch.zeros(256)
        a = np.zeros((4, 64), np.float32)
        seen = []
        for step in range(5):
            t.fill_(me * step)
            comm.allreduce(t)  # step 0 takes the general path and records it
            seen.append(t[0].item())
        assert comm._last is not None and comm._last.tensor is t
        t.fill_(me)
        comm.allreduce([t], op="mean")  # another op: general path, then recorded
        comm.allreduce([t], op="mean")
        seen.append(t[7].item())
        for _ in range(2):  # a 2-D numpy array of another dtype, twice
            a.fill(me)
            comm.allreduce(a, op="max")
        seen.append(float(a[3, 63]))
        t.set_(torch.full((300,), me))  # same tensor, other memory and size: general path
        comm.allreduce(t)
        seen.append(t[299].item())
        t.set_(torch.full((300,), me))  # same size, other memory
        comm.allreduce(t)
        seen.append(t[0].item())
        sent = comm.bytes_sent
        comm.allreduce(t)
        return seen, comm.bytes_sent - sent

    for seen, sent in on_two_ranks(body):
        assert seen == [0.0, 3.0, 6.0, 9.0, 12.0, 1.5, 2.0, 3.0, 3.0]
        assert sent == 300 * 4  # 2(n-1)/n of the payload, on the fast path too


def test_view_of_answers_only_a_repeat_of_the_last_call():
    t = torch.zeros(8)
    view = t.numpy()
    last = LastCall(t, "sum", view, plan=None)
    assert last.view_of(t, "sum") is view and last.view_of((t,), "sum") is view
    assert last.view_of(t, "max") is None and last.view_of([t, t], "sum") is None
    assert last.view_of(t.clone(), "sum") is None  # another tensor: its own numpy view
    t.set_(torch.zeros(9))  # same object, other size (its numpy view forbids resize_)
    assert last.view_of(t, "sum") is None
    t.set_(torch.zeros(8))  # same object and size, other memory
    assert last.view_of(t, "sum") is None
    base = torch.zeros(16)
    t = base[:8]
    last = LastCall(t, "sum", t.numpy(), plan=None)
    t.set_(base.untyped_storage(), 0, (8,), (2,))  # same object, address and size: strided
    assert last.view_of(t, "sum") is None
    a = np.zeros((2, 4), np.float32)
    last = LastCall([a], "sum", a.reshape(-1), plan=None)
    assert np.shares_memory(last.view_of(a, "sum"), a)
    assert last.view_of(np.zeros(8, np.float32), "sum").shape == (8,)
    assert last.view_of(np.zeros(8, np.float64), "sum") is None
    assert last.view_of(np.zeros(9, np.float32), "sum") is None
    assert last.view_of(np.zeros(16, np.float32)[::2], "sum") is None  # strided: staged copy
    read_only = np.zeros(8, np.float32)
    read_only.flags.writeable = False
    assert last.view_of(read_only, "sum") is None  # the general path refuses it


def test_the_fast_path_still_breaks_on_abort_and_close():
    def body(comm):
        x = np.ones(16)
        comm.allreduce(x)
        comm.allreduce(x)
        if comm.rank == 0:
            comm.abort("test")
        with pytest.raises(CollectiveAborted) as err:
            comm.allreduce(x)  # the fast path's call: refused here, released on the peer
        comm.close()
        with pytest.raises(CollectiveAborted, match="unusable"):
            comm.allreduce(x)
        return str(err.value)

    mine, peer = on_two_ranks(body)
    assert "aborted: test" in mine and "rank 0 gave up" in peer


def test_the_spin_budget_follows_the_measured_wake_ups():
    comm = ShmCommunicator.__new__(ShmCommunicator)
    assert comm._spin_s == _shm_wait.SPIN_FIRST_S
    comm._learn_wake(30e-6)
    assert comm._spin_s == 30e-6
    for _ in range(_shm_wait._WAKE_SAMPLES // 2):
        comm._learn_wake(1.0)  # a few slow ones do not move the median past the bound
    assert comm._spin_s <= _shm_wait.SPIN_MAX_S
    for _ in range(_shm_wait._WAKE_SAMPLES):
        comm._learn_wake(1e-9)
    assert comm._spin_s == _shm_wait.SPIN_MIN_S and len(comm._wakes) == _shm_wait._WAKE_SAMPLES


@pytest.mark.skipif(not futex.AVAILABLE, reason="no futexes here: waits nap")
def test_a_rank_waiting_long_sleeps_and_measures_its_wake_up():
    def body(comm):
        cpu = wall = 0.0
        wakes = list(comm._wakes or [])
        for _ in range(3):  # a post can miss a sleeper between two slices: it is woken thrice
            comm.barrier()
            if comm.rank == 0:
                time.sleep(0.4)
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            comm.barrier()
            cpu, wall = cpu + time.thread_time() - cpu0, wall + time.perf_counter() - wall0
        return cpu, wall, comm._wakes != wakes

    _, (cpu, wall, measured) = on_two_ranks(body)
    assert wall > 0.6 and cpu < 0.1 * wall, (cpu, wall)  # measured 1% of a core
    assert measured, "the woken rank measured no wake-up"


def test_a_wait_right_after_a_sync_point_polls_longer_before_sleeping():
    gid = uuid.uuid4().hex[:12]
    peer = Segment.create(segment_name(gid, 1), 4096, 2)  # never posts
    comm = ShmCommunicator.__new__(ShmCommunicator)
    comm._peers, comm._spin_s = [(1, peer)], 10e-6
    try:
        assert comm._spin(1) is False  # the first wait: the spin budget, then sleep
        comm._synced_at = time.perf_counter()
        started = time.perf_counter()
        assert comm._spin(1) is False
        assert time.perf_counter() - started >= _shm_wait.BURST_POLL_S
        peer.hdr[W_SEQ] = 1
        assert comm._spin(1) is True
    finally:
        peer.unlink()
        peer.close()
