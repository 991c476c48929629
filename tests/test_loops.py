"""Real training loops through %%distributed_fit (zero-change mode) on 2 CPU ranks, each against
the same loop run in one process on the full data: clipping, gradient accumulation, AMP with a
GradScaler, uneven shards."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from conftest import run_cell

pytestmark = pytest.mark.cluster

SETUP = """
import torch, numpy as np
torch.manual_seed(0)
X = torch.randn(64, 6)
y = torch.sin(X @ torch.linspace(-1.0, 1.0, 6)) + 0.1
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
"""


def _single_process(body: str, setup: str = SETUP, **names) -> dict:
    """The cell's own loop in this process, on the full data (what one machine would compute)."""
    ns: dict = {"rank": 0, "world_size": 1, "device": torch.device("cpu")}
    exec(setup, ns)
    ns.update(names)
    exec(body, ns)
    return ns


def _params(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def _fit(shell, flags: str, body: str, setup: str = SETUP) -> dict:
    run_cell(shell, setup)
    run_cell(shell, f"%%distributed_fit --no-widget --shard X,y {flags}\n" + body)
    return shell.user_ns


CLIPPED = """
from phalanx import no_sync
opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
norms = []
for step in range(10):
    opt.zero_grad()
    loss = ((model(X).squeeze(1) - y) ** 2).mean()
    loss.backward()
    norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)
    opt.step()
"""


def test_clipping_sees_the_full_batch_gradient(two_engines, shell):
    ns = _fit(shell, "--return model,norms", CLIPPED)
    ref = _single_process(CLIPPED)
    # the norms clipping saw are those of the full-batch gradient, not of a rank's half
    np.testing.assert_allclose(ns["norms"], ref["norms"], rtol=1e-5)
    assert max(ref["norms"]) > 0.5  # clipping did act
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)


ACCUMULATED = """
from phalanx import no_sync, bytes_sent
import contextlib
opt = torch.optim.Adam(model.parameters(), lr=0.01)
micro = len(X) // 4
for step in range(6):
    opt.zero_grad(set_to_none=step % 2 == 0)
    for i in range(4):
        skip = USE_NO_SYNC and i < 3
        with no_sync(model) if skip else contextlib.nullcontext():
            rows = slice(i * micro, (i + 1) * micro)
            loss = ((model(X[rows]).squeeze(1) - y[rows]) ** 2).mean()
            (loss / 4).backward()
    opt.step()
sent = bytes_sent() if world_size > 1 else 0
"""


def test_gradient_accumulation_is_exact_and_no_sync_skips_the_micro_steps(two_engines, shell):
    ref = _single_process(ACCUMULATED, USE_NO_SYNC=False)
    runs = {}
    for use in (False, True):
        ns = _fit(shell, "--return model,sent", ACCUMULATED, SETUP + f"USE_NO_SYNC = {use}\n")
        np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)
        runs[use] = ns["sent"]
    # 4 gradient averagings per step without no_sync, 1 with it
    assert runs[True] < runs[False] / 2, runs


AMP = """
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
# One process takes the two halves the ranks hold as two micro-batches: bfloat16 rounds a
# gradient summed over 64 rows differently from two summed over 32, which is not the point here.
parts = [(X[:32], y[:32]), (X[32:], y[32:])] if world_size == 1 else [(X, y)]
scales, skipped = [], 0
for step in range(8):
    opt.zero_grad()
    for j, (xb, yb) in enumerate(parts):
        half = j if world_size == 1 else rank
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(xb).float().squeeze(1)
        loss = ((out - yb) ** 2).mean()
        if step == 3 and half == 1:  # only rank 1's half overflows, once
            loss = loss * float("inf")
        scaler.scale(loss / len(parts)).backward()
    before = scaler.get_scale()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    skipped += scaler.get_scale() < before
    scales.append(scaler.get_scale())
"""


