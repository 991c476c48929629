"""Sync strategies over the in-process ThreadCommunicator: math, equivalences, flags."""

from __future__ import annotations

import threading
import textwrap

import numpy as np
import pytest
import torch

from phalanx.runtime.transport._comm import make_thread_communicators
from phalanx.runtime.sync._strategies import (EASGD, AllreduceSync, LocalSGD, NoSync, SyncStrategy,
                                   make_strategy, param_grads)
from deadlines import hang_limit


def _end_of_backward(strategy, params, step):
    """What the runtime does when backward completes, then just before ``step()``."""
    strategy.average_gradients(param_grads(params), step)
    strategy.before_step(params, step)


def run_ranks(n, fn, timeout=hang_limit(20.0)):
    """Run ``fn(comm)`` on ``n`` thread ranks; return their results, re-raise the first error."""
    comms = make_thread_communicators(n, timeout_s=10)
    results, errors = [None] * n, []

    def target(comm):
        try:
            results[comm.rank] = fn(comm)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            for other in comms:
                other.abort(f"rank {comm.rank} failed")

    threads = [threading.Thread(target=target, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


def problem(rows=8, features=5, seed=0, noise=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, features, generator=g, dtype=torch.float64)
    w = torch.randn(features, 1, generator=g, dtype=torch.float64)
    y = x @ w + noise * torch.randn(rows, 1, generator=g, dtype=torch.float64)
    return x, y, w


def make_model(features, seed):
    """A linear model initialised from its own generator (threads share torch's global RNG)."""
    model = torch.nn.Linear(features, 1).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def train(model, x, y, steps, lr, on_grad=None, on_step=None):
    """Plain SGD on mean squared error, with strategy hooks."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if on_grad:
            on_grad(step)
        opt.step()
        if on_step:
            on_step(step)
    return [p.detach().clone() for p in model.parameters()]


def distributed(spec, steps=20, lr=0.1, every=1, alpha=0.5, n=2, data=None):
    x, y, _ = data or problem()
    shard = len(x) // n

    def body(comm):
        model = make_model(x.shape[1], 100 + comm.rank)  # different inits: start() fixes them
        params = list(model.parameters())
        strategy = make_strategy(spec, comm, every=every, alpha=alpha)
        strategy.start(params)
        rows = slice(comm.rank * shard, (comm.rank + 1) * shard)
        xs, ys = x[rows], y[rows]
        train(model, xs, ys, steps, lr, lambda s: _end_of_backward(strategy, params, s),
              lambda s: strategy.after_step(params, s))
        strategy.finish(params)
        return [p.detach().clone() for p in params]

    return run_ranks(n, body)


def full_batch(steps=20, lr=0.1):
    x, y, _ = problem()
    model = make_model(x.shape[1], 100)  # rank 0's init, which start() broadcasts
    return train(model, x, y, steps, lr)


def test_allreduce_equals_full_batch_sgd():
    ranks = distributed("allreduce")
    reference = full_batch()
    for got in ranks:
        for p, q in zip(got, reference):
            assert torch.allclose(p, q, atol=1e-6, rtol=0)
    assert all(torch.equal(p, q) for p, q in zip(*ranks)), "ranks must agree bit for bit"


def test_localsgd_every_1_equals_allreduce_for_plain_sgd():
    a, b = distributed("allreduce")[0], distributed("localsgd", every=1)[0]
    for p, q in zip(a, b):
        assert torch.allclose(p, q, atol=1e-12, rtol=0)


def test_localsgd_averages_only_every_k_and_at_finish():
    def body(comm):
        w = np.array([float(comm.rank)])
        s = LocalSGD(comm, every=3)
        seen = []
        for step in range(4):
            w += 1.0 + comm.rank  # rank-dependent local progress
            s.after_step([w], step)
            seen.append(w.item())
        s.finish([w])
        return seen, w.item()

    (seen0, end0), (seen1, end1) = run_ranks(2, body)
    assert seen0[:2] == [1.0, 2.0] and seen1[:2] == [3.0, 5.0]  # local steps 0 and 1
    assert seen0[2] == seen1[2] == (3.0 + 7.0) / 2  # step 2 syncs
    assert end0 == end1 == (6.0 + 7.0) / 2  # finish averages the dirty step 3


def test_easgd_converges_on_least_squares():
    data = problem(rows=32, features=4, seed=3)
    ranks = distributed("easgd", steps=400, lr=0.1, every=2, alpha=0.25, data=data)
    w_true = data[2].reshape(-1)
    for weight, bias in ranks:
        assert torch.allclose(weight.reshape(-1), w_true, atol=1e-4)
        assert abs(bias.item()) < 1e-4
    assert all(torch.equal(p, q) for p, q in zip(*ranks)), "finish() must give the centre"


def test_easgd_elastic_update_math():
    alpha = 0.25

    def body(comm):
        x = np.array([1.0, 2.0]) * (comm.rank + 1)  # rank 0: [1, 2], rank 1: [2, 4]
        s = EASGD(comm, every=1, alpha=alpha)
        s.centre, s._moves = [np.zeros(2)], [np.zeros(2)]
        s.after_step([x], step=0)
        return x.copy(), s.centre[0].copy()

    (x0, c0), (x1, c1) = run_ranks(2, body)
    np.testing.assert_allclose(x0, [0.75, 1.5])  # x - alpha * (x - 0)
    np.testing.assert_allclose(x1, [1.5, 3.0])
    np.testing.assert_allclose(c0, [0.75, 1.5])  # 0 + alpha * ([1,2] + [2,4])
    assert np.array_equal(c0, c1)


def test_numpy_params_are_averaged_like_sklearn_coefficients():
    def body(comm):
        coef = np.full((3, 4), float(comm.rank), dtype=np.float64)
        intercept = np.array([10.0 * comm.rank], dtype=np.float32)
        s = make_strategy("allreduce", comm)
        s.before_step([coef, intercept], 0)  # nothing to do: no gradients
        assert coef[0, 0] == comm.rank
        s.after_step([coef, intercept], 0)
        return coef, intercept

    for coef, intercept in run_ranks(2, body):
        assert (coef == 0.5).all() and intercept.dtype == np.float32 and intercept[0] == 5.0


def test_start_broadcasts_rank0_and_nosync_does_not():
    def body(comm):
        a = np.array([comm.rank + 1.0])
        b = np.array([comm.rank + 1.0])
        make_strategy("localsgd", comm).start([a])
        nosync = make_strategy("none", comm)
        nosync.start([b])
        nosync.before_step([b], 0)
        nosync.after_step([b], 0)
        nosync.finish([b])
        return a.item(), b.item(), comm.bytes_sent

    (a0, b0, sent0), (a1, b1, _) = run_ranks(2, body)
    assert a0 == a1 == 1.0
    assert (b0, b1) == (1.0, 2.0)
    assert sent0 == 8  # only the start broadcast of one float64


def test_missing_gradient_becomes_zeros_on_every_rank():
    def body(comm):
        used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
        (used * (comm.rank + 1)).sum().backward()
        AllreduceSync(comm).average_gradients(param_grads([used, unused]), 0)
        return used.grad.clone(), unused.grad.clone()

    for used, unused in run_ranks(2, body):
        assert torch.equal(used, torch.full((2,), 1.5)) and torch.equal(unused, torch.zeros(3))


def test_flags_names_and_schedule():
    comm = make_thread_communicators(1)[0]
    assert make_strategy("allreduce", comm).averages_gradients
    assert not any(make_strategy(n, comm).averages_gradients for n in ("localsgd", "easgd", "none"))
    assert [make_strategy(n, comm).name for n in ("allreduce", "localsgd", "easgd", "none")] == [
        "allreduce", "localsgd", "easgd", "none"]
    assert [LocalSGD(comm, every=3).should_sync(s) for s in range(6)] == [
        False, False, True, False, False, True]
    assert isinstance(make_strategy(NoSync, comm), NoSync)


@pytest.mark.parametrize("spec, every, alpha, match", [
    ("bogus", 1, 0.5, "unknown sync strategy 'bogus'"),
    ("", 1, 0.5, "name or a dotted class path"),
    ("allreduce", 0, 0.5, "every must be an integer >= 1"),
    ("localsgd", -2, 0.5, "every must be an integer >= 1"),
    ("localsgd", 1.5, 0.5, "every must be an integer >= 1"),
    ("localsgd", True, 0.5, "every must be an integer >= 1"),
    ("easgd", 1, 0.0, r"alpha must be in \(0, 1\]"),
    ("easgd", 1, 1.5, r"alpha must be in \(0, 1\]"),
    ("collections.OrderedDict", 1, 0.5, "not a phalanx SyncStrategy subclass"),
    ("no_such_pkg_xyz.Strategy", 1, 0.5, "cannot import 'no_such_pkg_xyz'"),
    ("phalanx.runtime.sync._strategies.Nope", 1, 0.5, "has no 'Nope'"),
])
def test_make_strategy_rejects_bad_input(spec, every, alpha, match):
    with pytest.raises(ValueError, match=match):
        make_strategy(spec, make_thread_communicators(1)[0], every=every, alpha=alpha)


def test_user_strategy_by_dotted_name(tmp_path, monkeypatch):
    (tmp_path / "phx_user_strategies.py").write_text(textwrap.dedent("""
        from phalanx.runtime.sync._strategies import SyncStrategy

        class SumEveryStep(SyncStrategy):
            name = "sum-every-step"
            calls = []

            def after_step(self, params, step):
                self.calls.append(step)
                self.comm.allreduce(list(params), op="sum")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))

    def body(comm):
        s = make_strategy("phx_user_strategies.SumEveryStep", comm, every=2)
        w = np.array([comm.rank + 1.0])
        s.start([w])
        s.after_step([w], 0)
        return type(s).__name__, s.every, w.item()

    assert run_ranks(2, body) == [("SumEveryStep", 2, 2.0)] * 2


