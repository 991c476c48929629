"""Races on the fault path, reproduced on a real 2-engine cluster: none reaches the cell as an
internal error (KeyError, CompositeError, AttributeError), each is one DistributedFitError
naming the rank, its host and the cause, and the next run works.

An engine's death reaches the kernel twice: ipyparallel's client forgets the engine (on its IO
thread) and the launcher reports the process exit (on the cluster's loop).  The tests hold one
notice back until the other has arrived, so each order is played deterministically, and kill
engines at the moments a run checks or signals them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import types
from contextlib import contextmanager

import pytest

from conftest import assert_all_gone, run_cell
from test_reliability_engines import CRASH
from test_reliability_faults import ENDLESS as FAULTS_ENDLESS, SETUP, WARM_UP  # noqa: F401
from test_reliability_faults import _next_run_works, ready  # noqa: F401  (the fixture too)
from test_reliability_helpers import (engine_state, wait_for, when_rank_logged,
                                      write_sitecustomize)
from deadlines import hang_limit

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ENDLESS = "%%distributed_fit\n" + FAULTS_ENDLESS


def _fit_error(shell, cell):
    from phalanx.fit import DistributedFitError

    with pytest.raises(DistributedFitError) as info:  # anything else is an internal error
        run_cell(shell, cell)
    return info.value


@contextmanager
def launcher_notice_held(cluster, until):
    """Deliver the launcher's "engine set exited" notice only once ``until()`` holds."""
    original = cluster.exits.engine_set_exited

    def late(set_id, data):
        try:
            wait_for(until, 30, what="the other notice")
        finally:  # delivered even when the test failed: the next test's cluster needs it
            original(set_id, data)

    cluster.exits.engine_set_exited = late
    try:
        yield
    finally:
        del cluster.exits.engine_set_exited  # back to the class's method


@contextmanager
def unheard_by_phalanx(cluster):
    """phalanx does not hear the controller let an engine go (it marks the rank dead at once
    when it does): the slot keeps looking alive while ipyparallel already forgot the engine."""
    callbacks = cluster.client._registration_callbacks
    hook = cluster.exits.engine_unregistered
    callbacks.remove(hook)
    try:
        yield
    finally:
        callbacks.append(hook)


@contextmanager
def unregistration_held(client, until):
    """Let ipyparallel's client forget a dead engine only once ``until()`` holds."""
    handlers = client._notification_handlers
    original = handlers["unregistration_notification"]

    def late(msg):
        deadline = time.monotonic() + hang_limit(30)
        while not until() and time.monotonic() < deadline:
            time.sleep(0.02)
        original(msg)

    handlers["unregistration_notification"] = late
    try:
        yield
    finally:
        handlers["unregistration_notification"] = original


def _kill_and_wait_forgotten(session, rank):
    slot = session.cluster.slots()[rank]
    os.kill(slot.pid, signal.SIGKILL)
    wait_for(lambda: slot.engine_id not in session.cluster.client.ids, 30,
             what="ipyparallel forgetting the engine")
    return slot


def started_then_sleep(folder):
    """A long task that says when it began (a file named after its engine's pid)."""
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(120)


def test_interrupting_an_engine_ipyparallel_already_forgot_skips_it(ready, tmp_path):
    """The observed bug: Waiter._release sent SIGINT to every pending rank's engine id in one
    request, and ipyparallel raised KeyError for the id it had just unregistered."""
    from phalanx.fit.run._engine_calls import dispatch
    from phalanx.fit.telemetry._tracker import RunTracker
    from phalanx.fit.run._waiter import Waiter

    cluster = ready.cluster
    slots = cluster.slots()
    ars = [dispatch(cluster, s, started_then_sleep, str(tmp_path)) for s in slots]
    wait_for(lambda: len(os.listdir(tmp_path)) == 2, 30, what="both engines busy")
    late = threading.Event()
    with launcher_notice_held(cluster, late.is_set), unheard_by_phalanx(cluster):
        try:
            _kill_and_wait_forgotten(ready, 1)
            assert slots[1].state == "idle"  # the launcher's notice is still held back
            opts = types.SimpleNamespace(timeout=None, collective_timeout=5)
            waiter = Waiter(cluster, slots, ars, RunTracker("race", 2, None, lambda e: None), opts)
            waiter._release({0, 1}, [])  # raised KeyError before
            try:
                wait_for(ars[0].ready, 20, what="rank 0 interrupted")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{engine_state(cluster, slots[0])}") from None
            with pytest.raises(Exception, match="KeyboardInterrupt"):
                ars[0].get()
        finally:
            late.set()
    wait_for(lambda: slots[1].state == "dead", 30, what="the launcher's notice")
    ready.restart(1)


