"""The chaos runs' figures: faults by kind, time to error p50/p95/max, and every finding.

Example::

    summary = summarize(outcomes, final_leaks)
    print(markdown(summary))
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from _chaos import KINDS, Outcome


def summarize(outcomes: list[Outcome], final_leaks: list[str]) -> dict:
    by_kind = {}
    for kind in KINDS:
        mine = [o for o in outcomes if o.fault.kind == kind]
        times = sorted(o.time_to_error_s for o in mine if o.time_to_error_s is not None)
        by_kind[kind] = {"faults": len(mine), "ok": sum(o.verdict == "ok" for o in mine),
                         "p50_s": _pct(times, 50), "p95_s": _pct(times, 95),
                         "max_s": times[-1] if times else None}
    count = lambda verdict: sum(o.verdict == verdict for o in outcomes)  # noqa: E731
    return {"faults": len(outcomes), "by_kind": by_kind, "internal_errors": count("internal"),
            "wrong_errors": count("wrong"), "hangs": count("hang"), "missed": count("missed"),
            "next_cell_failures": sum(not o.next_cell_ok for o in outcomes),
            "runs_with_leaks": sum(bool(o.leaks) for o in outcomes), "leaks_at_stop": final_leaks,
            "outcomes": [asdict(o) for o in outcomes]}


def markdown(summary: dict) -> str:
    lines = ["| fault | runs | as expected | time to error p50 / p95 / max (s) |", "|---|---|---|---|"]
    for kind, row in summary["by_kind"].items():
        times = " / ".join("-" if row[k] is None else f"{row[k]:.2f}" for k in ("p50_s", "p95_s", "max_s"))
        lines.append(f"| {kind} | {row['faults']} | {row['ok']} | {times} |")
    lines.append("")
    lines.append(f"{summary['faults']} faults: {summary['internal_errors']} internal errors, "
                 f"{summary['wrong_errors']} wrong or late errors, {summary['hangs']} hangs, "
                 f"{summary['missed']} missed, {summary['next_cell_failures']} failed next cells, "
                 f"{summary['runs_with_leaks']} runs with leaks, "
                 f"{len(summary['leaks_at_stop'])} leaks after stopping the cluster.")
    return "\n".join(lines) + "\n"


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)
