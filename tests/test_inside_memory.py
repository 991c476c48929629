"""Memory per rank: live samples from the engines, peaks in the summary, out-of-memory named."""

from __future__ import annotations

import signal
import threading
import time

import psutil
import pytest

from conftest import run_cell
from phalanx import events
from phalanx.fit.telemetry._memory import RunMemory, cuda_oom_text, oom_hint
from phalanx.runtime.telemetry._memory import MemoryTracker, memory_sample
from deadlines import hang_limit

# Holds ~200 MB on rank 0 while both ranks step for at least 3.5 s (several samples).  The same
# number of steps on every rank: each step is an allreduce.
HOLD = """
import time, numpy as np, torch
from phalanx import log
ballast = np.ones(200 * 2**20 // 8) if rank == 0 else None
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(70):
    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step()
    log(loss=1.0)
    time.sleep(0.05)
"""


def test_sample_reads_rss_and_never_touches_cuda_here():
    sample = memory_sample()
    assert abs(sample["rss_mb"] * 2**20 - psutil.Process().memory_info().rss) < 0.1 * 2**30
    assert not any(k.startswith("cuda") for k in sample)
    now = [0.0]
    tracker = MemoryTracker(1.0, clock=lambda: now[0])
    assert tracker.due()
    tracker.take()
    now[0] = 0.5
    assert not tracker.due()
    now[0] = 1.0
    assert tracker.due() and tracker.peak["rss_mb"] > 0
    assert not MemoryTracker(0).due()  # 0 turns sampling off


def test_run_memory_keeps_latest_and_peaks_and_reports_fresh_once():
    m = RunMemory()
    m.add(1, [{"t": 1.0, "rss_mb": 900.0}, {"t": 2.0, "rss_mb": 800.0, "cuda_allocated_mb": 5.0}])
    m.add(1, [], peak={"rss_mb": 950.0, "cuda_peak_mb": 7.0})
    assert m.latest()[1]["rss_mb"] == 800.0
    assert m.peaks() == {1: {"rss_mb": 950.0, "cuda_allocated_mb": 5.0, "cuda_peak_mb": 7.0}}
    fresh = m.take_fresh()
    assert fresh == [{"rank": 1, "t": 2.0, "rss_mb": 800.0, "cuda_allocated_mb": 5.0}]
    assert m.take_fresh() is None
    events.validate_event(events.memory("r", fresh))


def test_out_of_memory_is_said_only_with_the_signs():
    kill = -signal.SIGKILL
    assert oom_hint(1, 5, 9000.0, total_mb=10000.0) is None  # not a SIGKILL: no claim
    assert oom_hint(kill, 5, 100.0, total_mb=10000.0).endswith("(1% of 9.77 GiB)")
    assert "likely out of memory" in oom_hint(kill, 5, 6000.0, total_mb=10000.0)
    assert "likely out of memory" in oom_hint(kill, 5, 100.0, total_mb=10000.0, pressure_avg10=40.0)
    log = "[12.3] Out of memory: Killed process 4242 (python) total-vm:..."
    assert "OOM killer" in oom_hint(kill, 4242, 100.0, kernel_log=log)
    assert "OOM killer" not in oom_hint(kill, 424, 100.0, kernel_log=log)
    text = cuda_oom_text("OutOfMemoryError", {"cuda_allocated_mb": 7168.0, "cuda_total_mb": 8192.0})
    assert text == "it ran out of GPU memory (torch.OutOfMemoryError): allocated 7.00 GiB, of 8.00 GiB"
    assert cuda_oom_text("ValueError", None) is None


