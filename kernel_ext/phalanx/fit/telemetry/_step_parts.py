"""Each rank's step time split into parts that add up to it, and which part makes a rank slow.

The engine reports running totals of its completed steps' parts (``runtime/telemetry/_timing.py``):
``forward_s`` (the loop's code before backward: data and forward), ``backward_s``,
``collective_s`` (phalanx collectives), ``optimizer_s``, ``log_s``, ``other_s``.  Here the time in
collectives is split into waiting for the slowest peer and moving bytes in the proportion the
settled calls showed (``fit/telemetry/_timing.py``), so the parts still add up to the step time.

Example::

    >>> b = step_breakdown({"steps": 2, "forward_s": 0.6, "backward_s": 0.2, "collective_s": 0.1,
    ...                     "optimizer_s": 0.05, "log_s": 0.01, "other_s": 0.04},
    ...                    {"collective_s": 0.1, "collective_wait_s": 0.08})
    >>> round(b["step_s"], 3), round(b["parts"]["wait"], 3), b["dominant"]
    (1.0, 0.08, 'data')
    >>> part_label("data")
    'data & forward'
"""

from __future__ import annotations

from statistics import median
from typing import Any, Mapping

# Wire names of the parts, in the order the bars stack them.
PART_NAMES = ("data", "backward", "wait", "move", "optimizer", "log", "other")
_LABELS = {"data": "data & forward", "backward": "backward", "wait": "waiting for a peer",
           "move": "moving bytes", "optimizer": "optimizer", "log": "log()", "other": "other"}
_SLOW_FACTOR = 1.25  # a rank is slow when its own work (step minus waiting) is 25% above the median


def part_label(name: str, backward_hooked: bool = True) -> str:
    """What a part is called in the views (``data`` holds backward too where it was not hooked)."""
    if name == "data" and not backward_hooked:
        return "data, forward & backward"
    return _LABELS[name]


def step_breakdown(parts: Mapping[str, float], collectives: Mapping[str, float]) -> dict[str, Any]:
    """``{steps, step_s, parts: {name: seconds}, dominant, dominant_share}`` for one rank."""
    coll = parts.get("collective_s", 0.0)
    settled = collectives.get("collective_s", 0.0)
    waiting = collectives.get("collective_wait_s", 0.0) / settled if settled > 0 else 0.0
    split = {"data": parts.get("forward_s", 0.0), "backward": parts.get("backward_s", 0.0),
             "wait": coll * waiting, "move": coll * (1 - waiting),
             "optimizer": parts.get("optimizer_s", 0.0), "log": parts.get("log_s", 0.0),
             "other": parts.get("other_s", 0.0)}
    step_s = sum(split.values())
    dominant = max(PART_NAMES, key=lambda n: split[n])
    return {"steps": int(parts.get("steps", 0)), "step_s": step_s, "parts": split,
            "dominant": dominant, "dominant_share": split[dominant] / step_s if step_s > 0 else 0.0}


def mark_slow(ranks: dict[int, dict]) -> None:
    """Set ``slow`` ("data & forward 61% of step time") on the ranks whose own work per step
    (step time minus waiting for peers) is well above the other ranks': the part named is the
    largest of its own work.  Waiting is left out: it is what a slow rank does to the others."""
    work = {r: _work_per_step(t) for r, t in ranks.items() if t.get("steps")}
    for r, t in ranks.items():
        t.pop("slow", None)
        others = [w for o, w in work.items() if o != r]
        if r not in work or not others or work[r] <= _SLOW_FACTOR * median(others):
            continue
        split = t["parts"]
        part = max((n for n in PART_NAMES if n != "wait"), key=lambda n: split[n])
        share = split[part] / t["step_s"] if t["step_s"] > 0 else 0.0
        t["slow"] = f"{part_label(part, split['backward'] > 0)} {share:.0%} of step time"


def _work_per_step(t: Mapping[str, Any]) -> float:
    return (t["step_s"] - t["parts"]["wait"]) / max(t["steps"], 1)


def breakdown_text(t: Mapping[str, Any]) -> str:
    """``0.35 s/step: data & forward 86%, waiting for a peer 4%, ...`` (parts of 1% or more)."""
    step_s, split = t["step_s"], t["parts"]
    if not step_s:
        return ""
    hooked = split.get("backward", 0.0) > 0
    shown = [f"{part_label(n, hooked)} {split[n] / step_s:.0%}" for n in PART_NAMES
             if split.get(n, 0.0) / step_s >= 0.01]
    return f"{step_s / max(t['steps'], 1):.3g} s/step: " + ", ".join(shown)