@pytest.mark.parametrize("first", ["client", "launcher"])
def test_an_engine_death_noticed_in_either_order_names_the_rank(ready, shell, first):
    cluster, client = ready.cluster, ready.cluster.client
    victim = cluster.slots()[1]
    if first == "client":
        held = launcher_notice_held(cluster, lambda: victim.engine_id not in client.ids)
    else:
        held = unregistration_held(client, lambda: victim.state == "dead")
    with held:
        killer = when_rank_logged(ready, 1, 5, lambda: os.kill(victim.pid, signal.SIGKILL))
        error = _fit_error(shell, ENDLESS)
        wait_for(lambda: victim.state == "dead" and victim.engine_id not in client.ids, 30,
                 what="both notices")
    assert error.rank == 1 and "died" in str(error) and f"host {victim.host}" in str(error)
    assert error.detected_at - killer["t"] < 15
    run_cell(shell, "%cluster restart 1")
    _next_run_works(shell, ready)


def test_a_run_started_on_an_engine_ipyparallel_already_forgot_names_the_rank(ready, shell):
    """The slot still looks alive (the launcher's notice is late), the client knows better."""
    cluster = ready.cluster
    victim = cluster.slots()[1]
    late = threading.Event()
    with launcher_notice_held(cluster, late.is_set), unheard_by_phalanx(cluster):
        try:
            _kill_and_wait_forgotten(ready, 1)
            error = _fit_error(shell, "%%distributed_fit\nallreduce(np.ones(4))\n")
        finally:
            late.set()
    assert error.rank == 1 and "died" in str(error) and f"pid {victim.pid}" in str(error)
    wait_for(lambda: victim.state == "dead", 30, what="the launcher's notice")
    run_cell(shell, "%cluster restart 1")
    _next_run_works(shell, ready)


def versions_or_die(victim_pid):
    """Runs on the engines in place of the version check; the victim dies in it."""
    from phalanx.fit.analysis._manifest import engine_versions

    if os.getpid() == victim_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    return engine_versions()


def test_an_engine_dying_in_the_version_check_names_the_rank(ready, shell, monkeypatch):
    """Was ipyparallel's CompositeError from the check that starts a run."""
    import functools

    from phalanx.fit.run import _run

    victim = ready.cluster.slots()[1]
    monkeypatch.setattr(_run, "engine_versions", functools.partial(versions_or_die, victim.pid))
    ready.fits.engines.forget_versions()
    error = _fit_error(shell, "%%distributed_fit\nallreduce(np.ones(4))\n")
    message = str(error)
    assert error.rank == 1 and "died while the run was starting" in message
    assert f"host {victim.host}" in message and "%cluster restart 1" in message
    monkeypatch.undo()
    wait_for(lambda: victim.state == "dead", 30, what="the launcher's notice")
    run_cell(shell, "%cluster restart 1")
    _next_run_works(shell, ready)


def commits_or_die(victim_pid, key, directory, scratch, rank):
    from phalanx.runtime.commits._resume import held_commits

    if os.getpid() == victim_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    return held_commits(key, directory, scratch, rank)


LOOP = """%%distributed_fit --checkpoint-every 5 --max-restarts 1
from phalanx.runtime import steps
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in steps(20):
    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
    log(seen=step)
    if rank == 1 and step == 7 and not os.path.exists(MARK):
        open(MARK, "w").close()
        raise ValueError("bad shard on rank 1")
"""


def test_an_engine_dying_while_a_restart_plans_its_resume_names_the_rank(
        ready, shell, monkeypatch, tmp_path):
    import functools

    from phalanx.fit.run import _recovery

    survivor = ready.cluster.slots()[0]
    monkeypatch.setattr(_recovery, "held_commits", functools.partial(commits_or_die, survivor.pid))
    run_cell(shell, f"MARK = {str(tmp_path / 'raised')!r}")
    error = _fit_error(shell, LOOP)
    message = str(error)
    assert error.rank == 0 and "died while resuming" in message, message
    monkeypatch.undo()
    wait_for(lambda: survivor.state == "dead", 30, what="the launcher's notice")
    run_cell(shell, "%cluster restart 0")
    _next_run_works(shell, ready)


