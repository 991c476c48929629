"""Every run findable later: the notebook's run log, and ``phalanx.runs()`` across a real kernel
restart (names continue, curves open again)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from deadlines import hang_limit
from kernel_support import kernel_manager

from phalanx.fit import FitUsageError
from phalanx.fit.telemetry._run_log import PRUNE_EVERY, RunLog, keep_setting, notebook_folder


def test_numbers_continue_and_each_run_says_how_it_ended(tmp_path):
    log = RunLog(str(tmp_path))
    assert log.next_number() == 1 and log.entries() == []
    log.started("k1-1", 1, "run-1", "%%distributed_fit\nfor i in range(3): log(loss=i)", 2, 3)
    assert log.entries()[0]["status"] == "running"  # this process is alive: still running
    log.ended("k1-1", "failed", 2.5, {0: 3, 1: 2}, {"loss": 1.5}, "rank 1: ValueError", 2)
    again = RunLog(str(tmp_path))  # what a restarted kernel reads
    [entry] = again.entries()
    assert (entry["name"], entry["status"], entry["wall_s"], entry["steps"], entry["error"]) == \
        ("run-1", "failed", 2.5, {"0": 3, "1": 2}, "rank 1: ValueError")
    assert again.next_number() == 2


def test_a_run_whose_kernel_died_is_listed_as_interrupted(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    log = RunLog(str(tmp_path))
    log.started("k2-1", 1, "run-1", "cell", 2)
    path = tmp_path / "k2-1" / "run.json"
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "pid": int(gone.stdout)}))  # its kernel exited
    [listed] = log.entries()
    assert listed["status"] == "interrupted" and "kernel ended" in listed["error"]


def test_the_log_keeps_the_newest_runs_only(tmp_path):
    from phalanx.fit.telemetry._history import MetricHistory

    log = RunLog(str(tmp_path), keep=3)
    for n in range(1, 26):
        log.started(f"k3-{n}", n, f"run-{n}", "cell", 1)
        history = MetricHistory(log.history_dir(f"k3-{n}"))
        if n % 2:  # every other run logged metrics: its folder holds their files too
            history.extend(0, [[1, 0.0, {"loss": 1.0}]])
        history.persist()
        log.ended(f"k3-{n}", "done", 0.1)
    entries = log.entries()
    names = [e["name"] for e in entries]
    assert len(names) < 3 + PRUNE_EVERY and names[-1] == "run-25"
    assert names == [f"run-{n}" for n in range(26 - len(names), 26)], "the oldest go first"
    assert log.next_number() == 26
    # a pruned run leaves nothing behind, with or without metrics; one without made no history
    assert sorted(os.listdir(tmp_path)) == sorted(e["run"] for e in entries)
    assert [os.path.isdir(log.history_dir(e["run"])) for e in entries] == \
        [e["number"] % 2 == 1 for e in entries]


def test_pruning_spares_another_kernels_running_run_and_an_ended_run_is_not_brought_back(tmp_path):
    other = RunLog(str(tmp_path), keep=2)
    other.started("k1-1", 1, "run-1", "cell", 1)  # still running: its kernel (this process) lives
    log = RunLog(str(tmp_path), keep=2)
    for n in range(2, 2 + PRUNE_EVERY + 1):
        log.started(f"k2-{n}", n, f"run-{n}", "cell", 1)
        log.ended(f"k2-{n}", "done", 0.1)
    names = [e["name"] for e in log.entries()]
    assert names[0] == "run-1" and "run-2" not in names, names
    log.started("k2-99", 99, "run-99", "cell", 1)
    shutil.rmtree(tmp_path / "k2-99")  # pruned by another kernel while it ran
    log.ended("k2-99", "done", 0.1)
    assert not (tmp_path / "k2-99").exists(), "an ended run came back after it was pruned"


def test_keep_setting_says_what_is_wrong(monkeypatch):
    monkeypatch.setenv("PHALANX_KEEP_RUNS", "lots")
    with pytest.raises(ValueError, match="PHALANX_KEEP_RUNS='lots': expected a whole number"):
        keep_setting()
    monkeypatch.setenv("PHALANX_KEEP_RUNS", "-2")
    with pytest.raises(ValueError, match="must be 0 or more"):
        keep_setting()


def test_each_notebook_has_its_own_folder(tmp_path):
    a = notebook_folder({"__session__": "/n/a/train.ipynb"}, str(tmp_path))
    b = notebook_folder({"__session__": "/n/b/train.ipynb"}, str(tmp_path))
    assert a != b and os.path.basename(a).startswith("train-")


def test_a_bad_keep_setting_refuses_the_run_clearly(monkeypatch):
    from phalanx._session import Session

    monkeypatch.setenv("PHALANX_KEEP_RUNS", "many")
    session = Session()
    try:
        with pytest.raises(FitUsageError, match="PHALANX_KEEP_RUNS"):
            session.runs()
    finally:
        session.close()


RUN = """%%distributed_fit --no-widget --steps 20
from phalanx import log
for i in range(20):
    log(loss=1.0 / (i + 1))
