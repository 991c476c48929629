"""The short chaos run: 10 faults drawn with a fixed seed on a real 2-engine cluster.

Every fault kind strikes at least once (see benchmarks/_chaos.py, shared with ``make chaos``);
each must end in one error naming the right rank, leave engines that run the next cell, and
leak nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from test_reliability_helpers import figures  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _chaos import Chaos, draw_faults  # noqa: E402
from _chaos_figures import markdown, summarize  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_ten_random_faults_each_end_in_one_clear_error_and_leak_nothing(shell, figures):
    chaos = Chaos(shell)
    outcomes = []
    chaos.start()
    try:
        for fault in draw_faults(10, seed=12):
            outcomes.append(chaos.run(fault))
    finally:
        final = chaos.stop()
    summary = summarize(outcomes, final)
    print(markdown(summary))
    findings = [(o.fault, o.verdict, o.detail, o.leaks) for o in outcomes
                if o.verdict != "ok" or o.leaks or not o.next_cell_ok]
    assert not findings and not final, (findings, final)
    for kind, row in summary["by_kind"].items():
        figures[f"chaos_{kind}_max_time_to_error_s"] = row["max_s"]
