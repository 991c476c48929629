"""The kernel-engine seam: a run's spec goes out and its ranks' results come back as typed values.

No cluster: specs and results travel the way ipyparallel carries them (pickled), an engine's
``run_cell`` runs in this process on a spec it cannot run (so no process group is formed), and
the kernel's waiter and error report read the results.
"""

from __future__ import annotations

import pickle
import signal
import types

import cloudpickle
import pytest

from phalanx.fit.run._errors import DistributedFitError, describe_failure, failure, root_cause
from phalanx.fit.run._waiter import Waiter
from phalanx.runtime import (CheckpointSpec, GroupSpec, Outcome, RankResult, ResumePlan, RunSpec,
                             run_cell)
from phalanx.wire._options import TrainOptions
from phalanx.wire._seam import Fault


def spec_for(rank: int, names: tuple[str, ...] = ()) -> RunSpec:
    group = GroupSpec(key="phx-test-1-w2", rank=rank, world_size=2, store=("file", "/nowhere"),
                      backend="gloo", timeout_s=60.0, hosts=("a", "a"), pids=(10, 11))
    plan = ResumePlan(step=15, sources=("memory", "peer"), src=0)
    return RunSpec(run_id="abc-1", rank=rank, world_size=2, body="x = 1\n", names=names,
                   group=group, metrics_address="tcp://127.0.0.1:1",
                   train=TrainOptions(returns=("x",), shard=("X",)), metrics_token="t",
                   checkpoint=CheckpointSpec("ckpt-abc-1", 5, None, resume=plan))


