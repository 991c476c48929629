"""The complete metric history in bounded memory, and its downsampled curves.

Pure tests of the columnar storage and the M4 downsampling; a 10M-row history fed through the
kernel's receiving path (the function the metrics receiver calls); a real run that keeps its
history with ``--keep-history``.
"""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pytest

from conftest import run_cell
from phalanx.fit import FitOptions, FitUsageError, MetricHistory
from phalanx.fit.telemetry._digest import CurveDigest, window_rows
from phalanx.fit.telemetry._downsample import M4Stream, downsample, m4_indices
from phalanx.fit.telemetry._tracker import RunTracker


# --- downsampling (pure) -----------------------------------------------------------------------

def _spiky(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = rng.normal(size=n).cumsum()
    if n > 10:
        y[rng.integers(0, n)] += 1e3     # a spike
        y[rng.integers(0, n)] -= 1e3     # a dip
        y[rng.integers(0, n)] = np.nan   # a diverged step
    return y


@pytest.mark.parametrize("seed", range(12))
def test_m4_stream_keeps_extremes_and_last_point_whatever_the_batches(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40_000))
    y, x = _spiky(n, seed), np.arange(n, dtype=float)
    stream, drawn, at = M4Stream(max_points=400), np.zeros((0, 2)), 0
    while at < n:
        size = int(rng.integers(1, 3000))
        keep, new = stream.add(np.stack([y[at:at + size], x[at:at + size]], axis=1))
        drawn = np.concatenate([drawn[:keep], new])   # what a plot applying the updates holds
        at += size
    points = stream.points()
    assert np.array_equal(drawn, points, equal_nan=True)
    assert len(points) <= 400 + 4 and stream.count == n
    assert np.nanmax(points[:, 0]) == np.nanmax(y) and np.nanmin(points[:, 0]) == np.nanmin(y)
    assert points[-1, 1] == n - 1 and np.array_equal(points[-1:, 0], y[-1:], equal_nan=True)
    assert np.all(np.diff(points[:, 1]) >= 0)   # still a curve: x never goes back


def test_short_lines_are_drawn_exactly():
    stream = M4Stream(max_points=100)
    keep, new = stream.add(np.array([[3.0, 0], [1.0, 1]]))
    assert keep == 0 and new[:, 0].tolist() == [3.0, 1.0]
    keep, new = stream.add(np.array([[2.0, 2]]))
    assert keep == 2 and new.tolist() == [[2.0, 2.0]]


def test_whole_curve_downsampling_keeps_extremes():
    y = _spiky(100_000, 1)
    keep = m4_indices(y, buckets=250)
    assert len(keep) <= 1000 and keep[-1] == len(y) - 1 and keep[0] == 0
    assert np.nanargmax(y) in keep and np.nanargmin(y) in keep
    xs, ys = downsample(np.arange(10), np.arange(10.0), max_points=100)
    assert xs.tolist() == list(range(10))   # short: unchanged


# --- columnar history (pure) -------------------------------------------------------------------

def test_history_rows_read_back_the_same_from_memory_and_disk(tmp_path):
    history = MetricHistory(str(tmp_path / "h"), memory_rows=8, chunk_rows=5, stage_rows=2)
    logged = []
    for step in range(40):
        rank = step % 3
        metrics = {"loss": 1.0 / (step + 1)}
        if step % 4 == 0:
            metrics["val"] = float(step)        # a metric only some rows log
        history.extend(rank, [[step, 100.0 + step, metrics]])
        logged.append({"rank": rank, "step": step, "t": 100.0 + step, **metrics})
    assert history.path is not None and len(os.listdir(history.path)) >= 4   # spilled
    assert history.rows() == logged and len(history) == 40
    assert history.rows(10, 12) == logged[10:12]
    assert history.rows(rank=1, steps=(10, 20)) == [r for r in logged if r["rank"] == 1 and 10 <= r["step"] <= 20]
    assert history.rows(times=(None, 102.0)) == logged[:3]
    frame = history.to_pandas(rank=0)
    assert frame["step"].tolist() == [r["step"] for r in logged if r["rank"] == 0]
    assert frame["val"].isna().sum() == sum("val" not in r for r in logged if r["rank"] == 0)
    assert history.latest(0) == {"loss": 1.0 / 40, "val": 36.0}
    held = history.memory_bytes()
    history.persist()
    assert history.memory_bytes() <= held and history.rows() == logged
    again = MetricHistory.read(history.path)
    assert again.rows() == logged and again.metric_names() == ["loss", "val"]


def test_a_removed_history_says_what_happened(tmp_path):
    history = MetricHistory(str(tmp_path / "gone"))
    history.extend(0, [[1, 0.0, {"loss": 1.0}]])
    history.persist()
    for name in os.listdir(history.path):
        os.remove(os.path.join(history.path, name))
    with pytest.raises(FileNotFoundError, match="--keep-history"):
        history.rows()


