"""The benchmarks' ratio table says what was measured: a miss never reads as its target."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _summary import _row, render_markdown  # noqa: E402


def _table_row(value: float, target: str, met: bool) -> str:
    table = render_markdown({"kind": "test"}, [_row("throughput", "m", value, target, met)])
    return table.splitlines()[-1]


def test_a_ratio_just_under_its_target_shows_the_digit_that_misses():
    assert _table_row(0.9696, ">= 0.97x", False) == "| throughput | m | 0.9696 | >= 0.97x | **no** |  |"


def test_other_ratios_keep_three_significant_digits():
    assert "| 0.97 |" in _table_row(0.9696, "reported", None)
    assert "| 0.972 |" in _table_row(0.97204, ">= 0.97x", True)
    assert "| 28 |" in _table_row(28.0, "<= 15 ms", False)
