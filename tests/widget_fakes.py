"""Fakes shared by the notebook-view tests: a settable clock, wire rows, per-rank progress and
a finished run's record."""

from __future__ import annotations

from phalanx.fit import MetricHistory, RunRecord


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rows(*items):
    """Wire rows from (rank, step, {metrics}) triples."""
    return [{"rank": r, "step": s, "t": 0.0, "metrics": m} for r, s, m in items]


def rank_progress(rank, step, total=None, rate=None, straggler=False, **metrics):
    eta = None if total is None or not rate else (total - step) / rate
    return {"rank": rank, "step": step, "total": total, "steps_per_s": rate, "eta_s": eta,
            "metrics": metrics, "straggler": straggler}


def fake_record(run_id="r-1", steps=None, status="done", history_rows=()):
    history = MetricHistory()
    for rank, step, metrics in history_rows:
        history.extend(rank, [[step, 0.0, metrics]])
    steps = steps or {0: 0, 1: 0}
    return RunRecord(run_id, "run-1", status, len(steps), 1.5, steps, history, {"seed": 1})
