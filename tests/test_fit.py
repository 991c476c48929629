"""%%distributed_fit on a real 2-engine cluster with real torch.distributed and shared memory."""

from __future__ import annotations

import io
import sys
import threading
import time

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError

from conftest import held_until, run_cell
from test_reliability_helpers import wait_for
from deadlines import hang_limit

pytestmark = pytest.mark.cluster

SETUP = """
import torch, numpy as np
from phalanx import log, allreduce, wrap
torch.manual_seed(0)
X = torch.randn(64, 5)
y = X @ torch.arange(1.0, 6.0) + 0.3
model = torch.nn.Linear(5, 1)
"""

LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(STEPS):
    opt.zero_grad()
    loss = ((model(X).squeeze(1) - y) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
"""


def _reference(shell, steps: int) -> torch.nn.Module:
    """The same loop, single process, full batch."""
    ns = shell.user_ns
    model = torch.nn.Linear(5, 1)
    model.load_state_dict(ns["model"].state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        ((model(ns["X"]).squeeze(1) - ns["y"]) ** 2).mean().backward()
        opt.step()
    return model


def _params(model) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


@pytest.fixture
def fit(two_engines, shell):
    run_cell(shell, SETUP + "STEPS = 12\n")
    return two_engines


def test_allreduce_matches_single_process_full_batch(fit, shell):
    run_cell(shell, "%%distributed_fit --shard X,y --return model --seed 3\n" + LOOP.replace("model(", "model("))
    trained = shell.user_ns["model"]
    run_cell(shell, SETUP)  # the original model again, for the reference
    reference = _reference(shell, 12)
    np.testing.assert_allclose(_params(trained), _params(reference), atol=1e-5)
    record = fit.last_run()
    assert record.status == "done" and record.steps == {0: 12, 1: 12}
    # the fit mode's count: every rank holds the whole Linear(5, 1) and its gradients (fp32)
    assert record.held == {r: {"parameters": 24, "gradients": 24, "optimizer_state": 0}
                           for r in (0, 1)}
    rows = record.history.rows()
    assert sorted({(r["rank"], r["step"]) for r in rows}) == [(r, s) for r in (0, 1) for s in range(1, 13)]


def test_ddp_wrap_matches_single_process_full_batch(fit, shell):
    body = LOOP.replace("opt = torch.optim.SGD(model.parameters(), lr=0.05)",
                        "net = wrap(model)\nopt = torch.optim.SGD(net.parameters(), lr=0.05)")
    body = body.replace("model(X)", "net(X)")
    run_cell(shell, "%%distributed_fit --shard X,y --return model\n" + body)
    trained = shell.user_ns["model"]
    assert isinstance(trained, torch.nn.Linear)
    run_cell(shell, SETUP)
    np.testing.assert_allclose(_params(trained), _params(_reference(shell, 12)), atol=1e-5)


def test_localsgd_every_step_equals_allreduce_for_plain_sgd(fit, shell):
    run_cell(shell, "%%distributed_fit --shard X,y --return model --sync allreduce\n" + LOOP)
    by_allreduce = _params(shell.user_ns["model"])
    run_cell(shell, SETUP + "STEPS = 12\n")
    run_cell(shell, "%%distributed_fit --shard X,y --return model --sync localsgd --every 1\n" + LOOP)
    np.testing.assert_allclose(_params(shell.user_ns["model"]), by_allreduce, atol=1e-5)


def test_easgd_converges_on_a_convex_problem(fit, shell):
    run_cell(shell, SETUP + "STEPS = 150\n")
    run_cell(shell, "%%distributed_fit --shard X,y --return model --sync easgd --every 4 --alpha 0.3\n" + LOOP)
    model = shell.user_ns["model"]
    with torch.no_grad():
        mse = ((model(shell.user_ns["X"]).squeeze(1) - shell.user_ns["y"]) ** 2).mean().item()
    assert mse < 0.05, mse


def test_sklearn_partial_fit_averaging_is_close_to_single_process(two_engines, shell):
    run_cell(shell, """
from sklearn.datasets import load_digits
from sklearn.linear_model import SGDClassifier
from sklearn.preprocessing import StandardScaler
digits = load_digits()
Xd = StandardScaler().fit_transform(digits.data)
order = np.random.RandomState(0).permutation(len(Xd))
Xd, yd = Xd[order], digits.target[order]
Xtr, ytr, Xte, yte = Xd[:1400], yd[:1400], Xd[1400:], yd[1400:]
clf = SGDClassifier(loss="log_loss", alpha=1e-3, random_state=0)
single = SGDClassifier(loss="log_loss", alpha=1e-3, random_state=0)
for epoch in range(5):
    for i in range(0, len(Xtr), 100):
        single.partial_fit(Xtr[i:i + 100], ytr[i:i + 100], classes=np.arange(10))
""")
    run_cell(shell, """%%distributed_fit --shard Xtr,ytr --return clf --seed 0
for epoch in range(5):
    for i in range(0, len(Xtr), 50):
        clf.partial_fit(Xtr[i:i + 50], ytr[i:i + 50], classes=np.arange(10))
""")
    ns = shell.user_ns
    distributed = ns["clf"].score(ns["Xte"], ns["yte"])
    single = ns["single"].score(ns["Xte"], ns["yte"])
    assert distributed >= single - 0.02, (distributed, single)
    assert "partial_fit" not in vars(ns["clf"])  # the returned estimator is a plain estimator
    assert two_engines.last_run().steps[0] == 5 * 14


def test_warm_reuse_keeps_the_process_group_and_scaling_reforms_it(fit, shell):
    probe = """%%distributed_fit --return group_id,ws
from phalanx.runtime.run._engine_state import engine_state
group_id, ws = id(engine_state().group), world_size
"""
    run_cell(shell, probe)
    first = shell.user_ns["group_id"]
    started = time.perf_counter()
    run_cell(shell, probe)
    warm = time.perf_counter() - started
    assert shell.user_ns["group_id"] == first, "a warm re-run formed a new group"
    assert warm < 2.0
    run_cell(shell, "%cluster scale 3")
    run_cell(shell, probe)
    assert shell.user_ns["ws"] == 3
    run_cell(shell, "%cluster scale 2")


def test_seeded_runs_repeat_the_same_history(fit, shell):
    body = """%%distributed_fit --seed 7
net = torch.nn.Linear(5, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad(); loss = ((net(torch.randn(8, 5)) - 1) ** 2).mean(); loss.backward(); opt.step()
    log(loss=loss.item())
"""
    run_cell(shell, body)
    first = [(r["rank"], r["step"], r["loss"]) for r in fit.last_run().history.rows()]
    run_cell(shell, body)
    second = [(r["rank"], r["step"], r["loss"]) for r in fit.last_run().history.rows()]
    assert sorted(first) == sorted(second) and len(first) == 10


def test_each_rank_receives_only_its_shard(fit, shell):
    run_cell(shell, "big = np.arange(101 * 3).reshape(101, 3)\n")
    run_cell(shell, "%%distributed_fit --shard big\nlog(rows=len(big), first=float(big[0, 0]))\n")
    rows = {r["rank"]: r for r in fit.last_run().history.rows()}
    assert rows[0]["rows"] == 50 and rows[1]["rows"] == 51
    assert rows[0]["first"] == 0 and rows[1]["first"] == 150


def test_collectives_on_tensors_arrays_and_dicts(fit, shell):
    run_cell(shell, """%%distributed_fit --return t,a,d,m
t = allreduce(torch.full((3,), float(rank + 1)), op="sum")
a = allreduce(np.full(2, rank + 1.0), op="max")
d = allreduce({"correct": 10.0 * (rank + 1), "seen": 20.0}, op="sum")
m = allreduce(rank + 1, op="mean")
""")
    ns = shell.user_ns
    assert ns["t"].tolist() == [3.0, 3.0, 3.0]
    assert ns["a"].tolist() == [2.0, 2.0]
    assert ns["d"] == {"correct": 30.0, "seen": 40.0}
    assert ns["m"] == 1.5


def test_notebook_defined_class_round_trips_as_the_same_class(fit, shell):
    run_cell(shell, """
class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 1)
    def forward(self, x):
        return self.lin(x)
tiny = TinyNet()
""")
    run_cell(shell, "%%distributed_fit --shard X,y --return tiny\n" + LOOP.replace("model", "tiny"))
    assert type(shell.user_ns["tiny"]) is shell.user_ns["TinyNet"]


def test_non_numeric_metric_warns_and_keeps_the_row(fit, shell):
    from phalanx.fit import MetricWarning

    with pytest.warns(MetricWarning, match="metric 'vec' on rank"):
        run_cell(shell, "%%distributed_fit\nlog(ok=1.0, vec=torch.ones(3), name='x')\n")
    rows = fit.last_run().history.rows()
    assert len(rows) == 2 and all(r["ok"] == 1.0 and "vec" not in r for r in rows)


# --- faults: one clear error naming the rank; the engines run the next cell -----------------

def _assert_next_run_works(shell, session):
    run_cell(shell, "%%distributed_fit --return total\ntotal = allreduce(1.0, op='sum')\n")
    assert shell.user_ns["total"] == 2.0
    assert session.last_run().status == "done"


def test_exception_on_one_rank_names_it_and_releases_the_others(fit, shell):
    from phalanx.fit import DistributedFitError

    started = time.monotonic()
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, """%%distributed_fit
for step in range(3):
    allreduce(np.ones(4))
if rank == 1:
    raise ValueError("bad batch on the second rank")
allreduce(np.ones(4))   # rank 0 waits here for a partner that never comes
""")
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "rank 1" in message and "ValueError: bad batch on the second rank" in message
    assert "host" in message and info.value.rank == 1
    assert fit.last_run().failed_rank == 1   # the views redden this rank only
    assert elapsed < hang_limit(10), elapsed
    _assert_next_run_works(shell, fit)


def test_engine_dying_mid_run_is_reported_within_seconds(fit, shell):
    from phalanx.fit import DistributedFitError

    started = time.monotonic()
    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, """%%distributed_fit
import os, signal
for step in range(1000):
    allreduce(np.ones(4))
    if rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
""")
    assert time.monotonic() - started < hang_limit(10)  # not the 60 s collective timeout
    assert "rank 1" in str(info.value) and "died" in str(info.value)
    run_cell(shell, "%cluster restart 1")
    _assert_next_run_works(shell, fit)


def test_timeout_stops_the_run_with_each_ranks_last_step(fit, shell):
    from phalanx.fit import DistributedFitError

    started = time.monotonic()
    with pytest.raises(DistributedFitError, match="passed --timeout 2 s") as info:
        run_cell(shell, "%%distributed_fit --timeout 2\nwhile True:\n    allreduce(np.ones(2))\n")
    assert time.monotonic() - started < hang_limit(8)
    assert "rank 0:" in str(info.value) and "rank 1:" in str(info.value)
    _assert_next_run_works(shell, fit)


def test_kernel_interrupt_stops_every_rank(fit, shell):
    import os
    import signal
    import threading

    from phalanx.fit import DistributedFitError

    # Interrupt once both ranks are inside the loop (a condition, not a delay that assumes an
    # idle machine): the SIGINT reaches the kernel while it waits for the engines.
    def both_ranks_in_the_loop() -> bool:
        tracker = fit.fits.active
        return tracker is not None and {r["rank"] for r in tracker.history.rows()} == {0, 1}

    def interrupt_when_training():
        try:
            wait_for(both_ranks_in_the_loop, 120, what="both ranks in the loop")
        except AssertionError as exc:
            watch["error"] = exc  # interrupt anyway: the engines must not be left looping
        watch["t"] = time.time()
        os.kill(os.getpid(), signal.SIGINT)

    watch: dict = {}
    thread = threading.Thread(target=interrupt_when_training, daemon=True)
    thread.start()
    with pytest.raises(DistributedFitError, match="interrupted"):
        run_cell(shell, "%%distributed_fit\nimport time\nfrom phalanx import log\n"
                        "log(started=1.0)\nwhile True:\n    time.sleep(0.01)\n")
    thread.join(timeout=hang_limit(10))
    assert "t" in watch and "error" not in watch, f"no metric row from both ranks: {watch}"
    stopped_after = time.time() - watch["t"]
    print(f"every rank stopped {stopped_after:.2f} s after the interrupt")
    assert stopped_after < 30  # far below the collective timeout: the ranks were not waited out
    assert all(r["state"] == "idle" for r in fit.status().rows)
    _assert_next_run_works(shell, fit)


def test_what_ranks_print_reaches_the_cell_while_the_run_goes_on(fit, shell, monkeypatch, tmp_path):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    gate, run_over, seen_during_run = tmp_path / "printed", threading.Event(), threading.Event()

    def open_gate_once_printed():
        wait_for(lambda: all(f"[rank {r}] hello from {r}\n" in out.getvalue() for r in (0, 1)),
                 timeout=hang_limit(120), what="both ranks' first line in the cell")
        if not run_over.is_set():
            seen_during_run.set()
        gate.touch()

    watcher = threading.Thread(target=open_gate_once_printed, daemon=True)
    watcher.start()
    try:  # each rank prints a line, waits for the test to see it, then ends without a newline
        run_cell(shell, "%%distributed_fit --no-widget\nprint(f'hello from {rank}')\n"
                 + held_until(gate, "print(f'last words {rank}', end='')\n", limit_s=60))
    finally:
        run_over.set()
        watcher.join(timeout=hang_limit(130))
    assert seen_during_run.is_set(), "the ranks' output arrived only once the run was over"
    assert "[rank 0] last words 0\n" in out.getvalue() and "[rank 1] last words 1\n" in out.getvalue()


def test_changed_objects_travel_with_the_run_and_unused_ones_stay_within_the_budget(
        fit, shell, monkeypatch):
    from phalanx.fit.run import _engine_cache
    from phalanx.runtime.run._entry import cached_hashes

    client = fit.cluster.client
    run_cell(shell, "scale = 2.0\nbig = list(range(10_000))\n")
    run_cell(shell, "%%distributed_fit\nassert scale == 2.0 and len(big) == 10_000\n")
    held = client[:].apply_sync(cached_hashes)
    assert all({"scale", "big"} <= set(h) for h in held)  # earlier tests' objects may stay too

    run_cell(shell, "scale = 3.0\n")
    tasks_before = len(client.history)
    run_cell(shell, "%%distributed_fit\nassert scale == 3.0\n")
    assert len(client.history) - tasks_before == 2  # one task per engine: the new value rode along
    now = client[:].apply_sync(cached_hashes)
    # big, unused by this run, stays for the next cell that reads it (it fits the budget)
    assert all(h["scale"] != old["scale"] and h["big"] == old["big"] for h, old in zip(now, held))

    monkeypatch.setattr(_engine_cache, "KEEP_BYTES", 0)  # no room for earlier runs' objects
    run_cell(shell, "%%distributed_fit\nassert scale == 3.0\n")
    assert all(set(h) == {"scale"} for h in client[:].apply_sync(cached_hashes))


def test_cells_taking_turns_send_their_large_objects_once(fit, shell):
    """A training cell and an evaluation cell run in turn: after the first round, neither's
    model nor data is sent again (each engine keeps both within its budget)."""
    client = fit.cluster.client
    run_cell(shell, "import numpy as np\nW = np.ones(200_000)\nV = np.zeros(200_000)\n")
    cells = ["%%distributed_fit\nassert W.sum() == 200_000\n",
             "%%distributed_fit\nassert V.sum() == 0\n"]
    def held():  # each engine's cached bytes of W and V, by identity: a resend replaces them
        from phalanx.runtime.run._engine_state import engine_state

        cache = engine_state().cache
        return [id(cache[n][1]) if n in cache else None for n in ("W", "V")]

    for cell in cells:
        run_cell(shell, cell)
    first = client[:].apply_sync(held)
    assert all(None not in h for h in first)
    for _ in range(2):
        for cell in cells:
            run_cell(shell, cell)
            assert client[:].apply_sync(held) == first


def test_unchanged_shards_stay_on_the_engines_and_changed_ones_travel(fit, shell):
    """A re-run with the same --shard data sends none of it again (each engine keeps its own
    part); changed data travels with the run and the cell sees it."""
    client = fit.cluster.client

    def kept_part():
        from phalanx.runtime.run._engine_state import engine_state

        entry = engine_state().cache.get("--shard X")
        return (entry[0], id(entry[1])) if entry else None

    run_cell(shell, "import numpy as np\nX = np.arange(40.0).reshape(20, 2)\n")
    body = ("%%distributed_fit --shard X --return seen\nfrom phalanx import allreduce\n"
            "seen = allreduce(float(X.sum()), op='sum')\n")
    run_cell(shell, body)
    first = client[:].apply_sync(kept_part)
    assert all(first) and first[0][0] != first[1][0]  # each rank holds its own part
    run_cell(shell, body)
    assert client[:].apply_sync(kept_part) == first  # the very bytes of the first run: not sent
    assert shell.user_ns["seen"] == float(np.arange(40.0).sum())

    run_cell(shell, "X = X * 2\n")
    run_cell(shell, body)
    changed = client[:].apply_sync(kept_part)
    assert all(c[0] != f[0] for c, f in zip(changed, first))
    assert shell.user_ns["seen"] == 2 * float(np.arange(40.0).sum())
    run_cell(shell, "%%distributed_fit\npass\n")
    assert client[:].apply_sync(kept_part) == changed  # kept for the next run that reads it


def test_back_to_back_runs_each_get_all_their_rows_over_one_metrics_thread(fit, shell):
    for run in range(4):  # the engines keep their sender's thread and socket between runs
        run_cell(shell, "%%distributed_fit --no-widget\n"
                        f"for i in range(40):\n    log(value={run} * 100 + i + rank / 10)\n")
        rows = fit.last_run().history.rows()
        for rank in (0, 1):
            got = sorted(r["value"] for r in rows if r["rank"] == rank)
            assert got == [run * 100 + i + rank / 10 for i in range(40)], (run, rank, got)
    names = fit.cluster.client[:].apply_sync(
        lambda: [t.name for t in __import__("threading").enumerate()])
    assert all(n.count("phalanx-metrics") <= 1 for n in names), names  # not one per run


def test_unpicklable_object_is_refused_naming_its_path(fit, shell):
    from phalanx.fit import ShippingError

    run_cell(shell, "import threading\nclass Holder:\n    pass\nholder = Holder()\nholder.inner = {'lock': threading.Lock()}\n")
    with pytest.raises(UsageError, match=r"cannot send holder\.inner\['lock'\]"):
        run_cell(shell, "%%distributed_fit\nprint(holder)\n")
    assert ShippingError  # the magic shows ShippingError as a one-line usage error


def test_unknown_name_is_a_one_line_usage_error_before_dispatch(fit, shell):
    # In the cell a UsageError, the one type IPython shows without a traceback; Python callers
    # of the session still get a NameError (tests/test_usage_errors.py).
    with pytest.raises(UsageError, match="'no_such_thing'"):
        run_cell(shell, "%%distributed_fit\nprint(no_such_thing)\n")


@pytest.mark.parametrize("flags, message", [
    ("--sync turbo", "unknown --sync 'turbo'"),
    ("--every 0", "--every must be a whole number of at least 1"),
    ("-n 5", "more ranks than the 2 engine"),
    ("--shard seven", "--shard seven: a int has no rows"),
    ("--backend nccl", "--backend nccl needs a GPU"),
    ("--backend mpi", "--backend mpi needs engines started together under MPI"),
    ("--alpha 2", "--alpha must be in"),
])
def test_bad_flags_send_nothing(fit, shell, flags, message):
    run_cell(shell, "seven = 7\n")
    with pytest.raises(UsageError, match=message):
        run_cell(shell, f"%%distributed_fit {flags}\nprint(seven)\n")


def test_large_objects_get_a_warning_naming_them(fit, shell, monkeypatch):
    from phalanx.fit import ShippingWarning
    from phalanx.fit.analysis import _shipping

    monkeypatch.setattr(_shipping, "LARGE_OBJECT_BYTES", 10_000)
    run_cell(shell, "weights = np.zeros(100_000)\n")
    with pytest.warns(ShippingWarning, match="sending weights"):
        run_cell(shell, "%%distributed_fit\nprint(weights.shape)\n")


def test_engines_on_one_host_share_its_cores(two_engines, shell):
    """Torch's thread pools of the engines on a host split its cores (they would oversubscribe
    them and spin against each other); a cell may still set its own."""
    import os

    cores = len(os.sched_getaffinity(0))
    run_cell(shell, "%%distributed_fit --no-widget --return threads\n"
                    "import torch\nfrom phalanx import allreduce\nthreads = allreduce(torch.tensor([torch.get_num_threads()]), op='max').item()\n")
    assert shell.user_ns["threads"] == max(1, cores // 2)
    run_cell(shell, "%%distributed_fit --no-widget -n 1 --return threads\n"
                    "import torch\nthreads = torch.get_num_threads()\n")
    assert shell.user_ns["threads"] == cores  # one rank on this host: all of them
    run_cell(shell, "%%distributed_fit --no-widget --return threads\n"
                    "import torch\ntorch.set_num_threads(3)\nthreads = torch.get_num_threads()\n")
    assert shell.user_ns["threads"] == 3