def test_gradscaler_skips_the_same_step_on_every_rank(two_engines, shell):
    # Before, the rank that skipped its step left the other waiting until the collective timeout.
    ns = _fit(shell, "--return model,scales,skipped --collective-timeout 20", AMP)
    assert two_engines.last_run().steps == {0: 7, 1: 7}  # 8 iterations, one skipped everywhere
    ref = _single_process(AMP)
    assert ns["skipped"] == ref["skipped"] == 1
    assert ns["scales"] == ref["scales"]
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)


UNEVEN_SETUP = """
import torch, numpy as np
torch.manual_seed(1)
X = torch.randn(101, 6)
y = X.sum(1, keepdim=True) * 0.5
model = torch.nn.Linear(6, 1)
"""

UNEVEN = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(0, len(X), 10):
    opt.zero_grad()
    loss = ((model(X[i:i + 10]) - y[i:i + 10]) ** 2).mean()
    loss.backward()
    opt.step()
"""

def _uneven_reference() -> torch.nn.Module:
    """One process: step k takes batch k of each shard (rows 0-49 and 50-100) together."""
    ns: dict = {}
    exec(UNEVEN_SETUP, ns)
    X, y, model = ns["X"], ns["y"], ns["model"]
    shards = [(X[:50], y[:50]), (X[50:], y[50:])]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(0, 60, 10):
        xb = torch.cat([sx[i:i + 10] for sx, _ in shards])
        yb = torch.cat([sy[i:i + 10] for _, sy in shards])
        opt.zero_grad()
        ((model(xb) - yb) ** 2).mean().backward()
        opt.step()
    return model


def test_uneven_shards_join_and_end_equal(two_engines, shell):
    ns = _fit(shell, "--return model --collective-timeout 20", UNEVEN, UNEVEN_SETUP)
    assert two_engines.last_run().steps == {0: 5, 1: 6}
    # rank 0 ran 5 steps; it returns the 6-step model because every rank ends with the parameters
    # of the rank that ran longest
    np.testing.assert_allclose(_params(ns["model"]), _params(_uneven_reference()), atol=1e-5)


def test_uneven_error_names_each_ranks_steps_and_rows(two_engines, shell):
    run_cell(shell, UNEVEN_SETUP)
    started = time.monotonic()
    from phalanx.fit import DistributedFitError

    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --no-widget --shard X,y --uneven error "
                        "--collective-timeout 30\n" + UNEVEN)
    took = time.monotonic() - started
    text = str(info.value)
    assert "uneven inputs" in text
    assert "rank 0 finished after 5 steps (50 rows" in text, text
    assert "rank 1 still training after 5 steps (51 rows" in text, text
    assert took < 2 + _dispatch_overhead(shell), took
    run_cell(shell, UNEVEN_SETUP)  # the engines still work afterwards
    run_cell(shell, "%%distributed_fit --no-widget --shard X,y\n" + UNEVEN)


def _dispatch_overhead(shell) -> float:
    """The time an even one-step run takes here, so the bound is about the failure alone."""
    started = time.monotonic()
    run_cell(shell, "%%distributed_fit --no-widget\nx = 1\n")
    return time.monotonic() - started


BRANCHES = """
torch.manual_seed(0)
heads = torch.nn.ModuleDict({"a": torch.nn.Linear(6, 1), "b": torch.nn.Linear(6, 1),
                             "never": torch.nn.Linear(6, 1)})
trunk = torch.nn.Linear(6, 6)
trunk.weight.requires_grad_(False)  # frozen at first, trained from step 4 on
opt = torch.optim.Adam(list(trunk.parameters()) + list(heads.parameters()), lr=0.05)
# one process takes the ranks' halves as two micro-batches
parts = [(0, X[:32], y[:32]), (1, X[32:], y[32:])] if world_size == 1 else [(rank, X, y)]
for step in range(8):
    if step == 4:
        trunk.weight.requires_grad_(True)
    opt.zero_grad()
    for who, xb, yb in parts:
        h = torch.tanh(trunk(xb))
        out = heads["a"](h)
        if who == 1 and step % 2 == 0:  # head b is used on rank 1 only, every other step
            out = out + heads["b"](h)
        (((out.squeeze(1) - yb) ** 2).mean() / len(parts)).backward()
    opt.step()
