"""Communicator interface, in one process: the thread-based fake (every op, dtypes, timeouts,
aborts, mismatches, bad input) and the shared helpers (process liveness, backoff, docstring
examples, import cost). The real torch.distributed and MPI transports are tested in
test_comm_transports.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from phalanx.runtime.transport._comm import (Backoff, CollectiveAborted, CollectiveMismatch,
                                             CollectiveTimeout, Communicator, check_op,
                                             make_thread_communicators, process_alive,
                                             process_start_time)
from deadlines import hang_limit

KERNEL_EXT = Path(__file__).resolve().parent.parent / "kernel_ext"


def run_threads(comms, fn, timeout=hang_limit(10.0)):
    """Run ``fn(comm)`` per thread rank; return results, with exceptions returned as values."""
    out = [None] * len(comms)

    def target(c):
        try:
            out[c.rank] = fn(c)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out[c.rank] = exc

    threads = [threading.Thread(target=target, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


# -- in-process fake --------------------------------------------------------------------------


@pytest.mark.parametrize("op, expect, dtype", [
    (op, expect, dtype) for op, expect in (("sum", 6.0), ("mean", 2.0), ("max", 3.0), ("min", 1.0))
    for dtype in (np.float32, np.float64, np.int64) if (op, dtype) != ("mean", np.int64)])
def test_thread_allreduce_ops_and_dtypes(op, expect, dtype):
    comms = make_thread_communicators(3)

    def body(c):
        xs = [np.full(5, c.rank + 1, dtype), np.full((2, 3), c.rank + 1, dtype)]
        c.allreduce(xs, op=op)
        return xs

    for xs in run_threads(comms, body):
        assert all(x.dtype == dtype and (x == expect).all() for x in xs)


def test_thread_allreduce_torch_numpy_mix_noncontiguous_and_single_array():
    import torch
    comms = make_thread_communicators(2)

    def body(c):
        t = torch.full((4, 4), float(c.rank + 1))
        column = t[:, 1]  # non-contiguous view: must be written back into t
        p = torch.nn.Parameter(torch.full((3,), float(c.rank + 1)))
        a = np.full(2, c.rank + 1, np.int64)
        c.allreduce([column, p, a], op="sum")
        scalar = np.array(float(c.rank))
        c.allreduce(scalar, op="max")
        return t, p, a, scalar

    for t, p, a, scalar in run_threads(comms, body):
        assert (t[:, 1] == 3).all() and (t[:, 0] == t[0, 0]).all()
        assert (p.detach() == 3).all() and (a == 3).all() and scalar == 1.0


def test_thread_broadcast_barrier_and_bytes_sent():
    comms = make_thread_communicators(3)

    def body(c):
        xs = [np.full(4, float(c.rank)), np.full(2, c.rank, np.int32)]
        c.broadcast(xs, src=2)
        c.barrier()
        c.allreduce([np.ones(3)], op="sum")  # 24 bytes -> 24 * 2 * 2 / 3 = 32
        return xs, c.bytes_sent

    results = run_threads(comms, body)
    for xs, _ in results:
        assert (xs[0] == 2.0).all() and (xs[1] == 2).all()
    assert [sent for _, sent in results] == [32, 32, 32 + 40]


def test_thread_timeout_names_the_missing_rank_and_its_progress():
    comms = make_thread_communicators(3, timeout_s=0.3)

    def body(c):
        c.barrier()
        if c.rank == 2:
            time.sleep(0.6)  # arrives after the others gave up
        c.allreduce([np.ones(2)])

    t0 = time.monotonic()
    out = run_threads(comms, body)
    assert time.monotonic() - t0 < 3
    for r in (0, 1):
        assert isinstance(out[r], CollectiveTimeout) and out[r].ranks == [2]
        assert "not arrived: rank 2 (last completed #1)" in str(out[r])
    assert isinstance(out[2], CollectiveAborted) and set(out[2].ranks) == {0, 1}


def test_thread_abort_releases_this_rank_and_peers_promptly():
    comms = make_thread_communicators(3, timeout_s=30)
    stamps = {}

    def body(c):
        if c.rank == 2:
            time.sleep(0.2)
            c.abort("user pressed stop")
            return None
        try:
            c.allreduce([np.ones(2)])
        finally:
            stamps[c.rank] = time.monotonic()

    t0 = time.monotonic()
    out = run_threads(comms, body)
    for r in (0, 1):
        assert isinstance(out[r], CollectiveAborted) and out[r].ranks == [2]
        assert "user pressed stop" in str(out[r]) and stamps[r] - t0 < 1.0


def test_thread_abort_from_another_thread_interrupts_own_wait():
    c0, _ = make_thread_communicators(2, timeout_s=30)
    threading.Timer(0.1, c0.abort, args=("stop",)).start()
    t0 = time.monotonic()
    with pytest.raises(CollectiveAborted, match="aborted on rank 0: stop"):
        c0.allreduce([np.ones(1)])
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(CollectiveAborted, match="unusable"):
        c0.barrier()


def test_thread_mismatched_collectives_are_reported():
    comms = make_thread_communicators(2)
    out = run_threads(comms, lambda c: c.allreduce([np.ones(3 + c.rank)]))
    assert all(isinstance(e, CollectiveMismatch) for e in out)
    assert "float64:4" in str(out[0])


def test_bad_input_is_refused_before_communicating():
    c = make_thread_communicators(1)[0]
    with pytest.raises(ValueError, match="unknown reduction op 'avg'"):
        c.allreduce([np.ones(1)], op="avg")
    with pytest.raises(TypeError, match="op='mean' needs floating-point arrays, got int64"):
        c.allreduce([np.ones(1, np.int64)], op="mean")
    frozen = np.ones(2)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c.allreduce([frozen])
    with pytest.raises(TypeError, match="got list"):
        c.allreduce([[1.0, 2.0]])
    assert check_op("max") is np.maximum
    assert isinstance(c, Communicator)
    with pytest.raises(ValueError, match="world size"):
        make_thread_communicators(0)


def test_process_alive_sees_zombies_and_reused_pids():
    me = os.getpid()
    assert process_alive(me) and process_alive(me, process_start_time(me))
    assert not process_alive(me, process_start_time(me) + 1)  # same pid, other process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + hang_limit(10)
    while process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)  # exits and stays a zombie: we have not reaped it
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)


def test_backoff_expires():
    b = Backoff(deadline=time.monotonic() + 0.05)
    while not b.expired():
        b.pause()
    assert b.nap > 10e-6


@pytest.mark.parametrize("module", ["runtime.transport._comm", "runtime.transport._comm_util",
                                    "runtime.transport._shm_layout",
                                    "runtime.transport._shm_segment",
                                    "runtime.transport._shm_futex", "runtime.run._threads",
                                    "wire._options", "runtime.run._fit_mode"])
def test_docstring_examples_run(module):
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(f"phalanx.{module}"))
    assert result.attempted and not result.failed


def test_importing_comm_loads_neither_torch_nor_mpi():
    code = ("import sys, phalanx.runtime.transport._comm, phalanx.runtime.transport._shm,"
            " phalanx.runtime.sync._strategies;"
            "print(sorted(m for m in ('torch', 'mpi4py', 'IPython', 'ipywidgets')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=hang_limit(60),
                         env={**os.environ, "PYTHONPATH": str(KERNEL_EXT)})
    assert out.stdout.strip() == "[]", out.stderr