def test_a_restart_that_fails_during_recovery_is_reported_with_its_cause(
        ready, shell, monkeypatch, tmp_path):
    write_sitecustomize(tmp_path, monkeypatch, CRASH)
    monkeypatch.setenv("PHALANX_TEST_CRASH", "1")  # engines started from now on crash
    run_cell(shell, f"MARK = {str(tmp_path / 'raised')!r}")
    error = _fit_error(shell, LOOP)
    message = str(error)
    assert error.rank == 1 and "ValueError: bad shard on rank 1" in message
    assert "restart rank 1's engine" in message and "broken engine environment" in message
    assert [s.state for s in ready.cluster.slots()] == ["idle", "dead"]  # no stale slot
    monkeypatch.delenv("PHALANX_TEST_CRASH")
    run_cell(shell, "%cluster restart 1")
    _next_run_works(shell, ready)


def _slow_reply_on(session, rank: int, seconds: float):
    """Make one engine linger once ``run_cell`` has returned a failure, before ipyparallel
    sends the reply (as a big result or a busy machine does); returns the undo."""
    def patch(seconds):
        import time

        from ipyparallel.engine import kernel

        original = getattr(kernel.serialize_object, "original", kernel.serialize_object)

        def serialize_object(obj, *args, **kwargs):
            if type(obj).__name__ == "RankResult" and obj.failed:
                time.sleep(seconds)
            return original(obj, *args, **kwargs)

        serialize_object.original = original
        kernel.serialize_object = serialize_object

    def unpatch():
        from ipyparallel.engine import kernel

        kernel.serialize_object = getattr(kernel.serialize_object, "original",
                                          kernel.serialize_object)

    engine = session.cluster.client[session.cluster.slots()[rank].engine_id]
    engine.apply_sync(patch, seconds)
    return lambda: engine.apply_sync(unpatch)


def test_an_interrupt_reaching_a_rank_on_its_way_back_keeps_its_own_error(ready, shell):
    # Rank 1 fails on its own; rank 0 is released by its abort.  The kernel then interrupts
    # rank 1, which is still returning: the interrupt must not replace its error (or, landing
    # in ipyparallel's reply, lose the reply and leave the rank "unresponsive").
    from phalanx.fit.run import _waiter

    undo = _slow_reply_on(ready, 1, _waiter.SECONDARY_GRACE_S + 2)
    try:
        error = _fit_error(shell, """%%distributed_fit
allreduce(np.ones(4))
if rank == 1:
    raise ValueError("bad shard on rank 1")
allreduce(np.ones(4))
""")
    finally:
        undo()
    message = str(error)
    assert error.rank == 1 and "ValueError: bad shard on rank 1" in message, message
    assert "unresponsive" not in message.lower() and "interrupted" not in message, message
    assert [s.state for s in ready.cluster.slots()] == ["idle", "idle"]
    _next_run_works(shell, ready)


def test_a_failed_restart_of_an_unresponsive_rank_is_reported_not_swallowed(
        ready, shell, monkeypatch, tmp_path):
    from phalanx.fit.run import _waiter

    monkeypatch.setattr(_waiter, "RELEASE_GRACE_S", 3.0)
    write_sitecustomize(tmp_path, monkeypatch, CRASH)
    monkeypatch.setenv("PHALANX_TEST_CRASH", "1")
    old_pid = ready.cluster.slots()[1].pid
    error = _fit_error(shell, """%%distributed_fit --collective-timeout 3
if rank == 1:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # deaf to interrupts, like native code
    while True:
        time.sleep(0.05)
allreduce(np.ones(4))
""")
    message = str(error)
    assert error.rank == 1 and "stalled" in message
    assert "restarting its engine failed" in message and "broken engine environment" in message
    assert ready.cluster.slots()[1].state == "dead"
    assert_all_gone([old_pid])
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=r"rank\(s\) 1 are dead"):  # never a stale slot
        run_cell(shell, "%%distributed_fit\npass\n")
    monkeypatch.delenv("PHALANX_TEST_CRASH")
    run_cell(shell, "%cluster restart 1")
    _next_run_works(shell, ready)


def test_the_controller_dying_mid_run_ends_the_run_with_one_error(ready, shell):
    from conftest import engine_pids

    cluster = ready.cluster
    controller = cluster.state.cluster.controller.pid
    killer = when_rank_logged(ready, 0, 5, lambda: os.kill(controller, signal.SIGKILL))
    error = _fit_error(shell, ENDLESS)
    assert "controller" in str(error) and f"pid {controller}" in str(error)
    assert error.detected_at - killer["t"] < 10
    pids = engine_pids(ready)
    ready.stop_cluster()
    assert_all_gone(pids + [controller])
    ready.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
    run_cell(shell, SETUP)
    _next_run_works(shell, ready)
