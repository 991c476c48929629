"""The result of one run as the notebook keeps it (``phalanx.last_run()``)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._durations import fmt_wall
from ._history import MetricHistory

if TYPE_CHECKING:
    from ._digest import CurveDigest
    from ._parts_series import PartsSeries
    from ._profile import ProfileReport


@dataclass
class RunRecord:
    """Status, wall time, per-rank steps, the complete history and the manifest of a run."""

    run_id: str
    name: str
    status: str                      # one of events.RUN_STATES
    world_size: int
    wall_s: float = 0.0
    steps: dict[int, int] = field(default_factory=dict)
    history: MetricHistory = field(default_factory=MetricHistory)
    manifest: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # What happened to the run on the way: {"kind": "resume"|"restart"|"resize", "step", ...}
    changes: list[dict] = field(default_factory=list)
    # Peak memory of each rank over the run: {rank: {"rss_mb", "cuda_allocated_mb", ...}}
    memory: dict[int, dict[str, float]] = field(default_factory=dict)
    profile: ProfileReport | None = None  # with --profile
    # Seconds per rank in phalanx collectives (waiting for the slowest peer / moving bytes) and
    # in log(): {rank: {"collective_s", "collective_wait_s", "collective_move_s", "log_s", ...}},
    # seconds but for "slow", the text saying which part made a slow rank slow
    timing: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The curves at bounded size (a CurveDigest): what the summary draws and a reloaded panel gets
    digest: CurveDigest | None = None
    # Each rank's step parts through the run, at bounded size (a PartsSeries)
    parts_series: PartsSeries | None = None
    # The optimizer steps the run was to take: --steps, else what the training framework said
    total_steps: int | None = None
    # Each rank's bytes of the cell's parameters, gradients and optimizer state at the end, as
    # the run's fit mode counts them (replicated: every rank the whole model)
    held: dict[int, dict[str, int]] = field(default_factory=dict)
    # The rank at fault when the run failed (the one the error names first), else None
    failed_rank: int | None = None

    @property
    def history_path(self) -> str | None:
        """The directory of the history's files (``part-*.npz``; read them back with
        ``MetricHistory.read(path)``), None while it is all in memory."""
        return self.history.path

    def curves(self) -> dict:
        """``{metric: {rank or "mean": (steps, values)}}``, a few thousand points per line
        (min/max-preserving); read from the history in chunks when the record has no digest."""
        if self.digest is None:
            from ._digest import CurveDigest

            digest = CurveDigest(self.world_size)
            for batch in self.history.batches():
                digest.add(batch)
            digest.finish()
            self.digest = digest
        return self.digest.points()

    def history_manifest(self) -> dict:
        """What the manifest says of the history: where it is, its size, per-rank statistics
        (small whatever the run's length)."""
        out: dict[str, object] = {"path": self.history.directory, "rows": len(self.history),
                                  "metrics": self.history.metric_names(),
                                  "format": "npz column chunks"}
        if self.digest is not None:
            out["per_rank"] = self.digest.stats()
        return out

    def export_tensorboard(self, directory: str) -> str:
        """Write the run as TensorBoard event files in ``directory/<name>-<run id>``, as
        ``--tensorboard`` does live (every rank's metrics, their mean, the options, summary and
        manifest); returns that folder.  Needs ``pip install 'phalanx[tensorboard]'``.

        Example: ``phalanx.last_run().export_tensorboard("runs")``, then ``tensorboard --logdir runs``
        """
        from ..exports._live import export_record
        from ..exports._tensorboard import TensorBoardSink

        sink = TensorBoardSink(directory)
        export_record(self, sink)
        return str(sink.path)

    def export_mlflow(self, uri: str, experiment: str = "phalanx") -> str:
        """Write the run to the MLflow tracking store ``uri`` (a path: MLflow's file store) as
        ``--mlflow`` does live; returns MLflow's run id.  Needs ``pip install 'phalanx[mlflow]'``.

        Example: ``phalanx.last_run().export_mlflow("mlruns")``
        """
        from ..exports._live import export_record
        from ..exports._mlflow import MlflowSink

        sink = MlflowSink(uri, experiment)
        export_record(self, sink)
        return str(sink.run_id)

    def final_metrics(self) -> dict[int, dict[str, float]]:
        """The last logged value of each metric, per rank."""
        return {rank: self.history.latest(rank) for rank in range(self.world_size)}

    def summary_rows(self) -> list[dict]:
        finals = self.final_metrics()
        return [{"rank": r, "steps": self.steps.get(r, 0), **finals.get(r, {}), **self._peak(r)}
                for r in range(self.world_size)]

    def _peak(self, rank: int) -> dict[str, float]:
        peaks = self.memory.get(rank, {})
        shown = {"peak_rss_mb": peaks.get("rss_mb"), "peak_cuda_mb": peaks.get("cuda_peak_mb")}
        return {k: v for k, v in shown.items() if v is not None}

    def __repr__(self) -> str:
        lines = [f"run {self.name}: {self.status} in {fmt_wall(self.wall_s)} on {self.world_size} "
                 f"rank(s), {len(self.history)} metric rows"]
        for row in self.summary_rows():
            metrics = ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k not in ("rank", "steps"))
            lines.append(f"  rank {row['rank']}: {row['steps']} steps  {metrics}")
        lines += [f"  rank {r}: {text}" for r, text in self.time_lines().items()]
        return "\n".join(lines)

    def time_lines(self) -> dict[int, str]:
        """Where each rank's time went: its step parts, collectives and log(), where there was any."""
        from ._step_parts import breakdown_text

        out = {}
        for rank, t in sorted(self.timing.items()):
            said = []
            if t.get("step_s"):
                said.append(breakdown_text(t) + (f" (slow: {t['slow']})" if t.get("slow") else ""))
            if t.get("collectives") or t.get("log_s"):
                said.append(f"{t['collective_s']:.3f} s in {int(t['collectives'])} collective(s) "
                            f"(waiting for the slowest peer {t['collective_wait_s']:.3f} s, moving "
                            f"bytes {t['collective_move_s']:.3f} s), {t['log_s']:.3f} s in log()")
            if said:
                out[rank] = "; ".join(said)
        return out

    def step_parts_over_time(self, rank: int | None = None) -> list[dict]:
        """Each rank's step parts through the run: points ``{rank, step, t, steps, forward_s,
        backward_s, collective_s, optimizer_s, log_s, other_s}``, each part in seconds per step
        over the ``steps`` steps up to ``step``; when a rank became slow, and in which part.  A
        long run's points are merged in pairs to stay within 2,000 per rank."""
        if self.parts_series is None:
            return []
        return [r for r in self.parts_series.rows() if rank is None or r["rank"] == rank]

    def slow_ranks(self) -> dict[int, str]:
        """The ranks whose own work per step was well above the others', with the part that made
        them slow: ``{1: "data & forward 61% of step time"}``."""
        return {r: t["slow"] for r, t in sorted(self.timing.items()) if t.get("slow")}

    def _repr_html_(self) -> str:
        rows = self.summary_rows()
        columns = list(dict.fromkeys(k for row in rows for k in row))
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{_fmt(row.get(c))}</td>" for c in columns) + "</tr>"
                       for row in rows)
        title = (f"<b>{html.escape(self.name)}</b>: {html.escape(self.status)} in "
                 f"{self.wall_s:.2f} s on {self.world_size} rank(s)")
        return f"<div>{title}<table><tr>{head}</tr>{body}</table></div>"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape("" if value is None else str(value))
