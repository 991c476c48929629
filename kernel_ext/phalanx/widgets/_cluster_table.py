"""The engine table of the cluster widget and of ``%cluster status`` (pure: rows in, HTML out).

The session answers with plain data (:class:`~phalanx._session.EngineStatus`); this module is
where it becomes a table.

Rows come from ``cluster`` events (rank, engine id, host, pid, device, state); the widget adds
the step of the current run (from ``progress`` events) and resident memory of local engines.

Example::

    >>> rows = merge_rows([{"rank": 0, "engine_id": 3, "host": "h", "pid": 9, "device": "cpu",
    ...                     "state": "idle", "memory_mb": None, "step": None}], {0: 12}, running=1)
    >>> rows[0]["state"], rows[0]["step"]
    ('busy', 12)
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from .._session import EngineStatus

COLUMNS = ("rank", "host", "device", "state", "memory_mb", "step")
HEADINGS = {"memory_mb": "memory (MB)", "gpu_memory": "GPU memory (alloc / reserved, peak)",
            "share": "last run's params / grads / optimizer"}
_STATE_COLOURS = {"idle": "#2e7d32", "busy": "#1565c0", "starting": "#8d6e00",
                  "stopping": "#8d6e00", "dead": "#c62828"}


class ClusterStatus:
    """The status table; renders as HTML in the notebook and as text elsewhere."""

    COLUMNS = ("rank", "engine_id", "host", "pid", "device", "state", "memory_mb", "step")

    def __init__(self, rows: list[dict], launcher: str) -> None:
        self.rows, self.launcher = rows, launcher

    @classmethod
    def of(cls, status: EngineStatus) -> ClusterStatus:
        """The table of what ``session.status()`` (or ``start_cluster``, ``scale``...) answered.

        During a run the session gives each of the run's ranks its step; such a rank is
        training, whatever its slot says: the cluster layer keeps a slot ``idle`` through a run
        (it asks ipyparallel's queues, which a run's engines leave empty while they train).

        Example::

            >>> row = {"rank": 0, "engine_id": 0, "host": "h", "pid": 1, "device": "cpu",
            ...        "state": "idle", "memory_mb": None, "step": 12}
            >>> ClusterStatus.of(type("S", (), {"rows": [row], "launcher": "local"})).rows[0]["state"]
            'busy'
        """
        return cls([training_state(row) for row in status.rows], status.launcher)

    def __len__(self) -> int:
        return len(self.rows)

    def _columns(self) -> tuple[str, ...]:
        gpu = any(r.get("cuda_allocated_mb") is not None for r in self.rows)
        shares = any(r.get("share") is not None for r in self.rows)
        return self.COLUMNS + (("cuda_allocated_mb", "cuda_reserved_mb", "cuda_peak_mb") if gpu else ()) \
            + (("share",) if shares else ())

    def _cells(self, row: dict) -> list[str]:
        return ["" if row.get(c) is None else str(row.get(c)) for c in self._columns()]

    def __repr__(self) -> str:
        if not self.rows:
            return "no cluster is running: start one with %cluster start -n 2"
        table = [[_heading(c) for c in self._columns()]] + [self._cells(r) for r in self.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in table]
        return (f"{len(self.rows)} engine(s), {self.launcher} launcher (ranks are dense 0..N-1; "
                "after scaling down they are renumbered)\n" + "\n".join(lines))

    def _repr_html_(self) -> str:
        if not self.rows:
            return "<i>no cluster is running: start one with <code>%cluster start -n 2</code></i>"
        head = "".join(f"<th>{html.escape(_heading(c))}</th>" for c in self._columns())
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(r)) + "</tr>"
                       for r in self.rows)
        return (f"<div><b>{len(self.rows)} engine(s)</b>, {self.launcher} launcher"
                f"<table><tr>{head}</tr>{body}</table></div>")


def _heading(column: str) -> str:
    """The status table's heading of ``column``: its field name, but where that says too little."""
    return HEADINGS["share"] if column == "share" else column


def training_state(row: Mapping[str, Any]) -> dict:
    """``row`` with an ``idle`` state shown ``busy`` where it carries a step of the current run."""
    out = dict(row)
    if out.get("state") == "idle" and out.get("step") is not None:
        out["state"] = "busy"
    return out


def local_memory_mb(pid: int | None, host: str | None) -> float | None:
    """Resident memory of a process on this host, in MB (``None`` for remote or gone ones)."""
    from ..cluster import memory_mb

    return memory_mb(pid, host or "")


def merge_rows(engines: Sequence[Mapping[str, Any]], steps: Mapping[int, int], running: int = 0,
               memory: Callable[[int | None, str | None], float | None] | None = None,
               samples: Mapping[int, Mapping[str, Any]] | None = None) -> list[dict]:
    """Engine rows with the run's steps; ranks below ``running`` (the run's world size) that
    report ``idle`` are shown ``busy``: the cluster layer does not poll during a run.
    ``samples`` (the engines' own memory reports of a run) win over what the kernel measured."""
    rows = []
    for e in engines:
        row = dict(e)
        rank = int(row["rank"])
        if rank in steps:
            row["step"] = steps[rank]
        if rank < running and row.get("state") == "idle":
            row["state"] = "busy"
        if row.get("memory_mb") is None and memory is not None:
            row["memory_mb"] = memory(row.get("pid"), row.get("host"))
        rows.append(row)
    if samples:
        from ..cluster._memory import merge_samples

        merge_samples(rows, {rank: dict(sample) for rank, sample in samples.items()})
    return rows


def table_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as an HTML table (or a line saying no cluster runs).

    Example::

        >>> "no cluster" in table_html([])
        True
    """
    if not rows:
        return "<i>no cluster is running: start one with the start button or <code>%cluster start</code></i>"
    gpu = any(row.get("cuda_allocated_mb") is not None for row in rows)
    columns = COLUMNS[:5] + ("gpu_memory",) + COLUMNS[5:] if gpu else COLUMNS
    rows = [{**row, "gpu_memory": gpu_cell(row)} for row in rows] if gpu else rows
    head = "".join(f"<th style='text-align:left;padding:0 .8em 0 0'>{HEADINGS.get(c, c)}</th>"
                   for c in columns)
    body = "".join("<tr>" + "".join(_cell(c, row.get(c)) for c in columns) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def gpu_cell(row: Mapping[str, Any]) -> str | None:
    """``1.20 GB / 2.00 GB, 1.50 GB`` for a rank that uses CUDA, else ``None``.

    Example::

        >>> gpu_cell({"cuda_allocated_mb": 100.0, "cuda_reserved_mb": 128.0, "cuda_peak_mb": 110.0})
        '100 MB / 128 MB, 110 MB'
    """
    if row.get("cuda_allocated_mb") is None:
        return None
    from ._format import fmt_mb

    return (f"{fmt_mb(row['cuda_allocated_mb'])} / {fmt_mb(row.get('cuda_reserved_mb'))}, "
            f"{fmt_mb(row.get('cuda_peak_mb'))}")


def _cell(column: str, value: Any) -> str:
    text = "" if value is None else html.escape(str(value))
    if column == "state" and value in _STATE_COLOURS:
        text = f"<span style='color:{_STATE_COLOURS[value]}'>{text}</span>"
    return f"<td style='padding:0 .8em 0 0'>{text}</td>"