@pytest.mark.cluster
def test_engine_rss_live_within_ten_percent_of_psutil_and_peak_in_summary(two_engines, shell):
    session = two_engines
    engine = psutil.Process(session.cluster.slots()[0].pid)
    samples: list[dict] = []
    readings: list[tuple[float, float]] = []   # psutil's own (time, RSS MB) of rank 0's engine
    running = threading.Event()
    running.set()

    def poll():  # what psutil reads, every 10 ms, to compare with samples taken at the same time
        while running.is_set():
            readings.append((time.time(), engine.memory_info().rss / 2**20))
            time.sleep(0.01)

    def watch(event):
        if event.get("type") == "memory":
            samples.extend(s for s in event["ranks"] if s["rank"] == 0 and s["rss_mb"] > 150)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    unsubscribe = session.events.subscribe(watch)
    try:
        run_cell(shell, "%%distributed_fit --no-widget\n" + HOLD)
    finally:
        unsubscribe()
        running.clear()
        poller.join(5)
    pairs = []
    # The last sample is taken as the run ends, and the ballast is freed right after it (the
    # run keeps nothing of its cell): a reading 10 ms later is of another moment.
    for sample in sorted(samples, key=lambda s: s["t"])[:-1]:
        at, measured = min(readings, key=lambda r: abs(r[0] - sample["t"]))
        if abs(at - sample["t"]) < 0.05:
            pairs.append((sample["rss_mb"], measured))
    assert len(pairs) >= 2, (len(samples), pairs)  # about one a second
    for reported, measured in pairs:
        assert abs(reported - measured) <= 0.1 * measured, (reported, measured)
    record = session.last_run()
    assert record.memory[0]["rss_mb"] > record.memory[1]["rss_mb"] + 150
    assert record.manifest["memory_peak_mb"]["0"]["rss_mb"] == record.memory[0]["rss_mb"]
    rows = record.summary_rows()
    assert rows[0]["peak_rss_mb"] > 150 and "peak_rss_mb" in repr(record)
    # Between runs the table has the kernel's own reading; nothing asks a CPU engine.
    between = session.status().rows
    assert all(r["memory_mb"] > 0 and "cuda_allocated_mb" not in r for r in between)


@pytest.mark.cluster
def test_rank_killed_by_sigkill_is_reported_with_its_last_rss(two_engines, shell):
    session = two_engines
    victim = session.cluster.slots()[1]
    sampled = threading.Event()

    def watch(event):
        if event.get("type") == "memory" and any(s["rank"] == 1 for s in event["ranks"]):
            sampled.set()

    def kill_after_a_sample():
        if sampled.wait(30):
            import os

            os.kill(victim.pid, signal.SIGKILL)

    unsubscribe = session.events.subscribe(watch)
    killer = threading.Thread(target=kill_after_a_sample, daemon=True)
    killer.start()
    from phalanx.fit import DistributedFitError

    try:
        with pytest.raises(DistributedFitError) as info:
            run_cell(shell, "%%distributed_fit --no-widget\n" + HOLD.replace("range(70)", "range(100_000)"))
    finally:
        unsubscribe()
        sampled.set()
        killer.join(5)
    message = str(info.value)
    assert info.value.rank == 1 and "killed by SIGKILL, last RSS" in message, message
    assert "GiB" in message
    run_cell(shell, "%cluster restart 1")
    assert all(s.state == "idle" for s in session.cluster.slots())


