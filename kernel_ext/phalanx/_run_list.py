"""``phalanx.runs()``: the notebook's runs as the person finds them again, restarts included.

Each :class:`PastRun` is one entry of the notebook's run log (:mod:`phalanx.fit.telemetry._run_log`):
name, cell, start, duration, status and final metrics, and its curves on demand (read back from
the history it wrote).  A run still going in the background in this kernel answers ``wait()``,
``stop()`` and ``result()`` through its handle, as ``%%distributed_fit --background``'s value
does.  :class:`RunList` shows them as a table.

Example::

    runs = phalanx.runs()
    runs                      # a table: name, cell, start, duration, status, final metrics
    runs[-1].history().to_pandas()
    runs[0]                   # its summary with the curves, as the cell showed it
"""

from __future__ import annotations

import datetime
import html
from typing import TYPE_CHECKING

from .fit.telemetry._durations import fmt_wall

if TYPE_CHECKING:
    from ._background import BackgroundRun
    from .fit import RunRecord
    from .fit.telemetry._history import MetricHistory
    from .fit.telemetry._run_log import RunLog


def _first_line(cell: str) -> str:
    lines = [line for line in (cell or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


class PastRun:
    """One recorded run of the notebook."""

    def __init__(self, entry: dict, log: RunLog, handle: BackgroundRun | None = None) -> None:
        self._entry, self._log, self._handle = entry, log, handle
        self.run_id: str = entry["run"]
        self.name: str = entry["name"]
        self.cell: str = entry.get("cell") or ""
        self.started = datetime.datetime.fromtimestamp(entry.get("started") or 0)
        self.world_size: int = entry.get("world_size") or 0
        self.metrics: dict[str, float] = dict(entry.get("metrics") or {})
        self.steps = {int(r): int(s) for r, s in (entry.get("steps") or {}).items()}
        self.error: str | None = entry.get("error")
        self._record: RunRecord | None = None

    @property
    def status(self) -> str:
        """running | done | failed | interrupted | timeout (a background run: as it is now)."""
        return self._handle.status if self._handle is not None else self._entry["status"]

    @property
    def wall_s(self) -> float | None:
        """Seconds the run took (None while it runs)."""
        return self._entry.get("wall_s")

    def history(self) -> MetricHistory:
        """The run's complete metric history, read back from disk (``.to_pandas()``)."""
        from .fit.telemetry._history import MetricHistory

        try:
            return MetricHistory.read(self._log.history_dir(self.run_id))
        except FileNotFoundError:
            return MetricHistory()  # a run that logged nothing (or whose files were removed)

    def record(self) -> RunRecord:
        """A :class:`~phalanx.fit.RunRecord` of the run as recorded (its curves, steps, status)."""
        if self._record is None:
            from .fit import RunRecord

            self._record = RunRecord(self.run_id, self.name, self.status, self.world_size,
                                     self.wall_s or 0.0, dict(self.steps), self.history(),
                                     error=self.error)
        return self._record

    def curves(self) -> dict:
        """``{metric: {rank or "mean": (steps, values)}}``, downsampled as the summary draws."""
        return self.record().curves()

    # --- a background run of this kernel ------------------------------------------------------

    def wait(self, timeout: float | None = None) -> RunRecord | None:
        """A background run: block until it ends (its record, or its error raised here).
        A run that is over: its record."""
        return self._handle.wait(timeout) if self._handle is not None else self.record()

    def stop(self) -> bool:
        """Stop a background run of this kernel that still goes; False for any other run."""
        return bool(self._handle.stop()) if self._handle is not None else False

    def result(self, name: str) -> object:
        """A ``--return`` name of a background run of this kernel."""
        if self._handle is None:
            raise ValueError(f"{self.name} was not a background run of this kernel: its returned "
                             "names are in the notebook's namespace")
        return self._handle.result(name)

    # --- display -----------------------------------------------------------------------------

    def row(self) -> dict:
        """What the run list shows of it."""
        return {"name": self.name, "cell": _first_line(self.cell),
                "start": self.started.strftime("%Y-%m-%d %H:%M:%S"),
                "duration": "" if self.wall_s is None else fmt_wall(self.wall_s),
                "status": self.status,
                "final metrics": ", ".join(f"{k} {v:.4g}" for k, v in self.metrics.items())}

    def __repr__(self) -> str:
        row = self.row()
        return (f"<{row['name']}: {row['status']}, started {row['start']}"
                + (f", {row['duration']}" if row["duration"] else "")
                + (f", {row['final metrics']}" if row["final metrics"] else "") + ">")

    def _repr_html_(self) -> str:
        from .widgets import RunSummary

        return RunSummary(self.record())._repr_html_()


class RunList(list):
    """The notebook's runs, oldest first; a table in the notebook."""

    def _repr_html_(self) -> str:
        if not self:
            return "<i>no runs recorded for this notebook yet</i>"
        rows = [run.row() for run in self]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values())
                       + "</tr>" for row in rows)
        return f'<table class="phalanx-runs"><tr>{head}</tr>{body}</table>'