never_grad = heads["never"].weight.grad
"""


def test_parameters_without_gradients_on_some_ranks(two_engines, shell):
    ns = _fit(shell, "--return trunk,heads,never_grad --collective-timeout 20", BRANCHES)
    ref = _single_process(BRANCHES)
    assert ns["never_grad"] is None  # no rank produced one: Adam left it alone, as in one process
    for name in ("trunk", "heads"):
        np.testing.assert_allclose(_params(ns[name]), _params(ref[name]), atol=1e-5)


GAN = """
import torch.nn.functional as F
torch.manual_seed(0)
tied = torch.nn.Linear(6, 6)
G = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), tied, torch.nn.Tanh(),
                        torch.nn.Linear(6, 6))
G[4].weight = tied.weight  # one parameter shared by two layers
D = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=0.01)
opt_d = torch.optim.SGD(D.parameters(), lr=0.05, momentum=0.5)
sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=3, gamma=0.5)
sched_d = torch.optim.lr_scheduler.ExponentialLR(opt_d, gamma=0.9)
temperature = torch.nn.Parameter(torch.ones(1))
for step in range(8):
    if step == 3:  # a parameter group added mid-run
        opt_d.add_param_group({"params": [temperature], "lr": 0.02})
    opt_d.zero_grad(set_to_none=False)
    fake = G(Z).detach()
    scale = temperature if step >= 3 else 1.0
    loss_d = F.softplus(-D(X) * scale).mean() + F.softplus(D(fake) * scale).mean()
    loss_d.backward()
    opt_d.step()
    opt_g.zero_grad()
    loss_g = F.softplus(-D(G(Z))).mean()
    loss_g.backward()
    opt_g.step()
    sched_d.step()
    sched_g.step()
"""


def test_gan_two_optimizers_schedulers_param_group_and_shared_weights(two_engines, shell):
    setup = "import torch\ntorch.manual_seed(5)\nX = torch.randn(64, 6) + 1.0\nZ = torch.randn(64, 4)\n"
    run_cell(shell, setup)
    run_cell(shell, "%%distributed_fit --no-widget --shard X,Z --return G,D,temperature\n" + GAN)
    ns = shell.user_ns
    ref = _single_process(GAN, setup)
    for name in ("G", "D"):
        np.testing.assert_allclose(_params(ns[name]), _params(ref[name]), atol=1e-5)
    np.testing.assert_allclose(ns["temperature"].detach().numpy(),
                               ref["temperature"].detach().numpy(), atol=1e-5)
    assert ns["G"][4].weight is ns["G"][2].weight  # still shared after the trip back


BATCHNORM = """
from phalanx import log, wrap
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                            torch.nn.Linear(8, 1))
net = wrap(model) if WRAP else model
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad()
    loss = ((net(X).squeeze(1) - y) ** 2).mean()
    loss.backward()
    opt.step()
log(running_mean=float(model[1].running_mean.sum()), batches=int(model[1].num_batches_tracked))
"""


def _state(model) -> np.ndarray:
    return torch.cat([t.detach().double().flatten() for t in model.state_dict().values()]).numpy()


def test_batchnorm_buffers_follow_rank_0_as_under_ddp(two_engines, shell):
    results = {}
    for wrap in (True, False):
        ns = _fit(shell, "--return model", BATCHNORM, SETUP + f"WRAP = {wrap}\n")
        results[wrap] = _state(ns["model"])
        rows = [r for r in two_engines.last_run().history.rows() if "running_mean" in r]
        if not wrap:  # every rank holds rank 0's running statistics
            assert len(rows) == 2 and rows[0]["running_mean"] == rows[1]["running_mean"], rows
    np.testing.assert_allclose(results[False], results[True], atol=1e-5)


LATE_BATCHNORM = """
from phalanx import log
from torch.nn.modules import module as _torch_module
torch.manual_seed(0)
parts = torch.nn.ModuleDict({"trunk": torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh()),
                             "bn": torch.nn.BatchNorm1d(8), "head": torch.nn.Linear(8, 1)})