def test_digest_and_window_are_bounded_and_exact_where_small():
    history = MetricHistory()
    digest = CurveDigest(world_size=2, max_points=200)
    for start in range(0, 20_000, 1000):
        for rank in (0, 1):
            rows = [[s, float(s), {"loss": float(rank * 10 + (s == 7777) * 500)}]
                    for s in range(start, start + 1000)]
            history.extend(rank, rows)
        digest.add(history.columns(2 * start))
    digest.finish()
    lines = digest.points()["loss"]
    assert all(len(xs) <= 204 for xs, _ in lines.values())
    assert max(lines[0][1]) == 500.0 and max(lines["mean"][1]) == 505.0   # the spike survives
    assert lines[1][0][-1] == 19_999 and lines["mean"][0][-1] == 19_999
    stats = digest.stats()
    assert stats["1"]["loss"] == {"count": 20_000, "last": 10.0, "min": 10.0, "max": 510.0}
    zoom = window_rows(history, steps=(7770, 7790), rank=0)
    assert [r["step"] for r in zoom] == list(range(7770, 7791))       # full resolution
    assert len(window_rows(history, max_points=400)) <= 2 * 400


def test_keep_history_option_checks_its_directory(tmp_path):
    assert FitOptions.build(keep_history=str(tmp_path)).keep_history == str(tmp_path)
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(FitUsageError, match="is a file"):
        FitOptions.build(keep_history=str(afile))


# --- 10M rows through the receiving path -------------------------------------------------------

RANKS, PER_RANK, BATCH = 8, 1_250_000, 2_500


# The rows' metric dicts repeat with period 997: shared, so making the input costs less than
# taking it in (the test measures the history, not the generator).
_METRICS = {r: [{"loss": k * 0.001 + r, "acc": 0.5} for k in range(997)] for r in range(RANKS)}


def _batch(rank: int, start: int) -> dict:
    metrics = _METRICS[rank]
    return {"rank": rank, "step": start + BATCH - 1,
            "rows": [[s, 1e9 + s * 0.05, metrics[s % 997]] for s in range(start, start + BATCH)]}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~30 s of CPU; far more wall time on a machine shared by many jobs
def test_ten_million_rows_stay_in_bounded_memory_and_read_back_whole(tmp_path):
    process = psutil.Process()
    tracker = RunTracker("big-1", RANKS, None, lambda event: None, history_dir=str(tmp_path / "run"))
    before = process.memory_info().rss
    peak = 0
    began = time.perf_counter()
    for start in range(0, PER_RANK, BATCH):
        for rank in range(RANKS):
            tracker.on_batch(_batch(rank, start))   # what the metrics receiver calls
        if start % 250_000 == 0:
            peak = max(peak, process.memory_info().rss - before)
    fed_s = time.perf_counter() - began
    peak = max(peak, process.memory_info().rss - before)
    history = tracker.history
    assert len(history) == RANKS * PER_RANK
    assert peak <= 400e6, f"kernel memory grew by {peak / 1e6:.0f} MB for 10M rows"
    expected_loss = sum((s % 997) * 0.001 for s in range(PER_RANK))
    for rank in range(RANKS):
        cols = history.columns(rank=rank)
        assert len(cols["step"]) == PER_RANK
        assert np.array_equal(cols["step"], np.arange(PER_RANK))
        assert cols["loss"].sum() == pytest.approx(expected_loss + rank * PER_RANK, rel=1e-9)
        assert np.all(cols["acc"] == 0.5)
    began = time.perf_counter()
    window = history.to_pandas(rank=3, steps=(600_000, 700_000))
    window_s = time.perf_counter() - began
    assert window["step"].tolist() == list(range(600_000, 700_001))
    assert (window["rank"] == 3).all()
    print(f"\n10M rows fed in {fed_s:.1f} s, kernel RSS +{peak / 1e6:.0f} MB, "
          f"one rank's window to_pandas {window_s * 1e3:.0f} ms")


# --- a real run ---------------------------------------------------------------------------------

LOOP = """%%distributed_fit {flags}
from phalanx import log
for step in range(300):
    log(loss=1.0 / (step + 1) + rank_bump, acc=float(step))
"""


@pytest.mark.cluster
def test_a_run_keeps_its_history_on_disk_where_asked(two_engines, shell, tmp_path):
    shell.user_ns["rank_bump"] = 0.0
    run_cell(shell, LOOP.format(flags=f"--no-widget --name kept --keep-history {tmp_path}"))
    record = two_engines.last_run()
    path = record.history_path
    assert path is not None and os.path.dirname(path) == str(tmp_path)
    assert record.manifest["history"]["path"] == path and record.manifest["history"]["rows"] == 600
    assert record.manifest["history"]["per_rank"]["1"]["loss"]["min"] == pytest.approx(1 / 300)
    read = MetricHistory.read(path)
    assert read.rows() == record.history.rows() and len(read) == 600
    assert record.history.memory_bytes() < 2e6   # the finished run lives on disk
    run_cell(shell, LOOP.format(flags="--no-widget"))
    default = two_engines.last_run().history_path
    # without --keep-history: in the notebook's run log, where phalanx.runs() reads it back
    assert default == two_engines.fits.run_log.history_dir(two_engines.last_run().run_id)
    [listed] = [r for r in two_engines.runs() if r.run_id == two_engines.last_run().run_id]
    assert listed.history().rows() == two_engines.last_run().history.rows()
    assert os.path.isdir(path)   # the kept one stays
    rows = two_engines.run_history_rows()
    assert {r["rank"] for r in rows} == {0, 1} and len(rows) == 600   # short: every point
