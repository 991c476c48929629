"""Adapters plug in: a library's adapter is one module, found by its entry point, that patches
through the run's ledger and contributes metric rows; nothing outside it is edited.  On a real
2-engine cluster: a stand-in library and its adapter installed as a distribution would be (an
entry point in the ``phalanx.adapters`` group), a run that uses the library, its rows in the
run's history, and the library as it was once the run ended."""

from __future__ import annotations

import pytest
from conftest import run_cell
from phalanx.runtime.run._patch_ledger import PatchLedger
from phalanx.wire._plugins import PluginError
from phalanx.runtime.adapters import Adapter, AdapterError, install_adapters, register

STANDIN_LIBRARY = '''
def train_step(x):
    """A stand-in library's training step."""
    return x * 2.0
'''

# the whole adapter: nothing else in phalanx names it
TOY_ADAPTER = '''
import phalanx
from phalanx.runtime.adapters import Adapter


def _install(run, namespace, shard):
    import standin_lib

    original = standin_lib.train_step

    def train_step(x):
        out = original(x)
        phalanx.log(doubled=float(out))  # the adapter's contribution: a metric row
        return out

    run.patches.set(standin_lib, "train_step", train_step, "standin_lib.train_step")


ADAPTER = Adapter("toy", "standin_lib.train_step", _install)
'''


def _distribution(root, name: str, *entry_points: str, group: str = "phalanx.adapters") -> None:
    """A module installed as a distribution with entry points (``name = module:object``) in
    one of phalanx's groups."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "\n".join(entry_points) + "\n")


@pytest.fixture
def toy_installed(tmp_path):
    (tmp_path / "standin_lib.py").write_text(STANDIN_LIBRARY)
    (tmp_path / "toy_adapter.py").write_text(TOY_ADAPTER)
    _distribution(tmp_path, "toy_adapter", "toy = toy_adapter:ADAPTER")
    return tmp_path


def test_an_adapter_installed_as_a_distribution_patches_its_library_for_the_run_only(
        shell, cluster_session, toy_installed):
    # fresh engines (this module's cluster), told where the distribution is before any run
    def add_path(path):
        import sys

        sys.path.insert(0, path)

    cluster_session.cluster.client[:].apply_sync(add_path, str(toy_installed))
    run_cell(shell, "%%distributed_fit -n 2\n"
                    "import standin_lib\n"
                    "for step in range(3):\n"
                    "    standin_lib.train_step(rank + step)\n")
    rows = cluster_session.last_run().history.rows()
    doubled = sorted((r["rank"], r["doubled"]) for r in rows if "doubled" in r)
    assert doubled == [(0, 0.0), (0, 2.0), (0, 4.0), (1, 2.0), (1, 4.0), (1, 6.0)]

    def after_run():
        import standin_lib

        from phalanx.runtime.adapters import registered

        return (standin_lib.train_step.__doc__, standin_lib.train_step(1.0),
                [a.name for a in registered()])

    for doc, value, names in cluster_session.cluster.client[:].apply_sync(after_run):
        assert doc == "A stand-in library's training step." and value == 2.0
        assert names[-1] == "toy" and "scikit-learn" in names and "xgboost" in names


def test_an_entry_point_that_is_not_an_adapter_is_named(tmp_path, monkeypatch):
    from phalanx.runtime import adapters

    (tmp_path / "not_an_adapter.py").write_text("ADAPTER = 'oops'\n")
    _distribution(tmp_path, "not_an_adapter", "broken = not_an_adapter:ADAPTER")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"entry point 'broken' of group 'phalanx.adapters' "
                                          r"names not_an_adapter:ADAPTER, which is not a "
                                          r"phalanx Adapter; fix or uninstall the package"):
        adapters.registered()


class _Run:
    def __init__(self) -> None:
        self.patches = PatchLedger()


def test_a_registered_adapter_runs_after_phalanx_own_and_one_that_raises_is_named(monkeypatch):
    from phalanx.runtime import adapters

    monkeypatch.setattr(adapters, "_added", [])
    monkeypatch.setattr(adapters, "_entry_point_adapters", list)
    assert [a.name for a in adapters.registered()] == [
        "scikit-learn", "framework logs", "double split", "xgboost", "lightgbm"]
    monkeypatch.setattr(adapters, "_BUILTIN", ())  # this pretend run has none of their state
    undone: list[str] = []
    register(Adapter("mine", "my library's step", lambda run, ns, shard: lambda: undone.append("mine")))
    assert [a.name for a in adapters.registered()] == ["mine"]
    run = _Run()
    install_adapters(run, {}, ())
    assert run.patches.undo_all() == [] and undone == ["mine"]

    def broken(run, namespace, shard):
        raise ImportError("mylib 0.1 is too old")

    register(Adapter("mine", "my library's step", broken))  # replaces the first by name
    with pytest.raises(AdapterError, match=r"the 'mine' adapter could not be installed: "
                                           r"ImportError: mylib 0.1 is too old; fix or "
                                           r"uninstall the package that provides it"):
        install_adapters(_Run(), {}, ())
    with pytest.raises(TypeError, match="register\\(\\) takes a phalanx Adapter, not function"):
        register(broken)  # type: ignore[arg-type]