opt = torch.optim.SGD(parts.parameters(), lr=0.1)
for step in range(6):
    opt.zero_grad()
    h = parts["trunk"](X)
    if step >= 3:                      # the BatchNorm joins after the first steps
        h = parts["bn"](h)
    ((parts["head"](h).squeeze(1) - y) ** 2).mean().backward()
    opt.step()
    if step == 1:
        hooks_in_step_2 = len(_torch_module._global_forward_pre_hooks)
probe = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
opt2 = torch.optim.SGD(probe.parameters(), lr=0.1)   # a second model joins with its optimizer
for step in range(3):
    opt2.zero_grad()
    probe(X).pow(2).mean().backward()
    opt2.step()
log(late=float(parts["bn"].running_mean.sum()), probe=float(probe[1].running_mean.sum()),
    hooks=hooks_in_step_2)
"""


def test_buffers_of_modules_that_join_late_still_follow_rank_0(two_engines, shell):
    """The modules with buffers are found in the first step; later steps run without a global
    forward hook (every module call would pay torch's slow path), yet a BatchNorm first called
    in step 4 and a model that comes with a new optimizer still get rank 0's statistics."""
    _fit(shell, "", LATE_BATCHNORM)
    rows = [r for r in two_engines.last_run().history.rows() if "late" in r]
    assert len(rows) == 2, rows
    assert rows[0]["late"] == rows[1]["late"] and rows[0]["probe"] == rows[1]["probe"], rows
    assert rows[0]["late"] != 0.0 and rows[0]["probe"] != 0.0  # they did train
    assert rows[0]["hooks"] == rows[1]["hooks"] == 0, rows


def test_sync_batchnorm_on_cpu_is_refused_with_what_to_do(two_engines, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, SETUP)
    with pytest.raises(DistributedFitError, match="SyncBatchNorm needs CUDA tensors"):
        run_cell(shell, "%%distributed_fit --no-widget --shard X,y\n" + BATCHNORM.replace(
            "net = wrap(model) if WRAP else model",
            "net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)"))


COMPILED = """
net = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.2)
for step in range(5):
    opt.zero_grad()
    loss = ((net(X).squeeze(1) - y) ** 2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
"""


def test_compiled_model(two_engines, shell):
    ns = _fit(shell, "--return model", COMPILED)
    ref = _single_process(COMPILED.replace("torch.compile(model)", "model"))
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)


PLAIN = """
net = wrap(model) if WRAP else model
opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
for step in range(6):
    opt.zero_grad()
    ((net(X).squeeze(1) - y) ** 2).mean().backward()
    opt.step()
"""


def test_user_strategy_average_gradients_hook_zero_change_and_under_wrap(two_engines, shell):
    # the strategy halves the averaged gradient: SGD then moves as with half the learning rate
    ref = _single_process(PLAIN, WRAP=False, LR=0.15, MOMENTUM=0.9)
    for wrap in (False, True):
        setup = SETUP + f"from phalanx import wrap\nWRAP = {wrap}\nLR = 0.3\nMOMENTUM = 0.9\n"
        ns = _fit(shell, "--return model --sync loops_strategies.HalfStepAllreduce", PLAIN, setup)
        np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5,
                                   err_msg=f"wrap={wrap}")


def test_wrap_with_parameter_averaging_keeps_local_gradients(two_engines, shell):
    setup = SETUP + "from phalanx import wrap\nWRAP = True\nLR = 0.3\nMOMENTUM = 0.0\n"
    ns = _fit(shell, "--return model --sync localsgd --every 1", PLAIN, setup)
    ref = _single_process(PLAIN, WRAP=False, LR=0.3, MOMENTUM=0.0)  # plain SGD: the same thing
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)