def test_base_strategy_is_usable_directly():
    s = SyncStrategy(make_thread_communicators(1)[0], every=2)
    w = np.ones(2)
    s.start([w]); s.before_step([w], 0); s.after_step([w], 0); s.finish([w])
    assert repr(s) == "SyncStrategy(every=2, alpha=0.5)" and (w == 1).all()


def _one_rank_hooks_called(strategy_class):
    """The hooks a strategy got through one optimizer step of a one-rank run."""
    from phalanx.runtime.sync._zero_change import StepHooks
    from phalanx.runtime.sync._join import JoinControl
    from phalanx.runtime.run._engine_state import RunContext

    comm = make_thread_communicators(1)[0]
    run = RunContext(run_id="one-rank", rank=0, world_size=1, device=torch.device("cpu"),
                     strategy_spec=strategy_class, collectives=comm, join=JoinControl(comm))
    hooks = StepHooks(run)
    hooks.install()
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(3, 2)).sum().backward()
        opt.step()
    finally:
        hooks.remove()
    return run.strategies[id(opt)].called


class _Recording(SyncStrategy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.called = []

    def average_gradients(self, grads, step):
        self.called.append("average_gradients")

    def before_step(self, params, step):
        self.called.append("before_step")

    def after_step(self, params, step):
        self.called.append("after_step")


class _IdentityOnOneRank(_Recording):
    identity_on_one_rank = True


def test_one_rank_skips_only_strategies_that_declare_themselves_the_identity_there():
    assert _one_rank_hooks_called(_IdentityOnOneRank) == []
    # a user strategy that says nothing may act alone (a schedule, a decay): it runs
    assert _one_rank_hooks_called(_Recording) == ["average_gradients", "before_step", "after_step"]
    assert not SyncStrategy.identity_on_one_rank
    assert all(make_strategy(name, make_thread_communicators(1)[0]).identity_on_one_rank
               for name in ("allreduce", "localsgd", "none"))


def test_easgd_requires_start():
    s = EASGD(make_thread_communicators(1)[0])
    with pytest.raises(RuntimeError, match="start"):
        s.after_step([np.ones(1)], 0)


def test_docstring_examples_run():
    import doctest

    from phalanx.runtime.sync import _strategies as _sync
    result = doctest.testmod(_sync)
    assert result.attempted and not result.failed


def test_agreement_names_the_one_value_that_differs_among_many():
    """The agreement check over real (thread) ranks: equal values pass, NaN on every rank
    agrees, and of 50 parameters the one a rank changed is the one named, on every rank."""
    from phalanx.runtime.sync._agreement import DivergenceError, check_agreement

    def values(rank, changed=None):
        seeded = torch.Generator().manual_seed(0)  # the ranks are threads: not the global one
        out = [torch.randn(8, 8, generator=seeded) for _ in range(49)]
        out.append(torch.full((3,), float("nan")))
        if changed is not None and rank == 1:
            out[changed] = out[changed] + 1e-3
        return out

    def agree(comm):
        check_agreement(comm, values(comm.rank), "after step 1")
        return "same"

    assert run_ranks(2, agree) == ["same", "same"]

    def one_differs(comm):
        mine = values(comm.rank, changed=37)
        with pytest.raises(DivergenceError) as caught:
            check_agreement(comm, mine, "after step 1", lambda: {id(mine[37]): "layer37.weight"})
        return str(caught.value)

    said = run_ranks(2, one_differs)
    assert all("layer37.weight" in message and "(8, 8)" in message for message in said), said
