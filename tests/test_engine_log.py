"""What a cluster's processes say that is not the user's goes to the cluster's log file, not to
the kernel's terminal, and ipyparallel's own JupyterLab listing does not see phalanx's clusters.

A real kernel (its standard error captured, as the terminal of ``make lab`` is) starts a real
cluster; an engine logs an error outside any cell's output (as ipyparallel's engine does) and
the cluster is stopped by signal, which made every engine print a tornado traceback.
"""

from __future__ import annotations

import os

import pytest
from deadlines import hang_limit
from kernel_support import kernel_manager

pytestmark = [pytest.mark.cluster]

NOISE = "Event loop stopped before Future completed (engine noise of test_engine_log)"
ENGINE_NOISE = f"""
from phalanx import get_session

def noise():
    from ipyparallel.engine.app import IPEngine
    IPEngine.instance().log.error({NOISE!r})

get_session().cluster.view().apply_sync(noise)
manager = get_session().cluster
print("LOG", manager.log_file)
print("PROFILE", manager.state.cluster.profile_dir)
print("ID", manager.state.cluster.cluster_id)
"""
LISTED = """
from ipyparallel.cluster import ClusterManager
listed = ClusterManager().load_clusters(profile_dir=manager.state.cluster.profile_dir,
                                        init_default_clusters=False)
print("LISTED", sorted(listed))
"""


def _run(client, code: str) -> str:
    out: list[str] = []
    reply = client.execute_interactive(
        code, timeout=hang_limit(120),
        output_hook=lambda m: out.append(m["content"].get("text", "")
                                         if m["msg_type"] == "stream" else ""))
    assert reply["content"]["status"] == "ok", ("".join(out), reply["content"])
    return "".join(out)


def _value(text: str, key: str) -> str:
    return next(line.split(" ", 1)[1] for line in text.splitlines() if line.startswith(key + " "))


@pytest.mark.slow
def test_engine_noise_goes_to_the_cluster_log_not_the_terminal(tmp_path):
    terminal = tmp_path / "kernel-terminal.txt"
    km = kernel_manager()
    with open(terminal, "wb") as sink:
        km.start_kernel(env=dict(os.environ), cwd=str(tmp_path), stdout=sink, stderr=sink)
    client = km.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=hang_limit(60))
        _run(client, "%load_ext phalanx\n%cluster start -n 2 --gpus none")
        said = _run(client, ENGINE_NOISE)
        log_file, profile, cluster_id = (_value(said, k) for k in ("LOG", "PROFILE", "ID"))
        # ipyparallel's sidebar (its server's ClusterManager) does not list the running cluster
        listed = _value(_run(client, LISTED), "LISTED")
        assert cluster_id not in listed, listed
        assert not os.path.exists(os.path.join(profile, "security", f"cluster-{cluster_id}.json"))
        # the cell still runs on the engines, and they stop by signal
        _run(client, "%%distributed_fit --no-widget\nx = 1 + 1\n")
        assert "cluster stopped" in _run(client, "%cluster stop")
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=False)
        km.cleanup_resources()
    kept = open(log_file).read()
    assert NOISE in kept, kept[-2000:]
    assert kept.count("stopped (exit code") >= 3, kept[-2000:]  # two engine sets, a controller
    assert "Traceback" not in kept, kept  # a stop by signal is said in one line, no traceback
    said_there = terminal.read_text(errors="replace")
    assert NOISE not in said_there and "Event loop stopped" not in said_there, said_there
    assert "Traceback" not in said_there, said_there


def test_the_cluster_log_keeps_each_process_output_and_the_newest_logs(tmp_path):
    from phalanx.cluster._engine_log import EngineLog, prune

    class Stopped:  # an ipyparallel launcher after its stop: it read its file, then removed it
        def __init__(self, text: str) -> None:
            self.text = text

        def get_output(self) -> str:
            return self.text

    log = EngineLog(str(tmp_path), "one")
    log.keep("engine set slot-0", Stopped("a\nb"), {"exit_code": 1})
    log.keep("controller", Stopped("".join(f"line {i}\n" for i in range(5000))), None)
    lines = open(log.path).read().splitlines()
    assert lines[:3] == [lines[0], "a", "b"] and "slot-0 stopped (exit code 1)" in lines[0]
    assert lines[3].endswith("controller stopped (exit code None)")
    assert lines[4] == "line 3000" and lines[-1] == "line 4999"  # its last 2,000 lines
    os.remove(log.path)
    for i in range(25):
        path = tmp_path / "log" / f"phalanx-{i}.log"
        path.write_text("x")
        os.utime(path, (1000 + i, 1000 + i))
    prune(str(tmp_path), keep=3)
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [
        "phalanx-22.log", "phalanx-23.log", "phalanx-24.log"]


def test_the_tail_ends_with_what_the_running_processes_said_so_far(tmp_path):
    """The panel's Log: the kept output of stopped processes, then each running one's file as
    it is now (read, not taken: it is still kept whole when that process stops)."""
    from types import SimpleNamespace

    from phalanx.cluster._engine_log import EngineLog, tail

    log = EngineLog(str(tmp_path), "abc")
    log.keep("engine set old", SimpleNamespace(get_output=lambda: "old engine said bye\n"))
    controller, engine = tmp_path / "controller.out", tmp_path / "engine-0.out"
    controller.write_text("controller up\n")
    engine.write_text("engine 0 registered\nengine 0 warns\n")
    cluster = SimpleNamespace(
        controller=SimpleNamespace(output_file=str(controller)),
        engines={"s0": SimpleNamespace(launchers={"0": SimpleNamespace(output_file=str(engine))}),
                 "gone": SimpleNamespace(output_file=str(tmp_path / "missing.out"))})
    lines = tail(log.path, cluster)
    assert lines[1:] == ["old engine said bye", "--- controller (running)", "controller up",
                         "--- engine set s0 (0) (running)", "engine 0 registered",
                         "engine 0 warns"]
    assert lines[0].startswith("--- ") and "engine set old stopped" in lines[0]
    assert tail(log.path, cluster, lines=2) == ["engine 0 registered", "engine 0 warns"]
    assert tail(None, None) == []