@pytest.mark.cluster
def test_cuda_out_of_memory_is_named_in_the_error(two_engines, shell):
    from phalanx.fit import DistributedFitError

    with pytest.raises(DistributedFitError) as info:
        run_cell(shell, "%%distributed_fit --no-widget\nimport torch\nif rank == 1:\n"
                        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n")
    message = str(info.value)
    assert info.value.rank == 1 and "ran out of GPU memory (torch.OutOfMemoryError)" in message
    deadline = time.monotonic() + hang_limit(30)
    while any(s.state != "idle" for s in two_engines.cluster.slots()) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_run_view_and_cluster_table_show_memory_from_the_events():
    from phalanx.widgets._cluster_table import merge_rows, table_html
    from phalanx.widgets._run_view import RunView

    view = RunView("r1", "mem-run", world_size=2, total_steps=10)
    view.handle(events.progress("r1", [{"rank": r, "step": 3, "total": 10} for r in (0, 1)]))
    view.handle(events.memory("r1", [{"rank": 1, "t": 1.0, "rss_mb": 2048.0,
                                      "cuda_allocated_mb": 512.0, "cuda_reserved_mb": 1024.0,
                                      "cuda_peak_mb": 600.0}]))
    view.drain()
    # The memory is behind the details toggle; the rank's line keeps to its steps and rate.
    assert "RSS 2.00 GB" in view.progress.details[1].value and "3/10 steps" in view.progress.lines[1].value
    assert "GPU 512 MB / 1.00 GB reserved (peak 600 MB)" in view.progress.details[1].value
    assert "RSS" not in view.progress.details[0].value
    engines = [{"rank": r, "engine_id": r, "host": "h", "pid": None, "device": "cuda:0",
                "state": "idle", "memory_mb": 10.0, "step": None} for r in (0, 1)]
    rows = merge_rows(engines, {}, samples={1: {"rss_mb": 2048.0, "cuda_allocated_mb": 512.0,
                                                "cuda_reserved_mb": 1024.0, "cuda_peak_mb": 600.0}})
    assert [r["memory_mb"] for r in rows] == [10.0, 2048.0]
    page = table_html(rows)
    assert "GPU memory" in page and "512 MB / 1.00 GB, 600 MB" in page
    assert "GPU memory" not in table_html(merge_rows(engines, {}))


def _last_runs_object_alive(shell) -> bool:
    """Whether the object the last run held by ``builtins._phalanx_test_ref`` is alive as the
    next run starts (collection turned back on after)."""
    run_cell(shell, "%%distributed_fit --no-widget --return kept\n"
                    "import builtins, gc\n"
                    "kept = builtins._phalanx_test_ref() is not None\n"
                    "gc.enable()\n")
    return shell.user_ns["kept"]


@pytest.mark.cluster
def test_a_finished_run_keeps_nothing_of_its_cell_on_the_engine(two_engines, shell):
    """What a cell built is freed when its run ends, not when Python's cycle collector next
    runs (the run records the modules that ran forward, for their buffers): on a GPU a re-run
    would otherwise start with the last run's model still in memory (measured on an H100:
    benchmarks/results/h100.md)."""
    run_cell(shell, "%%distributed_fit --no-widget\n"
                    "import builtins, gc, weakref, torch\n"
                    "gc.disable()  # only reference counts free anything until the check\n"
                    "model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))\n"
                    "model(torch.ones(2, 4)).sum().backward()\n"
                    "builtins._phalanx_test_ref = weakref.ref(model)\n")
    assert not _last_runs_object_alive(shell)


@pytest.mark.cluster
def test_views_get_the_engines_state_after_a_run(two_engines, shell):
    """The engine table showed live figures during the run; after it, the views get a fresh
    cluster event, not the figures read before the run began."""
    seen: list[dict] = []
    unsubscribe = two_engines.events.subscribe(seen.append)
    try:
        run_cell(shell, "%%distributed_fit --no-widget\nx = 1\n")
    finally:
        unsubscribe()
    ended = next(i for i, e in enumerate(seen) if e["type"] == "run_ended")
    after = [e for e in seen[ended:] if e["type"] == "cluster"]
    assert after, [e["type"] for e in seen]
    events.validate_event(after[-1])
    assert [r["rank"] for r in after[-1]["engines"]] == [0, 1]
    assert all(r["memory_mb"] > 0 for r in after[-1]["engines"])


@pytest.mark.cluster
def test_a_finished_runs_model_held_by_a_notebook_class_is_freed_with_the_run(two_engines, shell):
    """A model of a class defined in the notebook sits in a reference cycle (the class's
    methods hold the run's globals, which hold the model), which only Python's cycle collector
    frees.  A run that leaves 512 MB behind is collected when it ends, not in the next run, whose
    peak would count it (a CPU engine collected nothing before; a GPU one, only 5% of its
    device: 7 GB on an H200)."""
    run_cell(shell, "import torch\n"
                    "class Wide(torch.nn.Module):\n"
                    "    def __init__(self):\n"
                    "        super().__init__()\n"
                    "        self.layer = torch.nn.Linear(8192, 8192)  # 256 MB, its gradient too\n"
                    "    def forward(self, x):\n"
                    "        return self.layer(x)\n")
    run_cell(shell, "%%distributed_fit --no-widget\n"
                    "import builtins, gc, weakref\n"
                    "gc.disable()  # only reference counts and the run's own collection free it\n"
                    "model = Wide()\n"
                    "model(torch.ones(2, 8192)).sum().backward()\n"
                    "builtins._phalanx_test_ref = weakref.ref(model)\n")
    assert not _last_runs_object_alive(shell)