def slot(rank: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(engine_id=rank, host="hostA", pid=100 + rank, exit_code=None,
                                 state="idle", address="127.0.0.1")


CARRIERS = {"pickle": (pickle.dumps, pickle.loads),
            "cloudpickle": (cloudpickle.dumps, cloudpickle.loads)}


@pytest.mark.parametrize("carrier", CARRIERS)
def test_a_spec_arrives_whole_and_frozen(carrier):
    dumps, loads = CARRIERS[carrier]
    spec = spec_for(1)
    arrived = loads(dumps(spec))
    assert arrived == spec and arrived.group.rank == 1 and arrived.checkpoint.resume.src == 0
    with pytest.raises(AttributeError):
        arrived.rank = 0  # type: ignore[misc]


def test_a_spec_and_a_result_survive_ipyparallels_own_serialization():
    from ipyparallel.serialize import deserialize_object, serialize_object

    for value in (spec_for(0), RankResult(Outcome.OK, steps=3, returns=b"\x80")):
        arrived, _ = deserialize_object(serialize_object(value))
        assert arrived == value


RESULTS = {
    Outcome.OK: RankResult(Outcome.OK, steps=12, wall_s=1.5, returns=cloudpickle.dumps({"x": 1})),
    Outcome.RESIZED: RankResult(Outcome.RESIZED, steps=10, error="StopForResize", last_commit=10),
    Outcome.RAISED: RankResult(Outcome.RAISED, steps=4, error="ValueError", message="bad shard",
                               traceback="ValueError: bad shard\n", host="hostA", pid=101),
    Outcome.INTERRUPTED: RankResult(Outcome.INTERRUPTED, steps=4, error="KeyboardInterrupt"),
    Outcome.DIED: RankResult(Outcome.DIED, steps=7, error="EngineDied", exit_code=-9),
    Outcome.STOPPED: RankResult(Outcome.STOPPED, steps=2, error="Stalled", stopped=True,
                                stalled=True, waited_s=5.0),
    Outcome.UNRESPONSIVE: RankResult(Outcome.UNRESPONSIVE, steps=3, error="Unresponsive",
                                     grace_s=10.0, restart_error="OSError: no"),
    Outcome.CONTROLLER_LOST: RankResult(Outcome.CONTROLLER_LOST, error="ControllerDied",
                                        controller={"pid": 42, "exit_code": 1}),
}


def test_every_outcome_is_covered_here():
    assert set(RESULTS) == set(Outcome)


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_each_outcome_round_trips_and_says_whether_the_rank_failed(outcome):
    result = RESULTS[outcome]
    for dumps, loads in CARRIERS.values():
        assert loads(dumps(result)) == result
    assert result.ok == (outcome is Outcome.OK)
    assert result.failed == (outcome not in (Outcome.OK, Outcome.RESIZED))


# What the cell shows for rank 1 ending each way while rank 0 was interrupted by the kernel.
EXPECTED = {
    Outcome.RAISED: "raised ValueError after 4 step(s)",
    Outcome.DIED: "died during the run after step 7",
    Outcome.STOPPED: "Its process was stopped (SIGSTOP)",
    Outcome.UNRESPONSIVE: "phalanx tried to restart its engine, which failed: OSError: no",
}


@pytest.mark.parametrize("outcome", list(EXPECTED), ids=lambda o: o.value)
def test_a_failed_rank_is_named_and_described_by_its_outcome(outcome):
    results = {0: RESULTS[Outcome.INTERRUPTED], 1: RESULTS[outcome]}
    assert root_cause(results) == 1
    error = failure("failed", results, [slot(0), slot(1)], types.SimpleNamespace(timeout=None),
                    2.0, {0: 4, 1: 4})
    assert isinstance(error, DistributedFitError) and error.rank == 1
    assert EXPECTED[outcome] in str(error) and "rank 1 (engine 1 on host hostA" in str(error)
    assert error.results[1] is RESULTS[outcome]


def test_a_lost_controller_is_the_runs_error_whoever_else_failed():
    results = {0: RESULTS[Outcome.RAISED], 1: RESULTS[Outcome.CONTROLLER_LOST]}
    error = failure("failed", results, [slot(0), slot(1)], None, 3.0, {})
    assert error.rank is None and "controller (pid 42) exited" in str(error)


def test_a_rank_released_by_a_peer_is_not_blamed_over_the_peer_it_waited_for():
    released = RankResult(Outcome.RAISED, steps=4, error="CollectiveAborted", fault=Fault.PEER,
                          message="peer failed")
    assert root_cause({0: released, 1: RESULTS[Outcome.DIED]}) == 1
    assert root_cause({0: released, 1: RESULTS[Outcome.INTERRUPTED]}) == 0


def test_an_interrupt_alone_names_no_rank_but_says_where_each_stopped():
    results = {0: RESULTS[Outcome.INTERRUPTED], 1: RESULTS[Outcome.INTERRUPTED]}
    assert root_cause(results) is None
    assert describe_failure(0, results[0], slot(0)).endswith("was stopped at step 4.")


class Answered:
    """An AsyncResult whose rank already answered."""

    def __init__(self, result: RankResult) -> None:
        self.result, self.metadata = result, {"stdout": "", "stderr": ""}

    def ready(self) -> bool:
        return True

    def wait_for_output(self, timeout: float | None = None) -> bool:
        return True

    def done(self) -> bool:
        return True

    def add_done_callback(self, fn) -> None:
        fn(self)  # as a done concurrent.futures.Future does: at once

    def get(self, timeout: float | None = None) -> RankResult:
        return self.result


@pytest.mark.parametrize("outcomes, status", [
    ((Outcome.OK, Outcome.OK), "done"),
    ((Outcome.RESIZED, Outcome.RESIZED), "resized"),
    ((Outcome.OK, Outcome.RAISED), "failed"),
    ((Outcome.RESIZED, Outcome.DIED), "failed"),
])
def test_the_waiter_turns_the_ranks_outcomes_into_the_attempts_status(outcomes, status):
    cluster = types.SimpleNamespace(controller_exit=None, client=None)
    tracker = types.SimpleNamespace(steps={0: 0, 1: 0})
    opts = types.SimpleNamespace(timeout=None, collective_timeout=60.0)
    ars = [Answered(RESULTS[o]) for o in outcomes]
    results: dict[int, RankResult] = {}
    assert Waiter(cluster, [slot(0), slot(1)], ars, tracker, opts).wait(results) == status
    assert results == {r: RESULTS[o] for r, o in enumerate(outcomes)}


def test_an_engine_answers_a_spec_it_cannot_run_with_a_result_not_an_exception():
    # The shipped object the spec names was never stashed: the rank fails before any group forms.
    previous = signal.getsignal(signal.SIGINT)
    try:
        result = run_cell(spec_for(0, names=("never_shipped",)))
    finally:  # run_cell makes its interrupt gate the process's SIGINT handler, as on an engine:
        signal.signal(signal.SIGINT, previous)  # left in place, it would swallow later Ctrl-C
    assert isinstance(result, RankResult) and result.outcome is Outcome.RAISED
    assert result.error == "RuntimeError" and "never_shipped" in result.message
    assert result.steps == 0 and result.wall_s is not None and result.ended_at > 0
    assert pickle.loads(pickle.dumps(result)) == result
    text = describe_failure(0, result, slot(0))
    assert "raised RuntimeError after 0 step(s)" in text and "never_shipped" in text


def test_whose_fault_is_decided_by_type_on_the_engine_not_by_name():
    """A subclass of a transport's error is still a peer's fault, and a person's own class that
    happens to share a name with one is not: the kernel no longer reads type names."""
    from phalanx.runtime.run._faults import fault_of
    from phalanx.runtime.transport._comm_errors import (CollectiveAborted, CollectiveMismatch,
                                                        CollectiveTimeout)

    class SlowPeerAborted(CollectiveAborted):
        pass

    class CollectiveTimeoutError(Exception):  # a user's class, not phalanx's
        pass

    assert fault_of(SlowPeerAborted("rank 1 gave up")) is Fault.PEER
    assert fault_of(CollectiveTimeout("waited 30 s")) is Fault.DEADLINE
    assert fault_of(CollectiveMismatch("rank 0 entered allreduce, rank 1 broadcast")) is Fault.OWN
    assert fault_of(CollectiveTimeoutError("mine")) is Fault.OWN
    released = RankResult(Outcome.RAISED, error="SlowPeerAborted", fault=Fault.PEER)
    own = RankResult(Outcome.RAISED, error="CollectiveAborted", fault=Fault.OWN)
    assert root_cause({0: released, 1: own}) == 1