GROWING = """
import phalanx.runtime.sync._grad_sync as _grad_sync
relisted, step = [], -1
_refresh, _layout = _grad_sync.GradientSync.refresh, _grad_sync.BucketLayout
def _counted_refresh(self):
    relisted.append(("refresh", step))
    _refresh(self)
def _counted_layout(*args, **kwargs):
    relisted.append(("layout", step))
    return _layout(*args, **kwargs)
_grad_sync.GradientSync.refresh, _grad_sync.BucketLayout = _counted_refresh, _counted_layout
try:
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(12)], torch.nn.Linear(6, 1))
    bias = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for step in range(20):
        if step == 10:
            opt.add_param_group({"params": [bias], "lr": 0.1})
        opt.zero_grad()
        out = net(X).squeeze(1) + (bias if step >= 10 else 0.0)
        ((out - y) ** 2).mean().backward()
        opt.step()
finally:
    _grad_sync.GradientSync.refresh, _grad_sync.BucketLayout = _refresh, _layout
"""


def test_steps_list_parameters_again_only_when_they_change(two_engines, shell):
    """A 26-parameter model trained 20 steps: the hooks list its parameters and lay out the
    gradient buckets again only at the steps where the optimizer's parameters changed (each
    listing is Python work per parameter: 115 us a step at 100 parameters), and train right."""
    ns = _fit(shell, "--return net,bias,relisted", GROWING)
    ref = _single_process(GROWING)
    np.testing.assert_allclose(_params(ns["net"]), _params(ref["net"]), atol=1e-5)
    np.testing.assert_allclose(ns["bias"].detach().numpy(), ref["bias"].detach().numpy(), atol=1e-5)
    steps = {kind: sorted({s for k, s in ns["relisted"] if k == kind}) for kind in ("refresh", "layout")}
    # before the first step (the optimizer joins), at it, and where add_param_group changed them
    assert set(steps["refresh"]) <= {-1, 0, 10} and 10 in steps["refresh"], steps
    assert set(steps["layout"]) <= {0, 10} and 10 in steps["layout"], steps


FOLDS = """
import phalanx.runtime.sync._grad_sync as _grad_sync
averaged, steps_after, models = [], [], []
_reduce = _grad_sync.GradientSync._reduce
def _counted(self, buckets):
    averaged.append(sum(len(b.params) for b in buckets))
    _reduce(self, buckets)
_grad_sync.GradientSync._reduce = _counted
try:
    torch.manual_seed(0)
    for fold in range(3):
        net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(6):
            opt.zero_grad()
            ((net(X).squeeze(1) - y) ** 2).mean().backward()
            opt.step()
        models.append(net)
        if world_size > 1:
            steps_after.append(__import__("phalanx").runtime.run._engine_state.current_run().steps)
finally:
    _grad_sync.GradientSync._reduce = _reduce
"""


@pytest.mark.parametrize("sync", ["allreduce", "localsgd"])
def test_models_trained_one_after_another_count_steps_and_average_only_the_current_one(
        two_engines, shell, sync):
    """k-fold in one cell: the run's steps go on counting through every fold (they stopped at
    the first model's, and localsgd then kept one step index), each model trains as in one
    process (allreduce), and a pass averages the model it trains, not every earlier one too."""
    ns = _fit(shell, f"--sync {sync} --return models,averaged,steps_after", FOLDS)
    assert ns["steps_after"] == [6, 12, 18]
    if sync == "allreduce":
        ref = _single_process(FOLDS)
        for got, want in zip(ns["models"], ref["models"]):
            np.testing.assert_allclose(_params(got), _params(want), atol=1e-5)
        assert ns["averaged"] == [4] * 18  # each pass: the current model's 4 parameters


CRITIC = """
from phalanx.runtime.run._engine_state import current_run
torch.manual_seed(0)
G, D = torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)
opt_g = torch.optim.SGD(G.parameters(), lr=0.01)
opt_d = torch.optim.SGD(D.parameters(), lr=0.01)  # made second, stepped three times as often
counted = []
for it in range(4):
    for _ in range(3):
        opt_d.zero_grad(); D(G(X[:, :4]).detach()).mean().backward(); opt_d.step()
    opt_g.zero_grad(); (-D(G(X[:, :4]))).mean().backward(); opt_g.step()
    counted.append(current_run().steps)
"""


def test_optimizers_made_before_the_loop_keep_the_first_ones_steps(two_engines, shell):
    ns = _fit(shell, "--return counted", CRITIC)
    assert ns["counted"] == [1, 2, 3, 4]  # the generator's steps, as before
