"""``--profile STEPS``: merge every rank's torch.profiler trace into one, and say how to open it.

Each rank returns its Chrome trace (``runtime/telemetry/_profile.py``).  :func:`merge_traces` puts them on
one timeline with one track (``pid``) per rank, named ``rank N (host, pid)``: torch's own process
ids and its GPU device tracks of that rank all become the rank's track, timestamps are moved to
the earliest rank's base time (engines on one host share a clock; across hosts the alignment is
as good as the hosts' clocks), and flow-arrow ids are kept apart per rank.

:class:`ProfileReport` is what the cell shows: where the file was written, how to open it
(Perfetto's UI or ``chrome://tracing``: both read the file in the browser, no server of ours),
and each rank's top operators.

Example::

    >>> one = {"baseTimeNanoseconds": 2000, "traceEvents": [
    ...     {"ph": "X", "name": "aten::mm", "pid": 77, "tid": 77, "ts": 1.0, "dur": 2.0}]}
    >>> merged = merge_traces({0: one, 1: dict(one, baseTimeNanoseconds=5000)}, hosts=["h", "h"])
    >>> sorted({e["pid"] for e in merged["traceEvents"]})
    [0, 1]
    >>> [e["ts"] for e in merged["traceEvents"] if e["ph"] == "X"]
    [1.0, 4.0]
"""

from __future__ import annotations

import gzip
import html
import json
import os
import re
import time
from typing import Any, Mapping, Sequence

from ...wire._seam import RankResult

_PROCESS_META = ("process_name", "process_labels", "process_sort_index")
_FLOW_ID_STRIDE = 1 << 40  # flow ids of rank r live in [r * stride, (r + 1) * stride)
HOW_TO_OPEN = ("open it at https://ui.perfetto.dev (Open trace file) or in Chrome at "
               "chrome://tracing (Load): the file is read in the browser, nothing is uploaded "
               "to or served by phalanx")


def merge_traces(traces: Mapping[int, Mapping[str, Any]], hosts: Sequence[str] = (),
                 pids: Sequence[Any] = ()) -> dict:
    """One Chrome trace with a track per rank, from ``{rank: chrome trace dict}``."""
    bases = {r: int(t.get("baseTimeNanoseconds") or 0) for r, t in traces.items()}
    base = min(bases.values(), default=0)
    events: list[dict] = []
    for rank in sorted(traces):
        shift_us = (bases[rank] - base) / 1000.0
        events.extend(_rank_events(rank, traces[rank].get("traceEvents", []), shift_us))
        where = ", ".join(str(x) for x in (_at(hosts, rank), _at(pids, rank) and
                                           f"pid {_at(pids, rank)}") if x)
        label = f"rank {rank}" + (f" ({where})" if where else "")
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
            "traceName": "phalanx all-rank profile", "traceEvents": events}


def _at(values: Sequence[Any], index: int) -> Any:
    return values[index] if index < len(values) else None


def _rank_events(rank: int, events: list, shift_us: float) -> list[dict]:
    out = []
    for event in events:
        if not isinstance(event, dict):
            continue
        if event.get("ph") == "M" and event.get("name") in _PROCESS_META:
            continue  # the rank's own name replaces torch's "python" / device labels
        event = dict(event, pid=rank)
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = event["ts"] + shift_us
        if isinstance(event.get("id"), int) and event.get("ph") in ("s", "t", "f"):
            event["id"] = event["id"] + rank * _FLOW_ID_STRIDE
        out.append(event)
    return out


def trace_file_name(run_name: str, when: float | None = None) -> str:
    """``phalanx-profile-<run name>-<YYYYmmdd-HHMMSS>.json`` (a safe file name).

    Example::

        >>> trace_file_name("my run/1", when=0)
        'phalanx-profile-my-run-1-19700101-000000.json'
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_name).strip("-") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if when is None else when))
    return f"phalanx-profile-{safe}-{stamp}.json"


class ProfileReport:
    """The merged trace on disk and each rank's top operators (shown under the cell)."""

    def __init__(self, path: str, steps: dict[int, int], top: dict[int, list[dict]],
                 cuda: bool) -> None:
        self.path, self.steps, self.top, self.cuda = path, steps, top, cuda

    @classmethod
    def from_results(cls, results: Mapping[int, RankResult], run_name: str, slots: Sequence[Any],
                     directory: str = ".") -> "ProfileReport | None":
        """Merge the ranks' profiles in ``results`` and write the trace into ``directory``."""
        profiles = {r: res.profile for r, res in results.items() if res.profile}
        if not profiles:
            return None
        traces = {r: json.loads(gzip.decompress(p["trace"])) for r, p in profiles.items()}
        merged = merge_traces(traces, [getattr(s, "host", "") for s in slots],
                              [getattr(s, "pid", None) for s in slots])
        path = os.path.abspath(os.path.join(directory, trace_file_name(run_name)))
        with open(path, "w") as f:
            json.dump(merged, f)
        return cls(path, {r: p["steps"] for r, p in profiles.items()},
                   {r: p["top"] for r, p in profiles.items()}, any(p["cuda"] for p in profiles.values()))

    def ranks_in_trace(self) -> list[int]:
        """The rank tracks of the written file (read back from disk)."""
        with open(self.path) as f:
            events = json.load(f)["traceEvents"]
        return sorted({e["pid"] for e in events if e.get("ph") != "M"})

    def _key(self) -> str:
        return "self_cuda_ms" if self.cuda else "self_cpu_ms"

    def __repr__(self) -> str:
        lines = [f"profile of {_steps_text(self.steps)} written to {self.path}",
                 f"  {HOW_TO_OPEN}"]
        for rank, rows in sorted(self.top.items()):
            lines.append(f"  rank {rank} top operators by self {'CUDA' if self.cuda else 'CPU'} time:")
            lines += [f"    {r[self._key()]:9.2f} ms  {r['calls']:6d} calls  {r['name']}" for r in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        name = html.escape(os.path.basename(self.path))
        # Relative: the kernel runs next to the notebook, so the link resolves beside it.
        head = (f"<b>profile</b> of {_steps_text(self.steps)}: <a href='{name}' download>{name}</a>"
                f" ({html.escape(HOW_TO_OPEN)})")
        tables = "".join(self._rank_table(rank, rows) for rank, rows in sorted(self.top.items()))
        return f"<div>{head}<div style='display:flex;gap:2em;flex-wrap:wrap'>{tables}</div></div>"

    def _rank_table(self, rank: int, rows: list[dict]) -> str:
        unit = "CUDA" if self.cuda else "CPU"
        body = "".join(f"<tr><td>{html.escape(r['name'])}</td><td>{r['calls']}</td>"
                       f"<td>{r[self._key()]:.2f}</td></tr>" for r in rows)
        return (f"<table><caption>rank {rank}: top operators</caption><tr><th>operator</th>"
                f"<th>calls</th><th>self {unit} ms</th></tr>{body}</table>")


def _steps_text(steps: Mapping[int, int]) -> str:
    counts = sorted(set(steps.values()))
    what = f"{counts[0]} step(s)" if len(counts) == 1 else f"{min(counts)}-{max(counts)} steps"
    return f"{what} on {len(steps)} rank(s)"
