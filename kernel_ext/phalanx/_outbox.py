"""Events on their way to the lab panel: made JSON-safe, and coalesced between two flushes.

:class:`~._labcomm.LabComm` passes every bus event through :func:`wire_safe` and queues it in an
:class:`Outbox`; a flush sends what the outbox holds, so a burst of updates costs a few comm
messages rather than one each.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from . import events  # noqa: F401  (the examples below use it)


def _finite_metrics(metrics: Mapping[str, Any]) -> dict:
    # NaN/inf are not JSON: jupyter_client would turn them into strings (with a warning) and
    # the panel would reject the whole batch.  Keep the row and its valid values instead.
    return {k: v for k, v in metrics.items()
            if not (isinstance(v, float) and not math.isfinite(v))}


def wire_safe(event: dict) -> dict:
    """A copy of ``event`` that survives JSON: non-finite metric values are left out.

    Example::

        >>> row = {"rank": 0, "step": 1, "t": 0.0, "metrics": {"loss": float("nan"), "acc": 0.5}}
        >>> wire_safe(events.metrics("r", [row]))["rows"][0]["metrics"]
        {'acc': 0.5}
    """
    kind = event.get("type")
    if kind in ("metrics", "history_window"):
        rows = [{**r, "metrics": _finite_metrics(r["metrics"])} for r in event["rows"]]
        if event.get("means") is None:
            return {**event, "rows": rows}
        means = {name: [p for p in points if math.isfinite(p[1])]
                 for name, points in event["means"].items()}
        return {**event, "rows": rows, "means": means}
    if kind == "progress":
        ranks = []
        for r in event["ranks"]:
            r = {**r, "metrics": _finite_metrics(r.get("metrics") or {})}
            for key in ("total", "steps_per_s", "eta_s"):
                if isinstance(r.get(key), float) and not math.isfinite(r[key]):
                    r[key] = None
            ranks.append(r)
        return {**event, "ranks": ranks}
    return event


class Outbox:
    """Pending events between two flushes, coalesced so a flush sends few messages.

    States keep only their latest value (progress merges per rank); metric rows of one run are
    appended to a single pending batch, and so are their means over ranks; run start/end keep
    their order.

    Example::

        >>> box = Outbox()
        >>> box.add(events.progress("r", [{"rank": 0, "step": 1}]))
        >>> box.add(events.progress("r", [{"rank": 0, "step": 2}, {"rank": 1, "step": 2}]))
        >>> [(e["type"], len(e["ranks"])) for e in box.drain()]
        [('progress', 2)]
    """

    def __init__(self) -> None:
        self._items: list[dict] = []

    def __len__(self) -> int:
        return len(self._items)

    def _find(self, kind: str, key: str | None = None, value: Any = None) -> dict | None:
        for item in self._items:
            if item["type"] == kind and (key is None or item.get(key) == value):
                return item
        return None

    def add(self, event: dict) -> None:
        """Queue ``event``, merging it into a pending one of the same kind where that is safe."""
        kind = event["type"]
        if kind == "cluster":
            pending = self._find("cluster")
        elif kind == "network":
            pending = self._find("network", "network", event["network"])
        elif kind == "progress":
            pending = self._find("progress", "run", event["run"])
            if pending is not None:
                by_rank = {r["rank"]: r for r in pending["ranks"]}
                by_rank.update({r["rank"]: r for r in event["ranks"]})
                pending["ranks"] = [by_rank[k] for k in sorted(by_rank)]
                return
        elif kind == "metrics":
            pending = self._find("metrics", "run", event["run"])
            if pending is None:
                pending = {**event, "rows": [], "means": {}}  # ours to extend
                self._items.append(pending)
            pending["rows"].extend(event["rows"])
            for name, points in (event.get("means") or {}).items():
                pending["means"].setdefault(name, []).extend(points)
            return
        else:
            pending = None
        if pending is not None:  # a newer state replaces the older one in place
            self._items[self._items.index(pending)] = dict(event)
        else:
            self._items.append(dict(event))

    def drain(self) -> list[dict]:
        """Everything pending, oldest first; the outbox is empty afterwards."""
        items, self._items = self._items, []
        return items