"""
LISTED = ("import phalanx\nprint([(r.name, r.status, round(r.metrics['loss'], 4), "
          "r.cell.splitlines()[0], len(r.history())) for r in phalanx.runs()])")


class Kernel:
    def __init__(self, cwd: str, runs_dir: str) -> None:
        self.km = kernel_manager()
        self.km.start_kernel(env={**os.environ, "PHALANX_RUNS_DIR": runs_dir}, cwd=cwd)
        self._connect()

    def _connect(self) -> None:
        self.client = self.km.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=hang_limit(60))

    def run(self, code: str) -> str:
        out: list[str] = []
        reply = self.client.execute_interactive(
            code, timeout=hang_limit(180),
            output_hook=lambda m: out.append(m["content"].get("text", "")
                                             if m["msg_type"] == "stream" else ""))
        assert reply["content"]["status"] == "ok", ("".join(out), reply["content"])
        return "".join(out)

    def restart(self) -> None:
        self.run("import phalanx\nphalanx.get_session().close()")
        self.client.stop_channels()
        self.km.restart_kernel(now=False)
        self._connect()

    def close(self) -> None:
        try:
            self.run("import phalanx\nphalanx.get_session().close()")
        finally:
            self.client.stop_channels()
            self.km.shutdown_kernel(now=False)
            self.km.cleanup_resources()


@pytest.mark.cluster
@pytest.mark.slow
def test_runs_are_listed_after_a_kernel_restart_and_names_continue(tmp_path):
    (tmp_path / "work").mkdir()
    kernel = Kernel(str(tmp_path / "work"), str(tmp_path / "runs"))
    try:
        kernel.run("%load_ext phalanx\n%cluster start -n 2 --gpus none")
        kernel.run(RUN)
        kernel.run(RUN.replace("--steps 20", "--steps 20 --name tuned"))
        kernel.restart()
        listed = kernel.run(LISTED)
        first_line = "from phalanx import log"  # the cell's body, as the engines ran it
        assert listed.strip() == str([("run-1", "done", 0.05, first_line, 40),
                                      ("tuned", "done", 0.05, first_line, 40)])
        kernel.run("%load_ext phalanx\n%cluster start -n 2 --gpus none")
        kernel.run(RUN)
        names = kernel.run("import phalanx\nprint([r.name for r in phalanx.runs()])")
        assert names.strip() == "['run-1', 'tuned', 'run-3']", "no run-1 again after a restart"
        # An earlier kernel's run opens its curves again (the summary with its picture).
        page = kernel.run("import phalanx\nprint(phalanx.runs()[0]._repr_html_())")
        assert "run-1" in page and "data:image/svg+xml;base64," in page
        table = kernel.run("import phalanx\nprint(phalanx.runs()._repr_html_())")
        assert table.count("<tr>") == 4 and "loss 0.05" in table
    finally:
        kernel.close()


def test_the_panel_lists_earlier_kernels_runs_and_opens_their_curves(tmp_path):
    from phalanx import events
    from phalanx._panel_stream import RunArchive
    from phalanx._run_list import PastRun, RunList
    from phalanx.fit.telemetry._history import MetricHistory

    log = RunLog(str(tmp_path))
    log.started("old-1", 1, "run-1", "cell", 2, 50)
    history = MetricHistory(log.history_dir("old-1"))
    for rank in (0, 1):
        history.extend(rank, [[s, float(s), {"loss": 1.0 / s}] for s in range(1, 51)])
    history.persist()
    log.ended("old-1", "done", 3.0, {0: 50, 1: 50}, {"loss": 0.02}, None, 2)
    archive = RunArchive(earlier=lambda: RunList(PastRun(e, log) for e in log.entries()))
    archive.note(events.run_started("new-1", 2, 10, "allreduce", name="run-2"))
    assert [(e["run"], e["name"], e["status"]) for e in archive.entries()] == \
        [("old-1", "run-1", "done"), ("new-1", "run-2", "running")]
    first, *curves = archive.messages("old-1", chunk_rows=1000)
    assert first["type"] == "run_record" and first["name"] == "run-1" and first["wall_s"] == 3.0
    assert [r["step"] for r in first["ranks"]] == [50, 50]
    assert sum(len(c["rows"]) for c in curves) == 100 and curves[-1]["means"]["loss"]
