"""``%%distributed_fit --profile STEPS``: one merged trace with a track per rank, top operators."""

from __future__ import annotations

import json

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from conftest import run_cell
from phalanx import events
from phalanx.fit.telemetry._profile import merge_traces

LOOP = """
import torch
from phalanx import log
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
X, y = torch.randn(128, 32), torch.randn(128, 1)
for step in range(8):
    opt.zero_grad()
    loss = ((model(X) - y) ** 2).mean()
    loss.backward()
    opt.step()
    log(loss=loss.item())
"""


def test_merge_keeps_ranks_apart_and_on_one_timeline():
    def trace(base_ns, pid):
        return {"baseTimeNanoseconds": base_ns, "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": 5, "args": {"name": "main"}},
            {"ph": "X", "name": "aten::mm", "pid": pid, "tid": 5, "ts": 10.0, "dur": 1.0},
            {"ph": "X", "name": "kernel", "pid": 0, "tid": 7, "ts": 11.0, "dur": 1.0},  # a GPU track
            {"ph": "s", "id": 3, "pid": pid, "tid": 5, "ts": 10.0}]}

    merged = merge_traces({0: trace(5_000_000, 100), 1: trace(3_000_000, 200)}, ["a", "b"], [100, 200])
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0 (a, pid 100)", 1: "rank 1 (b, pid 200)"}
    assert merged["baseTimeNanoseconds"] == 3_000_000
    starts = {(e["pid"], e["name"]): e["ts"] for e in events if e["ph"] == "X"}
    assert starts[(0, "aten::mm")] == 2010.0 and starts[(1, "aten::mm")] == 10.0  # 2 ms later
    assert starts[(0, "kernel")] == 2011.0  # the rank's GPU work is on the rank's track
    assert len({e["id"] for e in events if e["ph"] == "s"}) == 2


@pytest.mark.cluster
def test_two_rank_profile_writes_one_trace_with_two_rank_tracks_and_a_top_table(
        two_engines, shell, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the kernel's working directory is the notebook's
    with capture_output() as captured:
        run_cell(shell, "%%distributed_fit --no-widget --profile 5 --name 'prof run'\n" + LOOP)
    record = two_engines.last_run()
    assert record.status == "done" and record.steps == {0: 8, 1: 8}  # the loop ran on after it
    files = list(tmp_path.glob("phalanx-profile-*.json"))
    assert len(files) == 1 and files[0].name.startswith("phalanx-profile-prof-run-")
    assert record.manifest["profile"] == files[0].name
    trace = json.loads(files[0].read_text())
    events = trace["traceEvents"]
    tracks = {e["pid"] for e in events if e.get("ph") == "X"}
    assert tracks == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names[0].startswith("rank 0") and names[1].startswith("rank 1")
    for rank in (0, 1):
        ops = {e["name"] for e in events if e.get("pid") == rank and e.get("ph") == "X"}
        assert "aten::addmm" in ops and any(n.startswith("ProfilerStep#") for n in ops)
        steps = {e["name"] for e in events if e.get("pid") == rank and e.get("name", "").startswith("ProfilerStep#")}
        assert len(steps) == 5, steps
    assert record.profile.steps == {0: 5, 1: 5}
    page = "".join(o.data.get("text/html", "") for o in captured.outputs)
    assert "rank 0: top operators" in page and "rank 1: top operators" in page
    assert "ui.perfetto.dev" in page and "chrome://tracing" in page and files[0].name in page
    text = repr(record.profile)
    assert "top operators by self CPU time" in text and "aten::" in text


@pytest.mark.cluster
def test_profile_needs_a_positive_step_count(two_engines, shell, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="--profile must be a whole number of at least 1, got 0"):
        run_cell(shell, "%%distributed_fit --profile 0\npass\n")
    run_cell(shell, "%%distributed_fit --no-widget\n" + LOOP)  # no flag: no file, no report
    assert two_engines.last_run().profile is None and not list(tmp_path.iterdir())


@pytest.mark.cluster
def test_panels_profile_request_profiles_the_next_run_only(two_engines, shell, tmp_path, monkeypatch):
    """The panel's Profile button sends ``profile_next``: the next run records 5 steps per rank
    as ``--profile`` would, the run after it is not profiled."""
    from phalanx._labcomm import LabComm

    class Comm:  # a comm as the kernel's comm manager hands it over; nothing is sent back here
        def send(self, data):
            pass

    monkeypatch.chdir(tmp_path)
    lab = LabComm(two_engines, comm_manager=None, create_comm=lambda **kw: Comm())
    lab._dispatch(Comm(), events.validate_request({"v": 1, "type": "profile_next"}))
    with capture_output():
        run_cell(shell, "%%distributed_fit --no-widget\n" + LOOP)
    record = two_engines.last_run()
    assert record.profile is not None and record.profile.steps == {0: 5, 1: 5}
    assert len(list(tmp_path.glob("phalanx-profile-*.json"))) == 1
    with capture_output():
        run_cell(shell, "%%distributed_fit --no-widget\n" + LOOP)
    assert two_engines.last_run().profile is None
    with pytest.raises(events.SchemaError, match="steps must be at least 1"):
        events.validate_request({"v": 1, "type": "profile_next", "steps": 0})
