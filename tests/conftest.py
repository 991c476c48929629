"""Shared fixtures: a real IPython shell with phalanx loaded and real ipyparallel clusters.

Clusters are real (controller + engine processes); every fixture that starts one stops it in its
finalizer and checks that no engine process survives.
"""

from __future__ import annotations

import os
import signal

import pytest
from deadlines import hang_limit

# what the tests leave running fails the run, named; every test module starts from a clean
# notebook; --shuffle-modules SEED runs the modules in a shuffled order
pytest_plugins = ["leftover_processes", "notebook_shell", "module_order"]

# Ctrl-C raises KeyboardInterrupt here however pytest was started.  A shell that runs a command in
# the background (`make test &`, nohup, some CI runners) starts it with SIGINT ignored, and Python
# then installs no handler: the tests that interrupt a run (as a person does with the kernel's
# interrupt) would wait for a signal that never lands.  A handled signal is also reset to its
# default in every child at exec, so the servers and kernels the tests start take SIGINT too.
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items):
    """Modules with slow tests first (stable otherwise): the order of a serial run
    (``make test PYTEST_WORKERS=``).  ``make test``'s parallel workers do not follow it: xdist's
    ``loadfile`` hands modules out by their number of tests, most first, which keeps a heavy
    module beside light ones.  Handing them out in this order instead (``--no-loadscope-reorder``)
    was measured slower: 24.7 minutes idle against 19.8, two heavy modules contending at a time."""
    def has_slow(item) -> bool:
        return item.get_closest_marker("slow") is not None

    slow_modules = {item.module.__name__ for item in items if has_slow(item)}
    items.sort(key=lambda item: item.module.__name__ not in slow_modules)


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory):
    """One real ``jupyter lab`` for the browser test modules of this worker (browser_support's
    ``lab_server`` checks, module by module, that their kernels leave nothing running)."""
    from browser_support import running_lab

    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


def run_cell(shell, source: str):
    """Run a cell; re-raise what it raised so a test sees the error itself."""
    result = shell.run_cell(source, store_history=False)
    if result.error_before_exec is not None:
        raise result.error_before_exec
    if result.error_in_exec is not None:
        raise result.error_in_exec
    return result.result


def held_until(gate, body: str, limit_s: float = 300.0) -> str:
    """``body`` preceded by a wait for the file ``gate`` to exist (at most ``limit_s``).  A test
    that acts while a run is still going creates the file once it has acted, instead of betting
    that a number of steps outlasts its actions on a busy machine."""
    return (f"import os as _os, time as _time\n"
            f"_until = _time.monotonic() + {limit_s}\n"
            f"while not _os.path.exists({str(gate)!r}) and _time.monotonic() < _until:\n"
            f"    _time.sleep(0.02)\n" + body)


def engine_pids(session) -> list[int]:
    return [s.pid for s in session.cluster.slots() if s.pid]


def assert_all_gone(pids, timeout: float = hang_limit(10.0)) -> None:
    """Every pid has exited (zombies count as gone)."""
    from phalanx.cluster._procs import wait_gone

    alive = wait_gone(pids, timeout)
    assert not alive, f"processes still running: {[p.pid for p in alive]}"


@pytest.fixture(scope="module")
def cluster_session(shell):
    """The shell's session with a running 2-engine CPU cluster (stopped afterwards)."""
    from phalanx._session import session_for_shell

    session = session_for_shell(shell)
    if session.cluster.running:
        session.cluster.stop()
    session.start_cluster(n=2, gpus="none", timeout=hang_limit(60))
    yield session
    pids = engine_pids(session)
    session.stop_cluster()
    assert_all_gone(pids)


@pytest.fixture
def no_cluster(shell):
    """The shell's session with no cluster running, and none left running after the test."""
    from phalanx._session import session_for_shell

    session = session_for_shell(shell)
    if session.cluster.running:
        session.stop_cluster()
    yield session
    session.stop_cluster()


@pytest.fixture
def two_engines(cluster_session):
    """The module's cluster, brought back to 2 live engines before the test."""
    session = cluster_session
    if not session.cluster.running:
        session.start_cluster(n=2, gpus="none")
    if any(s.state == "dead" for s in session.cluster.slots()):
        session.restart()
    if session.cluster.size != 2:
        session.scale(2)
    return session


# Engines started by the tests import the package from this checkout and can unpickle functions
# defined in test modules.
_TESTS = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.join(os.path.dirname(_TESTS), "kernel_ext")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SRC, _TESTS, os.environ.get("PYTHONPATH")) if p)

# Every run is written to its notebook's run log (phalanx.runs()): the tests' runs go to a
# folder of this test process (removed at its exit), not to the person's Jupyter data folder.
if "PHALANX_RUNS_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["PHALANX_RUNS_DIR"] = tempfile.mkdtemp(prefix="phalanx-test-runs-")
    atexit.register(shutil.rmtree, os.environ["PHALANX_RUNS_DIR"], True)
