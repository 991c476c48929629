"""Other packages add sync strategies and launchers by entry points, with no edit to phalanx:
a toy of each, installed as a distribution would be, used by name on a real cluster
(``--sync halfway``, ``%cluster start --launcher marked``); a typo's suggestion includes them,
and one that names the wrong kind of object is refused saying which package to fix."""

from __future__ import annotations

import pytest
from conftest import run_cell
from deadlines import hang_limit
from phalanx.cluster import ClusterError
from test_adapters import _distribution

TOY_STRATEGY = '''
import phalanx
from phalanx import SyncStrategy, param_values


class Halfway(SyncStrategy):
    """Averages the parameters after every step, and says so in a metric row."""

    def after_step(self, params, step):
        self.comm.allreduce(param_values(params), op="mean")
        phalanx.log(halfway=1.0)
'''

TOY_LAUNCHER = '''
from phalanx.cluster import Launcher


class Marked(Launcher):
    """The local launcher, whose engines carry a mark in their environment."""

    name = "marked"

    def engine_kwargs(self, set_id, count, environment, hosts=None):
        kwargs = super().engine_kwargs(set_id, count, environment, hosts)
        kwargs["environment"] = {**kwargs["environment"], "TOY_LAUNCHER": "marked"}
        return kwargs
'''


@pytest.fixture
def toys(tmp_path, monkeypatch):
    (tmp_path / "toy_sync.py").write_text(TOY_STRATEGY)
    (tmp_path / "toy_launcher.py").write_text(TOY_LAUNCHER)
    (tmp_path / "not_a_launcher.py").write_text("class Nothing:\n    pass\n")
    _distribution(tmp_path, "toy_sync", "halfway = toy_sync:Halfway", group="phalanx.strategies")
    _distribution(tmp_path, "toy_launcher", "marked = toy_launcher:Marked",
                  "broken = not_a_launcher:Nothing", group="phalanx.launchers")
    monkeypatch.syspath_prepend(str(tmp_path))  # the kernel's side finds the names here
    return tmp_path


def test_an_installed_strategy_is_a_sync_name_on_the_engines(shell, cluster_session, toys):
    def add_path(path):
        import sys

        sys.path.insert(0, path)

    cluster_session.cluster.client[:].apply_sync(add_path, str(toys))
    run_cell(shell, "import torch\n"
                    "torch.manual_seed(0)\n"
                    "net = torch.nn.Linear(3, 1)")
    run_cell(shell, "%%distributed_fit -n 2 --sync halfway --return net\n"
                    "import torch\n"
                    "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
                    "torch.manual_seed(rank)\n"
                    "for step in range(3):\n"
                    "    opt.zero_grad()\n"
                    "    net(torch.randn(4, 3)).pow(2).mean().backward()\n"
                    "    opt.step()\n")
    record = cluster_session.last_run()
    assert record.status == "done"
    marks = sorted((r["rank"], r["step"]) for r in record.history.rows() if "halfway" in r)
    assert marks == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]  # after each step
    with pytest.raises(Exception, match=r"did you mean 'halfway'"):
        run_cell(shell, "%%distributed_fit -n 2 --sync halfwya\npass\n")


def test_an_installed_launcher_starts_engines_and_a_wrong_one_is_refused(no_cluster, toys):
    session = no_cluster
    session.start_cluster(n=1, gpus="none", launcher="marked", timeout=hang_limit(60))
    assert session.launcher == "marked"
    marks = session.cluster.client[:].apply_sync(lambda: __import__("os").environ.get("TOY_LAUNCHER"))
    assert marks == ["marked"]
    session.stop_cluster()
    with pytest.raises(ClusterError, match=r"launcher 'broken': entry point 'broken' of group "
                                           r"'phalanx.launchers' names not_a_launcher:Nothing, "
                                           r"which is not a Launcher subclass"):
        session.start_cluster(n=1, gpus="none", launcher="broken", timeout=hang_limit(60))
    with pytest.raises(ClusterError, match=r"unknown launcher 'kubernetes': choose one of "
                                           r"local, mpi, ssh, slurm, pbs, lsf, broken, marked"):
        session.start_cluster(n=1, gpus="none", launcher="kubernetes", timeout=hang_limit(60))


def test_the_kernel_and_the_engines_know_the_same_built_in_strategies():
    """The kernel checks --sync against names it knows without importing the classes (no
    numpy); the engines build the classes: one list each, held together here."""
    from phalanx.wire._options import STRATEGIES as names
    from phalanx.runtime.sync._strategies import STRATEGIES as classes

    assert tuple(classes) == names
