"""Per-rank time in phalanx collectives, split into waiting for the slowest peer vs moving bytes.

Each rank reports every collective call as ``[seq, start, duration]`` (``runtime/telemetry/_timing.py``).
All ranks make the same calls in the same order, so call ``seq`` of every rank is one
collective: it can only finish after its last rank arrived, so a rank that entered it at
``start`` waited ``max(starts) - start`` for the slowest peer (never more than its own duration)
and spent the rest moving bytes.  A call is settled once every rank has reported it.

Example::

    >>> t = CollectiveTimes(world_size=2)
    >>> t.add(0, {"collectives": [[0, 10.0, 0.5]], "log_s": 0.01})
    >>> t.add(1, {"collectives": [[0, 10.4, 0.1]], "log_s": 0.02})
    >>> {r: (round(v["collective_wait_s"], 3), round(v["collective_move_s"], 3))
    ...  for r, v in t.totals().items()}
    {0: (0.4, 0.1), 1: (0.0, 0.1)}
"""

from __future__ import annotations

import statistics
import threading
from typing import Any, Mapping

from ._step_parts import step_breakdown, mark_slow

# A rank is marked slow ("slow: data & forward 61%") only once the ranks have this many seconds
# of steps behind them (the median rank's step time, summed).  Before that the parts are start-up
# noise: the first collective's wait holds the other ranks' imports and the first batch's
# shipping, and a 0.8 s run marked its faster rank slow for "moving bytes".  The margin itself
# (how far above the others' work a slow rank's is) is _step_parts._SLOW_FACTOR.
SLOW_MIN_STEP_S = 5.0
_PARTS = ("collective_s", "collective_wait_s", "collective_move_s", "collectives", "log_s")


class CollectiveTimes:
    """Settles collective calls across ranks as their reports arrive; thread-safe."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[int, dict[int, tuple[float, float]]] = {}
        self._totals = {r: dict.fromkeys(_PARTS, 0.0) for r in range(world_size)}
        self._steps: dict[int, dict[str, float]] = {}  # each rank's step parts (running totals)
        self._changed = False
        self._lock = threading.Lock()

    def add(self, rank: int, timing: Mapping[str, Any]) -> None:
        """One batch's ``{"collectives": [[seq, start, duration]], "log_s": running total}``."""
        with self._lock:
            totals = self._totals.setdefault(rank, dict.fromkeys(_PARTS, 0.0))
            log_s = float(timing.get("log_s") or 0.0)
            self._changed |= log_s > totals["log_s"]
            totals["log_s"] = max(totals["log_s"], log_s)
            parts = timing.get("parts")
            if parts and parts.get("steps", 0) > self._steps.get(rank, {}).get("steps", 0):
                self._steps[rank] = {k: float(v) for k, v in parts.items()}
                self._changed = True
            for seq, start, took in timing.get("collectives") or []:
                calls = self._pending.setdefault(int(seq), {})
                calls[rank] = (float(start), float(took))
                if len(calls) == self.world_size:
                    self._settle(self._pending.pop(int(seq)))

    def _settle(self, calls: dict[int, tuple[float, float]]) -> None:
        self._changed = True
        last = max(start for start, _ in calls.values())
        for rank, (start, took) in calls.items():
            wait = min(max(last - start, 0.0), took)
            totals = self._totals.setdefault(rank, dict.fromkeys(_PARTS, 0.0))
            totals["collective_s"] += took
            totals["collective_wait_s"] += wait
            totals["collective_move_s"] += took - wait
            totals["collectives"] += 1

    def totals(self) -> dict[int, dict]:
        """Per rank: seconds in collectives (waiting, moving), calls settled, seconds in log();
        with the step's parts (``parts``, ``step_s``, ``steps``) and the slow mark (``slow``)
        once a rank has finished a step."""
        with self._lock:
            out: dict[int, dict] = {r: dict(t) for r, t in self._totals.items()}
            for rank, parts in self._steps.items():
                out.setdefault(rank, dict.fromkeys(_PARTS, 0.0)).update(
                    step_breakdown(parts, out.get(rank, {})))
        timed = [t["step_s"] for t in out.values() if t.get("step_s")]
        if timed and statistics.median(timed) >= SLOW_MIN_STEP_S:
            mark_slow(out)
        return out

    def take_changed(self) -> list[dict] | None:
        """Every rank's totals (``time`` event entries) if they changed since the last call."""
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
        return [{"rank": r, **t} for r, t in sorted(self.totals().items())]

    def rewind(self, world_size: int) -> None:
        """A new attempt numbers its calls from 0 again: drop unsettled ones, keep the totals."""
        with self._lock:
            self.world_size = world_size
            self._pending.clear()
            self._steps.clear()  # the new attempt's engines count their steps from the start
