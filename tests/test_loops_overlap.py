"""Gradient averaging that overlaps the backward pass, on 2 CPU ranks of a real cluster.

With ``--bucket-mb`` tiny every parameter has a bucket of its own, and ``--overlap on`` hands
them to the gradient thread while backward still runs (on one host ``auto`` does not): the loops
of ``test_loops`` must give the same parameters as one process on the full data, and the
averaging must really start before the backward pass has finished.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cell
from test_loops import (BRANCHES, CLIPPED, GAN, SETUP, UNEVEN, UNEVEN_SETUP, _fit, _params,
                        _single_process, _uneven_reference)

pytestmark = pytest.mark.cluster

TINY = "--bucket-mb 0.00001 --overlap on"  # 10 bytes: one parameter per bucket, handed over


def test_clipping_is_exact_with_a_bucket_per_parameter(two_engines, shell):
    ns = _fit(shell, f"{TINY} --return model,norms", CLIPPED)
    ref = _single_process(CLIPPED)
    np.testing.assert_allclose(ns["norms"], ref["norms"], rtol=1e-5)
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)


def test_branches_frozen_layers_and_two_optimizers_with_a_bucket_per_parameter(two_engines, shell):
    ns = _fit(shell, f"{TINY} --return trunk,heads,never_grad --collective-timeout 20", BRANCHES)
    ref = _single_process(BRANCHES)
    assert ns["never_grad"] is None
    for name in ("trunk", "heads"):
        np.testing.assert_allclose(_params(ns[name]), _params(ref[name]), atol=1e-5)
    setup = "import torch\ntorch.manual_seed(5)\nX = torch.randn(64, 6) + 1.0\nZ = torch.randn(64, 4)\n"
    run_cell(shell, setup)
    run_cell(shell, f"%%distributed_fit --no-widget {TINY} --shard X,Z --return G,D\n" + GAN)
    ref = _single_process(GAN, setup)
    for name in ("G", "D"):
        np.testing.assert_allclose(_params(shell.user_ns[name]), _params(ref[name]), atol=1e-5)


def test_uneven_shards_join_with_a_bucket_per_parameter(two_engines, shell):
    ns = _fit(shell, f"{TINY} --return model --collective-timeout 20", UNEVEN, UNEVEN_SETUP)
    assert two_engines.last_run().steps == {0: 5, 1: 6}
    np.testing.assert_allclose(_params(ns["model"]), _params(_uneven_reference()), atol=1e-5)


# A hook on the first layer's output runs once the last layer's gradients are in, before the
# first layer's own: it waits there until the last layer's weight (2 KB, far more than the
# small control message each pass starts with) has gone out.  Only averaging that overlaps the
# backward pass sends it by then.
WIDE = SETUP.replace("torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)",
                     "torch.nn.Linear(6, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1)")
OVERLAP = """
import time
from phalanx import bytes_sent
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = []

def wait_for_bytes(grad):
    deadline = time.monotonic() + PATIENCE
    while bytes_sent() - sent_before_backward < 2048 and time.monotonic() < deadline:
        time.sleep(0.001)
    seen.append(bytes_sent() - sent_before_backward >= 2048)

for step in range(3):
    opt.zero_grad()
    h = model[0](X)
    h.register_hook(wait_for_bytes)
    loss = ((model[2](model[1](h)).squeeze(1) - y) ** 2).mean()
    sent_before_backward = bytes_sent()
    loss.backward()
    opt.step()
"""


def test_averaging_starts_while_backward_still_runs(two_engines, shell):
    assert "512" in WIDE
    ns = _fit(shell, f"{TINY} --return seen,model", OVERLAP, WIDE + "PATIENCE = 10\n")
    assert ns["seen"] == [True, True, True]
    ref = _single_process(OVERLAP.replace("from phalanx import bytes_sent", "bytes_sent = int"),
                          WIDE + "PATIENCE = 0\n")
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)
    # on one host --overlap auto keeps every bucket for the end of the pass: nothing but the
    # control message goes out before, so the hand-over is what the first run measured
    ns = _fit(shell, "--bucket-mb 0.00001 --return seen --collective-timeout 30", OVERLAP,
              WIDE + "PATIENCE = 0.3\n")
    assert ns["seen"] == [False, False, False]


# backward() raises on both ranks after its first gradients were averaged; the loop goes on
ABANDONED = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    h = model[0](X)
    if step == 1:
        h.register_hook(lambda grad: 1 / 0)
    loss = ((model[2](model[1](h)).squeeze(1) - y) ** 2).mean()
    try:
        loss.backward()
    except ZeroDivisionError:
        continue
    opt.step()
"""


def test_a_backward_that_raised_mid_averaging_ends_the_run_with_what_to_do(two_engines, shell):
    from phalanx.fit import DistributedFitError

    run_cell(shell, SETUP)
    with pytest.raises(DistributedFitError, match="raised after phalanx had begun averaging"):
        run_cell(shell, f"%%distributed_fit --no-widget {TINY} --shard X,y "
                        "--collective-timeout 20\n" + ABANDONED)
    ns = _fit(shell, f"{TINY} --return model", CLIPPED)  # the engines train again at once
    np.testing.assert_allclose(_params(ns["model"]), _params(_single_process(CLIPPED)["model"]),
                               atol=1e-5)


def test_bucket_size_and_overlap_flags_are_checked(two_engines, shell):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--bucket-mb must be a positive size"):
        run_cell(shell, "%%distributed_fit --bucket-mb 0\nx = 1\n")
    with pytest.raises(UsageError, match="unknown --overlap 'yes': use auto"):
        run_cell(shell, "%%distributed_fit --overlap yes\nx = 1\n")


BEFORE_WRAP = """
from phalanx import wrap
opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
net = wrap(model)  # after its optimizer: DDP averages, phalanx's own hooks stand aside
for step in range(6):
    opt.zero_grad()
    ((net(X).squeeze(1) - y) ** 2).mean().backward()
    opt.step()
"""


def test_an_optimizer_made_before_wrap(two_engines, shell):
    ns = _fit(shell, f"{TINY} --return model", BEFORE_WRAP)
    ref = _single_process(BEFORE_WRAP.replace("from phalanx import wrap", "wrap = lambda m: m"))
    np.testing.assert_allclose(_params(ns["model"]), _params(ref["model"]), atol=1e-5)
